"""How small can lossless int8 weights get? Code lengths of context models against zstd -19, same bytes.

For the int8 weights of each full-integer model (ours and the pymicro-wakeword ones of bench/real_models.py),
the ideal code length (bits, as an arithmetic coder would reach within ~1%) under:
  H0 tensor      the empirical order-0 entropy per tensor (what libdsz's Huffman stage approaches today)
  H0 channel     the same per output channel, WITHOUT the cost of the tables: a lower bound, not reachable
                 on small channels (a depthwise channel holds 5-21 values here)
  adaptive       an adaptive 256-symbol model per tensor (counts start at 1/2, no side information)
  adapt|left     the same with 8 contexts: |previous value| // 8 (memory order), as DeepCABAC conditions
  adapt|above    8 contexts: |value at the same position in the previous channel| // 8
  param channel  a discretized Gaussian or Laplace per channel (the cheaper), 16 bits of parameters each
Each column reads "x" = zstd -19 bytes / that estimate. The issue's target is 1.15x.

    python3 bench/int8_entropy.py        (fetches the wakeword models like bench/real_models.py)
"""
import json
import sys
from pathlib import Path

import numpy as np
import zstandard
from scipy.stats import laplace, norm

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from real_models import EXTERNAL, external  # noqa: E402

from pydsz.model.data import bundled  # noqa: E402
from pydsz.model.graph import TFLiteModel  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "int8_entropy.json"
LEVELS = np.arange(-128, 128)


def h0(values: np.ndarray) -> float:
    counts = np.bincount(values + 128, minlength=256).astype(float)
    p = counts[counts > 0] / counts.sum()
    return float(-(counts[counts > 0] * np.log2(p)).sum())


def adaptive(values: np.ndarray, contexts: np.ndarray, n_contexts: int) -> float:
    counts = np.full((n_contexts, 256), 0.5)
    totals = np.full(n_contexts, 128.0)
    bits = 0.0
    for s, c in zip((values + 128).tolist(), contexts.tolist()):
        bits -= np.log2(counts[c, s] / totals[c])
        counts[c, s] += 1
        totals[c] += 1
    return bits


def parametric(channel: np.ndarray) -> float:
    scale_n = max(float(channel.std()), 0.3)
    scale_l = max(float(np.abs(channel - np.median(channel)).mean()), 0.3)
    best = np.inf
    for cdf in (lambda t: norm.cdf(t, channel.mean(), scale_n), lambda t: laplace.cdf(t, np.median(channel), scale_l)):
        p = np.maximum(cdf(LEVELS + 0.5) - cdf(LEVELS - 0.5), 1e-9)
        best = min(best, float(-np.log2(p[channel + 128] / p.sum()).sum()))
    return best + 16


def channels(model: TFLiteModel, layer) -> np.ndarray:
    """[channel, values] along the axis of the per-channel scales."""
    w = model.stored(layer).astype(np.int64)
    axis = 3 if layer.op == "DEPTHWISE_CONV_2D" else 0
    return np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)


def measure(name: str, content: bytes) -> dict:
    model = TFLiteModel(content)
    layers = list({l.buffer: l for l in model.layers(kinds=("fc", "conv")) if l.compressible}.values())
    bits = dict.fromkeys(("H0 tensor", "H0 channel", "adaptive", "adapt|left", "adapt|above", "param channel"), 0.0)
    raw = b"".join(model.stored(l).tobytes() for l in layers)
    for layer in layers:
        q = channels(model, layer)
        flat = q.ravel()
        left = np.concatenate([[0], flat[:-1]])
        above = np.vstack([np.zeros((1, q.shape[1]), np.int64), q[:-1]]).ravel()
        bits["H0 tensor"] += h0(flat)
        bits["H0 channel"] += sum(h0(row) for row in q)
        bits["adaptive"] += adaptive(flat, np.zeros_like(flat), 1)
        bits["adapt|left"] += adaptive(flat, np.minimum(np.abs(left) // 8, 7), 8)
        bits["adapt|above"] += adaptive(flat, np.minimum(np.abs(above) // 8, 7), 8)
        bits["param channel"] += sum(parametric(row) for row in q)
    return {"model": name, "values": len(raw), "zstd19": len(zstandard.ZstdCompressor(level=19).compress(raw)),
            "bytes": {k: v / 8 for k, v in bits.items()}}


def main() -> None:
    models = [(n, bundled(n).read_bytes()) for n in ("lenet300_int8.tflite", "lenet5_int8.tflite")]
    models += [(Path(m).name, external(r, p, m).read_bytes()) for r, p, m in EXTERNAL if "wakeword" in r]
    results = [measure(name, content) for name, content in models]
    header = ["model", "values", "zstd-19 B", "b/value"] + list(results[0]["bytes"])
    rows = [[r["model"], r["values"], r["zstd19"], f"{8 * r['zstd19'] / r['values']:.2f}"]
            + [f"{v:.0f} ({r['zstd19'] / v:.3f}x)" for v in r["bytes"].values()] for r in results]
    print(format_table(header, rows))
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(f"saved {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
