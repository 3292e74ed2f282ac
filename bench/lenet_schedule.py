"""Retraining schedules for pruning LeNet-300-100 and LeNet-5: what each costs in top-1, on validation AND test.

    nice -n 10 python3 bench/lenet_schedule.py [--settings A,B] [--schedules A,B] [--seeds 0,1] [--workers 2] [--json PATH]

The question (issue 14): can the training reach 95-96% sparsity in LeNet-300-100's fc1 within ~0.15
test points, so that compression can spend the rest of a 0.3-point budget? Each run prunes the FC
tail with pydsz.prune.train.retrain (gradual magnitude pruning, masked Adam, distillation from the unpruned
tail) on the first 55,000 Fashion-MNIST training images, from the bundled model, and reports the top-1
loss against the unpruned model on the validation split (the last 5,000 training images: what
decisions may use) and on the 10,000 test images (what is reported), with the number of flipped
predictions: a paired difference's noise is about sqrt(flips) samples, i.e. ~0.2 points on test and
~0.3 on validation at these flip counts. demo.REFERENCE's own schedule is the baseline, measured in
the same run; every schedule runs for every seed, so differences can be set against the seed spread.

Schedules (a change from the REFERENCE entry each):
  reference       the REFERENCE entry as it is
  unpruned        the same retraining with no pruning: what the retraining itself costs or gains
  epochs x2       twice the epochs
  distill 0.5/1   the unpruned tail's share of the target
  ramp 0.25/0.75  the share of the steps over which the masks tighten (cubic, Zhu & Gupta)
  lr 3e-4/3e-3    Adam's initial learning rate (decays linearly to zero)
  3 stages        three retrainings one after the other, each tightening the masks to the next
                  point of the cubic curve with its own full learning-rate schedule (learning-rate
                  rewinding, Renda et al. 2020), each with the REFERENCE epochs

The machine is shared (2 cores): seconds are indicative only.
"""
import argparse
import functools
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

# The tails multiply small matrices: on a shared 2-core machine BLAS threads only spin.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from pydsz.compress.demo import REFERENCE, TRAIN_SIZE  # noqa: E402
from pydsz.prune.train import Retraining  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

# name -> change to the REFERENCE entry's retrain arguments
SCHEDULES = {
    "reference": {},
    "unpruned": {"sparsity_factor": 0},
    "epochs x2": {"epochs_factor": 2},
    "distill 0.5": {"distill": 0.5},
    "distill 1": {"distill": 1.0},
    "ramp 0.25": {"ramp": 0.25},
    "ramp 0.75": {"ramp": 0.75},
    "lr 3e-4": {"lr": 3e-4},
    "lr 3e-3": {"lr": 3e-3},
    "3 stages": {"stages": 3},
}


@functools.lru_cache(maxsize=1)
def _data(ref_name: str) -> dict:
    """The tail's layers and its captured inputs for train, validation and test (cached per process)."""
    from pydsz.model import activations
    from pydsz.model.data import bundled, fashion_mnist, load_npz
    from pydsz.model.graph import TFLiteModel
    from pydsz.model.tail import Tail
    from pydsz.prune.train import tail_layers

    data = bundled(REFERENCE[ref_name]["file"]).read_bytes()
    model = TFLiteModel(data)
    first = next(l for l in model.layers(("fc",)) if l.compressible)
    tail = Tail.from_model(model, first.name, strict=True)
    x, y = fashion_mnist("train")
    splits = {"train": (x[:TRAIN_SIZE], y[:TRAIN_SIZE]), "val": load_npz(bundled("fmnist_val.npz")),
              "test": load_npz(bundled("fmnist_test.npz"))}
    out = {"layers": tail_layers(tail)}
    for split, (xs, ys) in splits.items():
        h = activations.capture(data, xs, tail.input_tensor)
        out[split] = (h.reshape(len(h), -1), np.asarray(ys).astype(np.int64))
    return out


