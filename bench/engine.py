"""How much faster is `dsz compress` with the evaluation engine of issue 27 than the code before it, at
what size and loss? The same command, this tree's code and a base commit's, in one run.

    python bench/engine.py [--base b1ebc24] [--models hand_recrop,selfie_segmentation,iris_landmark]
                           [--cache DIR] [--max-loss 0.01] [--samples 64] [--json PATH] [--png PATH]

The base commit (default: main before issue 27) is exported with `git archive` into a temporary
directory and its extension built there (`setup.py build_ext --inplace`, about a minute; needs Cython,
`pip install cython`, which pip's isolated build of this tree does not leave behind); each of its
runs imports it through PYTHONPATH in a subprocess, the new code's runs import this tree the same way,
so both sides start alike. For each model (MediaPipe models from PyPI wheels and real photos:
bench/builders/nonclassifier_data.py, bench/MODELS-nonclassifier.md), one after the other on the same
machine, base then new:

    dsz compress MODEL --data calib/ --normalize 0,1 --metric output-error --max-loss 0.01 --layers all
                 -o out.dsz --report report/ -q

Recorded: wall seconds, the .dsz's bytes, the loss each run measured on the decoded .dsz
(report.json: the verification through the interpreter), evaluations, and the output error of both
decoded models on the unseen test photos, measured here by one and the same code (this tree's
runtime and metric). The claims of issue 27: new at least 5x faster on each model, its .dsz at most 2%
larger, both within the budget. Writes bench/results/engine.json and bench/results/engine.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE), str(HERE / "builders")]

import nonclassifier_data as nd  # noqa: E402
from machine import machine_info  # noqa: E402

from pydsz.budget import metrics  # noqa: E402
from pydsz.format import container  # noqa: E402
from pydsz.model import runtime  # noqa: E402
from pydsz.model.data import load_data  # noqa: E402
from pydsz.model.graph import TFLiteModel  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

BASE = "b1ebc24"  # main before issue 27
MODELS = ("hand_recrop", "selfie_segmentation", "iris_landmark")


def export(ref: str, into: Path) -> str:
    """The tree of commit `ref` in `into`, its extension built in place; returns the full commit id."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", ref], check=True, capture_output=True,
                            text=True).stdout.strip()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    built = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=into,
                           capture_output=True, text=True)
    if built.returncode != 0:
        raise SystemExit(f"building {ref} failed (is Cython installed? pip install cython):\n{built.stderr[-2000:]}")
    return commit


