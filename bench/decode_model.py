"""Decoding a whole .dsz model of AlexNet's FC size on the device side, against memory-bound baselines.

DeepSZ reports 296 ms to decode AlexNet's FC layers (234.5 MB dense) on an i7-8750H: 26 ms lossless,
108 ms SZ, 162 ms sparse reconstruction. This builds a .tflite with AlexNet's FC shapes (fc6 4096x9216,
fc7 4096x4096, fc8 1000x4096; magnitude-pruned 91/91/75% Laplace weights; no TensorFlow needed: the
flatbuffer is written with the `tflite` package's builder used by the tests), packs it, and times
`pydsz.load(buf).tflite_bytes()` against, in the same run, numpy allocating and filling the same
number of dense bytes (numpy may back it with huge pages) and one plain copy of the decoded model.

    python3 bench/decode_model.py [--bound 0.005] [--json bench/results/decode_model.json]
"""
import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from test_model import build_tflite  # noqa: E402  (the tests' flatbuffer writer)

import pydsz  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

SHAPES = [("fc6", 4096, 9216, 0.91), ("fc7", 4096, 4096, 0.91), ("fc8", 1000, 4096, 0.75)]


def alexnet_fc_model(seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    tensors = [{"shape": [1, SHAPES[0][2]]}]
    ops = []
    for i, (_, rows, cols, sparsity) in enumerate(SHAPES):
        w = rng.laplace(0, 0.01, (rows, cols)).astype(np.float32)
        w[np.abs(w) < np.quantile(np.abs(w), sparsity)] = 0
        b = np.zeros(rows, np.float32)
        x = len(tensors) - 1
        tensors += [{"shape": [rows, cols], "data": w.tobytes()}, {"shape": [rows], "data": b.tobytes()},
                    {"shape": [1, rows]}]
        ops.append(("FULLY_CONNECTED", [x, x + 1, x + 2], [x + 3]))
    return build_tflite(tensors, ops, inputs=[0], outputs=[len(tensors) - 1])


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bound", type=float, default=0.005, help="absolute error bound of every layer")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", default="bench/results/decode_model.json")
    args = parser.parse_args()

    model = alexnet_fc_model()
    t0 = time.perf_counter()
    packed = pydsz.pack_model(model, args.bound)
    encode_s = time.perf_counter() - t0
    info = pydsz.load(packed).info()
    dense_bytes = sum(r * c * 4 for _, r, c, _ in SHAPES)

    decode_s = best_of(lambda: pydsz.load(packed).tflite_bytes(), args.repeat)
    fill_s = best_of(lambda: np.full(dense_bytes // 4, 1.0, np.float32), args.repeat)
    copy_s = best_of(lambda: bytearray(model), args.repeat)
    assert pydsz.load(packed).tflite_bytes() != model  # lossy, but:
    assert len(pydsz.load(packed).tflite_bytes()) == len(model)

    rows = [[t["name"], "x".join(map(str, t["shape"])), f"{t['density']:.3f}", t["data_bytes"],
             t["index_bytes"], t["index_codec"], f"{t['ratio']:.1f}x"] for t in info["tensors"]]
    print(f"{platform.processor() or platform.machine()}, numpy {np.__version__}")
    print(format_table(["layer", "shape", "density", "data B", "index B", "index", "ratio"], rows))
    total = info["compressed_tensors"]
    print(f"\nFC layers {total['original_bytes'] / 1e6:.1f} MB -> {total['compressed_bytes'] / 1e6:.2f} MB "
          f"({total['ratio']:.1f}x) at bound {args.bound}; whole file {len(packed) / 1e6:.2f} MB; "
          f"encode {encode_s:.1f} s")
    print(format_table(["step (best of %d)" % args.repeat, "ms", "vs np.full"], [
        ["decode .dsz -> .tflite bytes", f"{1e3 * decode_s:.0f}", f"{decode_s / fill_s:.2f}x"],
        ["np.full of the dense FC bytes", f"{1e3 * fill_s:.0f}", "1.00x"],
        ["one copy of the .tflite bytes", f"{1e3 * copy_s:.0f}", f"{copy_s / fill_s:.2f}x"],
        ["DeepSZ (paper, i7-8750H)", "296", "-"],
    ]))
    result = {"machine": {"platform": platform.platform(), "numpy": np.__version__},
              "bound": args.bound, "tensors": info["tensors"], "file_bytes": len(packed),
              "encode_s": encode_s, "decode_s": decode_s, "np_full_s": fill_s, "copy_s": copy_s,
              "decode_vs_np_full": decode_s / fill_s}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