def one_run(args: tuple) -> dict:
    from dataclasses import replace

    from pydsz.prune.masks import density, masks_for
    from pydsz.prune.train import _softmax, logits, retrain

    setting, schedule, seed = args
    ref = REFERENCE[setting]
    change = dict(SCHEDULES[schedule])
    factor = change.pop("sparsity_factor", 1)
    sparsity = {name: s * factor for name, s in ref["sparsity"].items() if factor}
    d = _data(setting)
    teacher = [replace(l) for l in d["layers"]]
    epochs = ref["epochs"] * change.pop("epochs_factor", 1)
    stages = change.pop("stages", 1)
    settings = {"distill": ref["distill"], **change}
    start = time.perf_counter()
    layers = d["layers"]
    for k in range(1, stages + 1):
        share = 1 - (1 - k / stages) ** 3  # stage k ends on the k-th point of the cubic curve
        layers = retrain(layers, masks_for(layers, {}), *d["train"],
                         Retraining(epochs=epochs, seed=seed + k - 1, **settings),
                         targets={name: s * share for name, s in sparsity.items()}, teacher=teacher)
    seconds = time.perf_counter() - start
    row = {"setting": setting, "schedule": schedule, "seed": seed, "sparsity": sparsity, "seconds": seconds,
           "density": {l.name: density(l.weight) for l in layers}}
    for split in ("val", "test"):
        h, y = d[split]
        before, after = logits(teacher, h), logits(layers, h)
        hit_before, hit_after = np.argmax(before, 1) == y, np.argmax(after, 1) == y
        p = _softmax(after.astype(np.float64))
        row[split] = {"top1_before": float(hit_before.mean()), "loss": float(hit_before.mean() - hit_after.mean()),
                      "flips": int(np.sum(hit_before != hit_after)),
                      "cross_entropy": float(-np.mean(np.log(p[np.arange(len(y)), y])))}
    print(f"[{time.strftime('%H:%M:%S')}] {setting} {schedule} seed {seed}: val {100 * row['val']['loss']:+.2f}, "
          f"test {100 * row['test']['loss']:+.2f} points ({seconds:.0f} s)", flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default="lenet300,lenet300-96", help="REFERENCE entries, comma-separated: " + ", ".join(REFERENCE))
    parser.add_argument("--schedules", default=",".join(SCHEDULES), help="comma-separated: " + ", ".join(SCHEDULES))
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "lenet_schedule.json"))
    args = parser.parse_args()
    settings, schedules = args.settings.split(","), args.schedules.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    for name in settings:
        if name not in REFERENCE:
            parser.error(f"no REFERENCE entry {name!r} (have: {', '.join(REFERENCE)})")
    for name in schedules:
        if name not in SCHEDULES:
            parser.error(f"no schedule {name!r} (have: {', '.join(SCHEDULES)})")
    jobs = [(s, k, seed) for s in settings for k in schedules for seed in seeds]
    with ProcessPoolExecutor(args.workers) as pool:
        rows = list(pool.map(one_run, jobs))
    table = []
    for s in settings:
        for k in schedules:
            mine = [r for r in rows if r["setting"] == s and r["schedule"] == k]
            val, test = (np.array([100 * r[split]["loss"] for r in mine]) for split in ("val", "test"))
            table.append([s, k, " ".join(f"{v:+.2f}" for v in val), f"{val.mean():+.2f}",
                          " ".join(f"{v:+.2f}" for v in test), f"{test.mean():+.2f}",
                          f"{np.mean([r['test']['flips'] for r in mine]):.0f}",
                          f"{np.mean([r['seconds'] for r in mine]):.0f}"])
    print(f"\nTop-1 loss in points against the unpruned model, seeds {seeds} (noise of one paired difference "
          "~sqrt(flips) samples)")
    print(format_table(["setting", "schedule", "val per seed", "val mean", "test per seed", "test mean",
                        "test flips", "s"], table))
    with open(args.json, "w") as f:
        json.dump({"seeds": seeds, "train_size": TRAIN_SIZE, "reference": {s: REFERENCE[s] for s in settings},
                   "runs": rows}, f, indent=1)
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
