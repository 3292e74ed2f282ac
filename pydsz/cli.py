"""The `dsz` command line.

Exit status: 0 on success, 1 on a user error (one line on stderr, no traceback), 2 on a usage error.
Every output is written to a temporary file and renamed, so a failure never leaves a partial file.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from .errors import DszError, InputError


def _bound(value: str):
    """A number, or a number of quantization steps for int8/uint8 layers ("2q", kept as text)."""
    value = value.strip()
    return value if value.lower().endswith("q") and value[:-1].isdigit() else float(value)


def _bounds(text: str):
    """`0.005` or `2q` (every layer of that kind) or `fc1=0.005,fc2=2q` (per layer)."""
    try:
        if "=" not in text:
            return _bound(text)
        bounds = {}
        for item in text.split(","):
            name, _, value = item.partition("=")
            bounds[name.strip()] = _bound(value)
        return bounds
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid error bound {text!r}: give a number (0.005), steps for int8 layers (2q) or name=value "
            "pairs (fc1=0.005,fc2=2q)"
        ) from None


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


def _print_info(info: dict) -> None:
    from .tables import format_table

    rows = []
    for t in info["tensors"]:
        bound = f"{t['error_bound']:g}" + ("q" if t.get("bound_unit") == "steps" else "")
        rows.append([t["name"], "x".join(map(str, t["shape"])), t.get("dtype", "float32"),
                     f"{t.get('density', 1.0):.3f}", bound, t.get("data_bytes", "-"), t.get("index_bytes", "-"),
                     t["original_bytes"], t["compressed_bytes"], f"{t['ratio']:.1f}x"])
    # stored B: the tensor's bytes as the model stores them (2 per float16 value, 1 per int8 one)
    print(format_table(["tensor", "shape", "dtype", "density", "bound", "data B", "index B", "stored B",
                        "compressed B", "ratio"], rows))
    total = info["compressed_tensors"]
    ratio = f"{total['ratio']:.1f}x" if total["ratio"] else "-"
    print(f"compressed tensors: {total['original_bytes']} -> {total['compressed_bytes']} bytes ({ratio}); "
          f"rest of the model: {info['rest_bytes']} bytes (zstd); decoded model: {info['model_bytes']} bytes")


def cmd_pack(args) -> None:
    from .container import DszModel, kept_lossless, pack_model, read_file, write_atomic

    model = read_file(args.model)
    packed = pack_model(model, args.error_bound, layers=args.layers)
    write_atomic(args.output, packed)
    if not args.quiet:
        _print_info(DszModel(packed).info())
        for name, reason in kept_lossless(model, layers=args.layers).items():
            print(f"kept lossless: {name}: {reason}")
        print(f"wrote {args.output} ({len(packed)} bytes)")


def cmd_decompress(args) -> None:
    from .container import load, write_atomic

    write_atomic(args.output, load(args.input).tflite_bytes())


def cmd_info(args) -> None:
    from .container import load

    info = load(args.input).info()
    if args.json:
        _print_json(info)
    else:
        _print_info(info)


def load_tflite(path) -> bytes:
    """A .tflite file's bytes, or the decoded model of a .dsz file (told apart by magic, not name)."""
    from .container import MAGIC, load, read_file

    data = read_file(path)
    return load(data).tflite_bytes() if data[:4] == MAGIC else data


def _data(args, model_bytes: bytes):
    """--data (an .npz or a directory of images) for this model, checked against its inputs."""
    from .data import load_data
    from .model import TFLiteModel

    return load_data(args.data, TFLiteModel(model_bytes), normalize=args.normalize)


