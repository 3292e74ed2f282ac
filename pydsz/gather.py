"""Several small tensors as one stream: a gathered .dsz entry (doc/format.md).

A stream's header, code table and table entry cost 150-350 bytes whatever it holds; a 64-weight
depthwise kernel at a fine bound codes in ~50. A model of many small layers (hand_recrop: 13 of its 22
compressed kernels hold at most 300 weights) then spends more on headers than on weights, and its
biases and PReLU slopes (pydsz.constants) are too small for a stream each at all.

Gathered, each part keeps its own bound: its values are quantized with its own step (twice the bound,
a hair less so that the rounding of the reconstruction to the stored dtype stays within it), and the
integers of several parts are coded together, losslessly, by one array stream with one code table. A
decoder writes each span's integers times its step, rounded once to the stored dtype (float32 or
float16: an entry holds one).

Which kernels join, and which parts share a stream, is decided by the bytes (choose): parts of alike
integers share one, and a kernel whose own stream costs less keeps it.
"""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from pydsz import codec, constants
from pydsz.errors import FormatError

# the step is 2 x bound x HEADROOM: the product of an integer and the step, rounded to float32, is then
# within the bound of the value (the encoder checks every value and shrinks the step where it is not)
HEADROOM = 1 - 2.0 ** -20
# the integers a gathered stream of each dtype holds exactly (beyond them, not every integer is one)
MAX_INTEGER = {"float32": 2 ** 24, "float16": 2 ** 11}
# a kernel of more values than this keeps its own stream: its code table pays for itself
MAX_VALUES = 16384
# a gathered table entry's spans: their count, then each one's offset in the model, count of values, step
COUNT = struct.Struct("<I")
SPAN = struct.Struct("<QIf")
# a stream's header (array stream of one dimension: 56), data section fields (16) and table entry (48)
STREAM_BYTES = 120
# what a gathered stream's code table costs a symbol it codes, zstd-wrapped (hand_recrop's: 1 to 1.5)
TABLE_BYTES = 1.2


@dataclass
class Part:
    """One tensor to gather: its place in the model, its values (float32 or float16, as stored) and bound."""

    name: str  # the layer's name and shape ("conv6:1x3x3x8"), "" for a constant
    offset: int
    values: np.ndarray
    bound: float
    own_bytes: int = 0  # its own stream and table entry, for a kernel that may join or not

    @functools.cached_property
    def quantized(self) -> Optional[tuple[np.ndarray, float]]:
        """quantize(values, bound), computed once however many runs the part is tried in."""
        return quantize(self.values, self.bound)


def quantize(values: np.ndarray, bound: float) -> Optional[tuple[np.ndarray, float]]:
    """(integers in the values' dtype, step) whose products, rounded to that dtype, are within `bound` of
    `values`; None where the bound is finer than the dtype can hold them, or the integers would be too
    large for it (such a part keeps its own stream, whose outliers are stored verbatim)."""
    dtype = np.dtype(values.dtype)
    x = np.asarray(values, np.float64).reshape(-1)
    step = 2.0 * bound * HEADROOM
    for _ in range(8):
        step = float(np.float32(step))  # the file holds it as a float32
        if step <= 0 or not np.isfinite(step):
            return None
        q = np.rint(x / step)
        if np.all(np.abs(q) < MAX_INTEGER[dtype.name]) and np.all(np.abs(x - dequantize(q, step, dtype)) <= bound):
            return q.astype(dtype), step
        step *= 1 - 2.0 ** -12
    return None


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


def encode(parts: list) -> Optional[tuple[bytes, tuple]]:
    """One stream of the parts' integers, and the (offset, count, step) span of each part; None where a
    part's bound is too fine to gather (quantize)."""
    quantized = [p.quantized for p in parts]
    if any(q is None for q in quantized):
        return None
    q = np.concatenate([q for q, _ in quantized])
    # integers at bound 0.5 (a step of 1) are coded exactly; one beyond the radius is kept verbatim
    stream = codec.compress_array(q.astype(parts[0].values.dtype), 0.5, predictor="none")
    return stream, tuple((p.offset, p.values.size, step) for p, (_, step) in zip(parts, quantized))


