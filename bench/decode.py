"""Decoding AlexNet's FC layers from .dsz, stage by stage, against memory-bound and SZ3 baselines in one run.

The model: a .tflite with AlexNet's FC shapes (fc6 4096x9216, fc7 4096x4096, fc8 1000x4096) holding
Laplace weights magnitude-pruned to densities 9%, 9%, 25%, packed at each absolute bound. For each
bound, timed in alternation (best of --repeat) so that all share the machine's noise:
  pydsz   pydsz.load(file).tflite_bytes(): every layer decoded into its place in the model's bytes;
          the stages (lossless, values, reconstruction) come from edge_demo.stages, as the device sees them
  (a)     numpy allocating and filling the same dense arrays (np.full per layer)
  (b)     DeepSZ's decoder in numpy: SZ3 (hdf5plugin) decompressing the same non-zero values at the
          same bound, zstd inflating DeepSZ's index array (the same gap bytes pydsz's gap8 codec
          writes), numpy turning the gaps into positions and scattering the values into zeroed arrays
numpy's huge-page advice is turned off so that the baselines' arrays get the same 4 KiB pages as
the decoder's output (a bytes object, which TFLite takes): with huge pages the kernel's compaction
state alone moves np.full of these 234 MB between 50 ms and over a second on a shared machine.
Peak memory is measured in a fresh process that reads the file and decodes it: the growth of its
peak RSS over its RSS before reading, against the decoded model plus the file.

Stored dtypes: the same layers stored as float16 (behind DEQUANTIZE, the converter's float16 option)
at bound 1e-3 and as int8 (per-tensor scale, max|w|/127) at 1 step, decoded into the model's bytes,
against numpy filling the same number of values of that dtype (np.full), timed alternately.

Targets (the project's edge-decoding issue): pydsz within 2.5x of (a); at least 3x faster than (b);
peak no more than the decoded model plus the file plus 10%. DeepSZ reports 296 ms on an i7-8750H
(26 ms lossless, 108 ms SZ, 162 ms reconstruction).

    python3 bench/decode.py [--bounds 1e-3,2e-3,5e-3,1e-2] [--repeat 7] [--json PATH] [--png PATH]
"""
import argparse
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import h5py
import hdf5plugin
import numpy as np
import zstandard

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from machine import machine_info  # noqa: E402  (bench/machine.py)
from test_model import build_tflite  # noqa: E402  (the tests' flatbuffer writer: no TensorFlow needed)

import pydsz  # noqa: E402
from edge_demo.stages import decode_timed  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

LAYERS = [("fc6", 4096, 9216, 0.09), ("fc7", 4096, 4096, 0.09), ("fc8", 1000, 4096, 0.25)]
BOUNDS = (1e-3, 2e-3, 5e-3, 1e-2)
SCALE = 0.01  # Laplace scale of the weights before pruning
SEED = 2019
DEEPSZ_MS = {"lossless": 26, "values": 108, "reconstruction": 162, "total": 296}
TARGETS = {"vs_fill": 2.5, "vs_sz3": 3.0, "memory": 1.10}


def small_pages_only() -> None:
    """Stop numpy from advising the kernel to back large arrays with huge pages (numpy >= 1.22)."""
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _set_madvise_hugepage
    _set_madvise_hugepage(False)


def pruned_layers() -> list:
    """AlexNet's FC weights, [out, in] as TFLite stores them, with the smallest magnitudes zeroed."""
    rng = np.random.default_rng(SEED)
    weights = []
    for _, rows, cols, density in LAYERS:
        w = rng.laplace(0.0, SCALE, (rows, cols)).astype(np.float32)
        w[np.abs(w) < np.quantile(np.abs(w), 1 - density)] = 0
        weights.append(w)
    return weights


