"""The assessment's tasks: one candidate measured, a layer alone or a group of layers together, each
a module-level function of an Evaluator that an executor (pydsz.assess.executor) runs where it likes."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from pydsz.assess.evaluator import Evaluator
from pydsz.assess.ladder import Ladder, Point, scale, top
from pydsz.encode.pack import lossless_size
from pydsz.encode.tensor import encode_weight, lossless_parts, matrix
from pydsz.format import codec


def measure_point(evaluator: Evaluator, name: str, bound: float, part: int = 0, weight: Optional[np.ndarray] = None,
                  pattern: Optional[codec.SparseIndex] = None) -> Point:
    """Layer `name` alone compressed at `bound` (an executor's task; a Ladder's (bound, part)).
    weight: what bound 0 keeps, with its codec.sparse_index as `pattern` (default: the layer's stored
    weights, whose pattern the evaluator keeps: the index section depends on where the non-zeros
    are, not on the bound); a bound > 0 encodes evaluator.candidate(name, bound). Bound 0 is the
    original, so its loss is 0 without evaluating; a float layer's is the size of one of its
    lossless parts (`part`)."""
    if weight is None:
        weight, pattern = stored_pattern(evaluator, name)
    if bound == 0:
        stored = codec.stored_array(weight)
        if stored.dtype.kind == "f":
            size = lossless_size(lossless_parts(stored)[part])
        else:
            _, size, _, _ = encode_weight(stored, 0.0, pattern)
        return Point(name, 0.0, size, size, 0, 0.0)
    stream, dense, (size, data, index) = evaluator.encode(name, bound, pattern)
    m = evaluator.measure(evaluator.decoded({name: (stream, dense, evaluator.model.layer(name).shape)}), {name: bound})
    return Point(name, bound, size, data, index, m.loss, m.noise, m.lost, m.gained)


def stored_pattern(evaluator: Evaluator, name: str) -> tuple:
    """A layer's stored weights and their codec.sparse_index, kept by the evaluator."""
    if name not in evaluator.patterns:
        stored = np.asarray(evaluator.model.stored(name))
        evaluator.patterns[name] = stored, codec.sparse_index(matrix(stored))
    return evaluator.patterns[name]


def group_bounds(evaluator: Evaluator, names: Sequence[str], level: float) -> dict:
    """Each layer's bound at a group's `level`: level times the layer's scale (pydsz.assess.ladder.scale), at
    most twice its largest magnitude."""
    bounds = {}
    for name in names:
        stored, _ = stored_pattern(evaluator, name)
        bounds[name] = min(level * scale(stored), top(stored))
    return bounds


def measure_group(evaluator: Evaluator, names: tuple, level: float) -> tuple:
    """Layers `names` compressed together, each at its bound of a group's `level` (group_bounds; 0:
    lossless): one Point per layer with its own sizes and the group's loss (an executor's task)."""
    if level == 0:
        return tuple(measure_point(evaluator, name, 0.0) for name in names)
    streams, sizes = {}, {}
    bounds = group_bounds(evaluator, names, level)
    for name, bound in bounds.items():
        _, layer_pattern = stored_pattern(evaluator, name)
        stream, dense, sizes[name] = evaluator.encode(name, bound, layer_pattern)
        streams[name] = (stream, dense, evaluator.model.layer(name).shape)
    m = evaluator.measure(evaluator.decoded(streams), bounds)
    return tuple(Point(name, level, *sizes[name], m.loss, m.noise, m.lost, m.gained) for name in names)


def measure_task(evaluator: Evaluator, name, bound: float, part: int = 0):
    """An executor's task: measure_group for a group (a tuple of names), else measure_point."""
    if isinstance(name, tuple):
        return measure_group(evaluator, name, bound)
    return measure_point(evaluator, name, bound, part)


def assess_layer(evaluator: Evaluator, name: str, weight: np.ndarray, allowed: float,
                 on_point: Optional[Callable[[Point], None]] = None) -> list[Point]:
    """Measure one layer alone over its Ladder of bounds, here, one bound after the other; sorted by
    bound, bound 0 first. `allowed` is the loss the budget allows, summed over the samples (for top-1: samples)."""
    ladder = Ladder(name, weight, allowed, evaluator.metric.discrete)
    pattern = codec.sparse_index(matrix(weight))
    while (task := ladder.next()) is not None:
        ladder.issue(task)
        point = ladder.add(task, measure_point(evaluator, name, *task, weight, pattern))
        if on_point and point:
            on_point(point)
    return ladder.points()
