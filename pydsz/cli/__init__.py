"""The `dsz` command line.

Exit status: 0 on success, 1 on a user error (one line on stderr, no traceback), 2 on a usage error.
Every output is written to a temporary file and renamed, so a failure never leaves a partial file.
The commands live in groups: model_files (pack, decompress, info, eval), compression (compress,
prune, demo) and benchmark (bench); options holds what they share.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

from pydsz.cli import benchmark, compression, model_files
from pydsz.cli.options import default_threads
from pydsz.errors import DszError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsz", description="DeepSZ: error-bounded lossy compression "
                                     "of neural network weights (.tflite -> .dsz -> .tflite)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    model_files.add_commands(sub)
    compression.add_commands(sub)
    benchmark.add_commands(sub)
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
    default_threads(args)
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
