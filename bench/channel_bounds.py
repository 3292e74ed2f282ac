"""Would per-output-channel bounds, set by each channel's measured sensitivity, beat one bound per layer?

Issue 28 asks whether bounds finer than a layer pay where channels differ. On a MediaPipe model of
bench/head_to_head.py (default face_detection_short_range), the dense CONV_2D layers the head-to-head's
compensated .dsz codes in streams of their own are quantized plainly (no compensation), the rest of the
model left as it is:
  one bound per layer   each layer at f x the bound pydsz chose for it
  per channel           channel c of each layer at f x that bound x sqrt(mean(s) / s_c), in half-octave
                        steps (1/16 to 64), where s_c is the squared drift that uniform noise of 4x the
                        layer's bound on channel c alone causes on the calibration photos: the first-order
                        optimum at the same drift energy
Each swept over f; the drift is output-error on calib/ and test/ (64 photos each). Bytes are counted two
ways: one code table for the layer's integers (as a gathered stream codes them; + 16 B per run of
adjacent channels of one step, the span a gathered entry needs) and an ideal per-channel Laplace coder
(bench/value_coding.py's, 8 bits per channel).

    python3 bench/channel_bounds.py [--model face_detection_short_range]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "bench" / "builders")]

import head_to_head  # noqa: E402
from machine import machine_info  # noqa: E402
from value_coding import SIDE_BITS, laplace_bits  # noqa: E402

from pydsz.bench.baselines import lossless  # noqa: E402
from pydsz.budget import metrics  # noqa: E402
from pydsz.budget.rule import Budget
from pydsz.compress.compensation import Compensation
from pydsz.compress.pipeline import compress  # noqa: E402
from pydsz.context import Run
from pydsz.format import codec, container  # noqa: E402
from pydsz.model import runtime  # noqa: E402
from pydsz.model.graph import TFLiteModel  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "channel_bounds.json"
FACTORS = (0.5, 0.71, 1.0, 1.41, 2.0)
NOISE = 4.0  # the probe's amplitude, in the layer's bound: well above the rounding, still small
LEVEL = 2 ** 0.5


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="face_detection_short_range")
    parser.add_argument("--max-loss", type=float, default=0.01)
    parser.add_argument("--cache", type=Path, default=head_to_head.nd.DEFAULT_CACHE)
    args = parser.parse_args(argv)
    d = head_to_head.data(args.model, args.cache)
    model = TFLiteModel(d["model"])
    keys = [o["key"] for o in model.output_details()]
    metric = metrics.OutputError()
    result = compress(d["model"], *d["calib"], Budget(metric, args.max_loss), layers="all",
                      compensation=Compensation(enabled=True, calibration=d["hessian"]), run=Run(num_threads=1))
    names = {l.name for l in model.layers(("conv",)) if l.op == "CONV_2D"}
    layers = [(model.layer(t["name"]), t["error_bound"]) for t in container.load(result.dsz).info()["tensors"]
              if t["representation"] == "dense" and t["name"] in names]
    weights = {l.name: np.asarray(model.weight(l), np.float32) for l, _ in layers}
    stored = {l.name: np.asarray(model.stored(l)).dtype for l, _ in layers}
    splits = {s: runtime.fit_inputs(model.input_details(), d[s][0]) for s in ("calib", "test")}
    reference = {s: runtime.outputs(d["model"], x, keys) for s, x in splits.items()}

    def drift(tflite: bytes, split: str) -> float:
        return float(np.mean(metric.losses(runtime.outputs(tflite, splits[split], keys), reference[split], None)))

    rng = np.random.default_rng(0)
    sensitivity = {}
    for layer, bound in layers:
        w, s = weights[layer.name], []
        for c in range(w.shape[0]):
            probe = w.copy()
            probe[c] += rng.uniform(-NOISE * bound, NOISE * bound, size=probe[c].shape).astype(np.float32)
            s.append(max(drift(model.replace({layer.name: probe}), "calib") ** 2, 1e-20))
        sensitivity[layer.name] = np.array(s)

    def bounds(kind: str, f: float) -> dict:
        out = {}
        for layer, bound in layers:
            s = sensitivity[layer.name]
            r = np.ones_like(s) if kind == "one bound per layer" else np.sqrt(np.exp(np.mean(np.log(s))) / s)
            out[layer.name] = f * bound * np.clip(LEVEL ** np.round(np.log(r) / np.log(LEVEL)), 1 / 16, 64)
        return out

    points = []
    for kind in ("one bound per layer", "per channel"):
        for f in FACTORS:
            arrays, table, laplace, chosen = {}, 0, 0.0, bounds(kind, f)
            for layer, _ in layers:
                w, b = weights[layer.name], chosen[layer.name]
                step = 2 * b.reshape(-1, *([1] * (w.ndim - 1)))
                q = np.round(w / step)
                arrays[layer.name] = (q * step).astype(stored[layer.name]).astype(np.float32)
                runs = 1 + int(np.sum(b[1:] != b[:-1]))
                # the integers as pydsz.encode.gather.encode codes a stream of them: step 1, no predictor
                table += len(lossless.zstd19(codec.compress_array(q.astype(np.float32).reshape(-1), 0.5,
                                                                  predictor="none")))
                table += 16 * runs if runs > 1 else 0
                rows = q.reshape(q.shape[0], -1)
                laplace += (laplace_bits(rows, np.mean(np.abs(rows), axis=1, keepdims=True))
                            + SIDE_BITS * rows.shape[0]) / 8
            tflite = model.replace(arrays)
            points.append({"kind": kind, "factor": f, "bytes_one_table": table, "bytes_laplace": round(laplace),
                           "drift_calib": drift(tflite, "calib"), "drift_test": drift(tflite, "test")})
            print(f"{kind:20s} x{f:<5} one table {table:7,d} B  Laplace {laplace:9,.0f} B  drift calib "
                  f"{points[-1]['drift_calib']:.4%} test {points[-1]['drift_test']:.4%}", flush=True)
    spread = {name: float(np.std(np.log10(s))) for name, s in sensitivity.items()}
    print(format_table(["layer", "channels", "bound", "sensitivity spread (sd of log10)"],
                       [[l.name, weights[l.name].shape[0], f"{b:.3g}", f"{spread[l.name]:.2f}"] for l, b in layers]))
    RESULTS.write_text(json.dumps({"machine": machine_info(), "model": args.model, "max_loss": args.max_loss,
                                   "layers": {l.name: {"bound": b, "sensitivity": sensitivity[l.name].tolist()}
                                              for l, b in layers}, "points": points}, indent=1) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
