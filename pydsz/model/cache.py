"""Where cached activations live: in memory, or memory-mapped from a temporary file.

Pruning and assessment cache a layer's inputs for a whole data set (N x 25088 float32 for a
VGG-16-shaped model: 100 KB a sample). When the user sets a limit (`--max-cache-memory`, or the
environment variable DSZ_MAX_CACHE_MEMORY, which worker processes inherit), arrays that would take
the cached bytes held in memory over it are backed by a file in the temporary directory ($TMPDIR)
instead; the file is unlinked at once, so it disappears with the array. Without a limit every
cache is an ordinary array. This module is the one place that decides.
"""

from __future__ import annotations

import os
import tempfile
import weakref

import numpy as np

from pydsz.errors import InputError

ENV = "DSZ_MAX_CACHE_MEMORY"
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}

_in_memory = _in_memory_peak = 0  # bytes of the caches held in memory now, and at most at one time
_now = _peak = 0  # bytes of all caches (in memory or mapped) now, and at most at one time


def parse_size(text: str) -> int:
    """Bytes in "2G", "500M", "64K" or "1048576" (binary units, an optional trailing B)."""
    s = text.strip().upper().removesuffix("B").removesuffix("I")
    number, unit = (s[:-1], s[-1]) if s and s[-1] in _UNITS else (s, "")
    try:
        value = float(number)
    except ValueError:
        raise InputError(f"size {text!r}: give a number of bytes with an optional K, M, G or T") from None
    if not value >= 0:
        raise InputError(f"size {text!r}: must not be negative")
    return int(value * _UNITS[unit])


def set_limit(text: str | None) -> None:
    """Limit the cached bytes held in memory (None: no limit); this process and those it starts."""
    if text is None:
        os.environ.pop(ENV, None)
    else:
        parse_size(text)
        os.environ[ENV] = text


def limit() -> int | None:
    """The limit in bytes, or None."""
    text = os.environ.get(ENV)
    return None if not text else parse_size(text)


def empty(shape, dtype=np.float32) -> np.ndarray:
    """An uninitialised array for a cache: in memory while the caches stay within the limit, else
    memory-mapped from an unlinked temporary file."""
    shape = tuple(int(d) for d in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return _held(np.empty(shape, dtype)) if _fits(nbytes) else _mapped(shape, dtype)


def keep(array: np.ndarray) -> np.ndarray:
    """`array` as a cache: itself while the caches stay within the limit, else a memory-mapped copy."""
    if _fits(array.nbytes):
        return _held(array)
    out = _mapped(array.shape, array.dtype)
    out[...] = array
    return out


def _fits(nbytes: int) -> bool:
    cap = limit()
    return cap is None or _in_memory + nbytes <= cap


def peak() -> int:
    """The most bytes the caches (in memory or mapped) took at one time in this process: the part
    of the peak memory that grows with the data set (cli prints it beside the peak)."""
    return _peak


def peak_in_memory() -> int:
    """The most bytes the caches held in memory at one time (peak() less what was mapped from disk)."""
    return _in_memory_peak


def _held(array: np.ndarray) -> np.ndarray:
    """An in-memory cache, counted against the limit until it is freed."""
    return _track(array, in_memory=True)


def _mapped(shape: tuple, dtype) -> np.ndarray:
    with tempfile.TemporaryFile(prefix="dsz-cache-") as f:
        f.truncate(max(1, int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize))
        # the mapping keeps the unlinked file's pages alive after the file object closes
        return _track(np.memmap(f, dtype=dtype, mode="r+", shape=shape), in_memory=False)


def _track(array: np.ndarray, in_memory: bool) -> np.ndarray:
    """Count a cache among all of them (and among those in memory) until it is freed."""
    global _now, _peak, _in_memory, _in_memory_peak
    _now += array.nbytes
    _peak = max(_peak, _now)
    if in_memory:
        _in_memory += array.nbytes
        _in_memory_peak = max(_in_memory_peak, _in_memory)
    weakref.finalize(array, _untrack, array.nbytes, in_memory)
    return array


def _untrack(nbytes: int, in_memory: bool) -> None:
    global _now, _in_memory
    _now -= nbytes
    if in_memory:
        _in_memory -= nbytes
