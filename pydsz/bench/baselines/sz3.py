"""SZ3 (absolute error mode) as a bytes codec, through the hdf5plugin package's HDF5 filter.

SZ3 has no Python binding of its own here; hdf5plugin ships its HDF5 filter. Encoding writes the
array as the single chunk of a dataset in an in-memory HDF5 file and keeps that chunk's stored
bytes: the SZ3 stream. Decoding writes those bytes back as the chunk of a fresh dataset and reads
it, so the filter really decodes the stream. HDF5 stores a chunk unfiltered when the filter gives
up (tiny arrays); the filter mask that says so travels with the stream.
"""

from __future__ import annotations

import io
import struct

import numpy as np

from pydsz.errors import FormatError, InputError

# filter mask (u32), number of values (u64)
_HEADER = struct.Struct("<IQ")
HEADER_BYTES = _HEADER.size  # what `compress` adds to SZ3's own stream


def _modules():
    try:
        import h5py
        import hdf5plugin
    except ImportError:
        raise InputError("the SZ3 baseline needs h5py and hdf5plugin: pip install 'pydsz[bench]'") from None
    return h5py, hdf5plugin


def compress(x: np.ndarray, bound: float) -> bytes:
    """SZ3's stream of a 1-D float32 array, every value within `bound` (absolute) once decoded."""
    h5py, hdf5plugin = _modules()
    x = np.ascontiguousarray(x, np.float32).reshape(-1)
    if x.size == 0:
        return _HEADER.pack(0, 0)
    bio = io.BytesIO()
    with h5py.File(bio, "w") as f:
        f.create_dataset("x", data=x, chunks=x.shape, **hdf5plugin.SZ3(absolute=bound))
    with h5py.File(bio, "r") as f:
        mask, chunk = f["x"].id.read_direct_chunk((0,))
    return _HEADER.pack(mask, x.size) + bytes(chunk)


def decompress(buf: bytes) -> np.ndarray:
    """The float32 values of a `compress` stream."""
    h5py, hdf5plugin = _modules()
    if len(buf) < _HEADER.size:
        raise FormatError("SZ3 stream: truncated header")
    mask, n = _HEADER.unpack_from(buf)
    if n == 0:
        return np.zeros(0, np.float32)
    bio = io.BytesIO()
    with h5py.File(bio, "w") as f:
        # the bound only matters to an encoder; the stream carries its own
        d = f.create_dataset("x", shape=(n,), dtype=np.float32, chunks=(n,), **hdf5plugin.SZ3(absolute=1.0))
        d.id.write_direct_chunk((0,), bytes(buf[_HEADER.size:]), mask)
    try:
        with h5py.File(bio, "r") as f:
            return f["x"][()]
    except OSError as exc:
        raise FormatError(f"SZ3 stream: does not decode ({exc})") from None