def cmd_eval(args) -> None:
    import numpy as np

    from . import metrics
    from .model import TFLiteModel
    from .runtime import outputs

    model = load_tflite(args.model)
    reference = load_tflite(args.reference) if args.reference else None
    x, y = _data(args, model)
    if args.metric is not None:
        metric = metrics.get(args.metric, args.model_output)
    elif reference is not None:
        metric = metrics.default(TFLiteModel(reference), y is not None, args.model_output)[0]
    else:
        metric = metrics.Top1(args.model_output)
    if reference is None and not metric.needs_labels:
        raise InputError(f"metric {metric.name} compares with the original model: give it with --reference")
    if metric.needs_labels and y is None:
        raise InputError(f"{args.data}: no array 'y': metric {metric.name} needs labels "
                         "(or give --reference ORIGINAL and a metric that compares with it)")
    keys = [d["key"] for d in TFLiteModel(model).output_details()]
    out = outputs(model, x, keys, num_threads=args.num_threads)
    ref = out if reference is None else outputs(reference, x, keys, num_threads=args.num_threads)
    metric.check(ref, y)
    losses = metric.losses(out, ref, y)
    value = metric.value(float(np.mean(losses)))
    report = {"model": str(args.model), "data": str(args.data), "samples": int(len(losses)), "metric": metric.name,
              "output": metric.output, "unit": metric.unit, "value": value}
    if reference is not None:
        report["reference"] = str(args.reference)
        report["loss"] = float(np.mean(losses - metric.losses(ref, ref, y)))
    if metric.name == "top1":
        report["top1"] = value
    if args.json:
        _print_json(report)
        return
    against = f" against {args.reference}" if reference is not None else ""
    loss = f", loss {report['loss']:.4g}" if reference is not None and metric.needs_labels else ""
    print(f"{metric.spec}{against}: {value:.4f}{loss} ({metric.unit}; {len(losses)} samples)")


def _sparsity(text: str):
    """`0.92` (every FC layer), `fc1=0.92,fc2=0.91` (per layer) or `auto`."""
    if text == "auto":
        return text
    try:
        return _bounds(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"invalid sparsity {text!r}: give a fraction (0.92), name=value pairs (fc1=0.92,fc2=0.91) or auto"
        ) from None


def _print_result(result, quiet: bool) -> None:
    from .report import layer_table, totals_line

    if not quiet:
        print(layer_table(result))
        print(totals_line(result))


def _device(args) -> str:
    """--device resolved to "cpu" or "gpu"; an InputError (exit 1) when the GPU is asked for and missing."""
    from .gpu.device import name, resolve

    device = resolve(args.device)
    if device == "gpu" and not args.quiet:
        print(f"device: GPU ({name()})", flush=True)
    return device


def _print_device(result, quiet: bool) -> None:
    if not quiet and result.cpu_reason:
        print(f"the assessment ran on the CPU: {result.cpu_reason}")


def _peak_memory(model_bytes: int) -> str:
    """This process's peak resident memory so far, for the summary of a long command, beside what
    it is meant to stay within: 3x the model plus the cached activations (README, large models)."""
    from . import cache

    mib = 1 << 20
    bound = f"within 3 x the model ({model_bytes / mib:.0f} MiB) + cached activations ({cache.peak() / mib:.0f} MiB) " \
            f"= {(3 * model_bytes + cache.peak()) / mib:.0f} MiB"
    try:
        import resource
    except ImportError:  # not on every platform
        return f"unknown (meant to stay {bound})"
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return f"{kib / 1024:.0f} MiB (meant to stay {bound})"


def _calibration(args, model_bytes: bytes):
    """--calibration (an .npz or a directory of images, labels unused) for this model, or None;
    --normalize maps its pixels when it is a directory of images."""
    from .data import load_data
    from .model import TFLiteModel

    if args.calibration is None:
        return None
    if not args.compensate:
        raise InputError("--calibration builds the Hessians of --compensate: give --compensate too")
    normalize = args.normalize if os.path.isdir(args.calibration) else None
    return load_data(args.calibration, TFLiteModel(model_bytes), normalize=normalize)[0]


def cmd_compress(args) -> None:
    from . import cache
    from .container import write_atomic
    from .executor import Local, make as make_executor
    from .pipeline import compress
    from .report import write_report

    cache.set_limit(args.max_cache_memory)
    device = _device(args)
    model = load_tflite(args.model)
    x, y = _data(args, model)
    calibration = _calibration(args, model)
    executor = make_executor(args.cluster, args.workers, device)
    try:
        if not args.quiet and not isinstance(executor, Local):
            print(f"evaluating on {executor.description}", flush=True)
        result = compress(model, x, y, args.max_loss, metric=args.metric, output=args.model_output,
                          target_ratio=args.target_ratio, layers=args.layers, margin=args.margin,
                          progress=not args.quiet, num_threads=args.num_threads, device=device, executor=executor,
                          compensate=args.compensate, calibration=calibration)
    finally:
        executor.close()
    write_atomic(args.output, result.dsz)
    if args.report:
        write_report(result, args.report)
    if not args.quiet:
        if result.metric_reason:
            print(f"metric: {result.metric.spec} ({result.metric_reason}; --metric chooses another)")
        for warning in result.warnings:
            print(f"warning: {warning}")
    _print_result(result, args.quiet)
    _print_device(result, args.quiet)
    if not args.quiet:
        print(f"wrote {args.output} ({len(result.dsz)} bytes); peak memory {_peak_memory(len(model))}")


