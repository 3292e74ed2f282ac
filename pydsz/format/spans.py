"""Several small tensors as one stream: a gathered .dsz entry (doc/format.md), as decoders read it
(pydsz.encode.gather chooses and writes them).

A stream's header, code table and table entry cost 150-350 bytes whatever it holds; a 64-weight
depthwise kernel at a fine bound codes in ~50. A model of many small layers (hand_recrop: 13 of its 22
compressed kernels hold at most 300 weights) then spends more on headers than on weights, and its
biases and PReLU slopes (pydsz.encode.constants) are too small for a stream each at all.

Gathered, each part keeps its own bound: its values are quantized with its own step (twice the bound,
a hair less so that the rounding of the reconstruction to the stored dtype stays within it), and the
integers of several parts are coded together, losslessly, by one array stream with one code table. A
decoder writes each span's integers times its step, rounded once to the stored dtype (float32 or
float16: an entry holds one).

Which kernels join, and which parts share a stream, is decided by the bytes (choose): parts of alike
integers share one, and a kernel whose own stream costs less keeps it.
"""

from __future__ import annotations

import math
import struct
from typing import Callable

import numpy as np

from pydsz.errors import FormatError

# the integers a gathered stream of each dtype holds exactly (beyond them, not every integer is one)
MAX_INTEGER = {"float32": 2 ** 24, "float16": 2 ** 11}
# a gathered table entry's spans: their count, then each one's offset in the model, count of values, step
COUNT = struct.Struct("<I")
SPAN = struct.Struct("<QIf")






def dequantize(q: np.ndarray, step: float, dtype) -> np.ndarray:
    """What a decoder writes for a span: each integer times the step, in float64, rounded once to the
    stored dtype (float32 or float16)."""
    with np.errstate(over="ignore"):  # only a corrupt file's values overflow (to inf)
        return (np.asarray(q, np.float64) * step).astype(dtype)


def spans_bytes(spans: tuple) -> bytes:
    """A gathered entry's spans as its table entry holds them, after its name: their count, then each."""
    return COUNT.pack(len(spans)) + b"".join(SPAN.pack(*span) for span in spans)


def read_spans(unpack: Callable, what: str, ndim: int, n: int, dtype: str, offset: int, model_bytes: int) -> tuple:
    """A gathered entry's spans read from a file with `unpack` (a struct -> its values, bounds-checked):
    FormatError unless the dtype is float32 or float16, the entry one-dimensional, and its 1..n spans
    each of at least one value and inside the model, together the stream's n values, the first at the
    entry's offset, each step finite and positive."""
    (count,) = unpack(COUNT)
    if ndim != 1 or not 1 <= count <= n:
        raise FormatError(f"{what}: a gathered entry is one-dimensional with 1..{n} places, not {count}")
    spans = tuple(unpack(SPAN) for _ in range(count))
    if dtype not in MAX_INTEGER:
        raise FormatError(f"{what}: a gathered entry holds float32 or float16 values, not {dtype}")
    itemsize = np.dtype(dtype).itemsize
    if any(c < 1 or o + c * itemsize > model_bytes for o, c, _ in spans) or sum(c for _, c, _ in spans) != n \
            or spans[0][0] != offset:
        raise FormatError(f"{what}: its places do not fit a model of {model_bytes} bytes or do not hold its {n} values")
    if any(not (np.isfinite(step) and step > 0) for _, _, step in spans):
        raise FormatError(f"{what}: a step is not a positive number")
    return spans


def scatter(out: np.ndarray, spans: tuple, values: np.ndarray, itemsize: int) -> None:
    """Write a gathered entry's decoded values into their places of the model (out: uint8)."""
    values, at = values.reshape(-1), 0
    for offset, count, step in spans:
        out[offset:offset + count * itemsize] = dequantize(values[at:at + count], step, values.dtype).view(np.uint8)
        at += count


def label(names: list) -> str:
    """How a gathered entry is listed: its layers, and how many constants it holds."""
    layers = [n.split(":")[0] for n in names if n]
    constants_held = len(names) - len(layers)
    return "gathered: " + ", ".join(layers + ([f"{constants_held} constants"] if constants_held else []))


def named(names: list, spans: tuple, values: np.ndarray) -> dict:
    """The decoded values of the spans with a name, by layer: a kernel's span is named "conv6:1x3x3x8"
    (its layer and shape), a constant's "". FormatError where a name's shape does not hold its span."""
    out, at = {}, 0
    for name, (_, count, step) in zip(names, spans):
        span = values.reshape(-1)[at:at + count]
        at += count
        if name:
            layer, _, dims = name.partition(":")
            shape = tuple(int(d) for d in dims.split("x")) if dims.replace("x", "").isdigit() else ()
            if math.prod(shape) != count:
                raise FormatError(f"gathered span {name!r}: its shape does not hold its {count} values")
            out[layer] = dequantize(span, step, span.dtype).reshape(shape)
    return out








