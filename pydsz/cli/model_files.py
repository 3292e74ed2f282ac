"""The commands on model files: pack (bounds given), decompress, info, eval."""
from __future__ import annotations

import sys

from pydsz.cli.options import (
    THREADS_HELP,
    add_data_arguments,
    add_metric_arguments,
    bounds,
    data_for,
    load_tflite,
    print_json,
    threads,
)
from pydsz.errors import InputError


def _print_info(info: dict) -> None:
    from pydsz.tables import format_table

    rows = []
    for t in info["tensors"]:
        bound = f"{t['error_bound']:g}" + ("q" if t.get("bound_unit") == "steps" else "")
        rows.append([t["name"], "x".join(map(str, t["shape"])), t.get("dtype", "float32"),
                     f"{t.get('density', 1.0):.3f}", bound, t.get("data_bytes", "-"), t.get("index_bytes", "-"),
                     t["original_bytes"], t["compressed_bytes"], f"{t['ratio']:.1f}x"])
    # stored B: the tensor's bytes as the model stores them (2 per float16 value, 1 per int8 one)
    # "nonzero": the share of the decoded values that are not zero (dsz compress's "density" is the
    # weights' as given: a bound rounds small values to zero)
    print(format_table(["tensor", "shape", "dtype", "nonzero", "bound", "data B", "index B", "stored B",
                        "compressed B", "ratio"], rows))
    total = info["compressed_tensors"]
    ratio = f"{total['ratio']:.1f}x" if total["ratio"] else "-"
    print(f"compressed tensors: {total['original_bytes']} -> {total['compressed_bytes']} bytes ({ratio}); "
          f"rest of the model: {info['rest_bytes']} bytes ({info['rest_codec']}); decoded model: {info['model_bytes']} bytes")


def cmd_pack(args) -> None:
    from pydsz.encode.pack import bound_warnings, kept_lossless, pack_model
    from pydsz.format.container import DszModel
    from pydsz.format.files import check_output, write_atomic

    check_output(args.output, args.model, what="-o output")
    model = load_tflite(args.model, warn=not args.quiet)
    packed = pack_model(model, args.error_bound, layers=args.layers)
    if not args.quiet:
        for warning in bound_warnings(model, args.error_bound, layers=args.layers):
            print(f"warning: {warning}", file=sys.stderr)
    write_atomic(args.output, packed)
    if not args.quiet:
        _print_info(DszModel(packed).info())
        for name, reason in kept_lossless(model, layers=args.layers).items():
            print(f"kept lossless: {name}: {reason}")
        print(f"wrote {args.output} ({len(packed)} bytes)")


def cmd_decompress(args) -> None:
    from pydsz.format.container import load
    from pydsz.format.files import check_output, write_atomic

    check_output(args.output, args.input, what="-o output")
    write_atomic(args.output, load(args.input).tflite_bytes())


def cmd_info(args) -> None:
    from pydsz.format.container import load

    info = load(args.input).info()
    if args.json:
        print_json(info)
    else:
        _print_info(info)


def cmd_eval(args) -> None:
    import numpy as np

    from pydsz.budget import metrics
    from pydsz.model.graph import TFLiteModel
    from pydsz.model.runtime import outputs

    model = load_tflite(args.model)
    reference = load_tflite(args.reference) if args.reference else None
    x, y = data_for(args, model)
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
    metric = metric.knowing(TFLiteModel(reference if reference is not None else model))
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
        print_json(report)
        return
    against = f" against {args.reference}" if reference is not None else ""
    loss = f", loss {report['loss']:.4g}" if reference is not None and metric.needs_labels else ""
    print(f"{metric.spec}{against}: {value:.4f}{loss} ({metric.unit}; {len(losses)} samples)")


def add_commands(sub) -> None:
    p = sub.add_parser("pack", help="compress a .tflite model with given error bounds",
                       description="Compress a .tflite model's weight tensors with given absolute error bounds.")
    p.add_argument("model", help="input .tflite model")
    p.add_argument("--error-bound", "-e", type=bounds, required=True,
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
                       description="Per compressed tensor: shape, the share of its decoded values that are not zero, bound, sizes "
                       "and ratio.")
    p.add_argument("input", help="input .dsz file")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("eval", help="a model's value in a metric on a data set (default top-1 accuracy)",
                       description="Top-1 accuracy of a model on labelled data, or any metric, against an original "
                       "model given with --reference for the metrics that compare with it.")
    p.add_argument("model", help=".tflite or .dsz model")
    add_data_arguments(p, ".npz with x (and y for label metrics), or a directory of PNG/JPEG images")
    add_metric_arguments(p)
    p.add_argument("--reference", metavar="MODEL", help="the original .tflite (or .dsz) to compare with")
    p.add_argument("--num-threads", type=threads, default=None, help=THREADS_HELP)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_eval)
