"""DeepSZ's pipeline as commands: compress (within a loss budget), prune, and demo (both on a bundled model)."""
from __future__ import annotations

from pydsz.cli.options import (
    GROUPS_HELP,
    add_cache_argument,
    add_compensation_arguments,
    add_data_arguments,
    add_device_argument,
    add_layer_arguments,
    add_metric_arguments,
    add_output_arguments,
    add_progress_arguments,
    add_retraining_arguments,
    calibration_for,
    calibration_inputs,
    compensation_from,
    data_for,
    groups_from,
    load_tflite,
    max_loss,
    memory_size,
    metrics_names,
    peak_memory,
    print_device,
    print_result,
    progress,
    resolve_device,
    sparsity,
)
from pydsz.context import Run
from pydsz.errors import InputError


def cmd_compress(args) -> None:
    from pydsz.assess.executor import Local
    from pydsz.assess.executor import make as make_executor
    from pydsz.compress import footprint
    from pydsz.compress.pipeline import compress
    from pydsz.compress.report import write_report
    from pydsz.format.files import check_folder, check_output, write_atomic
    from pydsz.model import cache
    from pydsz.model.selection import Selection

    check_output(args.output, args.model, args.data, args.calibration, args.train, what="-o output")
    if args.report:
        check_folder(args.report, args.model, args.data, what="--report folder")
    process = footprint.process()
    cache.set_limit(args.max_cache_memory)
    device = resolve_device(args)
    if device == "gpu":
        process.update(footprint.cuda())
    allowance = None
    if args.max_memory is not None and args.prune:
        raise InputError("--max-memory fits the assessment of dsz compress; with --prune auto the pruning's "
                         "retraining and Hessians are not fitted to it: prune apart (dsz prune), then compress")
    if args.max_memory is not None:
        allowance = args.max_memory - sum(process.values())
        if allowance <= 0:
            raise InputError(f"--max-memory {args.max_memory / footprint.MIB:.0f} MiB: the process alone holds "
                             f"{sum(process.values()) / footprint.MIB:.0f} MiB (Python, its libraries and the codec "
                             "at work) before it loads anything")
    model = load_tflite(args.model, warn=not args.quiet)
    x, y = data_for(args, model)
    if args.train and not args.prune:
        raise InputError("--train is the training set of --prune auto: give --prune auto too, or prune apart "
                         "(dsz prune)")
    calibration = None if args.prune else calibration_for(args, model)
    budget = _budget(args, model, x, y)
    executor = make_executor(args.cluster, args.workers, device)
    split = None
    try:
        if not args.quiet and not isinstance(executor, Local):
            print(f"evaluating on {executor.description}", flush=True)
        if args.prune:
            result, split = _compress_pruned(args, model, x, y, budget, device, executor)
        else:
            result = compress(model, x, y, budget, target_ratio=args.target_ratio,
                              layers=Selection(args.layers, args.min_layer_bytes),
                              compensation=compensation_from(args, x, calibration),
                              run=_run(args, device, executor, allowance))
    finally:
        executor.close()
    write_atomic(args.output, result.dsz)
    if args.report:
        write_report(result, args.report, extra={"prune": vars(split)} if split else None)
    if not args.quiet:
        if result.metric_reason:
            print(f"metric: {result.metric.spec} ({result.metric_reason}; --metric chooses another)")
        for warning in result.warnings:
            print(f"warning: {warning}")
        if split is not None:
            for note in split.notes:
                print(note)
            print(split.line())
    print_result(result, args.quiet)
    print_device(result, args.quiet)
    if not args.quiet:
        print(f"wrote {args.output} ({len(result.dsz)} bytes); peak memory "
              f"{peak_memory(process, len(model), result.memory)}")


