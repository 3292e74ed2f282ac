"""Files in and out: one-line errors instead of OSError tracebacks, and no partial output."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pydsz.errors import InputError


def read_file(path) -> bytes:
    """A file's bytes, with a one-line InputError instead of an OSError traceback."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory") from None
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror}") from None


def write_atomic(path, data: bytes) -> None:
    """Write through a temporary file in the same directory and rename it, so no partial file is ever left."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    except OSError as exc:
        raise InputError(f"{path}: cannot write: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        # mkstemp creates 0600; give the file the permissions an ordinary open() would
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
