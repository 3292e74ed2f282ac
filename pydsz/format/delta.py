"""A model update's difference stream: a float32 array frame of the new values minus those a device
holds, which the device adds back in one pass in C (dsz_decodeArrayDelta; pydsz.compress.diff makes
them, doc/format.md's .dszu carries them)."""
from __future__ import annotations

from typing import Any

import numpy as np

from pydsz import _core
from pydsz.errors import FormatError
from pydsz.format import codec, wrapping


def encode(target: np.ndarray, base: np.ndarray, error_bound: float) -> bytes | None:
    """The float32 array stream of target - base that decode(stream, base) turns into values
    within error_bound of target (a model update's difference from the weights a device holds), or
    None where float32 cannot promise it: the sum's rounding on the device takes up to two ulps of
    the largest magnitude, which the difference's own bound leaves free."""
    t = np.ascontiguousarray(target, np.float32)
    b = np.ascontiguousarray(base, np.float32).reshape(t.shape)
    bound = bound_of(t, b, error_bound)
    if not bound > 0:
        return None
    stream = codec.compress_array(t - b, bound)
    out = decode(stream, b)
    return stream if np.abs(out.astype(np.float64) - t).max(initial=0.0) <= error_bound else None


def bound_of(target: np.ndarray, base: np.ndarray, error_bound: float) -> float:
    """The bound encode quantizes target - base at: error_bound less the four ulps of the
    largest magnitude that the device's float32 sum may round away (<= 0: none is left)."""
    largest = max(float(np.abs(target).max(initial=0.0)), float(np.abs(base).max(initial=0.0)))
    return float(error_bound) - 4 * float(np.spacing(np.float32(largest)))


def decode(buf: Any, base: np.ndarray) -> np.ndarray:
    """base (float32) plus a float32 compress_array stream's values, in one pass in C
    (dsz_decodeArrayDelta): a model update's difference applied to the weights a device holds."""
    info, u8 = codec._open_frame(buf, _core.KIND_ARRAY, "difference stream")
    if codec.DTYPE_NAMES.get(info["dtype"]) != "float32":
        raise FormatError("difference stream: not float32 values")
    held = np.ascontiguousarray(base, np.float32).reshape(-1)
    if held.size != info["n_elements"]:
        raise FormatError(f"difference stream: {info['n_elements']} values for a base of {held.size}")
    hs = info["header_size"]
    data = wrapping.inflate(info["data_lossless"], u8[hs:hs + info["data_stored"]], info["data_raw"],
                            "difference stream")
    out = np.empty(held.size, np.float32)
    try:
        _core.decode_array_delta(info, data, held, out)
    except _core.CoreError as e:
        raise FormatError(f"difference stream: data section: {e.name}") from None
    return out.reshape(info["shape"])