def fc_model(weights) -> bytes:
    tensors = [{"shape": [1, weights[0].shape[1]]}]
    ops = []
    for w in weights:
        x = len(tensors) - 1
        tensors += [{"shape": list(w.shape), "data": w.tobytes()},
                    {"shape": [w.shape[0]], "data": np.zeros(w.shape[0], np.float32).tobytes()},
                    {"shape": [1, w.shape[0]]}]
        ops.append(("FULLY_CONNECTED", [x, x + 1, x + 2], [x + 3]))
    return build_tflite(tensors, ops, inputs=[0], outputs=[len(tensors) - 1])


def typed_model(weights, dtype: str) -> bytes:
    """The FC layers with their weights stored as float16 (each read through a DEQUANTIZE op) or int8."""
    import tflite

    tensors = [{"shape": [1, weights[0].shape[1]]}]
    ops = []
    for w in weights:
        x = len(tensors) - 1
        if dtype == "float16":
            tensors += [{"shape": list(w.shape), "type": tflite.TensorType.FLOAT16, "data": w.astype(np.float16).tobytes()},
                        {"shape": list(w.shape)}]
            ops.append(("DEQUANTIZE", [x + 1], [x + 2]))
        else:
            scale = float(np.abs(w).max()) / 127
            tensors += [{"shape": list(w.shape), "type": tflite.TensorType.INT8, "scale": scale,
                         "data": np.clip(np.rint(w / scale), -127, 127).astype(np.int8).tobytes()}]
        weight = len(tensors) - 1
        tensors += [{"shape": [w.shape[0]], "data": np.zeros(w.shape[0], np.float32).tobytes()},
                    {"shape": [1, w.shape[0]]}]
        ops.append(("FULLY_CONNECTED", [x, weight, weight + 1], [weight + 2]))
    return build_tflite(tensors, ops, inputs=[0], outputs=[len(tensors) - 1])


def bench_dtypes(weights, repeat: int) -> list:
    """Decoding the layers stored as float16 and as int8 into the model's bytes, against np.full of
    as many values of that dtype."""
    shapes = [w.shape for w in weights]
    rows = []
    for dtype, bound in (("float16", 1e-3), ("int8", "1q")):
        model = typed_model(weights, dtype)
        packed = pydsz.pack_model(model, bound)
        best = best_times({
            "pydsz": lambda: pydsz.load(packed).tflite_bytes(),
            "np_full": lambda: [np.full(s, 1, dtype) for s in shapes],
        }, repeat)
        info = pydsz.load(packed).info()["compressed_tensors"]
        nnz = sum(int(np.count_nonzero(w)) for w in weights)
        rows.append({"dtype": dtype, "bound": str(bound), "model_bytes": len(model), "file_bytes": len(packed),
                     "ratio": info["ratio"], "time_s": best, "vs_fill": best["pydsz"] / best["np_full"],
                     "nonzeros": nnz, "ns_per_nonzero": 1e9 * best["pydsz"] / nnz,
                     "fill_ns_per_nonzero": 1e9 * best["np_full"] / nnz})
    return rows


def sz3_file(values: np.ndarray, bound: float) -> bytes:
    """An in-memory HDF5 file holding values as one SZ3-compressed chunk at an absolute bound.

    Reading the file back costs SZ3's decompression and little else; pydsz.bench.baselines.sz3 first
    writes its stream into a fresh file, which would add to the baseline's time."""
    bio = io.BytesIO()
    with h5py.File(bio, "w") as f:
        f.create_dataset("v", data=values, chunks=values.shape, **hdf5plugin.SZ3(absolute=bound))
    return bio.getvalue()


def gap8_index(positions: np.ndarray) -> bytes:
    """DeepSZ's index array for sorted flat positions, zstd-compressed: gaps as bytes, where a gap
    over 255 takes filler bytes 0 (each +255, no value) before its remainder (doc/format.md)."""
    gaps = np.diff(positions, prepend=-1)
    fillers = (gaps - 1) // 255
    symbols = np.zeros(len(gaps) + int(fillers.sum()), np.uint8)
    symbols[np.cumsum(fillers + 1) - 1] = gaps - 255 * fillers
    return zstandard.ZstdCompressor(level=19).compress(symbols.tobytes())