def _compress_pruned(args, model: bytes, x, y, budget, device: str, executor):
    """dsz compress --prune auto: prune (retraining with --train, else one-shot) and compress under the one
    --max-loss (pydsz.compress.prune_compress)."""
    from pydsz.compress.prune_compress import Pruning, compress_pruned
    from pydsz.model.data import load_npz
    from pydsz.model.selection import Selection
    from pydsz.prune.train import Retraining

    if args.target_ratio is not None:
        raise InputError("--prune auto splits --max-loss between pruning and bounds; --target-ratio has no loss "
                         "budget to split")
    if args.calibration is not None and args.compensate:
        raise InputError("--prune auto calibrates one-shot pruning on --calibration; with --compensate give the "
                         "steps apart (dsz prune, then dsz compress --compensate --calibration)")
    train = load_npz(args.train) if args.train else None
    calibration = calibration_inputs(args, model) if args.calibration else None
    pruning = Pruning(train, calibration, Retraining(epochs=args.epochs, distill=args.distill))
    # one-shot trials calibrated on --data are cross-fitted on it, whatever the compensation
    compensation = compensation_from(args, x, pruning_crossfits=train is None and calibration is None)
    return compress_pruned(model, x, y, budget, layers=Selection(args.layers, args.min_layer_bytes),
                           pruning=pruning, compensation=compensation, run=_run(args, device, executor))


def _budget(args, model: bytes, x, y):
    """dsz compress's one budget: --metric (on --model-output), --max-loss, --margin; `--max-loss input`
    measured on the data (pydsz.budget.rounding) and said."""
    from pydsz.budget.rule import Budget

    if args.max_loss != "input":
        return Budget(args.metric, args.max_loss, margin=args.margin, output=args.model_output)
    from pydsz.budget.rounding import input_rounding_loss
    from pydsz.model import runtime
    from pydsz.model.graph import TFLiteModel

    if args.target_ratio is not None:
        raise InputError("--max-loss input is a budget, --target-ratio asks for none: give one of them")
    parsed = TFLiteModel(model)
    metric = Budget(args.metric, output=args.model_output).for_model(parsed, y is not None).metric
    loss, steps = input_rounding_loss(model, runtime.fit_inputs(parsed.input_details(), x), y, metric,
                                      num_threads=args.num_threads)
    if not args.quiet:
        print(f"--max-loss input: {loss:.4g} ({metric.spec}: the original model's loss on --data with every input "
              f"value moved within half its step, {', '.join(f'{s:.4g}' for s in steps)})", flush=True)
    return Budget(metric, loss, margin=args.margin, output=args.model_output)


def _run(args, device: str, executor=None, max_memory=None) -> Run:
    return Run(args.num_threads, device, executor, progress=progress(args), max_memory=max_memory)


def _prune_sparsity(text: str):
    """`dsz prune --sparsity`: what _sparsity takes, or an n:m pattern such as 2:4 (one-shot only)."""
    n, colon, m = text.partition(":")
    if colon and n.isdigit() and m.isdigit():
        return int(n), int(m)
    return sparsity(text)


def cmd_prune(args) -> None:
    from pydsz.budget.rule import Budget
    from pydsz.compress import footprint
    from pydsz.format.files import check_output, write_atomic
    from pydsz.model import cache
    from pydsz.model.data import load_npz
    from pydsz.prune.gptq import hessian_note
    from pydsz.prune.oneshot import prune_model as prune_oneshot
    from pydsz.prune.retraining import prune_model
    from pydsz.prune.train import Retraining

    check_output(args.output, args.model, args.data, args.train, what="-o output")
    process = footprint.process()
    cache.set_limit(args.max_cache_memory)
    model = load_tflite(args.model, warn=not args.quiet)
    memory, extra = {"data": 0, "batch_bytes": 0, "outputs": 0}, {}
    if args.method == "oneshot":
        from pydsz.model.data import load_data, sample_count
        from pydsz.model.graph import TFLiteModel
        from pydsz.model.selection import KINDS

        # an .npz (labels only to report and to judge --sparsity auto by) or a directory of images
        val = data_for(args, model)
        calibration = (load_data(args.train, TFLiteModel(model), normalize=args.normalize)[0] if args.train
                       else val[0])
        memory, extra = _oneshot_memory(model, calibration, val[0], args.layers, auto=args.sparsity == "auto")
        unused = ("--train calibrates the pruning" if args.train else
                  "" if args.sparsity == "auto" else "only --sparsity auto's trials are cross-fitted")
        result = prune_oneshot(model, calibration, val, args.sparsity, kinds=KINDS[args.layers],
                               auto_budget=Budget(args.metric, args.auto_budget, output=args.model_output,
                                                  option="--auto-budget", margin_option=None),
                               run=_run(args, "cpu"), groups=groups_from(args, sample_count(val[0]), unused))
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
        device = resolve_device(args)
        if device == "gpu":
            process.update(footprint.cuda())
        train, val = load_npz(args.train), load_npz(args.data)
        result = prune_model(model, train, val, args.sparsity, auto_budget=args.auto_budget,
                             settings=Retraining(epochs=args.epochs, distill=args.distill),
                             run=_run(args, device))
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
        print(f"wrote {args.output}; peak memory {peak_memory(process, len(model), memory, extra)}")


