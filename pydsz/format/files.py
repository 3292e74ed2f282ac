"""Files in and out: one-line errors instead of OSError tracebacks, and no partial output.

An output is checked before any work (check_output: a command that runs for minutes must not find
only at its end that it cannot write), then written through a temporary file in the same folder,
fsynced and renamed over the target: an error or a signal at any point leaves the target as it was
and no temporary file behind. Every OSError becomes an InputError that names the path and the cause.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Mapping

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


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def check_output(path, *inputs, what: str = "output") -> Path:
    """`path` as an output can be written: InputError where it is empty, a directory, one of `inputs`
    (by name or as the same file under another), or in a folder that does not exist or cannot be
    written. Nothing is created."""
    if path is None or str(path).strip() == "":
        raise InputError(f"the {what} path is empty")
    path = Path(path)
    for given in inputs:
        if given is not None and str(given) != "" and _same_file(path, Path(given)):
            raise InputError(f"{path}: the {what} would overwrite the input {given}; give another path")
    if path.is_dir():
        raise InputError(f"{path}: is a directory; give a file name for the {what}")
    folder = path.parent
    if not folder.is_dir():
        raise InputError(f"{path}: cannot write: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{path}: cannot write: permission denied in {folder}")
    if path.exists() and not os.access(path, os.W_OK) and not os.access(folder, os.W_OK):
        raise InputError(f"{path}: cannot write: permission denied")
    return path


def check_folder(directory, *inputs, what: str = "report folder") -> Path:
    """`directory` can take output files: an existing folder, or a new one in an existing folder.
    InputError otherwise (a file of that name, no parent, not writable, one of `inputs`)."""
    if directory is None or str(directory).strip() == "":
        raise InputError(f"the {what} path is empty")
    directory = Path(directory)
    for given in inputs:
        if given is not None and str(given) != "" and _same_file(directory, Path(given)):
            raise InputError(f"{directory}: the {what} is the input {given}; give another path")
    if directory.exists() and not directory.is_dir():
        raise InputError(f"{directory}: is a file; give a folder for the {what}")
    existing = directory if directory.is_dir() else directory.parent
    if not existing.is_dir():
        raise InputError(f"{directory}: cannot write: the folder {existing} does not exist")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"{directory}: cannot write: permission denied in {existing}")
    return directory


def write_atomic(path, data: bytes) -> None:
    """Write `data` to `path` whole or not at all: through a temporary file in the same folder,
    fsynced, then renamed over `path` (an existing file stays as it was until the rename). An OSError
    (a full disk, a folder that cannot be written, a directory in the way) is an InputError naming
    the path and the cause; any exception or signal on the way removes the temporary file."""
    path = check_output(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise InputError(f"{path}: cannot write: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        # mkstemp creates 0600; give the file the permissions an ordinary open() would
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise InputError(f"{path}: cannot write: {exc.strerror or exc}") from None
        raise


def write_files(directory, files: Mapping[str, bytes]) -> list[Path]:
    """Write each of `files` ({name: bytes}) into `directory` (created if missing) with write_atomic,
    all or none: where one fails, those written here are removed again, and the folder too if this
    call created it. Returns the paths written."""
    directory = check_folder(directory)
    created = not directory.exists()
    try:
        directory.mkdir(parents=False, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{directory}: cannot create the folder: {exc.strerror}") from None
    written: list[Path] = []
    try:
        for name, data in files.items():
            write_atomic(directory / name, data)
            written.append(directory / name)
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        if created:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    return written