def choose(fixed: list, kernels: list) -> list:
    """How to gather: `fixed` (the constants) always, and those of `kernels` (Parts whose own_bytes are
    set) that cost less gathered, in streams of parts alike: [(parts, stream, spans)] per stream.

    Integers of different widths sharing one code table pay for the mixture (hand_recrop: 8.6 KB of
    codes where each part coded alone would take 6.8 KB), and every stream pays its headers. So the
    parts are ordered by width (mean magnitude of their integers) and cut into runs by dynamic
    programming over estimated bytes (codes at the run's order-0 entropy, a code table of TABLE_BYTES a
    symbol, STREAM_BYTES of headers), where a kernel may also keep its own stream; the runs are then
    encoded."""
    # the fixed parts quantize (groups checked), a kernel that does not keeps its own stream
    pool = [(p, p.quantized[0]) for p in list(fixed) + [k for k in kernels if k.values.size <= MAX_VALUES]
            if p.quantized is not None]
    own = [p.own_bytes if p.name else np.inf for p, _ in pool]
    order = sorted(range(len(pool)), key=lambda i: float(np.mean(np.abs(pool[i][1]))))
    pool, own = [pool[i] for i in order], [own[i] for i in order]
    symbols = np.unique(np.concatenate([q for _, q in pool])) if pool else np.zeros(0)
    hists = [np.bincount(np.searchsorted(symbols, q), minlength=symbols.size) for _, q in pool]
    # best[i]: the least bytes for the first i parts; how[i]: (start of the last run, gathered?)
    m = len(pool)
    best, how = [0.0] + [np.inf] * m, [None] * (m + 1)
    for i in range(1, m + 1):
        if best[i - 1] + own[i - 1] < best[i]:
            best[i], how[i] = best[i - 1] + own[i - 1], (i - 1, False)
        counts, extra = np.zeros(symbols.size), 0.0
        for j in range(i - 1, -1, -1):  # the run [j, i), grown one part to the left at a time
            counts += hists[j]
            extra += SPAN.size + len(pool[j][0].name) + 1
            used = counts[counts > 0]
            total = used.sum()
            bits = total * np.log2(total) - float(np.sum(used * np.log2(used)))
            cost = best[j] + bits / 8 + TABLE_BYTES * used.size + STREAM_BYTES + extra
            if cost < best[i]:
                best[i], how[i] = cost, (j, True)
    runs, i = [], m
    while i > 0:
        j, gathered = how[i]
        if gathered:
            runs.append([pool[k][0] for k in range(j, i)])
        i = j
    out = []
    for parts in reversed(runs):
        if len(parts) > 1 or not parts[0].name:  # a kernel alone is cheaper in its own stream
            stream, spans = encode(parts)
            out.append((parts, stream, spans))
    return out


@dataclass
class Group:
    """One gathered entry: its span names ("" for a constant), stream, spans, largest bound and dtype."""

    names: list
    stream: bytes
    spans: tuple
    bound: float
    dtype: str

    @property
    def n(self) -> int:
        return sum(count for _, count, _ in self.spans)


def groups(model, kernels: list, rel: float, kinds: tuple, lossless_size: Callable) -> list:
    """The gathered entries of a model, one set per stored dtype (float32, float16): its constants
    (pydsz.constants, of the layer `kinds`), each within `rel` times its largest magnitude
    (constants.bounds), where that beats keeping them in the model's lossless rest (`lossless_size`
    of their values), with those `kernels` of the dtype that pay (choose)."""
    out = []
    for dtype in ("float32", "float16"):
        fixed = []
        buffers = constants.buffers(model, dtype.upper(), kinds) if rel > 0 else []
        arrays = constants.arrays(model, buffers)
        if arrays:
            parts = [Part("", model.place(b)[0], a, bound)
                     for b, a, bound in zip(buffers, arrays, constants.bounds(arrays, rel))]
            coded = encode(parts)
            if coded is not None and len(coded[0]) + SPAN.size * len(parts) < lossless_size(np.concatenate(arrays)):
                fixed = parts
        for parts, stream, spans in choose(fixed, [k for k in kernels if k.values.dtype == dtype]):
            out.append(Group([p.name for p in parts], stream, spans, max(p.bound for p in parts), dtype))
    return out