def _oneshot_memory(model: bytes, calibration, val, layers: str, auto: bool = False) -> tuple[dict, dict]:
    """What one-shot pruning holds (pydsz.compress.footprint; the Hessians' part: oneshot.footprint); and,
    before any work, a model whose outputs on the calibration inputs are not finite is refused (inputs
    that are not are, when they are loaded)."""
    from pydsz.model import runtime
    from pydsz.model.data import check_outputs
    from pydsz.model.graph import TFLiteModel
    from pydsz.model.selection import KINDS
    from pydsz.prune.oneshot import footprint

    parsed = TFLiteModel(model)
    val = runtime.fit_inputs(parsed.input_details(), val, finite=False)
    calibration = runtime.fit_inputs(parsed.input_details(), calibration, finite=False)
    probe = runtime.probe(parsed, calibration)
    batch = runtime.batch_size(parsed, calibration)
    keys = [d["key"] for d in parsed.output_details()]
    outputs = runtime.outputs(model, calibration, keys, batch_size=batch)  # what the Hessians are built from
    check_outputs(outputs)
    memory = {"data": sum(a.nbytes for a in calibration) + sum(a.nbytes for a in val),
              "batch_bytes": max(batch, 2) * probe.sample_bytes,  # the probe kept every tensor of two samples
              "outputs": sum(v.nbytes for v in outputs.values())}
    return memory, footprint(parsed, probe, len(calibration[0]), KINDS[layers], auto)


def cmd_demo(args) -> None:
    from pydsz.compress.demo import REFERENCE, run, table
    from pydsz.compress.report import layer_table, write_report
    from pydsz.format.files import check_folder, check_output, write_atomic

    if args.output is not None:
        check_output(args.output, what="-o output")
    if args.report:
        check_folder(args.report, what="--report folder")
    device = resolve_device(args)
    if not args.quiet:
        spec = REFERENCE[args.model]
        print(f"{spec['title']}: prune " + ", ".join(f"{k}={v}" for k, v in spec["sparsity"].items())
              + f" ({spec['epochs']} epochs on Fashion-MNIST's first 55,000 training images), then compress "
              f"within {100 * args.max_loss:g} points of top-1 on the validation split", flush=True)
    row = run(args.model, max_loss=args.max_loss, progress=progress(args), device=device)
    if args.output:
        write_atomic(args.output, row["result"].dsz)
    if args.report:
        write_report(row["result"], args.report, extra={"reference": row["summary"]})
    print(layer_table(row["result"]))
    print(table([row]))
    print_device(row["result"], args.quiet)


