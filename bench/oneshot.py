"""One-shot pruning and compensated encoding on the reference models (issue 14), measured in one run.

Calibration: the first 5,000 Fashion-MNIST training images (no labels used). Decisions: the bundled
validation split (the last 5,000 training images). Judged on the test split.

A. Each model is pruned one-shot (pydsz.oneshot, SparseGPT) at the per-layer sparsities of SPECS,
   chosen beforehand on the validation split, the time per layer printed; then
   pydsz.pipeline.compress (top-1) within --max-loss of the unpruned model's validation top-1, so
   pruning and compression share one budget. The same run compresses the unpruned model as the
   baseline. Where labels exist both methods combine: LeNet-5's FC tail retrained with masks
   (demo.REFERENCE's settings) and its conv layers pruned one-shot, every layer compressed.
   Today's FC-only path is quoted from bench/results/reference.json.
B. Compensation (pydsz.compensate.Compensator), layer by layer on the one-shot pruned models: the
   largest bound of a fine ladder at which the layer alone stays within the budget on the
   validation split, with plain and with compensated weights, and the layer's bytes there.
C. Compensation end to end on the models of PART_C: the assessment, the optimizer and the encoder
   run once with plain and once with compensated weights (the hook wrapped in here), and the
   decoded models are measured on validation and test.

Usage: nice -n 10 python3 bench/oneshot.py [--max-loss 0.003] [--json PATH]
"""
import argparse
import datetime
import json
import os
import platform
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # 2 shared cores: BLAS threads only spin
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import numpy as np  # noqa: E402

from pydsz import assess, container, oneshot, runtime  # noqa: E402
from pydsz.assess import FIRST_BOUND, Evaluator, encode_weight  # noqa: E402
from pydsz.data import bundled, fashion_mnist, load_npz  # noqa: E402
from pydsz.model import TFLiteModel  # noqa: E402
from pydsz.metrics import Top1  # noqa: E402
from pydsz.budget import Budget  # noqa: E402
from pydsz.compensate import Compensator  # noqa: E402
from pydsz.demo import REFERENCE, TRAIN_SIZE  # noqa: E402
from pydsz.gptq import selectable  # noqa: E402
from pydsz.pipeline import _plan, compress  # noqa: E402
from pydsz.masks import density  # noqa: E402
from pydsz.prune import prune_model  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

CALIBRATION = 5000
# model -> (layers compressed, {spec: how it is pruned}): "oneshot" a per-layer sparsity for
# pydsz.oneshot, "retrain" the demo.REFERENCE entry whose masked retraining of the FC tail runs
# first (55,000 training images with labels); neither: the unpruned model
SPECS = {
    "lenet5": ("all", {"dense": {},
                       "oneshot-light": {"oneshot": {"conv2": 0.5, "fc1": 0.6}},
                       "oneshot-mid": {"oneshot": {"conv2": 0.5, "fc1": 0.7, "fc2": 0.3}},
                       "retrain-fc+oneshot-conv": {"retrain": "lenet5", "oneshot": {"conv2": 0.5}}}),
    "lenet300": ("fc", {"dense": {},
                        "oneshot-light": {"oneshot": {"fc1": 0.7, "fc2": 0.5}}}),
}
KINDS = {"fc": ("fc",), "all": ("fc", "conv")}
LADDER_STEP = 2 ** 0.5  # the compensation ladder: FIRST_BOUND * sqrt(2)**k
# (model, spec) whose pruned model part C compresses with and without compensation
PART_C = (("lenet5", "retrain-fc+oneshot-conv"), ("lenet300", "oneshot-light"))


