"""The anchors of the field, re-implemented as baselines for `dsz bench` (pydsz/bench/anchors.py).

One module per method; each is a per-tensor codec, `encode(w, setting) -> bytes` and
`decode(buf) -> ndarray`, whose bytes hold everything the decoder needs (shape, tables, codebooks),
so that the sizes compared are the sizes stored:

  deepsz            DeepSZ as published: SZ3 on the data arrays (fillers included), 8-bit gaps with
                    filler zeros compressed with the best of zstd/lzma/bz2/zlib, the paper's 9-point
                    grid of bounds and its additive-loss optimizer
  deep_compression  Deep Compression: k-means weight sharing (linear init), Huffman-coded cluster
                    indices and Huffman-coded 5-bit relative position indices with filler zeros
  quantized         float16, and int-b symmetric per-output-channel quantization, zstd -19 after
  lossless          zstd -19 of the float32 bytes
  sz3               the SZ3 codec through hdf5plugin's HDF5 filter
  huffman           canonical Huffman coding of small alphabets (numpy)
"""

from __future__ import annotations

import struct

import numpy as np

from pydsz.errors import FormatError

_NDIM = struct.Struct("<B")
_DIM = struct.Struct("<I")


def pack_shape(shape: tuple) -> bytes:
    """The tensor's shape as bytes: ndim (u8), then each dimension (u32)."""
    return _NDIM.pack(len(shape)) + b"".join(_DIM.pack(int(d)) for d in shape)


def unpack_shape(buf: bytes, what: str) -> tuple[tuple, int]:
    """(shape, bytes read) from the front of buf."""
    if len(buf) < 1:
        raise FormatError(f"{what}: empty stream")
    (ndim,) = _NDIM.unpack_from(buf)
    end = 1 + 4 * ndim
    if len(buf) < end:
        raise FormatError(f"{what}: truncated shape")
    return tuple(_DIM.unpack_from(buf, 1 + 4 * i)[0] for i in range(ndim)), end


def relative_index(w: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Deep Compression's (and DeepSZ's) relative index of the non-zeros of w in row-major order.

    Each entry stores its distance from the previous entry minus one in `bits` bits; where the
    distance exceeds 2**bits, filler entries (value zero) are inserted every 2**bits positions.
    Returns (symbols, positions) of all entries, fillers included; the decoder recovers the
    positions as cumsum(symbols + 1) - 1.
    """
    step = 1 << bits
    positions = np.flatnonzero(np.asarray(w).reshape(-1))
    gaps = np.diff(positions, prepend=-1)
    fillers = (gaps - 1) // step
    ends = np.cumsum(fillers + 1) - 1  # each non-zero's entry, after its fillers
    symbols = np.full(int(ends[-1]) + 1 if ends.size else 0, step - 1, np.int64)
    symbols[ends] = gaps - fillers * step - 1
    return symbols, np.cumsum(symbols + 1) - 1


def positions_of(symbols: np.ndarray, size: int, what: str) -> np.ndarray:
    """The entries' flat positions from their relative index; FormatError past the tensor's end."""
    positions = np.cumsum(np.asarray(symbols, np.int64) + 1) - 1
    if positions.size and positions[-1] >= size:
        raise FormatError(f"{what}: index runs past the tensor's {size} values")
    return positions
