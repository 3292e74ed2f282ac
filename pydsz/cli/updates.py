"""Model updates as commands: diff (the server's: the update from the model a device holds to a new
one) and patch (the device's: apply it)."""
from __future__ import annotations

import sys

from pydsz.cli.options import (
    GROUPS_HELP,
    add_compensation_arguments,
    add_data_arguments,
    add_device_argument,
    add_layer_arguments,
    add_metric_arguments,
    add_output_arguments,
    calibration_for,
    compensation_from,
    data_for,
    load_tflite,
    progress,
    resolve_device,
)


def cmd_diff(args) -> None:
    from pydsz.budget.rule import Budget
    from pydsz.compress.diff import diff
    from pydsz.context import Run
    from pydsz.format.files import check_output, write_atomic
    from pydsz.format.update import held_model
    from pydsz.model.selection import Selection
    from pydsz.tables import format_table

    check_output(args.output, args.base, args.model, args.data, args.calibration, what="-o output")
    base = held_model(args.base)
    new = load_tflite(args.model, warn=not args.quiet)
    x, y = data_for(args, new)
    result = diff(base, new, x, y, Budget(args.metric, args.max_loss, margin=args.margin, output=args.model_output),
                  layers=Selection(args.layers, args.min_layer_bytes),
                  compensation=compensation_from(args, x, calibration_for(args, new)),
                  run=Run(args.num_threads, resolve_device(args), progress=progress(args)))
    write_atomic(args.output, result.update)
    if args.quiet:
        return
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if any(l.kind == "whole" for l in result.layers):
        print("a difference from the base costs more than the new model's own .dsz: the update carries that "
              "whole (as dsz compress makes it)")
    else:
        rows = [[l.name, l.kind, f"{l.bound:.3g}" if l.bound else "-", l.stream_bytes, l.nbytes]
                for l in result.layers]
        print(format_table(["layer", "coded as", "bound", "stream B", "layer B"], rows))
    print(f"{result.metric.spec} of the patched model against the new one: {result.loss:.4g} "
          f"(--max-loss {result.max_loss:g}; {result.samples} samples)")
    print(f"wrote {args.output} ({len(result.update)} bytes; the new model is {result.new_bytes})")


def cmd_patch(args) -> None:
    from pydsz.format.files import check_output, write_atomic
    from pydsz.format.update import load_update, patch

    check_output(args.output, args.base, args.update, what="-o output")
    update = load_update(args.update)
    model = patch(args.base, update)
    if args.output.lower().endswith(".dsz"):
        from pydsz.encode.pack import holding

        model = holding(model, update.entries)
    write_atomic(args.output, model)
    if not args.quiet:
        print(f"wrote {args.output} ({len(model)} bytes)")


def add_commands(sub) -> None:
    p = sub.add_parser("diff", help="the update from the model a device holds to a new one (error-bounded)",
                       description="Code NEW against BASE (the .dsz or .tflite a device holds, as it decodes it): "
                       "each changed layer's difference from the base's values, or its new values where that is "
                       "smaller, within bounds chosen under --max-loss, measured on the patched model against NEW. "
                       "The base's own error counts against that budget: a .dsz made within half of it (dsz compress "
                       "--max-loss) leaves the updates room to be small.")
    p.add_argument("base", help="the .dsz or .tflite the device holds")
    p.add_argument("model", help="the new .tflite model (the same graph)")
    add_data_arguments(p, "the data the budget is measured on: an .npz with x (and y for label metrics), or a "
                       "directory of images" + GROUPS_HELP)
    add_metric_arguments(p)
    p.add_argument("--max-loss", type=float, default=None, help="the loss the patched model may have against the "
                   "new one, in the metric's unit, with dsz compress's defaults")
    p.add_argument("--margin", type=float, default=None, help="standard errors of the measured loss kept in hand "
                   "(default: dsz compress's for the metric)")
    add_layer_arguments(p)
    add_compensation_arguments(p)
    add_device_argument(p)
    add_output_arguments(p, "output .dszu file")
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser("patch", help="apply an update to the model a device holds",
                       description="Apply UPDATE (a .dszu) to BASE (the .dsz or .tflite it was made against): the "
                       "new .tflite (or, with -o NAME.dsz, a .dsz holding it losslessly). A wrong base, a damaged "
                       "update or an update of another model is refused before anything is written.")
    p.add_argument("base", help="the .dsz or .tflite the update was made against")
    p.add_argument("update", help="the .dszu")
    p.add_argument("-o", "--output", required=True, help="the new .tflite, or .dsz")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    p.set_defaults(func=cmd_patch)