def _prune_sparsity(text: str):
    """`dsz prune --sparsity`: what _sparsity takes, or an n:m pattern such as 2:4 (one-shot only)."""
    n, colon, m = text.partition(":")
    if colon and n.isdigit() and m.isdigit():
        return int(n), int(m)
    return _sparsity(text)


def cmd_prune(args) -> None:
    from . import cache
    from .container import write_atomic
    from .data import load_npz
    from .oneshot import hessian_note, prune_model as prune_oneshot
    from .prune import prune_model

    cache.set_limit(args.max_cache_memory)
    model = load_tflite(args.model)
    if args.method == "oneshot":
        from .data import load_data
        from .model import TFLiteModel

        # an .npz (labels only to report and to judge --sparsity auto by) or a directory of images
        val = _data(args, model)
        calibration = (load_data(args.train, TFLiteModel(model), normalize=args.normalize)[0] if args.train
                       else val[0])
        kinds = {"fc": ("fc",), "conv": ("conv",), "all": ("fc", "conv")}[args.layers]
        result = prune_oneshot(model, calibration, val, args.sparsity, kinds=kinds, auto_budget=args.auto_budget,
                               metric=args.metric, output=args.model_output, progress=not args.quiet,
                               num_threads=args.num_threads)
    else:
        if args.normalize is not None or args.metric is not None or args.model_output is not None:
            raise InputError("--normalize, --metric and --model-output are for --method oneshot; --method retrain "
                             "takes .npz files with labels and judges by top-1")
        if not args.train:
            raise InputError("--method retrain needs --train (training .npz); --method oneshot needs none")
        if args.layers != "fc":
            raise InputError(f"--method retrain prunes FC layers only; --layers {args.layers} needs --method oneshot")
        if isinstance(args.sparsity, tuple):
            raise InputError(f"n:m sparsity {args.sparsity[0]}:{args.sparsity[1]} needs --method oneshot")
        device = _device(args)
        train, val = load_npz(args.train), load_npz(args.data)
        result = prune_model(model, train, val, args.sparsity, epochs=args.epochs, auto_budget=args.auto_budget,
                             distill=args.distill, progress=not args.quiet, num_threads=args.num_threads,
                             device=device)
    write_atomic(args.output, result.tflite)
    if not args.quiet:
        print(f"method: {result.method}")
        if result.already_sparse:
            print(f"already sparse, left as they were: {', '.join(result.already_sparse)}")
        print("sparsity: " + ", ".join(f"{k}={v:.3f}" for k, v in result.sparsity.items()))
        if result.seconds:
            print("seconds per layer: " + ", ".join(f"{k}={v:.2f}" for k, v in result.seconds.items()))
            print(f"Hessian memory: {hessian_note(model, result.pruned)}")
        for note in result.notes:
            print(note)
        if result.top1_before is not None:
            print(f"top-1 on {args.data}: {100 * result.top1_before:.2f}% -> {100 * result.top1_after:.2f}%")
        print(f"wrote {args.output}; peak memory {_peak_memory(len(model))}")


def cmd_demo(args) -> None:
    from .container import write_atomic
    from .pipeline import REFERENCE, reference_run, reference_table
    from .report import layer_table, write_report

    device = _device(args)
    if not args.quiet:
        spec = REFERENCE[args.model]
        print(f"{spec['title']}: prune " + ", ".join(f"{k}={v}" for k, v in spec["sparsity"].items())
              + f" ({spec['epochs']} epochs on Fashion-MNIST's first 55,000 training images), then compress "
              f"within {100 * args.max_loss:g} points of top-1 on the validation split", flush=True)
    row = reference_run(args.model, max_loss=args.max_loss, progress=not args.quiet, device=device)
    if args.output:
        write_atomic(args.output, row["result"].dsz)
    if args.report:
        write_report(row["result"], args.report, extra={"reference": row["summary"]})
    print(layer_table(row["result"]))
    print(reference_table([row]))
    _print_device(row["result"], args.quiet)


