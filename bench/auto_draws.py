"""How far `dsz compress --prune auto` moves with the user's 500 validation images: the one-command rows of
bench/auto_sparsity.py on other draws of 500 from the same 5,000 images, judged on the test images and, where
the model left some of its training file unused, on 10,000 images drawn like the validation images.

    DSZ_HELDOUT_CACHE=DIR nice -n 10 python3 bench/auto_draws.py [--cases mlp-d] [--draws 10] [--json PATH]
        [--methods one-shot] [--keep]

--keep keeps the rows of the JSON at --json that this run does not measure again (other cases and methods,
each row naming its commit) and its note.

A user holds one draw. bench/auto_sparsity.py's row is the builder's (seed 23: mlp-d's 500 are 90.8% right
where its 5,000 are 86.4%); this measures the draw's share of the outcome. Rows, each on every draw:
    fixed             the issue's hand schedule (93/90/70% magnitude, 8 epochs), then dsz compress --max-loss
                      0.005 (bench/auto_sparsity.py's fixed row): what the two judges make of one plan
    prune auto 0.01   dsz compress --prune auto --train --max-loss 0.01 (issue 40's command)
    one-shot          dsz compress --prune auto --max-loss 0.01, calibration the training images
Judged: test10k, Fashion-MNIST's test images; like-val, images 20,000-29,999 of its training file where the
model was trained on fewer (mlp-d: the first 4,000), none otherwise.
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from auto_sparsity import HAND, HELDOUT, _row  # noqa: E402
from machine import machine_info  # noqa: E402

from pydsz.budget.rule import Budget  # noqa: E402
from pydsz.compress.pipeline import compress  # noqa: E402
from pydsz.compress.prune_compress import Pruning, compress_pruned  # noqa: E402
from pydsz.model import runtime  # noqa: E402
from pydsz.model.data import fashion_mnist, load_npz, split_validation  # noqa: E402
from pydsz.prune.retraining import prune_model  # noqa: E402
from pydsz.prune.train import Retraining  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

BUDGET = 0.01
VAL = 500
LIKE_VAL = slice(20000, 30000)  # training images beyond every model's own when it was trained on fewer
TRAINED_ON = {"mlp-d": 4000}  # as bench/builders/make_heldout_models.py trains them (55,000 otherwise)
METHODS = ("fixed", "prune auto 0.01", "one-shot")


def _inputs(case: str, x: np.ndarray) -> np.ndarray:
    """Fashion-MNIST images as the builder feeds the case: raw pixels, or scaled to [0, 1]."""
    raw = json.loads((HELDOUT / f"{case}.json").read_text())["raw_pixels"]
    x = x.reshape(len(x), -1).astype(np.float32)
    return x if raw else x / 255.0


def run_case(case: str, draws: int, methods) -> list:
    model = (HELDOUT / f"{case}.tflite").read_bytes()
    train = load_npz(HELDOUT / f"{case}-train.npz")
    x, y = fashion_mnist("train")
    (_, _), (x_val, y_val) = split_validation(x, y)
    pool = _inputs(case, x_val)
    judged = {"test10k": load_npz(HELDOUT / f"{case}-test10k.npz")}
    if TRAINED_ON.get(case, 55000) <= LIKE_VAL.start:
        judged["like-val"] = (_inputs(case, x[LIKE_VAL]), y[LIKE_VAL])
    rows = []
    for seed in range(1, draws + 1):
        pick = np.random.default_rng(seed).choice(len(pool), VAL, replace=False)
        val = (pool[pick], y_val[pick])
        top1 = runtime.accuracy(model, *val)
        for method in methods:
            start = time.perf_counter()
            if method == "fixed":
                pruned = prune_model(model, train, val, HAND, settings=Retraining(epochs=8))
                result = compress(pruned.tflite, *val, Budget("top1", 0.005))
                extra = {"sparsity": pruned.sparsity}
            else:
                pruning = Pruning(train=train) if method == "prune auto 0.01" else Pruning(calibration=train[0][:5000])
                result, split = compress_pruned(model, *val, BUDGET, pruning=pruning)
                extra = {"sparsity": split.sparsity, "split": split.line()}
            rows.append(_row(case, method, model, result, judged, time.perf_counter() - start, draw=seed,
                             val_top1=top1, **extra))
    return rows


def summary(rows: list) -> list:
    """Per case and method: the ratio and losses over the draws, and the draws within the budget."""
    out = []
    for key in dict.fromkeys((r["case"], r["method"]) for r in rows):
        some = [r for r in rows if (r["case"], r["method"]) == key]
        ratios = [r["ratio"] for r in some]
        line = {"case": key[0], "method": key[1], "draws": len(some), "ratio_median": statistics.median(ratios),
                "ratio_min": min(ratios), "ratio_max": max(ratios)}
        for split in some[0]["test_loss"]:
            losses = [r["test_loss"][split] for r in some]
            line[split] = {"median": statistics.median(losses), "max": max(losses),
                           "within": sum(v <= BUDGET for v in losses),
                           "at_least_40x_within": sum(r["ratio"] >= 40 and r["test_loss"][split] <= BUDGET for r in some)}
        out.append(line)
    return out


def table(lines: list) -> str:
    splits = list(dict.fromkeys(s for line in lines for s in ("test10k", "like-val") if s in line))
    head = ["case", "method", "draws", "ratio median (min-max)"]
    for s in splits:
        head += [f"{s} loss median (max)", f"{s}: within 1 point", f"{s}: >= 40x within"]
    body = []
    for line in lines:
        cells = [line["case"], line["method"], str(line["draws"]),
                 f"{line['ratio_median']:.1f}x ({line['ratio_min']:.1f}-{line['ratio_max']:.1f})"]
        for s in splits:
            if s in line:
                v = line[s]
                cells += [f"{100 * v['median']:+.2f} ({100 * v['max']:+.2f})", f"{v['within']}/{line['draws']}",
                          f"{v['at_least_40x_within']}/{line['draws']}"]
            else:
                cells += ["-", "-", "-"]
        body.append(cells)
    return format_table(head, body)


def plot(rows: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(dict.fromkeys((r["case"], r["method"]) for r in rows))
    fig, axes = plt.subplots(1, len(keys), figsize=(3.6 * len(keys), 3.4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        some = [r for r in rows if (r["case"], r["method"]) == key]
        for split, marker in (("test10k", "o"), ("like-val", "^")):
            pts = [(100 * r["test_loss"][split], r["ratio"]) for r in some if split in r["test_loss"]]
            if pts:
                ax.scatter(*zip(*pts), marker=marker, label=split)
        ax.axvline(100 * BUDGET, color="grey", lw=0.8, ls="--")
        ax.set_title(f"{key[0]}: {key[1]}", fontsize=9)
        ax.set_xlabel("loss, top-1 points", fontsize=8)
        ax.set_ylabel("FC ratio", fontsize=8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="mlp-d")
    parser.add_argument("--draws", type=int, default=10)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "auto_draws.json"))
    parser.add_argument("--keep", action="store_true", help="keep the rows of --json this run does not measure")
    args = parser.parse_args()
    cases, methods = args.cases.split(","), args.methods.split(",")
    earlier = json.loads(Path(args.json).read_text()) if args.keep and Path(args.json).exists() else {}
    kept = [r for r in earlier.get("rows", []) if r["case"] not in cases or r["method"] not in methods]
    note = {"note": earlier["note"]} if "note" in earlier else {}
    rows = []
    for case in cases:
        if not (HELDOUT / f"{case}.tflite").exists():
            raise SystemExit(f"{HELDOUT / case}.tflite is missing: build it with bench/builders/make_heldout_models.py")
        rows += run_case(case, args.draws, methods)
        lines = summary(kept + rows)
        Path(args.json).write_text(json.dumps({"machine": machine_info(), "budget": BUDGET, "summary": lines,
                                               "rows": kept + rows, **note}, indent=1, default=str))
    print(table(lines))
    plot(kept + rows, args.json.replace(".json", ".png"))
    print(f"\nwrote {args.json} and its .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