def deepsz_decode(layers, shapes, times: dict) -> list:
    """Baseline (b): per layer, SZ3-decompress the values, inflate the index and scatter; adds the
    seconds of each step to times."""
    out = []
    for (values_file, index), shape in zip(layers, shapes):
        t0 = time.perf_counter()
        with h5py.File(io.BytesIO(values_file), "r") as f:
            values = f["v"][()]
        t1 = time.perf_counter()
        symbols = np.frombuffer(zstandard.ZstdDecompressor().decompress(index), np.uint8)
        steps = symbols.astype(np.int64)
        steps[symbols == 0] = 255
        positions = np.cumsum(steps)[symbols != 0] - 1
        t2 = time.perf_counter()
        dense = np.zeros(shape, np.float32)
        dense.reshape(-1)[positions] = values
        t3 = time.perf_counter()
        out.append(dense)
        for key, dt in (("sz3", t1 - t0), ("index", t2 - t1), ("scatter", t3 - t2)):
            times[key] = times.get(key, 0.0) + dt
    return out


def best_times(fns: dict, repeat: int) -> dict:
    """Smallest wall time of each fn; the fns alternate within each round so that they share the noise."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


_PEAK_PROBE = """
import sys
from pathlib import Path
import pydsz

def status(key):
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith(key))

try:  # reset the high-water mark to the current RSS (Linux >= 4.0), so imports do not count
    Path("/proc/self/clear_refs").write_text("5")
except OSError:
    pass
before = status("VmRSS:")
data = Path(sys.argv[1]).read_bytes()
model = pydsz.load(data).tflite_bytes()
print(status("VmHWM:") - before, len(model), len(data))
"""


def peak_memory(path: Path) -> dict:
    """Peak RSS growth of a fresh process reading and decoding the .dsz file at path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", _PEAK_PROBE, str(path)], capture_output=True, text=True,
                       env=env, check=True)
    peak, model_bytes, file_bytes = map(int, r.stdout.split())
    return {"peak_bytes": peak, "model_bytes": model_bytes, "file_bytes": file_bytes,
            "vs_model_and_file": peak / (model_bytes + file_bytes)}


def bench_bound(model: bytes, weights, bound: float, repeat: int, tmp: Path) -> dict:
    t0 = time.perf_counter()
    packed = pydsz.pack_model(model, bound)
    encode_s = time.perf_counter() - t0
    info = pydsz.load(packed).info()
    path = tmp / f"alexnet_fc_{bound:g}.dsz"
    path.write_bytes(packed)

    deepsz = []
    for w in weights:
        positions = np.flatnonzero(w)
        deepsz.append((sz3_file(w.reshape(-1)[positions], bound), gap8_index(positions)))
    shapes = [w.shape for w in weights]
    staged, deepsz_steps = [], []

    def staged_decode():
        staged.append(decode_timed(pydsz.load(packed))[1])

    def deepsz_run():
        deepsz_steps.append({})
        deepsz_decode(deepsz, shapes, deepsz_steps[-1])

    best = best_times({
        "pydsz": lambda: pydsz.load(packed).tflite_bytes(),
        "staged": staged_decode,
        "np_full": lambda: [np.full(s, 1.0, np.float32) for s in shapes],
        "sz3": deepsz_run,
    }, repeat)
    # the split of the fastest run of each
    stages = min(staged, key=lambda s: s.total)
    steps = min(deepsz_steps, key=lambda t: sum(t.values()))

    decoded = pydsz.load(packed).weights()
    sz3_out = deepsz_decode(deepsz, shapes, {})
    errors = {"pydsz": max(float(np.abs(decoded[f"fc{i + 1}"] - w).max()) for i, w in enumerate(weights)),
              "sz3": max(float(np.abs(d - w).max()) for d, w in zip(sz3_out, weights))}
    total = info["compressed_tensors"]
    return {
        "bound": bound, "encode_s": encode_s, "file_bytes": len(packed), "ratio": total["ratio"],
        "tensors": info["tensors"], "deepsz_bytes": {"sz3": sum(len(v) for v, _ in deepsz),
                                                     "index": sum(len(i) for _, i in deepsz)},
        "time_s": best, "stages_s": {"lossless": stages.lossless, "values": stages.values,
                                     "reconstruction": stages.reconstruction, "total": stages.total},
        "deepsz_steps_s": steps,
        "max_error": errors, "memory": peak_memory(path),
        "vs_fill": best["pydsz"] / best["np_full"], "sz3_vs_pydsz": best["sz3"] / best["pydsz"],
    }


