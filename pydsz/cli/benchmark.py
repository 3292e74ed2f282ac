"""`dsz bench`: pydsz against the anchors of the field on one model.

--layers fc (the default): DeepSZ's setting, every method on the FC layers of one pruned model
(pydsz.bench.anchors). --layers conv or all: the model as given against what a user would pick instead,
whole files, no labels needed (pydsz.bench.headtohead).
"""
from __future__ import annotations

import argparse
import os

from pydsz.cli.options import (
    THREADS_HELP,
    add_device_argument,
    add_progress_arguments,
    add_retraining_arguments,
    load_tflite,
    metrics_names,
    progress,
    resolve_device,
    sparsity,
    threads,
)
from pydsz.context import Run
from pydsz.errors import InputError


def _budgets(text: str):
    """`0.0015,0.003,0.006` (top-1 loss budgets)."""
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid budgets {text!r}: give numbers separated by commas "
                                         "(0.0015,0.003,0.006)") from None


def _bits(text: str):
    try:
        bits = [int(v) for v in text.split(",")]
    except ValueError:
        bits = []
    if not bits or any(not 2 <= b <= 16 for b in bits):
        raise argparse.ArgumentTypeError(f"invalid bit widths {text!r}: give integers in 2..16 separated by commas")
    return bits


def _whole_model(args, model: bytes) -> None:
    from pydsz.bench import headtohead
    from pydsz.model.data import load_data
    from pydsz.model.graph import TFLiteModel

    if args.train or args.sparsity is not None:
        raise InputError("--train and --sparsity prune the FC layers (--layers fc); with --layers "
                         f"{args.layers} the model is benched as given (one-shot pruning is one of its methods)")
    parsed = TFLiteModel(model)

    def data(path):
        return load_data(path, parsed, normalize=args.normalize if os.path.isdir(path) else None)

    calibration = data(args.calibration)[0] if args.calibration else None
    sweep = headtohead.Sweep(budgets=args.budgets, bits=args.bits or headtohead.BITS, title=os.path.basename(args.model))
    info = headtohead.benchmark(model, data(args.data), data(args.test), _budget(args, "output-error"),
                                layers=args.layers, calibration=calibration, sweep=sweep,
                                run=Run(args.num_threads, progress=progress(args)))
    if args.report:
        import json

        from pydsz.format.files import write_files

        write_files(args.report, {"bench.json": json.dumps(info, indent=1).encode(), "bench.png": headtohead.plot([info])})
    print(f"{info['model']}: {info['file_bytes']} bytes, zstd -19 {info['zstd19_bytes']}; "
          f"{info['compressible_layers']} compressible layers ({', '.join(info['weights'])})")
    print(headtohead.table(info))
    print(headtohead.comparison_table(info))


def cmd_bench(args) -> None:
    from pydsz.bench import anchors, summary
    from pydsz.format.files import check_folder
    from pydsz.model.data import load_npz

    if args.report:
        check_folder(args.report, args.model, args.data, args.test, what="--report folder")
    model = load_tflite(args.model, warn=not args.quiet)
    if args.layers != "fc":
        return _whole_model(args, model)
    if args.calibration or args.normalize:
        raise InputError("--calibration and --normalize are for --layers conv or all")
    device = resolve_device(args)
    val, test = load_npz(args.data), load_npz(args.test)
    train = load_npz(args.train) if args.train else None
    from pydsz.prune.train import Retraining

    pruned = anchors.Pruned(train, args.sparsity, Retraining(epochs=args.epochs, distill=args.distill))
    sweep = anchors.Sweep(budgets=args.budgets, bits=args.bits or anchors.BITS, title=os.path.basename(args.model))
    info = anchors.benchmark(model, val, test, _budget(args, "top1"), pruned=pruned, sweep=sweep,
                             run=Run(args.num_threads, device, progress=progress(args)))
    if args.report:
        summary.write_report(info, args.report)
    lines = summary.summary_lines(info)
    print(lines[0])
    print(summary.main_table(info))
    print("\n".join(lines[1:]))
    if args.sweep:
        print(summary.sweep_table(info))


def add_commands(sub) -> None:
    p = sub.add_parser("bench",
                       help="pydsz against what users pick instead, every decoded model measured by the interpreter",
                       description="--layers fc (default): prune once (with --train and --sparsity; else the model "
                       "is taken as pruned), then compress its FC layers with pydsz, DeepSZ, Deep Compression, "
                       "int8, float16 and zstd, each swept over its knob. --layers conv or all: the model as given, "
                       "no labels needed, against float16, per-channel int-b, int4 blockwise and the LiteRT "
                       "Quantizer's recipes (where installed), whole files compared at equal test loss. Every "
                       "decoded model runs through the interpreter on the validation and test data.")
    p.add_argument("model", help="input .tflite model")
    p.add_argument("--layers", choices=["fc", "conv", "all"], default="fc",
                   help="fc: DeepSZ's bench on the FC layers of a pruned model (default); conv or all: the whole "
                   "model as given against what users pick instead")
    p.add_argument("--train", help="training .npz with arrays x and y (to prune and retrain first)")
    p.add_argument("--sparsity", type=sparsity, default=None,
                   help="fraction pruned when --train is given: 0.92, fc1=0.92,fc2=0.91, or auto")
    add_retraining_arguments(p)
    p.add_argument("--data", required=True, help="validation data: budgets and bounds are decided on it (an .npz; "
                   "with --layers conv/all also a directory of images)")
    p.add_argument("--test", required=True, help="test data: what every method is judged by")
    p.add_argument("--normalize", choices=["0,1", "-1,1", "0,255"], default=None,
                   help="for directories of images and a float input: map the pixels' 0..255 onto this range")
    p.add_argument("--calibration", metavar="PATH", default=None,
                   help="--layers conv/all: inputs for the compensation's Hessians and the one-shot pruning, "
                   "disjoint from --data (without them those pydsz variants are skipped)")
    p.add_argument("--metric", default=None,
                   help="what every method is judged by (default top1 for --layers fc, output-error otherwise): "
                   + ", ".join(metrics_names()))
    p.add_argument("--max-loss", type=float, default=None,
                   help="the main loss budget in the metric's unit, counted from the model as given "
                   "(default 0.003 for top1: 0.3 points; 0.01 for output-error)")
    p.add_argument("--budgets", type=_budgets, default=None,
                   help="loss budgets swept by pydsz (and DeepSZ): default 0.5, 0.75, 1, 1.5, 2 and 4 times "
                   "--max-loss for --layers fc, 0.5, 1 and 2 times otherwise; a budget the data cannot resolve "
                   "is skipped and reported")
    p.add_argument("--bits", type=_bits, default=None,
                   help="bit widths of the per-channel integer baseline (default 4,5,6,8 for --layers fc; "
                   "12,10,9,8,7,6,5,4 otherwise)")
    p.add_argument("--report", metavar="DIR", help="write bench.json and bench.png there")
    p.add_argument("--sweep", action="store_true", help="--layers fc: also print every point of every curve")
    add_device_argument(p)
    p.add_argument("--num-threads", type=threads, default=None, help=THREADS_HELP)
    add_progress_arguments(p)
    p.set_defaults(func=cmd_bench)


def _budget(args, metric: str):
    """dsz bench's budget: --metric (default `metric`) and --max-loss."""
    from pydsz.budget.rule import Budget

    return Budget(args.metric or metric, args.max_loss)
