"""`dsz bench`: pydsz against the anchors of the field on one model."""
from __future__ import annotations

import argparse
import os

from .options import (add_device_argument, add_retraining_arguments, load_tflite, metrics_names, resolve_device,
                      sparsity)


def _budgets(text: str):
    """`0.0015,0.003,0.006` (top-1 loss budgets)."""
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid budgets {text!r}: give numbers separated by commas "
                                         "(0.0015,0.003,0.006)") from None


def cmd_bench(args) -> None:
    from .. import bench
    from ..data import load_npz

    device = resolve_device(args)
    model = load_tflite(args.model)
    val, test = load_npz(args.data), load_npz(args.test)
    train = load_npz(args.train) if args.train else None
    info = bench.run(model, val, test, args.max_loss, metric=args.metric, train=train, sparsity=args.sparsity, epochs=args.epochs,
                     distill=args.distill, budgets=args.budgets, title=os.path.basename(args.model),
                     progress=not args.quiet, num_threads=args.num_threads, device=device)
    if args.report:
        directory = os.path.join(args.report, "")
        bench.write_report(info, directory + "bench.json", directory + "bench.png")
    summary = bench.summary_lines(info)
    print(summary[0])
    print(bench.main_table(info))
    print("\n".join(summary[1:]))
    if args.sweep:
        print(bench.sweep_table(info))


def add_commands(sub) -> None:
    p = sub.add_parser("bench",
                       help="pydsz against DeepSZ, Deep Compression, quantization and zstd on one pruned model",
                       description="Prune once (with --train and --sparsity; else the model is taken as pruned), "
                       "then compress its FC layers with every method, each swept over its knob, and measure "
                       "every decoded model with the interpreter on the validation and test splits.")
    p.add_argument("model", help="input .tflite model")
    p.add_argument("--train", help="training .npz with arrays x and y (to prune and retrain first)")
    p.add_argument("--sparsity", type=sparsity, default=None,
                   help="fraction pruned when --train is given: 0.92, fc1=0.92,fc2=0.91, or auto")
    add_retraining_arguments(p)
    p.add_argument("--data", required=True, help="validation .npz: budgets and bounds are decided on it")
    p.add_argument("--test", required=True, help="test .npz: the accuracy every method is judged by")
    p.add_argument("--metric", default="top1",
                   help="what every method is judged by (default top1): " + ", ".join(metrics_names()))
    p.add_argument("--max-loss", type=float, default=None,
                   help="the main loss budget in the metric's unit, counted from the model as given "
                   "(default 0.003 for top1: 0.3 points)")
    p.add_argument("--budgets", type=_budgets, default=None,
                   help="loss budgets swept by pydsz and DeepSZ (default: 0.5, 0.75, 1, 1.5, 2 and 4 times --max-loss)")
    p.add_argument("--report", metavar="DIR", help="write bench.json and bench.png (ratio vs test loss) there")
    p.add_argument("--sweep", action="store_true", help="also print every point of every curve")
    add_device_argument(p)
    p.add_argument("--num-threads", type=int, default=None, help="interpreter threads")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_bench)
