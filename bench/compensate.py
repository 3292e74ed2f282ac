"""`dsz compress --compensate` against plain encoding, in one run, at the same budget.

For LeNet-300-100 and LeNet-5, as given and magnitude-pruned (no retraining, so that the run takes
minutes), `pipeline.compress` at --max-loss of top-1 on the validation split (the last 5,000
Fashion-MNIST training images): plain; compensated with the Hessians taken on the same images
(no calibration set: compensation and decisions share the samples); and compensated with the
Hessians taken on a calibration set, the first 5,000 training images (`--calibration`). Printed: the ratio of the compressed layers, the chosen bounds, the measured loss on
validation and the top-1 loss on the disjoint 10,000-image test split, and the time.

Usage: python3 bench/compensate.py [--max-loss 0.003] [--json PATH]
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from label_free import models  # noqa: E402  (the same four models)
from machine import machine_info  # noqa: E402

from pydsz.budget.rule import Budget
from pydsz.compress import pipeline  # noqa: E402
from pydsz.compress.compensation import Compensation
from pydsz.format import container  # noqa: E402
from pydsz.model import runtime  # noqa: E402
from pydsz.model.data import bundled, fashion_mnist, load_npz  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

CALIBRATION = 5000  # the first training images: neither the validation split nor the test split
# (label, compensate, where the Hessians come from)
ENCODINGS = [("plain", False, None), ("compensated, H on val", True, "val"),
             ("compensated, H on calibration", True, "train")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-loss", type=float, default=0.003)
    parser.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "compensate.json"))
    args = parser.parse_args()
    val, test = load_npz(bundled("fmnist_val.npz")), load_npz(bundled("fmnist_test.npz"))
    calibration = fashion_mnist("train")[0][:CALIBRATION]
    rows = []
    for title, model in models():
        test_top1 = runtime.accuracy(model, *test)
        for encoding, compensate, hessians in ENCODINGS:
            start = time.perf_counter()
            result = pipeline.compress(model, *val, Budget("top1", args.max_loss),
                                       compensation=Compensation(enabled=compensate, calibration=calibration if hessians == "train" else None))
            seconds = time.perf_counter() - start
            decoded = container.load(result.dsz).tflite_bytes()
            rows.append({"model": title, "encoding": encoding, "compensate": compensate, "ratio": result.ratio,
                         "bounds": {l.name: l.bound for l in result.layers}, "val_loss": result.loss,
                         "test_top1_loss": test_top1 - runtime.accuracy(decoded, *test), "seconds": seconds})
            print(f"{title} {encoding}: {result.ratio:.2f}x", file=sys.stderr, flush=True)
    for r in rows:
        plain = next(o for o in rows if o["model"] == r["model"] and not o["compensate"])
        r["ratio_vs_plain"] = r["ratio"] / plain["ratio"]
    print(f"--max-loss {args.max_loss} of top-1 on {len(val[1])} validation images; losses in points")
    print(format_table(["model", "encoding", "ratio", "vs plain", "bounds", "val loss", "test top-1 loss", "s"],
                       [[r["model"], r["encoding"], f"{r['ratio']:.2f}x",
                         f"{r['ratio_vs_plain']:.2f}", " ".join(f"{b:.3g}" for b in r["bounds"].values()),
                         f"{100 * r['val_loss']:+.2f}", f"{100 * r['test_top1_loss']:+.2f}", f"{r['seconds']:.0f}"]
                        for r in rows]))
    with open(args.json, "w") as f:
        json.dump({"max_loss": args.max_loss, "calibration": f"Fashion-MNIST train[:{CALIBRATION}]",
                   "machine": machine_info(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
