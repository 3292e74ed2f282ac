"""Budgets without labels against the labelled one, on the bundled classifiers, in one run.

For LeNet-300-100 and LeNet-5, as given and magnitude-pruned (no retraining, so that the run takes
minutes), `pipeline.compress` at --max-loss on the validation split (the last 5,000 Fashion-MNIST
training images) with each metric: top1 (with the labels), expected-top1 and agreement (without).
Printed per run: the ratio of the compressed layers, the loss in the metric's unit on validation,
and the real top-1 loss on the disjoint 10,000-image test split (with its labels), so that a
label-free budget can be judged by what it costs in accuracy. The target: a label-free run within
10% of the labelled run's ratio.

Usage: python3 bench/label_free.py [--max-loss 0.003] [--json PATH] [--png PATH]
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import numpy as np  # noqa: E402

from pydsz.budget.rule import Budget
from pydsz.compress import pipeline  # noqa: E402
from pydsz.format import container  # noqa: E402
from pydsz.model import runtime  # noqa: E402
from pydsz.model.data import bundled, load_npz  # noqa: E402
from pydsz.model.graph import TFLiteModel  # noqa: E402
from pydsz.prune.masks import magnitude_mask  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine_info  # noqa: E402

METRICS = (("top1", True), ("expected-top1", False), ("agreement", False))
PRUNED = {"lenet300.tflite": {"fc1": 0.9, "fc2": 0.9, "fc3": 0.5}, "lenet5.tflite": {"fc1": 0.9, "fc2": 0.5}}


def models() -> list:
    out = []
    for name, sparsity in PRUNED.items():
        model = TFLiteModel(bundled(name).read_bytes())
        pruned = model.replace({n: np.where(magnitude_mask(model.weight(n), s), model.weight(n), 0)
                                for n, s in sparsity.items()})
        title = name.split(".")[0]
        out += [(title, model.data), (f"{title} pruned " + "/".join(f"{100 * s:.0f}" for s in sparsity.values()), pruned)]
    return out


def plot(rows: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = list(dict.fromkeys(r["model"] for r in rows))
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(METRICS)
    for k, (metric, labels) in enumerate(METRICS):
        ratios = [next(r["ratio"] for r in rows if r["model"] == t and r["metric"] == metric) for t in titles]
        ax.bar(np.arange(len(titles)) + k * width, ratios, width,
               label=f"{metric} ({'labels' if labels else 'no labels'})")
    ax.set_xticks(np.arange(len(titles)) + width * (len(METRICS) - 1) / 2, titles, fontsize=8)
    ax.set_ylabel("compressed layers: original / stored bytes")
    ax.set_title("the same top-1 budget with and without labels")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-loss", type=float, default=0.003)
    parser.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "label_free.json"))
    parser.add_argument("--png", default=os.path.join(ROOT, "bench", "results", "label_free.png"))
    args = parser.parse_args()
    val, test = load_npz(bundled("fmnist_val.npz")), load_npz(bundled("fmnist_test.npz"))
    rows = []
    for title, model in models():
        test_top1 = runtime.accuracy(model, *test)
        for metric, labels in METRICS:
            start = time.perf_counter()
            result = pipeline.compress(model, val[0], val[1] if labels else None, Budget(metric, args.max_loss))
            seconds = time.perf_counter() - start
            decoded = container.load(result.dsz).tflite_bytes()
            rows.append({"model": title, "metric": metric, "labels": labels, "ratio": result.ratio,
                         "dsz_bytes": len(result.dsz), "val_loss": result.loss,
                         "test_top1_loss": test_top1 - runtime.accuracy(decoded, *test),
                         "bounds": {l.name: l.bound for l in result.layers}, "seconds": seconds})
            print(f"{title} {metric}: {result.ratio:.2f}x", file=sys.stderr, flush=True)
    for r in rows:
        labelled = next(o for o in rows if o["model"] == r["model"] and o["metric"] == "top1")
        r["ratio_vs_labelled"] = r["ratio"] / labelled["ratio"]
    table = format_table(["model", "metric", "labels", "ratio", "vs top1", "val loss", "test top-1 loss", "s"],
                         [[r["model"], r["metric"], "yes" if r["labels"] else "no", f"{r['ratio']:.2f}x",
                           f"{r['ratio_vs_labelled']:.2f}", f"{100 * r['val_loss']:+.2f}",
                           f"{100 * r['test_top1_loss']:+.2f}", f"{r['seconds']:.0f}"] for r in rows])
    print(f"--max-loss {args.max_loss} on {len(val[1])} validation images; losses in points; "
          "test top-1 loss on the 10,000 test images, from the model as given")
    print(table)
    label_free = [r for r in rows if r["metric"] == "expected-top1"]
    met = all(r["ratio_vs_labelled"] >= 0.9 for r in label_free)
    print(f"{'MET' if met else 'NOT MET'}  expected-top1 without labels within 10% of the labelled ratio: "
          + ", ".join(f"{r['ratio_vs_labelled']:.2f}" for r in label_free))
    with open(args.json, "w") as f:
        json.dump({"max_loss": args.max_loss, "machine": machine_info(), "rows": rows}, f, indent=1)
    plot(rows, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
