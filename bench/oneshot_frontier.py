"""Issue 40's one-shot criterion: `dsz compress --prune auto` without `--train` against the best fixed one-shot
plan at the same test loss, on the draws of bench/auto_draws.py.

    DSZ_HELDOUT_CACHE=DIR nice -n 10 python3 bench/oneshot_frontier.py [--case mlp-d] [--draws 10] [--json PATH]
        [--points FROM.json] [--draws-from AUTO_DRAWS.json]

The fixed plans: per-layer sparsities on a grid (every FC layer but the last, which auto leaves alone too),
each pruned one-shot (SparseGPT, calibrated on the training images, as the one-shot row), then compressed
with bounds chosen on like-val (10,000 training images the model never saw, bench/auto_draws.py's) at margin
0 within each of COMPRESSION (from the pruned model): plentiful data, so the bounds are as good as the plan
allows. Each point judged on test10k from the unpruned model. The frontier at a test loss t: the largest
ratio of the points that lose at most t. Beside it, the one-shot command on each draw of 500 validation
images (bench/auto_draws.py's one-shot row, measured again here) and its efficiency: its ratio over the
frontier's at its own test loss. And the oracle as issue 40 defines it: the point of the largest ratio
whose like-val loss is within the budget, judged on test10k.

--points takes the fixed plans' points from an earlier run's JSON (77 s a point on 2 cores): they depend on
one-shot pruning and compress at margin 0, not on the command's decisions, so a change to those is measured
against the same frontier; the grid's plans it lacks are measured now (each such point names its commit),
and the JSON names the earlier run's. --draws-from takes the command's rows from a
bench/auto_draws.py JSON (its one-shot rows of the case) instead of measuring them again.
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from auto_draws import BUDGET, LIKE_VAL, _inputs, run_case  # noqa: E402
from auto_sparsity import HELDOUT  # noqa: E402
from machine import commit, machine_info  # noqa: E402

from pydsz.budget.rule import Budget  # noqa: E402
from pydsz.compress.pipeline import compress  # noqa: E402
from pydsz.format import container  # noqa: E402
from pydsz.model import runtime  # noqa: E402
from pydsz.model.data import fashion_mnist, load_npz  # noqa: E402
from pydsz.model.graph import TFLiteModel  # noqa: E402
from pydsz.prune.oneshot import prune_layers  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

# sparsities of every FC layer but the last; 0.75 since auto's ladder has it (pydsz.prune.masks.AUTO_LADDER)
GRID = (0.5, 0.6, 0.7, 0.75, 0.8, 0.9)
COMPRESSION = (0.002,)  # top-1 the bounds may lose on like-val, from the pruned model (0.005 moved 0.8/0.8 by 1%)


def frontier_at(points: list, loss: float) -> dict:
    """The point of the largest ratio among those losing at most `loss` on test10k (None if none does)."""
    fits = [p for p in points if p["test10k"] <= loss + 1e-12]
    return max(fits, key=lambda p: p["ratio"]) if fits else None


def fixed_points(model: bytes, calibration: np.ndarray, like_val: tuple, test: tuple, known: list = ()) -> list:
    """The grid's points: those of `known` (an earlier run's) as they are, the plans it lacks measured."""
    from tqdm import tqdm

    fcs = [l.name for l in TFLiteModel(model).layers(("fc",)) if l.compressible][:-1]
    plans = [{k: float(v) for k, v in zip(fcs, s)}
             for s in np.array(np.meshgrid(*[GRID] * len(fcs))).T.reshape(-1, len(fcs))]
    points = list(known)
    plans = [p for p in plans if not any(_same(p, k["sparsity"]) for k in points)]
    if not plans:
        return points
    before = {name: runtime.accuracy(model, *data) for name, data in (("like-val", like_val), ("test10k", test))}
    head = commit()
    for plan in tqdm(plans, desc="fixed one-shot plans"):
        pruned = prune_layers(model, calibration, plan).tflite
        for budget in COMPRESSION:
            result = compress(pruned, *like_val, Budget("top1", budget, margin=0))
            decoded = container.load(result.dsz).tflite_bytes()
            points.append({"sparsity": plan, "compression": budget, "ratio": result.ratio, "commit": head,
                           **{name: before[name] - runtime.accuracy(decoded, *data)
                              for name, data in (("like-val", like_val), ("test10k", test))}})
    return points


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-9 for k in a)


def draws(case: str, count: int, source: Optional[str] = None) -> list:
    """auto_draws.py's one-shot row on each of its draws, with its test10k loss: measured now, or the first
    `count` of the JSON at `source`."""
    if source:
        rows = json.loads(Path(source).read_text())["rows"]
        measured = [r for r in rows if r["case"] == case and r["method"] == "one-shot"][:count]
    else:
        measured = run_case(case, count, ["one-shot"])
    return [{"draw": r["draw"], "ratio": r["ratio"], "sparsity": r["sparsity"], "test10k": r["test_loss"]["test10k"],
             "seconds": r["seconds"], "split": r["split"], "commit": r.get("commit")} for r in measured]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="mlp-d")
    parser.add_argument("--draws", type=int, default=10)
    parser.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "oneshot_frontier.json"))
    parser.add_argument("--points", help="the fixed plans' points from this earlier run's JSON")
    parser.add_argument("--draws-from", help="the command's rows from this bench/auto_draws.py JSON")
    args = parser.parse_args()
    case = args.case
    if not (HELDOUT / f"{case}.tflite").exists():
        raise SystemExit(f"{HELDOUT / case}.tflite is missing: build it with bench/builders/make_heldout_models.py")
    model = (HELDOUT / f"{case}.tflite").read_bytes()
    calibration = load_npz(HELDOUT / f"{case}-train.npz")[0][:5000]
    x, y = fashion_mnist("train")
    like_val = (_inputs(case, x[LIKE_VAL]), y[LIKE_VAL])
    test = load_npz(HELDOUT / f"{case}-test10k.npz")
    start = time.perf_counter()
    known, frontier_seconds, points_commit = [], 0.0, commit()
    if args.points:
        earlier = json.loads(Path(args.points).read_text())
        known, frontier_seconds = earlier["points"], earlier["summary"]["frontier_seconds"]
        points_commit = earlier.get("points_commit", earlier["commit"])
    points = fixed_points(model, calibration, like_val, test, known)
    frontier_seconds += time.perf_counter() - start
    rows = draws(case, args.draws, args.draws_from)
    for r in rows:
        best = frontier_at(points, r["test10k"])
        r["frontier"] = best
        r["efficiency"] = r["ratio"] / best["ratio"] if best else None
    held = [p for p in points if p["like-val"] <= BUDGET]
    oracle = max(held, key=lambda p: p["ratio"]) if held else None
    effs = [r["efficiency"] for r in rows if r["efficiency"] is not None]
    summary = {"draws": len(rows), "ratio_median": statistics.median(r["ratio"] for r in rows),
               "test10k_median": statistics.median(r["test10k"] for r in rows),
               "within": sum(r["test10k"] <= BUDGET for r in rows),
               "efficiency_median": statistics.median(effs) if effs else None,
               "efficiency_min": min(effs) if effs else None, "at_least_0.9": sum(e >= 0.9 for e in effs),
               "oracle": oracle, "points": len(points), "frontier_seconds": frontier_seconds}
    Path(args.json).write_text(json.dumps({"machine": machine_info(), "commit": commit(),
                                           "points_commit": points_commit, "case": case,
                                           "budget": BUDGET, "grid": GRID, "compression": COMPRESSION,
                                           "summary": summary, "rows": rows, "points": points}, indent=1))
    body = [[str(r["draw"]), f"{r['ratio']:.1f}x", f"{100 * r['test10k']:+.2f}",
             f"{r['frontier']['ratio']:.1f}x" if r["frontier"] else "-",
             ", ".join(f"{v:g}" for v in r["frontier"]["sparsity"].values()) if r["frontier"] else "-",
             f"{r['efficiency']:.2f}" if r["efficiency"] else "-"] for r in rows]
    print(format_table(["draw", "one-shot", "test10k loss", "fixed at that loss", "its sparsity", "efficiency"], body))
    if oracle:
        print(f"oracle (the largest ratio within {BUDGET:g} on like-val): {oracle['ratio']:.1f}x at "
              f"{oracle['sparsity']}, test10k {100 * oracle['test10k']:+.2f}")
    print(f"efficiency median {summary['efficiency_median']}, >= 0.9 on {summary['at_least_0.9']} of {len(effs)}")
    plot(points, rows, args.json.replace(".json", ".png"))
    print(f"wrote {args.json} and its .png")
    return 0


def plot(points: list, rows: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([100 * p["test10k"] for p in points], [p["ratio"] for p in points], s=10, c="grey",
               label="fixed one-shot plans, bounds on like-val")
    ax.scatter([100 * r["test10k"] for r in rows], [r["ratio"] for r in rows], marker="^", c="C1",
               label="dsz compress --prune auto (one-shot), 10 draws of 500")
    ax.axvline(100 * BUDGET, color="k", lw=0.8, ls="--")
    ax.set_xlabel("test10k loss, top-1 points")
    ax.set_ylabel("FC ratio")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
