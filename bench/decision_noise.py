"""How well each estimate a user's data allows predicts a pruned model's test loss (issue 40, "every sample put
to work"): the numbers a new decision rule for `--prune auto` would rest on.

    nice -n 10 python3 bench/decision_noise.py [--cases mlp-a,mlp-d,cnn-b] [--json PATH]

For each held-out case (bench/builders/make_heldout_models.py: Keras models trained elsewhere, 500
validation images for the decisions, the 10,000 test images as the truth) and each of a fixed set of
magnitude plans (the issue's 93/90/70% and plans around it), the FC tail is retrained as `dsz prune`
does (gradual magnitude, the default settings, the unpruned tail as teacher), and its top-1 loss against
the unpruned model is estimated four ways, beside the truth:

  val labels     the 500 validation labels: what auto's decisions judge by today (its noise: one sd of
                 the net of the flipped samples, sqrt(changed)/n)
  val soft       the same 500 inputs judged by the unpruned model's own probabilities, temperature-scaled
                 on the validation labels (one parameter): the accuracy a sample loses is p(original's
                 class) - p(pruned model's class), a fraction where the model was unsure; its noise is
                 the sd of those over the samples
  flips          the share of predictions that changed, on the validation inputs and on the training
                 inputs (which the student was retrained on): an upper bound of the loss, measurable
                 without labels
  test           the loss on the 10,000 test images (the truth; +-0.1 point) and the flips there

Nothing here is a baseline to beat: it is the measurement that says which estimate to decide by.
"""
import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from machine import machine_info  # noqa: E402

from pydsz.context import Run  # noqa: E402
from pydsz.model import activations  # noqa: E402
from pydsz.model.data import load_npz  # noqa: E402
from pydsz.model.graph import TFLiteModel  # noqa: E402
from pydsz.prune import auto_retrain  # noqa: E402
from pydsz.prune.retraining import _fc_layers, _trainable_tail  # noqa: E402
from pydsz.prune.train import Retraining, _softmax, logits  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

HELDOUT = Path(os.environ.get("DSZ_HELDOUT_CACHE", Path.home() / ".cache" / "pydsz" / "heldout"))
# per FC layer in order (a model with fewer FC layers takes the first ones)
PLANS = ((0.8, 0.9, 0.0), (0.9, 0.9, 0.5), (0.93, 0.9, 0.7), (0.95, 0.93, 0.7), (0.97, 0.95, 0.8),
         (0.98, 0.97, 0.85))


def softmax(z: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    return _softmax(np.asarray(z, np.float64) / temperature)


def temperature(z: np.ndarray, y: np.ndarray) -> float:
    """The temperature that gives the labels the least negative log-likelihood (a grid of 60, 0.3..5)."""
    grid = np.exp(np.linspace(np.log(0.3), np.log(5.0), 60))
    nll = [-np.mean(np.log(softmax(z, t)[np.arange(len(y)), y] + 1e-12)) for t in grid]
    return float(grid[int(np.argmin(nll))])


def estimates(original: np.ndarray, pruned: np.ndarray, p: np.ndarray, y) -> dict:
    """The estimates of one split: original, pruned: predicted classes; p: the calibrated probabilities."""
    n, i = len(original), np.arange(len(original))
    changed = original != pruned
    out = {"flips": float(np.mean(changed))}
    soft = p[i, original] - p[i, pruned]
    out["soft"], out["soft_sd"] = float(np.mean(soft)), float(np.std(soft) / np.sqrt(n))
    if y is not None:
        out["labels"] = float(np.mean(original == y) - np.mean(pruned == y))
        out["labels_sd"] = float(np.sqrt(np.sum(changed)) / n)
    return out


def case_rows(case: str) -> list:
    def path(part):
        return HELDOUT / f"{case}{part}"

    if not path(".tflite").exists():
        raise SystemExit(f"{path('.tflite')} is missing: build it with bench/builders/make_heldout_models.py")
    data = path(".tflite").read_bytes()
    model = TFLiteModel(data)
    layers, tail_input = _trainable_tail(model, _fc_layers(model, "no FC layer")[0].name)
    splits = {"train": load_npz(path("-train.npz")), "val": load_npz(path("-val.npz")),
              "test": load_npz(path("-test10k.npz"))}
    h = {k: activations.capture(data, x, tail_input) for k, (x, _) in splits.items()}
    teacher = [replace(layer) for layer in layers]
    z = {k: logits(teacher, v) for k, v in h.items()}
    t = temperature(z["val"], splits["val"][1])
    p = {k: softmax(v, t) for k, v in z.items()}
    fcs = [layer.name for layer in layers]
    rows = []
    for plan in PLANS:
        targets = {name: s for name, s in zip(fcs, plan) if s}
        start = time.perf_counter()
        student = auto_retrain.retrain_as(auto_retrain.GRADUAL, layers, (h["train"], splits["train"][1]), targets,
                                          settings=Retraining(), teacher=teacher, run=Run(progress=False))
        row = {"case": case, "plan": targets, "temperature": t, "seconds": time.perf_counter() - start}
        for k in splits:
            row[k] = estimates(z[k].argmax(axis=1), logits(student, h[k]).argmax(axis=1), p[k], splits[k][1])
        rows.append(row)
        print(f"[{time.strftime('%H:%M:%S')}] {case} {targets}: val labels {100 * row['val']['labels']:+.2f}, "
              f"soft {100 * row['val']['soft']:+.2f}, test {100 * row['test']['labels']:+.2f}", flush=True)
    return rows


def table(rows: list) -> str:
    def pm(e, key):
        return f"{100 * e[key]:+.2f} +-{100 * e[key + '_sd']:.2f}"

    body = [[r["case"], "/".join(f"{100 * s:.0f}" for s in r["plan"].values()), pm(r["val"], "labels"),
             pm(r["val"], "soft"), f"{100 * r['val']['flips']:.1f}", f"{100 * r['train']['flips']:.1f}",
             f"{100 * r['test']['labels']:+.2f}", f"{100 * r['test']['flips']:.1f}"] for r in rows]
    return format_table(["case", "sparsity %", "val labels", "val soft", "val flips %", "train flips %",
                         "test loss", "test flips %"], body)


def plot(rows: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4.2))
    truth = [100 * r["test"]["labels"] for r in rows]
    for key, marker in (("labels", "o"), ("soft", "^")):
        ax.errorbar(truth, [100 * r["val"][key] for r in rows], yerr=[100 * r["val"][key + "_sd"] for r in rows],
                    fmt=marker, label=f"val {key}", capsize=2)
    lo, hi = min(truth + [0]), max(truth) + 1
    ax.plot([lo, hi], [lo, hi], "k:", linewidth=1)
    ax.set_xlabel("test loss, 10,000 images (points)")
    ax.set_ylabel("estimate from 500 validation images (points)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="mlp-a,mlp-d,cnn-b")
    parser.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "decision_noise.json"))
    args = parser.parse_args()
    rows = []
    for case in args.cases.split(","):
        rows += case_rows(case)
    Path(args.json).write_text(json.dumps({"machine": machine_info(), "rows": rows}, indent=1))
    print(table(rows))
    plot(rows, args.json.replace(".json", ".png"))
    print(f"\nwrote {args.json} and its .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
