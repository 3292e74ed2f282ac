"""How much a top-1 budget's decisions flatter their own samples: the predictions the chosen file moves on the
decision labels, against those it moves on unseen samples of the same pool and on the test images.

    nice -n 10 python3 bench/decision_optimism.py [--models fmnist_cnn_10k,...] [--budgets 0.005,0.01] [--json PATH]

The zoo's Fashion-MNIST classifiers (bench/builders/zoo_classifiers.py, built beforehand), each compressed as
bench/zoo.py's rows are (`dsz compress --data decision.npz --max-loss B --layers all`: the same call, the same
bytes), then judged on three splits: decision (the 400-1,000 labels the bounds were chosen on), oracle (the
other 9,000-9,600 images of the pool the decision labels were drawn from, never seen by the decisions) and
test (Fashion-MNIST's 10,000 test images). Per split: the share of predictions moved, the calibrated-top1
count of their loss (calibrated.CalibratedTop1, the temperature fitted on that split's labels: what the
decisions count, here on each split) and the top-1 loss the labels show.

The decision split and the oracle split are draws of one pool: where the chosen file moves fewer of the
decision samples than of the oracle's, that is the choice fitting its own samples (their bounds picked where
these samples' predictions stay), not the pool. A JSON of the rows and a PNG of the moved shares beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench" / "builders")]

import zoo_classifiers  # noqa: E402  (bench/builders/zoo_classifiers.py)

from bench.machine import commit, machine_info  # noqa: E402
from pydsz.budget import calibrated  # noqa: E402
from pydsz.budget.probabilities import as_probabilities  # noqa: E402
from pydsz.budget.rule import Budget  # noqa: E402
from pydsz.compress.pipeline import compress  # noqa: E402
from pydsz.format import container  # noqa: E402
from pydsz.model import runtime  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

SPLITS = ("decision", "oracle", "test")


def judged(original: bytes, decoded: bytes, x: np.ndarray, y: np.ndarray) -> dict:
    """The moved share, the calibrated-top1 count of the loss (temperature fitted on y) and the labels' loss."""
    before, after = (np.asarray(runtime.predict(m, x), np.float64).reshape(len(x), -1) for m in (original, decoded))
    q = calibrated.calibrate(np.log(np.maximum(as_probabilities(before), 1e-300)), y)
    a, b, rows = before.argmax(1), after.argmax(1), np.arange(len(y))
    return {"samples": len(y), "moved": float(np.mean(a != b)),
            "calibrated": float(np.mean(q[rows, a] - q[rows, b])),
            "top1_loss": float(np.mean(a == y) - np.mean(b == y))}


def run(name: str, budgets: list[float]) -> list[dict]:
    paths = zoo_classifiers.paths(name)
    original = Path(paths["model"]).read_bytes()
    data = {s: np.load(paths[s]) for s in SPLITS}
    rows = []
    for budget in budgets:
        d = data["decision"]
        result = compress(original, d["x"], d["y"], Budget("top1", budget), layers="all")
        decoded = container.load(result.dsz).tflite_bytes()
        row = {"model": name, "budget": budget, "dsz_bytes": len(result.dsz),
               **{s: judged(original, decoded, data[s]["x"], data[s]["y"]) for s in SPLITS}}
        row["optimism"] = row["oracle"]["moved"] / max(row["decision"]["moved"], 1e-12)
        print(f"{name} {budget:g}: moved {100 * row['decision']['moved']:.1f}% of decision, "
              f"{100 * row['oracle']['moved']:.1f}% of oracle, {100 * row['test']['moved']:.1f}% of test", flush=True)
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    head = ["model", "budget", "bytes"] + [f"{s}: moved / calibrated / top-1" for s in SPLITS] + ["oracle / decision moved"]
    body = [[r["model"], f"{100 * r['budget']:g} pt", str(r["dsz_bytes"])]
            + [f"{100 * r[s]['moved']:.1f}% / {100 * r[s]['calibrated']:+.2f} / {100 * r[s]['top1_loss']:+.2f}"
               for s in SPLITS] + [f"{r['optimism']:.2f}x"] for r in rows]
    return format_table(head, body)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.2 * len(rows) + 2, 3.4))
    width = 0.27
    for i, split in enumerate(SPLITS):
        ax.bar(np.arange(len(rows)) + (i - 1) * width, [100 * r[split]["moved"] for r in rows], width, label=split)
    ax.set_xticks(np.arange(len(rows)), [f"{r['model'].removeprefix('fmnist_')}\n{100 * r['budget']:g} pt" for r in rows],
                  fontsize=7)
    ax.set_ylabel("predictions moved, %")
    ax.set_title("the chosen file's moved predictions: its own decision labels vs unseen", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(zoo_classifiers.BY_NAME))
    parser.add_argument("--budgets", default="0.005,0.01")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "decision_optimism.json")
    args = parser.parse_args()
    budgets = [float(b) for b in args.budgets.split(",")]
    rows = [r for name in args.models.split(",") for r in run(name, budgets)]
    print(table(rows))
    args.json.write_text(json.dumps({"machine": machine_info(), "commit": commit(("pydsz",)), "rows": rows}, indent=1))
    plot(rows, args.json.with_suffix(".png"))
    print(f"wrote {args.json} and its .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