def _budgets(text: str):
    """`0.0015,0.003,0.006` (top-1 loss budgets)."""
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid budgets {text!r}: give numbers separated by commas "
                                         "(0.0015,0.003,0.006)") from None


def cmd_bench(args) -> None:
    from . import bench
    from .data import load_npz

    device = _device(args)
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


def _add_retraining_arguments(p) -> None:
    p.add_argument("--epochs", type=float, default=8, help="retraining epochs (default 8)")
    p.add_argument("--distill", type=float, default=0.5,
                   help="share of the unpruned model's predictions in the training target (default 0.5; 0: labels only)")


def _add_device_argument(p) -> None:
    p.add_argument("--device", choices=["cpu", "gpu", "auto"], default="auto",
                   help="where retraining and the assessment run the FC tail: gpu needs pip install pydsz[gpu] "
                   "and an NVIDIA GPU; auto (default) takes the GPU when both are there")


def _cache_size(text: str) -> str:
    from .cache import parse_size

    try:
        parse_size(text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _add_cache_argument(p) -> None:
    p.add_argument("--max-cache-memory", metavar="SIZE", type=_cache_size, default=None,
                   help="cached activations beyond this much memory (e.g. 2G, 500M) are memory-mapped from a "
                   "temporary file in $TMPDIR (default: all in memory)")


def _add_output_arguments(p, output_help: str) -> None:
    """-o, --num-threads and --quiet of the commands that write one model file."""
    p.add_argument("-o", "--output", required=True, help=output_help)
    p.add_argument("--num-threads", type=int, default=None, help="interpreter threads")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars, print nothing on success")


def metrics_names() -> list:
    from .metrics import BUILTIN

    return [*BUILTIN, "module:function"]


def _add_data_arguments(p, data_help: str) -> None:
    p.add_argument("--data", required=True, help=data_help)
    p.add_argument("--normalize", choices=["0,1", "-1,1", "0,255"], default=None,
                   help="for a directory of images and a float input: map the pixels' 0..255 onto this range")


def _add_metric_arguments(p) -> None:
    p.add_argument("--metric", default=None,
                   help="what the loss is measured in (default: top1 with labels, expected-top1 without, for classifiers; "
                   "output-error otherwise): " + ", ".join(metrics_names()))
    p.add_argument("--model-output", metavar="NAME", default=None,
                   help="judge only this output of the model (by tensor name, or output<i>)")


def _add_bench_command(sub) -> None:
    p = sub.add_parser("bench",
                       help="pydsz against DeepSZ, Deep Compression, quantization and zstd on one pruned model",
                       description="Prune once (with --train and --sparsity; else the model is taken as pruned), "
                       "then compress its FC layers with every method, each swept over its knob, and measure "
                       "every decoded model with the interpreter on the validation and test splits.")
    p.add_argument("model", help="input .tflite model")
    p.add_argument("--train", help="training .npz with arrays x and y (to prune and retrain first)")
    p.add_argument("--sparsity", type=_sparsity, default=None,
                   help="fraction pruned when --train is given: 0.92, fc1=0.92,fc2=0.91, or auto")
    _add_retraining_arguments(p)
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
    _add_device_argument(p)
    p.add_argument("--num-threads", type=int, default=None, help="interpreter threads")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_bench)