def compress(tree: Path, model: Path, calib: Path, out: Path, max_loss: float, log: Path) -> dict:
    """`dsz compress` of the code in `tree` (its own pydsz first on the path), timed."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "pydsz.cli", "compress", str(model), "--data", str(calib), "--normalize=0,1",
           "--metric", "output-error", "--max-loss", str(max_loss), "--layers", "all", "-o", str(out / "out.dsz"),
           "--report", str(out / "report"), "-q",
           # the same threads on both sides: the new code's default takes every core, the base's one
           "--num-threads", "1"]
    start = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=out)
    seconds = time.perf_counter() - start
    with open(log, "a") as f:
        f.write(f"$ PYTHONPATH={tree} {shlex.join(cmd)}\n[rc {p.returncode}, {seconds:.1f} s]\n{p.stdout}{p.stderr}\n")
    if p.returncode != 0:
        raise SystemExit(f"{shlex.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    report = json.loads((out / "report" / "report.json").read_text())
    return {"seconds": round(seconds, 1), "dsz_bytes": report["totals"]["dsz_bytes"],
            "measured_loss": report["metric"]["measured_loss"], "evaluations": report["totals"]["evaluations"],
            "dsz": out / "out.dsz", "cmd": shlex.join(cmd)}


def test_error(original: bytes, dsz: Path, test: Path) -> float:
    """Mean output error (output-error, the worst output per sample) of the decoded .dsz against the
    original on the test photos."""
    model = TFLiteModel(original)
    x, _ = load_data(test, model, normalize="0,1")
    keys = [d["key"] for d in model.output_details()]
    reference = runtime.outputs(original, x, keys)
    decoded = runtime.outputs(container.load(dsz.read_bytes()).tflite_bytes(), x, keys)
    return float(np.mean(metrics.get("output-error").losses(decoded, reference, None)))


def plot(rows: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    names = [r["model"] for r in rows]
    xs = np.arange(len(rows))
    a.bar(xs - 0.2, [r["base"]["seconds"] for r in rows], 0.4, label="base")
    a.bar(xs + 0.2, [r["new"]["seconds"] for r in rows], 0.4, label="new")
    for x, r in zip(xs, rows):
        a.text(x + 0.2, r["new"]["seconds"], f"{r['speedup']:.1f}x", ha="center", va="bottom", fontsize=8)
    a.set_xticks(xs, names, fontsize=8)
    a.set_ylabel("dsz compress, seconds")
    a.set_yscale("log")
    a.legend(fontsize=8)
    b.bar(xs - 0.2, [r["base"]["dsz_bytes"] / 1024 for r in rows], 0.4, label="base")
    b.bar(xs + 0.2, [r["new"]["dsz_bytes"] / 1024 for r in rows], 0.4, label="new")
    for x, r in zip(xs, rows):
        b.text(x + 0.2, r["new"]["dsz_bytes"] / 1024, f"{100 * (r['size_ratio'] - 1):+.1f}%", ha="center",
               va="bottom", fontsize=8)
    b.set_xticks(xs, names, fontsize=8)
    b.set_ylabel(".dsz, KiB")
    b.legend(fontsize=8)
    fig.suptitle("dsz compress --layers all, output-error 1%, 64 photos: issue 27's engine vs the base", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default=BASE, help=f"the commit to compare with (default {BASE})")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--cache", type=Path, default=nd.DEFAULT_CACHE)
    parser.add_argument("--max-loss", type=float, default=0.01)
    parser.add_argument("--json", type=Path, default=HERE / "results" / "engine.json")
    parser.add_argument("--png", type=Path, default=HERE / "results" / "engine.png")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="dsz-engine-") as tmp:
        tmp = Path(tmp)
        (tmp / "base").mkdir()
        print(f"building {args.base} in {tmp / 'base'} ...", flush=True)
        commit = export(args.base, tmp / "base")
        log = tmp / "commands.log"
        for name in args.models.split(","):
            nd.build(name, args.cache)
            model = nd.model_path(name, args.cache)
            calib, test = args.cache / name / "calib", args.cache / name / "test"
            row = {"model": name, "model_bytes": model.stat().st_size}
            for side, tree in (("base", tmp / "base"), ("new", ROOT)):
                out = tmp / name / side
                out.mkdir(parents=True)
                result = compress(tree, model, calib, out, args.max_loss, log)
                result["test_error"] = test_error(model.read_bytes(), result.pop("dsz"), test)
                row[side] = result
                print(f"{name} {side}: {result['seconds']} s, {result['dsz_bytes']} bytes", flush=True)
            row["speedup"] = row["base"]["seconds"] / row["new"]["seconds"]
            row["size_ratio"] = row["new"]["dsz_bytes"] / row["base"]["dsz_bytes"]
            rows.append(row)
        print(format_table(
            ["model", "base s", "new s", "speedup", "base .dsz", "new .dsz", "size", "base loss", "new loss",
             "base test", "new test", "evals base", "evals new"],
            [[r["model"], r["base"]["seconds"], r["new"]["seconds"], f"{r['speedup']:.1f}x", r["base"]["dsz_bytes"],
              r["new"]["dsz_bytes"], f"{100 * (r['size_ratio'] - 1):+.1f}%", f"{r['base']['measured_loss']:.4f}",
              f"{r['new']['measured_loss']:.4f}", f"{r['base']['test_error']:.4f}", f"{r['new']['test_error']:.4f}",
              r["base"]["evaluations"], r["new"]["evaluations"]] for r in rows]))
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {"question": "dsz compress --layers all (output-error 1%, 64 photos): issue 27's engine against the "
                          "code before it, in one run", "base": commit, "new": head, "max_loss": args.max_loss,
              "machine": machine_info(), "rows": rows,
              "claims": {"speedup_at_least_5x": all(r["speedup"] >= 5 for r in rows),
                         "size_at_most_2pct_larger": all(r["size_ratio"] <= 1.02 for r in rows),
                         "within_budget": all(r[s]["measured_loss"] <= args.max_loss for r in rows
                                              for s in ("base", "new"))}}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, args.png)
    print(f"wrote {args.json} and {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
