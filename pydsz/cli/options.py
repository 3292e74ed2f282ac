"""What the dsz commands share: option types, loading the model and data an option names, resolving
--device, and printing a result and the peak memory."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional

from pydsz.errors import FormatError, InputError


def _bound(value: str):
    """A number, or a number of quantization steps for int8/uint8 layers ("2q", kept as text)."""
    value = value.strip()
    return value if value.lower().endswith("q") and value[:-1].isdigit() else float(value)


def bounds(text: str):
    """`0.005` or `2q` (every layer of that kind), `fc1=0.005,fc2=2q` (per layer), or both:
    `0.005,fc3=0.01` (every layer not named takes the default)."""
    from pydsz.encode.pack import OTHERS

    try:
        if "," not in text and "=" not in text:
            return _bound(text)
        bounds = {}
        for item in text.split(","):
            name, equals, value = item.partition("=")
            name = name.strip() if equals else OTHERS
            if name in bounds:
                raise ValueError(f"{'a default' if name == OTHERS else name} given twice")
            bounds[name] = _bound(value if equals else item)
        return bounds
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid error bound {text!r}: give a number (0.005), steps for int8 layers (2q), name=value "
            "pairs (fc1=0.005,fc2=2q), or a default and pairs (0.005,fc3=0.01)"
        ) from None


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


def load_tflite(path, warn: bool = False) -> bytes:
    """A .tflite file's bytes, or the decoded model of a .dsz file: by magic, or, for a file too short
    to hold one, by a name ending in .dsz (so that a truncated .dsz is called that, not "not a TFLite
    model"). warn: say in one line that a .dsz was given where a .tflite is expected (its weights are
    then the decoded ones, already within the bounds it was made with)."""
    from pydsz.format.container import MAGIC, load
    from pydsz.format.files import read_file

    data = read_file(path)
    if data[:4] == MAGIC or (len(data) < len(MAGIC) and str(path).lower().endswith(".dsz")):
        try:
            model = load(data).tflite_bytes()
        except FormatError as exc:
            raise FormatError(f"{path}: {exc}") from None
        if warn:
            print(f"warning: {path} is a .dsz: its decoded model is taken, whose weights already carry the errors "
                  "of the bounds it was made with; give the original .tflite to start from the exact weights",
                  file=sys.stderr)
        return model
    return data


def progress(args) -> bool:
    """Whether to draw progress bars, as tqdm's conventions have it: not with --quiet or --no-progress,
    not where stderr is no terminal (a log file would get every update), not with TQDM_DISABLE set."""
    if getattr(args, "quiet", False) or getattr(args, "no_progress", False):
        return False
    if os.environ.get("TQDM_DISABLE", "").strip().lower() not in ("", "0", "false", "no"):
        return False
    return sys.stderr.isatty()


def data_for(args, model_bytes: bytes):
    """--data (an .npz or a directory of images) for this model, checked against its inputs."""
    from pydsz.model.data import load_data
    from pydsz.model.graph import TFLiteModel

    return load_data(args.data, TFLiteModel(model_bytes), normalize=args.normalize)


def max_loss(text: str):
    """--max-loss: a number, or `input` (pydsz.budget.rounding)."""
    if text == "input":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid --max-loss {text!r}: give a number (0.003) or input") from None


def sparsity(text: str):
    """`0.92` (every FC layer), `fc1=0.92,fc2=0.91` (per layer) or `auto`."""
    if text == "auto":
        return text
    try:
        return bounds(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"invalid sparsity {text!r}: give a fraction (0.92), name=value pairs (fc1=0.92,fc2=0.91) or auto"
        ) from None


def print_result(result, quiet: bool) -> None:
    from pydsz.compress.report import assessment_line, layer_table, totals_line

    if not quiet:
        print(layer_table(result))
        print(totals_line(result))
        if getattr(result, "assessment", None):
            print(assessment_line(result))


def resolve_device(args) -> str:
    """--device resolved to "cpu" or "gpu"; an InputError (exit 1) when the GPU is asked for and missing."""
    from pydsz.gpu.device import name, resolve

    device = resolve(args.device)
    if device == "gpu" and not args.quiet:
        print(f"device: GPU ({name()})", flush=True)
    return device


def print_device(result, quiet: bool) -> None:
    if not quiet and result.cpu_reason:
        print(f"the assessment ran on the CPU: {result.cpu_reason}")


def peak_memory(process: dict, model_bytes: int, memory: dict, extra: Optional[dict] = None) -> str:
    """This process's peak resident memory so far beside what it is meant to stay within
    (pydsz.compress.footprint): `memory` is Evaluator.footprint()'s parts, `extra` any further ones."""
    from pydsz.compress import footprint
    from pydsz.model import cache

    parts = footprint.interpreter_path(process, model=model_bytes, cached=cache.peak_in_memory(), **memory)
    mapped = cache.peak() - cache.peak_in_memory()  # file pages the kernel drops under pressure
    return footprint.line({**parts, **(extra or {})}) + (
        f"; activations cached on disk: {mapped / footprint.MIB:.0f} MiB" if mapped > 0 else "")


