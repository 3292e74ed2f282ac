"""How much would a better value coder save on dense conv weights? Ideal code lengths against today's streams.

Issue 28 asks for value coding of dense conv weights at fine bounds "where measured worth it". For each
MediaPipe model of bench/head_to_head.py, `dsz compress --metric output-error --max-loss 0.01 --layers all`
with compensation (the head-to-head's best variant, same photos) writes a .dsz; for each of its dense
streams of one layer (gathered streams of small layers are left out), the layer's quantization integers
are read back from the decoded weights and their ideal code length (bits, as an arithmetic or rANS
coder reaches within ~1%) is computed under:
  H0             the empirical order-0 entropy of the layer, table not counted (what libdsz's one Huffman
                 table per stream approaches)
  Laplace row    a discretized Laplace per output channel, its scale the channel's mean |integer|,
                 8 bits of side information per channel
  Laplace r x c  the same with scale row_mean x column_mean / mean (output channels of different gains
                 times inputs of different magnitudes), 8 bits per row and per column
"stream" is what the .dsz stores today for those layers (header, code table and Huffman bits), each stream
zstd -19 compressed as the file is measured (the table's runs of unused lengths shrink there). The last
columns say what the model's file would be if the rank-one coder replaced those streams.

    python3 bench/value_coding.py [--models face_detection_short_range,...]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "bench" / "builders")]

import head_to_head  # noqa: E402
from machine import machine_info  # noqa: E402
from results import CODERS, coding_totals  # noqa: E402

from pydsz.bench.baselines import lossless  # noqa: E402
from pydsz.budget import metrics  # noqa: E402
from pydsz.budget.rule import Budget
from pydsz.compress.compensation import Compensation
from pydsz.compress.pipeline import compress  # noqa: E402
from pydsz.context import Run
from pydsz.format import container  # noqa: E402
from pydsz.model.graph import TFLiteModel  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "value_coding.json"
SIDE_BITS = 8  # a scale quantized to 8 bits of log2


def h0(q: np.ndarray) -> float:
    _, counts = np.unique(q, return_counts=True)
    return float(-(counts * np.log2(counts / counts.sum())).sum())


def laplace_bits(q: np.ndarray, scale: np.ndarray) -> float:
    """Code length of integers q under a discretized Laplace of mean |q| `scale` (broadcast)."""
    b = np.maximum(scale, 0.05)

    def cdf(x):
        return np.where(x < 0, 0.5 * np.exp(x / b), 1 - 0.5 * np.exp(-x / b))
    p = cdf(q + 0.5) - cdf(q - 0.5)
    return float(-np.log2(np.maximum(p, 1e-300)).sum())


def integers(model: TFLiteModel, name: str, bound: float) -> np.ndarray:
    """The layer's quantization integers as [output channels, rest]: the stored reconstruction over the step."""
    layer = model.layer(name)
    w = np.asarray(model.stored(layer), np.float64)
    q = np.round(w / (2 * bound))
    axis = w.ndim - 1 if layer.op == "DEPTHWISE_CONV_2D" else 0
    return np.moveaxis(q, axis, 0).reshape(w.shape[axis], -1)


def measure(name: str, cache: Path, max_loss: float) -> dict:
    d = head_to_head.data(name, cache)
    start = time.perf_counter()
    result = compress(d["model"], *d["calib"], Budget(metrics.OutputError(), max_loss), layers="all",
                      compensation=Compensation(enabled=True, calibration=d["hessian"]), run=Run(num_threads=1))
    seconds = time.perf_counter() - start
    dsz = container.load(result.dsz)
    decoded = TFLiteModel(dsz.tflite_bytes())
    layers = []
    streams = {e.name: e.stream for e in dsz.entries}
    for t in dsz.info()["tensors"]:
        if t["representation"] != "dense" or t["name"] not in {l.name for l in decoded.layers(("fc", "conv"))}:
            continue  # gathered small layers, sparse streams
        q = integers(decoded, t["name"], t["error_bound"])
        rows = np.mean(np.abs(q), axis=1, keepdims=True)
        cols = np.mean(np.abs(q), axis=0, keepdims=True)
        mean = max(float(np.mean(np.abs(q))), 1e-12)
        # what the stream costs inside the zstd -19 of the file: its own zstd -19 (its table's runs shrink)
        layers.append({"layer": t["name"], "values": int(q.size), "stream_raw": t["compressed_bytes"],
                       "stream": len(lossless.zstd19(streams[t["name"]])),
                       "H0": h0(q) / 8,
                       "laplace_row": (laplace_bits(q, rows) + SIDE_BITS * q.shape[0]) / 8,
                       "laplace_rc": (laplace_bits(q, rows * cols / mean) + SIDE_BITS * sum(q.shape)) / 8})
    file_bytes = len(lossless.zstd19(result.dsz))
    saved = sum(l["stream"] - l["laplace_rc"] for l in layers)
    return {"model": name, "dsz_bytes": len(result.dsz), "file_bytes": file_bytes,
            "zstd19_of_model": len(lossless.zstd19(d["model"])), "file_rank_one": file_bytes - saved,
            "compress_s": seconds, "layers": layers}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(m.name for m in head_to_head.nd.MODELS))
    parser.add_argument("--max-loss", type=float, default=0.01)
    parser.add_argument("--cache", type=Path, default=head_to_head.nd.DEFAULT_CACHE)
    args = parser.parse_args(argv)
    models = [measure(name, args.cache, args.max_loss) for name in args.models.split(",")]
    rows = []
    for m in models:
        total = coding_totals(m)
        rows.append([m["model"], len(m["layers"]), f"{total['stream']:,.0f}"]
                    + [f"{total[k]:,.0f} ({total[k] / total['stream'] - 1:+.1%})" if total["stream"] else "-"
                       for k in CODERS]
                    + [f"{m['file_bytes']:,}", f"{m['file_rank_one']:,.0f}", " -> ".join(
                        f"{m['zstd19_of_model'] / b:.2f}x" for b in (m["file_bytes"], m["file_rank_one"]))])
    print(format_table(["model", "dense layers", "stream B", "H0", "Laplace row", "Laplace r x c", "file B (zstd -19)",
                        "with r x c", "vs zstd -19 of the model"], rows))
    RESULTS.write_text(json.dumps({"machine": machine_info(), "max_loss": args.max_loss, "models": models}, indent=1)
                       + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
