"""Lossless only: zstd -19 of a tensor's float32 bytes; and DeepSZ's best-fit lossless choice."""

from __future__ import annotations

import bz2
import lzma
import zlib

import numpy as np
import zstandard

from pydsz.bench.baselines import pack_shape, unpack_shape
from pydsz.errors import FormatError

LEVEL = 19


def zstd19(raw: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=LEVEL).compress(raw)


def unzstd(buf: bytes) -> bytes:
    try:
        return zstandard.ZstdDecompressor().decompress(buf)
    except zstandard.ZstdError as exc:
        raise FormatError(f"zstd section: {exc}") from None


# DeepSZ compresses each index array with whichever general-purpose compressor does best
_CODECS = {
    1: (zstd19, unzstd),
    2: (lambda b: lzma.compress(b, preset=9), lzma.decompress),
    3: (lambda b: bz2.compress(b, 9), bz2.decompress),
    4: (lambda b: zlib.compress(b, 9), zlib.decompress),
}


def best_fit(raw: bytes) -> bytes:
    """The smallest of zstd -19, lzma, bz2 and zlib on raw, behind a one-byte codec id."""
    return min((bytes([cid]) + enc(raw) for cid, (enc, _) in _CODECS.items()), key=len)


def unfit(buf: bytes) -> bytes:
    """Inverse of best_fit."""
    if not buf or buf[0] not in _CODECS:
        raise FormatError("best-fit section: unknown codec id")
    try:
        return _CODECS[buf[0]][1](bytes(buf[1:]))
    except (lzma.LZMAError, OSError, ValueError, zlib.error) as exc:
        raise FormatError(f"best-fit section: {exc}") from None


def encode(w: np.ndarray, setting=None) -> bytes:
    """The tensor's shape and zstd -19 of its float32 bytes (`setting` is unused: nothing to tune)."""
    w = np.ascontiguousarray(w, np.float32)
    return pack_shape(w.shape) + zstd19(w.tobytes())


def decode(buf: bytes) -> np.ndarray:
    shape, pos = unpack_shape(buf, "lossless stream")
    raw = unzstd(bytes(buf[pos:]))
    if len(raw) != 4 * int(np.prod(shape)):
        raise FormatError(f"lossless stream: {len(raw)} bytes for shape {shape}")
    return np.frombuffer(raw, "<f4").reshape(shape).astype(np.float32)
