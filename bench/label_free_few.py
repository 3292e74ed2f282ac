"""Budgets without labels on the few unlabelled samples a user has: held on unseen images, or refused.

For LeNet-300-100 and LeNet-5, as given and magnitude-pruned (bench/label_free.py's four models),
`pipeline.compress` at expected-top1 --max-loss (the default without labels) on --draws random draws of
each size in --samples from the validation split, judged by the real top-1 loss on the 10,000 test
images with their labels. --prune: `dsz compress --prune auto` instead (prune_compress.compress_pruned,
one-shot pruning calibrated on the same samples), on the two models as given. A run either answers (its ratio, and whether the test loss is within the
budget) or refuses with an InputError where the samples cannot resolve the budget
(pydsz.budget.rule.Budget._holds_cheapest_changes: the message names the samples that would). The
target: every answer within the budget on test.

Usage: python3 bench/label_free_few.py [--max-loss 0.003] [--samples 32,64,128] [--draws 3] [--prune] [--json PATH]
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.dirname(os.path.abspath(__file__))]
import numpy as np  # noqa: E402

from label_free import models  # noqa: E402
from machine import machine_info  # noqa: E402

from pydsz.budget.rule import Budget  # noqa: E402
from pydsz.compress import pipeline, prune_compress  # noqa: E402
from pydsz.errors import InputError  # noqa: E402
from pydsz.format import container  # noqa: E402
from pydsz.model import runtime  # noqa: E402
from pydsz.model.data import bundled, load_npz  # noqa: E402
from pydsz.tables import format_table  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-loss", type=float, default=0.003)
    parser.add_argument("--samples", default="32,64,128")
    parser.add_argument("--draws", type=int, default=3)
    parser.add_argument("--prune", action="store_true", help="--prune auto, one-shot on the same samples")
    parser.add_argument("--json", default=None, help="default: bench/results/label_free_few[_prune].json")
    args = parser.parse_args()
    args.json = args.json or os.path.join(ROOT, "bench", "results", f"label_free_few{'_prune' if args.prune else ''}.json")
    val, test = load_npz(bundled("fmnist_val.npz")), load_npz(bundled("fmnist_test.npz"))
    rows = []
    for title, model in models()[::2] if args.prune else models():
        test_top1 = runtime.accuracy(model, *test)
        for n in map(int, args.samples.split(",")):
            for draw in range(args.draws):
                x = val[0][np.random.default_rng(draw).choice(len(val[0]), n, replace=False)]
                row = {"model": title, "samples": n, "draw": draw}
                start = time.perf_counter()
                try:
                    budget = Budget("expected-top1", args.max_loss)
                    result = (prune_compress.compress_pruned(model, x, None, budget)[0] if args.prune
                              else pipeline.compress(model, x, None, budget))
                except InputError as error:
                    row["refused"] = str(error)
                else:
                    loss = test_top1 - runtime.accuracy(container.load(result.dsz).tflite_bytes(), *test)
                    row.update(ratio=result.ratio, val_loss=result.loss, test_top1_loss=loss,
                               held=loss <= args.max_loss)
                row["seconds"] = time.perf_counter() - start
                rows.append(row)
                print(title, n, draw, "refused" if "refused" in row else f"{row['ratio']:.1f}x", file=sys.stderr,
                      flush=True)
    print(f"{'--prune auto, ' if args.prune else ''}expected-top1 --max-loss {args.max_loss} on draws of the validation images; test top-1 loss in points "
          "on the 10,000 test images")
    print(format_table(["model", "samples", "draw", "answer", "test top-1 loss", "held", "s"], [
        [r["model"], r["samples"], r["draw"], "refused" if "refused" in r else f"{r['ratio']:.1f}x",
         "" if "refused" in r else f"{100 * r['test_top1_loss']:+.2f}", "" if "refused" in r else
         ("yes" if r["held"] else "NO"), f"{r['seconds']:.0f}"] for r in rows]))
    answered = [r for r in rows if "refused" not in r]
    held = sum(r["held"] for r in answered)
    print(f"{'MET' if held == len(answered) else 'NOT MET'}  answers within the budget on test: {held} of "
          f"{len(answered)} ({len(rows) - len(answered)} refused)")
    with open(args.json, "w") as f:
        json.dump({"max_loss": args.max_loss, "prune": args.prune, "machine": machine_info(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