def add_retraining_arguments(p) -> None:
    p.add_argument("--epochs", type=float, default=8, help="retraining epochs (default 8)")
    p.add_argument("--distill", type=float, default=0.5,
                   help="share of the unpruned model's predictions in the training target (default 0.5; 0: labels only)")


def add_device_argument(p) -> None:
    p.add_argument("--device", choices=["cpu", "gpu", "auto"], default="auto",
                   help="where retraining and the assessment run the FC tail: gpu needs pip install pydsz[gpu] "
                   "and an NVIDIA GPU; auto (default) takes the GPU when both are there")


def _checked(check, text: str):
    """check(text), its InputError an argparse error (argparse prints its message)."""
    try:
        return check(text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cache_size(text: str) -> str:
    """--max-cache-memory: the text as given (pydsz.model.cache.set_limit takes it), once it parses."""
    from pydsz.model.cache import parse_size

    _checked(parse_size, text)
    return text


def memory_size(text: str) -> int:
    """--max-memory: bytes in "2G", "500M", ... (pydsz.model.cache.parse_size)."""
    from pydsz.model.cache import parse_size

    return _checked(parse_size, text)


def add_cache_argument(p) -> None:
    p.add_argument("--max-cache-memory", metavar="SIZE", type=_cache_size, default=None,
                   help="cached activations beyond this much memory (e.g. 2G, 500M) are memory-mapped from a "
                   "temporary file in $TMPDIR (default: all in memory)")


def threads(text: str) -> int:
    """--num-threads: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid thread count {text!r}: give a whole number >= 1")
    return value


def add_progress_arguments(p) -> None:
    """--quiet and --no-progress of the commands that run for a while."""
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars, print nothing on success")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bars, the rest printed as usual (bars are drawn only where stderr is a "
                   "terminal and TQDM_DISABLE is not set)")


def add_output_arguments(p, output_help: str) -> None:
    """-o, --num-threads, --quiet and --no-progress of the commands that write one model file."""
    p.add_argument("-o", "--output", required=True, help=output_help)
    p.add_argument("--num-threads", type=threads, default=None, help=THREADS_HELP)
    add_progress_arguments(p)


THREADS_HELP = ("interpreter threads (default: every core this process may use; with --workers or --cluster, "
                "the runtime's default in each worker)")


def default_threads(args) -> None:
    """--num-threads left out: every core this process may use where the evaluations run in it (the
    runtime's own default used one of two cores: BirdNET's compress took 11:00 where two threads took
    7:25, to the same bytes); a Dask executor's workers are the parallelism and keep the runtime's."""
    if not hasattr(args, "num_threads") or args.num_threads is not None:
        return
    if getattr(args, "workers", None) is None and getattr(args, "cluster", None) is None:
        args.num_threads = len(os.sched_getaffinity(0))


def metrics_names() -> list:
    from pydsz.budget.metrics import BUILTIN

    return [*BUILTIN, "module:function"]


def add_data_arguments(p, data_help: str) -> None:
    p.add_argument("--data", required=True, help=data_help)
    p.add_argument("--normalize", choices=["0,1", "-1,1", "0,255"], default=None,
                   help="for a directory of images and a float input: map the pixels' 0..255 onto this range")


def layers(text: str) -> str:
    """--layers: fc, conv, all, layer names (fc3, conv12,conv13), or kinds and names together."""
    from pydsz.model.selection import parse

    _checked(parse, text)
    return text


# --data's help where the compensation cross-fits it
GROUPS_HELP = ("; an .npz may give each sample's source (the photo a crop was cut from, the recording of a clip) in "
               "an array 'groups', which cross-fitting keeps apart")


def add_compensation_arguments(p) -> None:
    compensation = p.add_mutually_exclusive_group()
    compensation.add_argument("--compensate", action="store_const", const=True, default=None,
                              help="encode GPTQ-compensated weights: each value's quantization error is pushed into "
                              "the weights not yet quantized through the inverse Hessian of the layer's inputs, so "
                              "the outputs move less at the same bound (the default: the Hessians from "
                              "--calibration, or cross-fitted on --data, each half's loss measured with the weights "
                              "compensated on the other half; with fewer than 16 samples only when asked for)")
    compensation.add_argument("--no-compensate", dest="compensate", action="store_const", const=False,
                              help="no compensation")
    p.add_argument("--calibration", metavar="PATH", default=None,
                   help="more inputs for the compensation's Hessians (an .npz with x, or a directory of "
                   "images, mapped by --normalize; no labels needed), disjoint from --data, used instead of "
                   "cross-fitting --data")


def groups_from(args, n: int, unused: str = ""):
    """--data's `groups` (pydsz.model.data.load_groups) for its n samples, or None; unless --quiet says that
    cross-fitting keeps them apart, or why they go `unused`."""
    from pydsz.model.data import GROUPS, load_groups

    groups = load_groups(args.data, n)
    if groups is not None and not args.quiet:
        print(f"--data: {n} samples of {len(set(groups.tolist()))} groups ('{GROUPS}'): "
              + (f"unused: {unused}" if unused else "cross-fitting keeps each group within one half"))
    return groups


def compensation_from(args, x, calibration=None, pruning_crossfits: bool = False):
    """--compensate / --no-compensate, with the Hessians' own inputs (--calibration, or None) and --data's
    `groups` (groups_from), which cross-fitting keeps apart: the compensation's, and with pruning_crossfits
    one-shot pruning's trials' (calibrated on --data)."""
    from pydsz.compress.compensation import Compensation
    from pydsz.model.data import CROSSFIT_SAMPLES, sample_count

    n = sample_count(x)
    unused = ("" if pruning_crossfits else "--no-compensate" if args.compensate is False else
              "the compensation's Hessians come from --calibration" if calibration is not None else
              f"fewer than {CROSSFIT_SAMPLES} samples are not cross-fitted" if n < CROSSFIT_SAMPLES else "")
    return Compensation(enabled=args.compensate, calibration=calibration, groups=groups_from(args, n, unused))


def calibration_for(args, model_bytes: bytes):
    """--calibration's inputs for the compensation, or None."""
    if args.calibration is None:
        return None
    if args.compensate is False:
        raise InputError("--calibration builds the Hessians of the compensation, which --no-compensate turns off")
    return calibration_inputs(args, model_bytes)


def calibration_inputs(args, model_bytes: bytes):
    """--calibration (an .npz or a directory of images, labels unused) for this model; --normalize maps
    its pixels when it is a directory of images."""
    from pydsz.model.data import load_data
    from pydsz.model.graph import TFLiteModel

    normalize = args.normalize if os.path.isdir(args.calibration) else None
    return load_data(args.calibration, TFLiteModel(model_bytes), normalize=normalize)[0]


def add_layer_arguments(p) -> None:
    from pydsz.model.selection import MIN_LAYER_BYTES

    p.add_argument("--layers", type=layers, default="fc", metavar="fc|conv|all|NAMES",
                   help="which layers' weights to compress: fc (default, as in DeepSZ), conv, all, or layer names "
                   "such as fc3 or conv12,conv13 (dsz info lists them)")
    p.add_argument("--min-layer-bytes", type=int, default=MIN_LAYER_BYTES, metavar="N",
                   help=f"leave out layers of fewer bytes, chosen by kind (default {MIN_LAYER_BYTES}: a stream's own "
                   "headers take about what a smaller layer could save); named layers are kept whatever their size")


def add_metric_arguments(p) -> None:
    p.add_argument("--metric", default=None,
                   help="what the loss is measured in (default: top1 with labels, expected-top1 without, for classifiers; "
                   "output-error otherwise): " + ", ".join(metrics_names()))
    p.add_argument("--model-output", metavar="NAME", default=None,
                   help="judge only this output of the model (by tensor name, or output<i>)")
