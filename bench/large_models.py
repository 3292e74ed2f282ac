"""DeepSZ's table on the AlexNet- and VGG-16-shaped models: `dsz prune` then `dsz compress`, end to end.

For each model (bench/builders/make_large_models.py builds and caches them) this runs, through the command
line as a user would, each step in its own process so that its time and peak memory are its own:

  prune     dsz prune --method retrain with the paper's sparsities (from Deep Compression):
            AlexNet fc6/fc7 91%, fc8 75%; VGG-16 fc6/fc7 96%, fc8 77% (pydsz's fc1, fc2, fc3)
  compress  dsz compress --max-loss on the validation images
  evaluate  top-1 on the 10,000 test images of the original, the pruned and the decoded model

and prints the FC layers' ratio next to DeepSZ's published 45.5x (AlexNet) and 115.6x (VGG-16).
Those are ImageNet models trained for weeks; these have the same FC shapes but a fixed random conv
trunk on Fashion-MNIST and a tail trained for minutes: the data and the training differ, so the
ratios are comparable in kind, not in value. Each step's peak memory is checked against the bound the
command itself prints (pydsz.compress.footprint: the process, the model's copies, the cached activations).

    python bench/large_models.py --models alexnet vgg16
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent / "builders"))
import make_large_models  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SPARSITY = {"alexnet": "fc1=0.91,fc2=0.91,fc3=0.75", "vgg16": "fc1=0.96,fc2=0.96,fc3=0.77"}
DEEPSZ = {"alexnet": 45.5, "vgg16": 115.6}  # published FC ratios (HPDC 2019), ImageNet


def run_step(args: list) -> dict:
    """One `dsz` command in its own process: seconds, peak memory (as it prints it) and its stdout."""
    start = time.time()
    result = subprocess.run([sys.executable, "-m", "pydsz.cli", *map(str, args)], capture_output=True, text=True)
    seconds = time.time() - start
    if result.returncode:
        raise SystemExit(f"dsz {args[0]} failed: {result.stderr.strip()}")
    peak = re.search(r"peak memory (\d+) MiB \(meant to stay within (\d+) MiB", result.stdout)
    return {"seconds": round(seconds, 1), "peak_mib": int(peak.group(1)) if peak else None,
            "bound_mib": int(peak.group(2)) if peak else None, "stdout": result.stdout}


def evaluate(path: Path, x: np.ndarray, y: np.ndarray, num_threads: int) -> float:
    from pydsz.format.container import load
    from pydsz.format.files import read_file
    from pydsz.model import runtime

    data = read_file(path)
    model = load(data).tflite_bytes() if path.suffix == ".dsz" else data
    return runtime.accuracy(model, x, y, num_threads=num_threads)


def bench_model(name: str, args, work: Path) -> dict:
    from pydsz.model.data import fashion_mnist, split_validation

    path = make_large_models.model_path(name, num_threads=args.num_threads)
    made = make_large_models.info(name)
    (x, y), (x_val, y_val) = split_validation(*fashion_mnist("train"))
    x_test, y_test = fashion_mnist("test")
    four_d = lambda a: a[..., None].astype(np.float32)  # noqa: E731
    train, val = work / f"{name}-train.npz", work / f"{name}-val.npz"
    np.savez(train, x=four_d(x[:args.train_samples]), y=y[:args.train_samples])
    np.savez(val, x=four_d(x_val[:args.val_samples]), y=y_val[:args.val_samples])
    pruned, packed = work / f"{name}-pruned.tflite", work / f"{name}.dsz"

    sparsity = args.sparsity or SPARSITY[name]
    prune = run_step(["prune", path, "--method", "retrain", "--train", train, "--data", val, "--sparsity",
                      sparsity, "--epochs", args.epochs, "--device", args.device,
                      "--num-threads", args.num_threads, "-o", pruned])
    compress = run_step(["compress", pruned, "--data", val, "--max-loss", args.max_loss, "--device", args.device,
                         "--num-threads", args.num_threads, "--report", work / name, "-o", packed])
    report = json.loads((work / name / "report.json").read_text())
    top1 = {k: evaluate(p, four_d(x_test), y_test, args.num_threads)
            for k, p in (("original", path), ("pruned", pruned), ("compressed", packed))}
    f32 = path.stat().st_size  # every constant is float32; the flatbuffer around them is a few KB
    return {
        "model": name, "fc_shapes": made["fc_shapes"], "model_float32_bytes": f32,
        "fc_ratio": report["totals"]["ratio"], "deepsz_fc_ratio": DEEPSZ[name], "sparsity": sparsity,
        "top1_test": top1, "top1_loss_points": round(100 * (top1["original"] - top1["compressed"]), 2),
        "seconds": {"prune": prune["seconds"], "compress": compress["seconds"]},
        "peak_mib": {"prune": prune["peak_mib"], "compress": compress["peak_mib"]},
        # what two runs (e.g. before and after a change) compare to tell that the outputs are the same
        "sha256": {"pruned": hashlib.sha256(pruned.read_bytes()).hexdigest(),
                   "compressed": hashlib.sha256(packed.read_bytes()).hexdigest()},
        # the bound each command prints beside its peak
        "bound_mib": {"prune": prune["bound_mib"], "compress": compress["bound_mib"]},
        "within_bound": {k: s["peak_mib"] is not None and s["peak_mib"] <= s["bound_mib"]
                         for k, s in (("prune", prune), ("compress", compress))},
        "settings": {"train_samples": args.train_samples, "val_samples": args.val_samples, "epochs": args.epochs,
                     "max_loss": args.max_loss, "device": device_name(args.device),
                     "num_threads": args.num_threads, "model_trained_on": made["train_samples"],
                     "model_epochs": made["epochs"]},
        "compress_stdout": compress["stdout"].splitlines()[-12:],
    }


def device_name(choice: str) -> str:
    from pydsz import gpu

    return gpu.name() if gpu.resolve(choice) == "gpu" else "cpu"


def table(rows: list) -> str:
    from pydsz.tables import format_table

    header = ["model", "FC ratio", "DeepSZ (ImageNet)", "top-1 orig", "pruned", "compressed", "prune s",
              "prune peak MiB (bound)", "compress s", "compress peak MiB (bound)"]
    body = [[r["model"], f"{r['fc_ratio']:.1f}x", f"{r['deepsz_fc_ratio']}x",
             f"{100 * r['top1_test']['original']:.2f}%", f"{100 * r['top1_test']['pruned']:.2f}%",
             f"{100 * r['top1_test']['compressed']:.2f}%", f"{r['seconds']['prune']:.0f}",
             f"{r['peak_mib']['prune']} ({r['bound_mib']['prune']})", f"{r['seconds']['compress']:.0f}",
             f"{r['peak_mib']['compress']} ({r['bound_mib']['compress']})"] for r in rows]
    return format_table(header, body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(DEEPSZ), choices=list(DEEPSZ))
    parser.add_argument("--train-samples", type=int, default=10000, help="retraining images (default 10000)")
    parser.add_argument("--val-samples", type=int, default=2000, help="validation images compress decides on")
    parser.add_argument("--epochs", type=float, default=1, help="retraining epochs (default 1)")
    parser.add_argument("--sparsity", help="dsz prune's --sparsity instead of the paper's (one model per run)")
    parser.add_argument("--max-loss", type=float, default=0.003)
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu", "auto"),
                        help="where prune retrains and compress evaluates the FC tail (default cpu)")
    parser.add_argument("--num-threads", type=int, default=2, help="interpreter threads (default 2, as CI's machine)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="dsz-large-") as tmp:
        for name in args.models:
            rows.append(bench_model(name, args, Path(tmp)))
            print(table(rows[-1:]), flush=True)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "large_models.json"
    # one model per run fits a session better than both: keep the other model's row from its own run
    # (each row carries its settings)
    kept = json.loads(out.read_text())["rows"] if out.exists() else []
    rows = [r for r in kept if r["model"] not in args.models] + rows
    print(table(rows))
    print("Data and training differ from DeepSZ's (ImageNet, trained networks): same FC shapes, Fashion-MNIST, "
          "fixed random conv trunk; top-1 on the 10,000 test images; the machine was shared.")
    out.write_text(json.dumps({"rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
