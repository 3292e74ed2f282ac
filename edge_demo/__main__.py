"""python -m edge_demo MODEL.dsz --data TEST.npz: decode, time each stage, report peak memory, classify.

With --base HELD, MODEL is an update (.dszu) of the model HELD (.dsz or .tflite): the device's side of
an update over the air, the held model decoded and the update applied."""
from __future__ import annotations

import argparse
import resource
import sys
import time

import pydsz
from pydsz.format.files import check_output, read_file, write_atomic
from pydsz.tables import format_table

from .stages import decode_timed

_PROC_STATUS = "/proc/self/status"


def _status_bytes(key: str) -> int | None:
    """A size field of /proc/self/status (VmRSS, VmHWM), or None where there is no /proc."""
    try:
        with open(_PROC_STATUS) as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))
    except (OSError, StopIteration, ValueError):
        return None


def _reset_peak() -> bool:
    """Set the process's peak RSS back to its current RSS (Linux >= 4.0), so that the next peak read
    belongs to what runs in between; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _process_peak() -> int:
    """The process's peak resident memory in bytes since it started (ru_maxrss: KiB on Linux)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _mb(n: int) -> str:
    return f"{n / 1e3:.1f} kB" if n < 100_000 else f"{n / 1e6:.1f} MB"


def _decoded(args, raw: bytes, read_s: float) -> tuple[bytes, list]:
    """The .dsz's model and the time of each stage of decoding it."""
    model = pydsz.load(raw)
    tflite, stages = decode_timed(model)
    weights = sum(e.nbytes for e in model.entries)
    streams = sum(len(e.stream) for e in model.entries)
    print(f"{args.model}: {_mb(len(raw))} -> .tflite {_mb(len(tflite))} ({len(model.entries)} tensors "
          f"decoded: {_mb(weights)} of weights from {_mb(streams)}, {weights / max(streams, 1):.1f}x)")
    return tflite, [["read the file", 1e3 * read_s],
                    ["lossless decompression", 1e3 * stages.lossless],
                    ["value decoding", 1e3 * stages.values],
                    ["sparse reconstruction", 1e3 * stages.reconstruction],
                    ["decode total", 1e3 * stages.total]]


def _patched(args, raw: bytes, read_s: float) -> tuple[bytes, list]:
    """The model the update `raw` makes of the held one, and the time of reading, decoding the held
    model and applying the update (checked against both models' hashes before anything is written)."""
    from pydsz.format.update import Update, held_model

    t0 = time.perf_counter()
    update = Update(raw)
    held_raw = read_file(args.base)
    t1 = time.perf_counter()
    held = held_model(held_raw)
    t2 = time.perf_counter()
    tflite = update.apply(held)
    t3 = time.perf_counter()
    changed = sum(e.nbytes for e in update.entries)
    print(f"{args.model}: {_mb(len(raw))} update of {args.base} ({_mb(len(held_raw))}) -> .tflite "
          f"{_mb(len(tflite))} ({len(update.entries)} tensors changed: {_mb(changed)} of weights)")
    return tflite, [["read the files", 1e3 * (read_s + t1 - t0)],
                    ["decode the held model", 1e3 * (t2 - t1)],
                    ["apply the update", 1e3 * (t3 - t2)],
                    ["total", 1e3 * (read_s + t3 - t0)]]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edge_demo", description=__doc__.splitlines()[0])
    parser.add_argument("model", help=".dsz file (with --base: a .dszu update)")
    parser.add_argument("--base", metavar="HELD", help="the .dsz or .tflite the update MODEL was made against")
    parser.add_argument("--data", help=".npz with x (inputs) and y (integer labels) to classify")
    parser.add_argument("--write-tflite", metavar="PATH", help="also write the decoded .tflite here")
    parser.add_argument("--threads", type=int, default=None, help="interpreter threads (default: the runtime's)")
    args = parser.parse_args(argv)
    try:
        if args.write_tflite is not None:  # an output that cannot be written fails before the work
            check_output(args.write_tflite, args.model, args.data, args.base, what="--write-tflite output")
        if args.data:  # a bad data file fails before the decoding, not after
            from pydsz.model.data import load_npz

            x, y = load_npz(args.data)
        measured = _reset_peak()
        before = _status_bytes("VmRSS")
        t0 = time.perf_counter()
        raw = read_file(args.model)
        read_s = time.perf_counter() - t0
        if args.base:
            tflite, rows = _patched(args, raw, read_s)
        else:
            tflite, rows = _decoded(args, raw, read_s)
        decode_peak = _status_bytes("VmHWM") if measured else None
        if args.write_tflite:
            write_atomic(args.write_tflite, tflite)
        interpreter = None
        if args.data:
            # the interpreter is only needed to classify: decoding works without any runtime
            from pydsz.format.interpreter import make_interpreter

            t1 = time.perf_counter()
            interpreter = make_interpreter(tflite, num_threads=args.threads)
            interpreter.allocate_tensors()
            rows.append(["interpreter load", 1e3 * (time.perf_counter() - t1)])
        print(format_table(["stage", "ms"], [[name, f"{ms:.1f}"] for name, ms in rows]))
        if not args.base:
            print("(value decoding is timed in a separate pass: the decoder fuses it with reconstruction)")

        line = f"peak memory: {_mb(_process_peak())} resident (whole process)"
        if decode_peak is not None and before is not None:
            line += (f"; reading and decoding added {_mb(decode_peak - before)} "
                     f"for a {_mb(len(tflite))} model from a {_mb(len(raw))} file")
        print(line)

        if interpreter is not None:
            from pydsz.model.runtime import predict, top1

            t2 = time.perf_counter()
            scores = predict(interpreter, x)
            elapsed = time.perf_counter() - t2
            print(f"top-1 accuracy {100 * top1(scores, y):.2f}% on {len(y)} samples "
                  f"({1e3 * elapsed / len(y):.3f} ms per sample)")
    except pydsz.DszError as exc:
        print(f"edge_demo: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