def part_a(name, layers, spec, cal, val, test, max_loss):
    model = bundled(f"{name}.tflite").read_bytes()
    reference = runtime.accuracy(model, *val)
    seconds, pruned = {}, model
    if "retrain" in spec:
        ref = REFERENCE[spec["retrain"]]
        x, y = fashion_mnist("train")
        start = time.perf_counter()
        pruned = prune_model(model, (x[:TRAIN_SIZE], y[:TRAIN_SIZE]), val, ref["sparsity"], epochs=ref["epochs"],
                             distill=ref["distill"]).tflite
        seconds["retrain"] = time.perf_counter() - start
    if "oneshot" in spec:
        result = oneshot.prune_layers(pruned, cal, spec["oneshot"], kinds=KINDS[layers])
        pruned = result.tflite
        seconds.update(result.seconds)
    start = time.perf_counter()
    out = compress(pruned, *val, max_loss, layers=layers, metric="top1",
                   spent=reference - runtime.accuracy(pruned, *val))
    decoded = container.load(out.dsz).tflite_bytes()
    test_top1 = {"original": runtime.accuracy(model, *test), "pruned": runtime.accuracy(pruned, *test),
                 "compressed": runtime.accuracy(decoded, *test)}
    return pruned, {
        "sparsity": {l.name: 1 - density(TFLiteModel(pruned).weight(l.name)) for l in out.layers},
        "prune_seconds": seconds, "compress_seconds": time.perf_counter() - start,
        "weight_bytes": out.fc_original_bytes, "compressed_bytes": out.fc_compressed_bytes, "ratio": out.ratio,
        "bounds": {l.name: l.bound for l in out.layers},
        "val_top1": {"original": reference, "compressed": out.after}, "test_top1": test_top1,
        "test_loss": test_top1["original"] - test_top1["compressed"]}


def part_b(model, layers, cal, val, budget):
    """Per layer: (largest bound within budget, bytes there) plain and compensated."""
    names = [l.name for l in selectable(TFLiteModel(model), KINDS[layers])]
    evaluator = Evaluator(model, *val, names)
    comp = Compensator(model, cal, names)
    rows = {}
    for name in names:
        weight = np.asarray(comp.model.weight(name))
        best = {"plain": (0.0, weight.nbytes), "compensated": (0.0, weight.nbytes)}
        bound = FIRST_BOUND
        while bound < 2 * float(np.max(np.abs(weight))):
            for kind, w in (("plain", weight), ("compensated", comp.weights(name, bound))):
                decoded, _, data, index = encode_weight(w, bound)
                if evaluator.measure({name: decoded}).loss <= budget:
                    best[kind] = (bound, data + index)
            bound *= LADDER_STEP
        rows[name] = {"bytes": weight.nbytes, **{k: {"bound": b, "bytes": s} for k, (b, s) in best.items()}}
    return rows


