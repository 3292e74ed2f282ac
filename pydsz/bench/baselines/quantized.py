"""TFLite-style weight quantization as a baseline, each tensor zstd -19 compressed afterwards.

"float16": the weights as IEEE half floats (TFLite's float16 quantization). An integer b (8 is
what dynamic-range quantization stores): symmetric per-output-channel quantization, each row of
the [out, in] matrix scaled by max|row| / (2**(b-1) - 1) and rounded to an int8 code; the float32
scales are stored with the codes. Bit widths below 8 still store one int8 per weight (zstd then
finds the unused range): they are the knob of the accuracy/size curve, not a packed format.

For whole models (pydsz.bench.headtohead), `per_channel` and `blockwise` give the codes and scales of
the LiteRT Quantizer's CHANNELWISE and BLOCKWISE_32 schemes on any layer: the channel axis is the
one TFLite quantizes along for the op (`channel_axis`: the last for a depthwise kernel
[1, H, W, C*M], the first for FULLY_CONNECTED [out, in] and CONV_2D OHWI), blocks run along the
input axis (the last).
"""

from __future__ import annotations

import struct

import numpy as np

from pydsz.bench.baselines import lossless, pack_shape, unpack_shape
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


def channel_axis(op: str, ndim: int) -> int:
    """The axis TFLite keeps one scale per index of, for a weight of `op` (a builtin op name)."""
    return ndim - 1 if op == "DEPTHWISE_CONV_2D" else 0


def per_channel(w: np.ndarray, bits: int, axis: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Symmetric int-b along `axis`: (codes, float32 scales, the dequantized float32 weights). Codes
    are int8 up to 8 bits, int16 up to 16 (wider than any LiteRT type: a point of the curve only)."""
    if not 2 <= int(bits) <= 16:
        raise InputError(f"per-channel quantization to {bits} bits: give 2..16")
    w = np.asarray(w, np.float32)
    top = 2 ** (int(bits) - 1) - 1
    others = tuple(i for i in range(w.ndim) if i != axis)
    s = (np.abs(w).max(axis=others, keepdims=True) / np.float32(top)).astype(np.float32) if w.size else \
        np.zeros([1] * w.ndim, np.float32)
    q = np.clip(np.rint(w / np.where(s > 0, s, 1)), -top, top).astype(np.int8 if bits <= 8 else np.int16)
    return q, s.reshape(-1), (q.astype(np.float32) * s).astype(np.float32)


def blockwise(w: np.ndarray, bits: int = 4, block: int = 32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Symmetric int-b with one scale per `block` consecutive values along the last (input) axis:
    (codes packed as LiteRT stores int4, two per byte, low nibble first; float32 scales; the
    dequantized weights). InputError where the input axis is not a multiple of the block, which the
    LiteRT Quantizer refuses too."""
    w = np.asarray(w, np.float32)
    if w.ndim == 0 or w.shape[-1] % block:
        raise InputError(f"blockwise int{bits}: the input axis ({w.shape[-1] if w.ndim else 0} values) is not a "
                         f"multiple of the block ({block})")
    top = 2 ** (bits - 1) - 1
    blocks = w.reshape(-1, block)
    s = (np.abs(blocks).max(axis=1, keepdims=True) / np.float32(top)).astype(np.float32)
    q = np.clip(np.rint(blocks / np.where(s > 0, s, 1)), -top, top).astype(np.int8)
    nibbles = (q.reshape(-1) & 0xF).astype(np.uint8)
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    packed = nibbles[0::2] | (nibbles[1::2] << 4) if bits <= 4 else q.reshape(-1).view(np.uint8)
    return packed, s.reshape(-1), (q.astype(np.float32) * s).reshape(w.shape).astype(np.float32)


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
