"""TFLite-style weight quantization as a baseline, each tensor zstd -19 compressed afterwards.

"float16": the weights as IEEE half floats (TFLite's float16 quantization). An integer b (8 is
what dynamic-range quantization stores): symmetric per-output-channel quantization, each row of
the [out, in] matrix scaled by max|row| / (2**(b-1) - 1) and rounded to an int8 code; the float32
scales are stored with the codes. Bit widths below 8 still store one int8 per weight (zstd then
finds the unused range): they are the knob of the accuracy/size curve, not a packed format.
"""

from __future__ import annotations

import struct

import numpy as np

from pydsz.baselines import lossless, pack_shape, unpack_shape
from pydsz.errors import FormatError, InputError

FLOAT16 = "float16"
_KIND = struct.Struct("<B")  # 0: float16, else the bit width


def _rows(w: np.ndarray) -> np.ndarray:
    return w.reshape(w.shape[0] if w.ndim else 1, -1)


def scales(w: np.ndarray, bits: int) -> np.ndarray:
    """Per-output-channel scales (float32): max |w| of the row over the largest code."""
    top = np.abs(_rows(np.asarray(w, np.float32))).max(axis=1)
    return (top / np.float32(2 ** (bits - 1) - 1)).astype(np.float32)


def encode(w: np.ndarray, setting=8) -> bytes:
    """Shape, the kind, and zstd -19 of the half floats or of the scales and int8 codes."""
    w = np.ascontiguousarray(w, np.float32)
    if setting == FLOAT16:
        return pack_shape(w.shape) + _KIND.pack(0) + lossless.zstd19(w.astype("<f2").tobytes())
    bits = int(setting)
    if not 2 <= bits <= 8:
        raise InputError(f"quantization to {setting!r}: give float16 or a bit width in 2..8")
    s = scales(w, bits)
    top = 2 ** (bits - 1) - 1
    safe = np.where(s > 0, s, 1)[:, None]
    q = np.clip(np.rint(_rows(w) / safe), -top, top).astype(np.int8)
    return pack_shape(w.shape) + _KIND.pack(bits) + lossless.zstd19(s.astype("<f4").tobytes() + q.tobytes())


def decode(buf: bytes) -> np.ndarray:
    shape, pos = unpack_shape(buf, "quantized stream")
    if len(buf) < pos + 1:
        raise FormatError("quantized stream: truncated")
    (kind,) = _KIND.unpack_from(buf, pos)
    raw = lossless.unzstd(bytes(buf[pos + 1:]))
    size = int(np.prod(shape))
    if kind == 0:
        if len(raw) != 2 * size:
            raise FormatError(f"quantized stream: {len(raw)} bytes of float16 for shape {shape}")
        return np.frombuffer(raw, "<f2").astype(np.float32).reshape(shape)
    rows = shape[0] if shape else 1
    if len(raw) != 4 * rows + size:
        raise FormatError(f"quantized stream: {len(raw)} bytes of scales and codes for shape {shape}")
    s = np.frombuffer(raw, "<f4", rows)
    q = np.frombuffer(raw, np.int8, size, 4 * rows).reshape(rows, -1)
    return (q.astype(np.float32) * s[:, None]).reshape(shape)