def print_results(rows: list, repeat: int) -> None:
    ms = lambda s: f"{1e3 * s:.0f}"  # noqa: E731
    print(f"pydsz, stage by stage (ms; best of {repeat}; values timed alone, reconstruction = the fused "
          "pass minus values, and the first touch of the model's dense memory, which (a) pays too)")
    print(format_table(
        ["bound", "ratio", "file MB", "lossless", "values", "reconstruction", "sum", "peak MB", "peak/(out+in)"],
        [[f"{r['bound']:g}", f"{r['ratio']:.1f}x", f"{r['file_bytes'] / 1e6:.2f}",
          *(ms(r["stages_s"][k]) for k in ("lossless", "values", "reconstruction", "total")),
          f"{r['memory']['peak_bytes'] / 1e6:.1f}", f"{r['memory']['vs_model_and_file']:.3f}"] for r in rows]
        + [["DeepSZ (paper, i7-8750H)", "", "",
            *(str(DEEPSZ_MS[k]) for k in ("lossless", "values", "reconstruction", "total")), "", ""]]))
    print(f"\nagainst the baselines (ms; best of {repeat}, alternating)")
    print(format_table(
        ["bound", "pydsz", "(a) np.full", "pydsz/(a)", "(b) SZ3", "index", "scatter", "(b) total",
         "(b)/pydsz", "SZ3/pydsz values"],
        [[f"{r['bound']:g}", ms(r["time_s"]["pydsz"]), ms(r["time_s"]["np_full"]), f"{r['vs_fill']:.2f}x",
          *(ms(r["deepsz_steps_s"][k]) for k in ("sz3", "index", "scatter")), ms(r["time_s"]["sz3"]),
          f"{r['sz3_vs_pydsz']:.2f}x", f"{r['deepsz_steps_s']['sz3'] / r['stages_s']['values']:.1f}x"]
         for r in rows]))


def print_dtypes(rows: list, repeat: int) -> None:
    print(f"\nstored dtypes: decoding into the model's bytes against np.full of as many values of the dtype "
          f"(ms; best of {repeat}, alternating)")
    print(format_table(["dtype", "bound", "model MB", "file MB", "ratio", "pydsz", "np.full", "pydsz/np.full",
                        "pydsz ns/non-zero", "np.full ns/non-zero"],
                       [[r["dtype"], r["bound"], f"{r['model_bytes'] / 1e6:.1f}", f"{r['file_bytes'] / 1e6:.2f}",
                         f"{r['ratio']:.1f}x", f"{1e3 * r['time_s']['pydsz']:.0f}",
                         f"{1e3 * r['time_s']['np_full']:.0f}", f"{r['vs_fill']:.2f}x",
                         f"{r['ns_per_nonzero']:.1f}", f"{r['fill_ns_per_nonzero']:.1f}"] for r in rows]))