def _add_pipeline_commands(sub) -> None:
    p = sub.add_parser("compress", help="the smallest .dsz within a loss budget in a metric (DeepSZ)",
                       description="Assess every layer's loss over error bounds, choose one bound per layer for the "
                       "smallest size within --max-loss, verify by measuring, write the .dsz. The loss is measured "
                       "in --metric: " + ", ".join(metrics_names()) + ".")
    p.add_argument("model", help="input .tflite model (pruned for high ratios: see dsz prune)")
    _add_data_arguments(p, "calibration data: an .npz with x (or x0, x1, ... / the inputs' names) and, for "
                        "label metrics, y; or a directory of PNG/JPEG images")
    _add_metric_arguments(p)
    p.add_argument("--max-loss", type=float, default=None,
                   help="the largest loss allowed, in the metric's unit: top1/topk/agreement/expected-top1 0.003 = 0.3 points "
                   "(default), output-error 0.01 = 1%% relative error (default), cosine distance (default 0.001), "
                   "psnr: the lowest PSNR in dB (default 40)")
    p.add_argument("--target-ratio", type=float, default=None,
                   help="instead: the least loss with the layers compressed by this ratio")
    p.add_argument("--layers", choices=["fc", "conv", "all"], default="fc",
                   help="which layers' weights to compress (default: fc, as in DeepSZ)")
    p.add_argument("--margin", type=float, default=1.0,
                   help="standard deviations of the data's noise kept in hand when choosing bounds "
                   "(default 1; 0 trusts the measured losses as they are and overfits the data)")
    p.add_argument("--compensate", action="store_true",
                   help="encode GPTQ-compensated float32 weights: each value's quantization error is pushed into the "
                   "weights not yet quantized through the inverse Hessian of the layer's inputs, so the outputs "
                   "move less at the same bound (opt-in; bench/compensate.py and bench/oneshot_conv.py measure it)")
    p.add_argument("--calibration", metavar="PATH", default=None,
                   help="with --compensate: the inputs the Hessians are built from (an .npz with x, or a directory "
                   "of images, mapped by --normalize; no labels needed), disjoint from --data. Without it the "
                   "Hessians come from --data, the compensation fits the very samples the loss is measured on, and "
                   "a warning says so: the loss on other data is then likely larger than the budget")
    p.add_argument("--report", metavar="DIR", help="write report.json and curves.png there")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, default=None,
                       help="spread the evaluations over a local Dask cluster of this many processes "
                       "(pip install pydsz[distributed]; with --device gpu one per GPU, where dask-cuda is "
                       "installed); the result is the same")
    where.add_argument("--cluster", metavar="ADDRESS", default=None,
                       help="spread the evaluations over the Dask cluster whose scheduler is at ADDRESS "
                       "(tcp://host:8786; see doc/distributed.md)")
    _add_device_argument(p)
    _add_cache_argument(p)
    _add_output_arguments(p, "output .dsz file")
    p.set_defaults(func=cmd_compress)

    p = sub.add_parser("prune", help="prune layers: retrain the FC tail with masks held, or one-shot from calibration data",
                       description="--method retrain (default): prune FC layers by magnitude and retrain the FC tail "
                       "(numpy or GPU) on cached activations; the conv trunk stays frozen. --method oneshot: prune "
                       "the layers of --layers one at a time in execution order from calibration inputs alone "
                       "(SparseGPT: mask and error compensation through the inverse Hessian), no training.")
    p.add_argument("model", help="input .tflite model")
    p.add_argument("--method", choices=["retrain", "oneshot"], default="retrain",
                   help="retrain (needs --train) or oneshot (calibrates on --train when given, else on --data)")
    p.add_argument("--train", help="training .npz with arrays x and y (retrain: required; oneshot: calibration set, "
                   "an .npz or a directory of images, no labels needed)")
    _add_data_arguments(p, "validation .npz with arrays x and y (oneshot: labels optional, or a directory of images)")
    _add_metric_arguments(p)
    p.add_argument("--sparsity", type=_prune_sparsity, required=True,
                   help="fraction pruned: 0.92 (every layer), fc1=0.92,fc2=0.91, auto (per layer, largest first, "
                   "within --auto-budget), or n:m such as 2:4 (oneshot: n of every m consecutive inputs)")
    p.add_argument("--layers", choices=["fc", "conv", "all"], default="fc",
                   help="which layers to prune (default fc; conv and all need --method oneshot)")
    _add_retraining_arguments(p)
    p.add_argument("--auto-budget", type=float, default=0.001,
                   help="the loss `auto` may spend on --data, one standard deviation of noise kept in hand: top-1 "
                   "for retrain (which checks it again after the full retraining); for oneshot in --metric's unit "
                   "(default 0.001)")
    _add_device_argument(p)
    _add_cache_argument(p)
    _add_output_arguments(p, "output .tflite file")
    p.set_defaults(func=cmd_prune)

    p = sub.add_parser("demo", help="prune and compress a bundled reference model; print the paper's table",
                       description="The main job on a bundled model: prune (training images from Debian's "
                       "dataset-fashion-mnist), compress within --max-loss on the validation split, report "
                       "top-1 on the test split.")
    # LeNet-5 by default: its result stays within the target from run to run, while LeNet-300-100's
    # pruning loss on the validation split swings by about 0.3 points with float rounding (BLAS threads)
    p.add_argument("--model", choices=["lenet5", "lenet300"], default="lenet5", help="bundled model (default lenet5)")
    p.add_argument("--max-loss", type=float, default=0.003, help="top-1 loss budget (default 0.003)")
    p.add_argument("--report", metavar="DIR", help="write report.json and curves.png there")
    p.add_argument("-o", "--output", help="also write the .dsz there")
    _add_device_argument(p)
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsz", description="DeepSZ: error-bounded lossy compression "
                                     "of neural network weights (.tflite -> .dsz -> .tflite)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("pack", help="compress a .tflite model with given error bounds",
                       description="Compress a .tflite model's weight tensors with given absolute error bounds.")
    p.add_argument("model", help="input .tflite model")
    p.add_argument("--error-bound", "-e", type=_bounds, required=True,
                   help="absolute bound for every float layer (0.005), quantization steps for every int8 layer "
                        "(2q), or per layer (fc1=0.005,fc2=2q); 0 keeps a layer lossless")
    p.add_argument("--layers", choices=["fc", "conv", "all"], default="fc",
                   help="which layers' weights to compress (default: fc, as in DeepSZ)")
    p.add_argument("-o", "--output", required=True, help="output .dsz file")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")
    p.set_defaults(func=cmd_pack)

    p = sub.add_parser("decompress", help="decode a .dsz file into a .tflite model",
                       description="Decode a .dsz file into a .tflite model runnable by any TFLite interpreter.")
    p.add_argument("input", help="input .dsz file")
    p.add_argument("-o", "--output", required=True, help="output .tflite file")
    p.set_defaults(func=cmd_decompress)

    p = sub.add_parser("info", help="show what a .dsz file holds",
                       description="Per compressed tensor: shape, density, bound, sizes and ratio.")
    p.add_argument("input", help="input .dsz file")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("eval", help="a model's value in a metric on a data set (default top-1 accuracy)",
                       description="Top-1 accuracy of a model on labelled data, or any metric, against an original "
                       "model given with --reference for the metrics that compare with it.")
    p.add_argument("model", help=".tflite or .dsz model")
    _add_data_arguments(p, ".npz with x (and y for label metrics), or a directory of PNG/JPEG images")
    _add_metric_arguments(p)
    p.add_argument("--reference", metavar="MODEL", help="the original .tflite (or .dsz) to compare with")
    p.add_argument("--num-threads", type=int, default=None, help="interpreter threads")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_eval)
    _add_pipeline_commands(sub)
    _add_bench_command(sub)
    return parser


@contextlib.contextmanager
def _native_stderr_silenced():
    """Send what native libraries write to fd 2 (TFLite's "INFO: Created ... delegate") to /dev/null.

    Python's own sys.stderr (errors, progress bars) keeps writing to the real stderr through a
    duplicate of it, so a user error stays one line.
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real fd 2 (embedded interpreters, some test runners)
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    old_stderr = sys.stderr
    os.dup2(devnull, 2)
    sys.stderr = os.fdopen(saved, "w", buffering=1, closefd=False)
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stderr = old_stderr
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _joined_values(argv: list) -> list:
    """`--normalize -1,1` as `--normalize=-1,1`: argparse takes a value that starts with '-' and is
    no plain negative number for an option."""
    out = []
    for arg in argv:
        if out and out[-1] == "--normalize" and arg.startswith("-"):
            out[-1] = f"--normalize={arg}"
        else:
            out.append(arg)
    return out


def main(argv=None) -> int:
    args = build_parser().parse_args(_joined_values(sys.argv[1:] if argv is None else list(argv)))
    try:
        with _native_stderr_silenced():
            args.func(args)
    except DszError as exc:
        print(f"dsz: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("dsz: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
