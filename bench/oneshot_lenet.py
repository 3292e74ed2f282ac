"""One-shot pruning against retraining and Deep Compression on LeNet-300-100 and LeNet-5, at equal TEST loss.

    nice -n 10 python3 bench/oneshot_lenet.py [--max-loss 0.003] [--json PATH]

Data: calibration = the first 5,000 Fashion-MNIST training images (no labels used by one-shot);
retraining = the first 55,000 with labels; decisions = the bundled validation split (the last 5,000
training images); judged on the 10,000 test images. Every loss is counted from the UNPRUNED model.

1. The FC layers, pruned at demo.REFERENCE's sparsities four ways:
     retrain           today's path: magnitude masks, masked retraining with distillation (prune_model)
     oneshot           SparseGPT (pydsz.prune.oneshot), no training
     oneshot+retrain   SparseGPT's masks and compensated weights, then the same masked retraining
                       (prune.retrain_masked), so the masks come from the Hessian, not from magnitude
   each then through `dsz bench`'s methods (pydsz.bench.anchors.run with the pruned model): pydsz at budgets
   0.5..4x max-loss and Deep Compression over its clusters, every point's loss on test. Reported:
   pydsz's best ratio whose test loss is within max-loss, and pydsz over Deep Compression (32
   clusters) at equal test loss (pydsz's best point losing no more on test).
2. LeNet-5 with every layer (--layers all): the retrained FC tail, conv2 pruned one-shot by half,
   pipeline.compress of all four layers within max-loss (pruning's validation loss spent first):
   whole-model weight bytes (every conv and FC weight) float32 / compressed, test loss.
3. One-shot pruning of LeNet-5, every layer by half, on the 5,000 calibration images: time per layer
   and the largest layer's Hessian memory (as `dsz prune --method oneshot` prints them).

The machine is shared (2 cores, other jobs running): the seconds are indicative only.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pydsz.bench import anchors  # noqa: E402
from pydsz.budget.rule import Budget
from pydsz.compress.demo import REFERENCE, TRAIN_SIZE  # noqa: E402
from pydsz.compress.pipeline import compress  # noqa: E402
from pydsz.format import container  # noqa: E402
from pydsz.model import runtime  # noqa: E402
from pydsz.model.data import bundled, fashion_mnist, load_npz  # noqa: E402
from pydsz.model.graph import TFLiteModel  # noqa: E402
from pydsz.prune import oneshot  # noqa: E402
from pydsz.prune.masks import density  # noqa: E402
from pydsz.prune.retraining import prune_model, retrain_masked  # noqa: E402
from pydsz.prune.train import Retraining
from pydsz.tables import format_table  # noqa: E402

CALIBRATION = 5000
# (model, REFERENCE entry) pairs: lenet300-96 is the sparser setting tried for 70x on LeNet-300-100
RUNS = (("lenet300", "lenet300"), ("lenet300", "lenet300-96"), ("lenet5", "lenet5"))
METHODS = ("retrain", "oneshot", "oneshot+retrain")


def prune(method: str, model: bytes, ref: dict, cal, train, val) -> tuple[bytes, float]:
    start = time.perf_counter()
    if method == "retrain":
        out = prune_model(model, train, val, ref["sparsity"],
                          settings=Retraining(epochs=ref["epochs"], distill=ref["distill"])).tflite
    else:
        out = oneshot.prune_layers(model, cal, ref["sparsity"], kinds=("fc",)).tflite
        if method == "oneshot+retrain":
            out = retrain_masked(out, model, train, val,
                                 settings=Retraining(epochs=ref["epochs"], distill=ref["distill"])).tflite
    return out, time.perf_counter() - start


def summarize(info: dict, max_loss: float) -> dict:
    points = info["points"]
    best = anchors.ours_at(points, max_loss)
    dc = next(p for p in points if p["method"] == anchors.DC and p["setting"] == 32)
    ours = anchors.ours_at(points, dc["test_loss"])
    interpolated = anchors.ours_interpolated(points, dc["test_loss"])
    return {"pruned_test_loss": info["pruned"]["test_loss"], "pruned_val_loss": info["pruned"]["val_loss"],
            "ours_within": best and {k: best[k] for k in ("setting", "ratio", "val_loss", "test_loss")},
            "dc32": {k: dc[k] for k in ("ratio", "val_loss", "test_loss")},
            "ours_at_dc_loss": ours and {k: ours[k] for k in ("setting", "ratio", "test_loss")},
            "over_dc": ours["ratio"] / dc["ratio"] if ours else None,
            "over_dc_interpolated": interpolated / dc["ratio"] if interpolated else None,
            "dc_curve": [{k: p[k] for k in ("setting", "ratio", "test_loss")} for p in points
                         if p["method"] == anchors.DC],
            "ours_curve": [{k: p[k] for k in ("setting", "ratio", "val_loss", "test_loss")} for p in points
                           if p["method"] == anchors.OURS]}


def whole_lenet5(pruned_fc: bytes, cal, val, test, max_loss: float) -> dict:
    original = bundled("lenet5.tflite").read_bytes()
    result = oneshot.prune_layers(pruned_fc, cal, {"conv2": 0.5}, kinds=("fc", "conv"))
    model = result.tflite
    reference = runtime.accuracy(original, *val)
    out = compress(model, *val, Budget("top1", max_loss, spent=reference - runtime.accuracy(model, *val)), layers="all")
    decoded = container.load(out.dsz).tflite_bytes()
    t_orig, t_dec = runtime.accuracy(original, *test), runtime.accuracy(decoded, *test)
    return {"sparsity": {l.name: 1 - density(TFLiteModel(model).weight(l.name)) for l in out.layers},
            "weight_bytes": out.fc_original_bytes, "compressed_bytes": out.fc_compressed_bytes, "ratio": out.ratio,
            "dsz_bytes": len(out.dsz), "val_loss": reference - out.after, "test_loss": t_orig - t_dec,
            "conv2_seconds": result.seconds["conv2"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-loss", type=float, default=0.003)
    parser.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "oneshot_lenet.json"))
    args = parser.parse_args()
    x, y = fashion_mnist("train")
    cal, train = x[:CALIBRATION], (x[:TRAIN_SIZE], y[:TRAIN_SIZE])
    val, test = load_npz(bundled("fmnist_val.npz")), load_npz(bundled("fmnist_test.npz"))
    report, rows, pruned_by = {}, [], {}
    for name, ref_name in RUNS:
        ref = REFERENCE[ref_name]
        model = bundled(ref["file"]).read_bytes()
        for method in METHODS:
            print(f"[{time.strftime('%H:%M:%S')}] {ref_name} {method}", flush=True)
            pruned, seconds = prune(method, model, ref, cal, train, val)
            pruned_by[(ref_name, method)] = pruned
            info = anchors.benchmark(model, val, test, args.max_loss, pruned=anchors.Pruned(model=pruned),
                                     sweep=anchors.Sweep(clusters=(4, 8, 16, 32), bits=(8,), title=f"{ref_name} {method}"))
            row = {"prune_seconds": seconds, **summarize(info, args.max_loss)}
            report[f"{ref_name} {method}"] = row
            within, at = row["ours_within"], row["ours_at_dc_loss"]
            rows.append([ref["title"], method, f"{100 * row['pruned_test_loss']:+.2f}",
                         f"{within['ratio']:.1f}x" if within else "-",
                         f"{100 * within['test_loss']:+.2f}" if within else "-",
                         f"{row['dc32']['ratio']:.1f}x", f"{100 * row['dc32']['test_loss']:+.2f}",
                         f"{at['ratio']:.1f}x" if at else "-",
                         f"{row['over_dc']:.2f}" if row["over_dc"] else "-", f"{seconds:.0f}"])
    print(f"[{time.strftime('%H:%M:%S')}] lenet5 --layers all", flush=True)
    whole = whole_lenet5(pruned_by[("lenet5", "retrain")], cal, val, test, args.max_loss)
    report["lenet5 all layers"] = whole
    timing = oneshot.prune_layers(bundled("lenet5.tflite").read_bytes(), cal, 0.5, kinds=("fc", "conv"))
    memory = oneshot.hessian_note(bundled("lenet5.tflite").read_bytes(), timing.pruned)
    report["lenet5 oneshot timing"] = {"seconds": timing.seconds, "hessian": memory}

    print(f"\n1. FC layers at REFERENCE sparsities; losses on TEST from the unpruned model (budget {args.max_loss})")
    print(format_table(["model", "pruning", "pruned loss", f"pydsz within {100 * args.max_loss:g}", "its loss",
                        "DC-32", "DC loss", "pydsz at DC loss", "over DC", "prune s"], rows))
    print(f"\n2. LeNet-5, every layer (retrained FC + conv2 one-shot 0.5): weight bytes {whole['weight_bytes']} -> "
          f"{whole['compressed_bytes']} ({whole['ratio']:.1f}x), val loss {100 * whole['val_loss']:+.2f}, "
          f"test loss {100 * whole['test_loss']:+.2f} points; .dsz {whole['dsz_bytes']} bytes")
    print(f"\n3. one-shot LeNet-5, every layer by half, {CALIBRATION} calibration images: "
          + ", ".join(f"{k}={v:.2f}s" for k, v in timing.seconds.items())
          + f" ({sum(timing.seconds.values()):.1f} s in all); Hessian memory: {memory}")
    with open(args.json, "w") as f:
        json.dump({"max_loss": args.max_loss, "calibration": CALIBRATION, "runs": report}, f, indent=1, default=str)
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