def check_targets(rows: list, dtype_rows: list = ()) -> list:
    checks = [(f"{r['dtype']} decoding within {TARGETS['vs_fill']}x of np.full of {r['dtype']}",
               r["vs_fill"] <= TARGETS["vs_fill"], f"{r['vs_fill']:.2f}x") for r in dtype_rows]
    for r in rows:
        b = f"{r['bound']:g}"
        checks += [
            (f"pydsz within {TARGETS['vs_fill']}x of (a) at {b}", r["vs_fill"] <= TARGETS["vs_fill"],
             f"{r['vs_fill']:.2f}x"),
            (f"pydsz >= {TARGETS['vs_sz3']}x faster than (b) at {b}", r["sz3_vs_pydsz"] >= TARGETS["vs_sz3"],
             f"{r['sz3_vs_pydsz']:.2f}x"),
            (f"peak <= {TARGETS['memory']:.2f} x (model + file) at {b}",
             r["memory"]["vs_model_and_file"] <= TARGETS["memory"], f"{r['memory']['vs_model_and_file']:.3f}"),
            (f"every weight within the bound at {b}", r["max_error"]["pydsz"] <= r["bound"],
             f"max error {r['max_error']['pydsz']:.3g}"),
        ]
    return checks


def plot(rows: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['bound']:g}" for r in rows] + ["DeepSZ\n(paper)"]
    stages = [[1e3 * r["stages_s"][k] for r in rows] + [DEEPSZ_MS[k]] for k in ("lossless", "values", "reconstruction")]
    x = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    bottom = np.zeros(len(labels))
    for name, heights in zip(("lossless", "value decoding", "sparse reconstruction"), stages):
        ax.bar(x - 0.2, heights, 0.3, bottom=bottom, label=name)
        bottom += heights
    n = len(rows)
    ax.bar(x[:n] + 0.07, [1e3 * r["time_s"]["np_full"] for r in rows], 0.2, label="(a) np.full", color="0.6")
    ax.bar(x[:n] + 0.27, [1e3 * r["time_s"]["sz3"] for r in rows], 0.2, label="(b) DeepSZ in numpy: SZ3, index, scatter",
           color="0.3")
    ax.set_xticks(x, labels)
    ax.set_xlabel("absolute error bound")
    ax.set_ylabel("ms to decode AlexNet's FC layers")
    ax.set_ylim(top=1.35 * max(max(bottom), max(1e3 * r["time_s"]["sz3"] for r in rows)))
    ax.legend(loc="upper left", ncol=2, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bounds", default=",".join(f"{b:g}" for b in BOUNDS), help="comma-separated absolute bounds")
    ap.add_argument("--repeat", type=int, default=7, help="timing rounds (the best is kept)")
    ap.add_argument("--json", default=str(ROOT / "bench/results/decode.json"))
    ap.add_argument("--png", default=str(ROOT / "bench/results/decode.png"))
    ap.add_argument("--tmp", default="/tmp", help="directory for the .dsz files the memory probe reads")
    args = ap.parse_args()
    bounds = [float(b) for b in args.bounds.split(",")]
    small_pages_only()
    info = machine_info(h5py=h5py.__version__, hdf5plugin=hdf5plugin.version)
    print(f"{info['cpu']} ({info['cores']} cores), {info['platform']}, numpy {info['numpy']}")

    weights = pruned_layers()
    model = fc_model(weights)
    dense = sum(w.nbytes for w in weights)
    print(f"AlexNet FC layers: {', '.join(f'{n} {r}x{c} at {d:.0%}' for n, r, c, d in LAYERS)}; "
          f"{dense / 1e6:.1f} MB dense, model {len(model) / 1e6:.1f} MB\n")
    rows = [bench_bound(model, weights, b, args.repeat, Path(args.tmp)) for b in bounds]
    print_results(rows, args.repeat)
    dtype_rows = bench_dtypes(weights, args.repeat)
    print_dtypes(dtype_rows, args.repeat)

    print()
    checks = check_targets(rows, dtype_rows)
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    result = {"machine": info, "layers": LAYERS, "scale": SCALE, "dense_bytes": dense, "repeat": args.repeat,
              "deepsz_ms": DEEPSZ_MS, "targets": TARGETS, "results": rows, "dtypes": dtype_rows,
              "checks": [{"name": n, "pass": ok, "detail": d} for n, ok, d in checks]}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    if args.png:
        plot(rows, args.png)
    print(f"\nwrote {args.json}" + (f" and {args.png}" if args.png else ""))
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
