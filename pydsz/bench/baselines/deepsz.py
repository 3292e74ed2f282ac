"""DeepSZ as published (Jin et al., HPDC 2019), the baseline `dsz bench` holds pydsz against.

Per FC layer of the pruned model: the data array (the non-zeros in row-major order, plus a zero
for every filler entry) is compressed by SZ3 with an absolute bound; the index array holds each
entry's distance from the previous one in 8 bits, with a filler entry (value zero) wherever a
distance exceeds 256, and is compressed with the best of zstd, lzma, bz2 and zlib. SZ 2.1, which
the paper used, is not packaged; SZ3 is its successor and compresses these arrays at least as well.

Bounds come from the paper's fixed grid (1e-3 ... 9e-3, as its public scripts sweep): every layer
is measured alone at every grid bound, and a dynamic programme over the grid picks the bounds of
least total size whose summed accuracy losses fit the budget (the paper's additive-loss model; the
measured losses are taken at face value, with no noise margin and no verification of the result,
as in the paper). pydsz.budget.knapsack is that dynamic programme; it counts a negative measured loss
(a layer that happened to fix samples) as zero.
"""

from __future__ import annotations

import struct
from typing import Callable, Mapping, Optional

import numpy as np

from pydsz.assess.evaluator import Evaluator
from pydsz.assess.ladder import Point
from pydsz.bench.baselines import lossless, pack_shape, positions_of, relative_index, sz3, unpack_shape
from pydsz.budget.knapsack import Option, loss_unit, minimize_size
from pydsz.errors import FormatError

GRID = tuple(k * 1e-3 for k in range(1, 10))
INDEX_BITS = 8
_SZ3_BYTES = struct.Struct("<I")


def encode(w: np.ndarray, bound: float) -> bytes:
    """Shape, the SZ3 stream of the data array, the best-fit compressed index array."""
    w = np.ascontiguousarray(w, np.float32)
    symbols, positions = relative_index(w, INDEX_BITS)
    data = sz3.compress(w.reshape(-1)[positions], bound)
    index = lossless.best_fit(symbols.astype(np.uint8).tobytes())
    return pack_shape(w.shape) + _SZ3_BYTES.pack(len(data)) + data + index


def sections(buf: bytes) -> tuple[tuple, bytes, bytes]:
    """(shape, SZ3 stream, compressed index) of an `encode` stream."""
    shape, pos = unpack_shape(buf, "DeepSZ stream")
    if len(buf) < pos + _SZ3_BYTES.size:
        raise FormatError("DeepSZ stream: truncated")
    (n,) = _SZ3_BYTES.unpack_from(buf, pos)
    pos += _SZ3_BYTES.size
    if len(buf) < pos + n:
        raise FormatError("DeepSZ stream: truncated data array")
    return shape, bytes(buf[pos:pos + n]), bytes(buf[pos + n:])


def decode(buf: bytes) -> np.ndarray:
    """The dense float32 tensor: SZ3's values scattered to the index's positions."""
    shape, data, index = sections(buf)
    size = int(np.prod(shape))
    positions = positions_of(np.frombuffer(lossless.unfit(index), np.uint8), size, "DeepSZ stream")
    values = sz3.decompress(data)
    if values.size != positions.size:
        raise FormatError(f"DeepSZ stream: {values.size} values for {positions.size} index entries")
    out = np.zeros(size, np.float32)
    out[positions] = values
    return out.reshape(shape)


def assess(evaluator: Evaluator, weights: Mapping[str, np.ndarray], grid=GRID,
           on_point: Optional[Callable[[Point], None]] = None) -> tuple[dict[str, list[Point]], dict]:
    """Every layer alone at every grid bound, decoded and evaluated: (points by layer, streams by
    (layer, bound)). Only one layer is compressed per test, as in the paper."""
    table, streams = {}, {}
    for name, w in weights.items():
        table[name] = []
        for bound in grid:
            stream = encode(w, bound)
            _, data, index = sections(stream)
            m = evaluator.measure({name: decode(stream)})
            point = Point(name, bound, len(stream), len(data), len(index), m.loss, m.noise, m.lost, m.gained)
            table[name].append(point)
            streams[name, bound] = stream
            if on_point:
                on_point(point)
    return table, streams


def choose(table: Mapping[str, list[Point]], allowed: float, samples: int, discrete: bool = True) -> dict[str, float]:
    """The paper's optimizer: per-layer bounds of least total size whose summed measured losses are
    at most `allowed` (summed over the samples: for top-1, samples). Where even the smallest grid
    bounds do not fit, those are taken: the grid has nothing tighter."""
    options = {name: [Option(p.bound, p.size, p.loss / samples) for p in points] for name, points in table.items()}
    plan = minimize_size(options, allowed / samples, loss_unit(samples, discrete, allowed))
    if plan is None:
        return {name: min(p.bound for p in points) for name, points in table.items()}
    return {name: option.bound for name, option in plan.choice.items()}