def part_c(model, layers, cal, val, test, original, reference, max_loss):
    """assess -> optimize -> encode with plain and with compensated weights, the same path for both
    (pipeline.compress less its verification loop, which would hide the difference in its retries).
    The compensated assessment is the Evaluator's: handed the Compensator it encodes
    Compensator.weights(layer, bound) instead of the layer's own weights."""
    names = [l.name for l in selectable(TFLiteModel(model), KINDS[layers])]
    n = len(val[1])
    top1 = runtime.accuracy(model, *val)
    allowed = Budget(Top1(), max_loss, spent=reference - top1).allowed(n)
    comp = Compensator(model, cal, names)
    rows = {}
    for kind in ("plain", "compensated"):
        evaluator = Evaluator(model, *val, names, compensator=comp if kind == "compensated" else None)
        table = {name: assess.assess_layer(evaluator, name, np.asarray(comp.model.weight(name)), allowed)
                 for name in names}
        plan = _plan(table, n, allowed, None, 1.0, Top1())
        bounds = {name: plan.choice[name].bound if plan else 0.0 for name in names}
        stored = model
        if kind == "compensated":
            stored = TFLiteModel(model).replace({name: comp.weights(name, b) for name, b in bounds.items() if b})
        decoded = container.load(container.pack_model(stored, bounds, layers=layers)).tflite_bytes()
        points = {name: next(p for p in table[name] if p.bound == bounds[name]) for name in names}
        rows[kind] = {"bounds": bounds, "ratio": sum(comp.model.layer(nm).nbytes for nm in names)
                      / sum(p.data_bytes + p.index_bytes for p in points.values()),
                      "val_loss": reference - runtime.accuracy(decoded, *val),
                      "test_loss": original - runtime.accuracy(decoded, *test)}
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-loss", type=float, default=0.003)
    parser.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "oneshot.json"))
    args = parser.parse_args()
    cal = fashion_mnist("train")[0][:CALIBRATION]
    val, test = load_npz(bundled("fmnist_val.npz")), load_npz(bundled("fmnist_test.npz"))
    with open(os.path.join(ROOT, "bench", "results", "reference.json")) as f:
        retrained = json.load(f)["models"]
    budget = int(args.max_loss * len(val[1]) + 1e-6)

    report, table, timing, comp_rows, e2e_rows = {}, [], [], [], []
    for name, (layers, specs) in SPECS.items():
        report[name] = {}
        for spec_name, spec in specs.items():
            pruned, row = part_a(name, layers, spec, cal, val, test, args.max_loss)
            report[name][spec_name] = row
            table.append([name, spec_name, layers, f"{row['ratio']:.1f}x", f"{100 * row['test_top1']['original']:.2f}",
                          f"{100 * row['test_top1']['pruned']:.2f}", f"{100 * row['test_top1']['compressed']:.2f}",
                          f"{100 * row['test_loss']:+.2f}", f"{row['compress_seconds']:.0f}"])
            if row["prune_seconds"]:
                timing.append([name, spec_name] + [f"{k}={v:.2f}s" for k, v in row["prune_seconds"].items()]
                              + [""] * (5 - len(row["prune_seconds"])))
            if (name, spec_name) in PART_C:
                original = row["test_top1"]["original"]
                c = part_c(pruned, layers, cal, val, test, original, row["val_top1"]["original"], args.max_loss)
                report[name][spec_name]["compensation_end_to_end"] = c
                for kind, r in c.items():
                    e2e_rows.append([name, spec_name, kind, f"{r['ratio']:.1f}x", f"{100 * r['val_loss']:+.2f}",
                                     f"{100 * r['test_loss']:+.2f}"])
            if spec_name == "oneshot-light":  # compensation on the one-shot model
                comp = part_b(pruned, layers, cal, val, budget)
                report[name]["compensation"] = comp
                for layer, c in comp.items():
                    p, q = c["plain"], c["compensated"]
                    comp_rows.append([name, layer, f"{p['bound']:.3g}", f"{q['bound']:.3g}",
                                      f"{c['bytes'] / p['bytes']:.1f}x", f"{c['bytes'] / q['bytes']:.1f}x"])
        if name in retrained:
            r = retrained[name]
            t = r["test_top1"]
            table.append([name, "retrain (reference.json)", "fc", f"{r['ratio']:.1f}x", f"{100 * t['original']:.2f}",
                          f"{100 * t['pruned']:.2f}", f"{100 * t['compressed']:.2f}",
                          f"{100 * (t['original'] - t['compressed']):+.2f}", "-"])

    print("\nA. prune + compress within the budget (ratio: the compressed layers' float32 bytes / data + index)")
    print(format_table(["model", "method", "layers", "ratio", "test orig", "test pruned", "test compr",
                        "test loss", "compress s"], table))
    print(f"\nOne-shot pruning time per layer ({CALIBRATION} calibration images)")
    print(format_table(["model", "spec"] + ["seconds"] * 5, timing))
    print(f"\nB. per layer alone, largest bound within {budget} samples of validation drop; ratio there")
    print(format_table(["model", "layer", "bound plain", "bound comp", "ratio plain", "ratio comp"], comp_rows))

    print("\nC. the same assess -> optimize -> encode path with plain and compensated weights (no verification)")
    print(format_table(["model", "spec", "weights", "ratio", "val loss", "test loss"], e2e_rows))

    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
           "max_loss": args.max_loss, "calibration": CALIBRATION, "models": report}
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
