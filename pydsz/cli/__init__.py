"""The `dsz` command line.

Exit status (EXIT_STATUS, also in `dsz --help`): 0 on success, 1 on a user error (one line on stderr,
no traceback), 2 on a usage error, 130 on SIGINT, 143 on SIGTERM. Every output path is checked before
the work starts, then written to a temporary file, fsynced and renamed, so neither a failure nor a
signal ever leaves a partial file.
The commands live in groups: model_files (pack, decompress, info, eval), compression (compress,
prune, demo) and benchmark (bench); options holds what they share.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys

from pydsz.cli import benchmark, compression, model_files, updates
from pydsz.cli.options import default_threads
from pydsz.errors import DszError
from pydsz.model import runtime

EXIT_STATUS = ("exit status: 0 success; 1 a user error (bad input, a file that cannot be read or written: one "
               "line on stderr); 2 a usage error; 130 interrupted (SIGINT); 143 terminated (SIGTERM). No output "
               "file is ever left partial.")


def _version() -> str:
    import pydsz
    from pydsz import _core
    from pydsz.format.container import FORMAT_VERSION

    lib = _core.VERSION_NUMBER
    return (f"dsz (pydsz) {pydsz.__version__}, libdsz {lib // 10000}.{lib // 100 % 100}.{lib % 100}, "
            f".dsz format version {FORMAT_VERSION}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsz", description="DeepSZ: error-bounded lossy compression "
                                     "of neural network weights (.tflite -> .dsz -> .tflite)", epilog=EXIT_STATUS)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    model_files.add_commands(sub)
    compression.add_commands(sub)
    benchmark.add_commands(sub)
    updates.add_commands(sub)
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


class Terminated(BaseException):
    """SIGTERM, raised where the process is, so that what is being written is removed as on SIGINT."""


def _terminate(signum, frame):
    raise Terminated()


def main(argv=None) -> int:
    args = build_parser().parse_args(_joined_values(sys.argv[1:] if argv is None else list(argv)))
    default_threads(args)
    runtime.pin_mmap_threshold()  # the peak the bound promises, whatever order arrays come in
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        with _native_stderr_silenced():
            args.func(args)
        sys.stdout.flush()
    except DszError as exc:
        print(f"dsz: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("dsz: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("dsz: terminated", file=sys.stderr)
        return 143
    except BrokenPipeError:
        # the reader of stdout went away (dsz info | head): nothing more to say to it; stdout points at
        # /dev/null so that the interpreter's own flush at exit does not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
