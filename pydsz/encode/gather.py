"""Which small tensors share a gathered stream, and the stream (pydsz.format.spans reads it back).

Which kernels join, and which parts share a stream, is decided by the bytes (choose): parts of alike
integers share one, and a kernel whose own stream costs less keeps it. Each part keeps its own bound:
its values are quantized with its own step (twice the bound, a hair less so that the rounding of the
reconstruction to the stored dtype stays within it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from pydsz.encode import constants
from pydsz.format import codec
from pydsz.format.spans import MAX_INTEGER, SPAN, dequantize

# the step is 2 x bound x HEADROOM: the product of an integer and the step, rounded to float32, is then
# within the bound of the value (the encoder checks every value and shrinks the step where it is not)
HEADROOM = 1 - 2.0 ** -20


# a kernel of more values than this keeps its own stream: its code table pays for itself
MAX_VALUES = 16384


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
    (pydsz.encode.constants, of the layer `kinds`), each within `rel` times its largest magnitude
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