def add_commands(sub) -> None:
    p = sub.add_parser("compress", help="the smallest .dsz within a loss budget in a metric (DeepSZ)",
                       description="Assess every layer's loss over error bounds, choose one bound per layer for the "
                       "smallest size within --max-loss, verify by measuring, write the .dsz. The loss is measured "
                       "in --metric: " + ", ".join(metrics_names()) + ".")
    p.add_argument("model", help="input .tflite model (pruned for high ratios: see dsz prune)")
    add_data_arguments(p, "calibration data: an .npz with x (or x0, x1, ... / the inputs' names) and, for "
                        "label metrics, y; or a directory of PNG/JPEG images" + GROUPS_HELP)
    add_metric_arguments(p)
    p.add_argument("--max-loss", type=max_loss, default=None,
                   help="the largest loss allowed, in the metric's unit: top1/topk/agreement/expected-top1 0.003 = 0.3 points "
                   "(default), output-error 0.01 = 1%% relative error (default), cosine distance (default 0.001), "
                   "psnr: the lowest PSNR in dB (default 40); or 'input': the loss the model's own outputs take "
                   "when its inputs move within half their rounding step (half a gray level of 8-bit images), "
                   "measured on --data and printed")
    p.add_argument("--target-ratio", type=float, default=None,
                   help="instead: the least loss with the layers compressed by this ratio")
    add_layer_arguments(p)
    p.add_argument("--margin", type=float, default=None,
                   help="standard errors of the measured loss kept in hand when choosing bounds (default 1 "
                   "for top1 (whose bounds are chosen in calibrated-top1, the file then checked on the labels), "
                   "topk, agreement and expected-top1, 2 for output-error, psnr and cosine; 0 trusts "
                   "the measured losses as they are and overfits the data)")
    add_compensation_arguments(p)
    p.add_argument("--prune", choices=["auto"], default=None,
                   help="auto: prune first, DeepSZ's whole pipeline under the one --max-loss, split between "
                   "pruning (auto sparsity: the plan of the smallest file within its share) and the bounds, and "
                   "say how it was split; retraining the FC tail with --train, one-shot (SparseGPT, the layers "
                   "of --layers, calibrated on --calibration or --data) without")
    p.add_argument("--train", metavar="NPZ", default=None,
                   help="with --prune auto: the training .npz (x, y) the FC tail retrains on (top-1 only)")
    add_retraining_arguments(p)
    p.add_argument("--report", metavar="DIR", help="write report.json and curves.png there")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, default=None,
                       help="spread the evaluations over a local Dask cluster of this many processes "
                       "(pip install pydsz[distributed]; with --device gpu one per GPU, where dask-cuda is "
                       "installed); the result is the same")
    where.add_argument("--cluster", metavar="ADDRESS", default=None,
                       help="spread the evaluations over the Dask cluster whose scheduler is at ADDRESS "
                       "(tcp://host:8786; see doc/distributed.md)")
    add_device_argument(p)
    add_cache_argument(p)
    p.add_argument("--max-memory", metavar="SIZE", type=memory_size, default=None,
                   help="stay within this much resident memory (e.g. 1G; each worker's own with --workers): the "
                   "batch is lowered and activations cached on disk to fit, or the command stops before the work, "
                   "saying what it needs (default: no limit; the peak and the bound it kept are printed)")
    add_output_arguments(p, "output .dsz file")
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
    add_data_arguments(p, "validation .npz with arrays x and y (oneshot: labels optional, or a directory of images)"
                       + GROUPS_HELP)
    add_metric_arguments(p)
    p.add_argument("--sparsity", type=_prune_sparsity, required=True,
                   help="fraction pruned: 0.92 (every layer), fc1=0.92,fc2=0.91, auto (the per-layer plan of the smallest "
                   "predicted file within --auto-budget, measured on --data), or n:m such as 2:4 (oneshot: n of "
                   "every m consecutive inputs)")
    p.add_argument("--layers", choices=["fc", "conv", "all"], default="fc",
                   help="which layers to prune (default fc; conv and all need --method oneshot)")
    add_retraining_arguments(p)
    p.add_argument("--auto-budget", type=float, default=0.001,
                   help="the loss `auto` may spend on --data, one standard deviation of noise kept in hand: top-1 "
                   "for retrain (which checks it again after the full retraining); for oneshot in --metric's unit "
                   "(default 0.001)")
    add_device_argument(p)
    add_cache_argument(p)
    add_output_arguments(p, "output .tflite file")
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
    add_device_argument(p)
    add_progress_arguments(p)
    p.set_defaults(func=cmd_demo)
