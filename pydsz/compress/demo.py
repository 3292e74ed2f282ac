"""The main job on a bundled model (`dsz demo`): DeepSZ's whole pipeline on LeNet-5 or LeNet-300-100
and Fashion-MNIST, pruned, compressed within a budget measured from the unpruned model, and judged on
the test split, with the paper's table. bench/reference.py runs it for every bundled model.
"""

from __future__ import annotations

import time

from pydsz.budget.rule import Budget
from pydsz.compress.pipeline import compress
from pydsz.context import Run
from pydsz.errors import InputError
from pydsz.format import container
from pydsz.model import runtime
from pydsz.model.data import bundled, fashion_mnist, load_npz
from pydsz.prune.retraining import prune_model
from pydsz.prune.train import Retraining
from pydsz.tables import format_table

# The bundled reference models and how the demo and bench/reference.py prune them. lenet300-96 is
# the same model pruned harder: on the validation split it loses as little, on the test split more
# (bench/reference.py shows both: the trade-off is the point).
REFERENCE = {
    "lenet300": {"file": "lenet300.tflite", "title": "LeNet-300-100",
                 "sparsity": {"fc1": 0.94, "fc2": 0.92, "fc3": 0.5}, "epochs": 24, "distill": 0.8},
    "lenet300-96": {"file": "lenet300.tflite", "title": "LeNet-300-100 (96%)",
                    "sparsity": {"fc1": 0.96, "fc2": 0.93, "fc3": 0.7}, "epochs": 24, "distill": 0.8},
    "lenet5": {"file": "lenet5.tflite", "title": "LeNet-5",
               "sparsity": {"fc1": 0.95, "fc2": 0.7}, "epochs": 16, "distill": 0.8},
}
TRAIN_SIZE = 55000  # Fashion-MNIST's first 55,000 training images; the last 5,000 are validation


def run(name: str, max_loss: float = 0.003, progress: bool = False, device: str = "cpu") -> dict:
    """Prune a bundled reference model, compress it within max_loss of the unpruned model's
    validation top-1 (pruning and compression share the budget), and measure both on the test split.

    Returns {"result": Result, "summary": the paper's table row and timings}.
    """
    if name not in REFERENCE:
        raise InputError(f"no reference model {name!r} (have: {', '.join(REFERENCE)})")
    spec = REFERENCE[name]
    model = bundled(spec["file"]).read_bytes()
    x, y = fashion_mnist("train")
    val, test = load_npz(bundled("fmnist_val.npz")), load_npz(bundled("fmnist_test.npz"))
    start = time.perf_counter()
    pruned = prune_model(model, (x[:TRAIN_SIZE], y[:TRAIN_SIZE]), val, spec["sparsity"],
                         settings=Retraining(epochs=spec["epochs"], distill=spec["distill"]),
                         run=Run(progress=progress, device=device))
    pruned_at = time.perf_counter()
    result = compress(pruned.tflite, *val, Budget("top1", max_loss, spent=pruned.top1_before - pruned.top1_after),
                      run=Run(progress=progress, device=device))
    done = time.perf_counter()
    decoded = container.load(result.dsz).tflite_bytes()
    summary = {
        "model": spec["title"], "sparsity": pruned.sparsity, "max_loss": max_loss,
        "val_top1": {"original": pruned.top1_before, "pruned": pruned.top1_after, "compressed": result.after},
        "test_top1": {"original": runtime.accuracy(model, *test), "pruned": runtime.accuracy(pruned.tflite, *test),
                      "compressed": runtime.accuracy(decoded, *test)},
        "fc_original_bytes": result.fc_original_bytes, "fc_compressed_bytes": result.fc_compressed_bytes,
        "ratio": result.ratio, "file_ratio": result.file_ratio,
        "seconds": {"prune": pruned_at - start, "compress": done - pruned_at},
    }
    return {"result": result, "summary": summary}


def table(rows: list[dict]) -> str:
    """The paper's table: top-1 (test split), FC layers' size and ratio, original vs compressed."""
    lines = []
    for row in rows:
        s = row["summary"]
        t, v = s["test_top1"], s["val_top1"]
        lines.append([f"{s['model']} original", f"{100 * t['original']:.2f}%", f"{100 * v['original']:.2f}%",
                      f"{s['fc_original_bytes'] / 1024:.1f} KB", "", ""])
        lines.append([f"{s['model']} pydsz", f"{100 * t['compressed']:.2f}%", f"{100 * v['compressed']:.2f}%",
                      f"{s['fc_compressed_bytes'] / 1024:.1f} KB", f"{s['ratio']:.1f}x",
                      f"{100 * (t['original'] - t['compressed']):+.2f}"])
    return format_table(["network", "top-1 test", "top-1 val", "FC size", "ratio", "test loss (points)"], lines)
