"""Step 2 of DeepSZ: each layer's loss in the chosen metric over a range of error bounds.

Which bounds a layer is measured at is decided as the measurements come in (pydsz.ladder), and which
layers are measured alone at all by the planner (pydsz.plan), which runs the tasks (pydsz.tasks) on an
executor. Losses are sums over the samples of the metric's per-sample loss, compressed minus original
(for top-1, samples lost minus samples gained: whole numbers, so exact). The Evaluator
(pydsz.evaluator) says what a candidate loses, running as little of the model as it can.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from pydsz import codec
from pydsz.encoding import LOSSLESS_PART, encode_weight, matrix
from pydsz.evaluator import Evaluator, EvaluatorState, Measure
from pydsz.ladder import STEP_LADDER, Fitted, Ladder, Point
from pydsz.selection import compressible_layers
from pydsz.tasks import group_bounds, measure_group, measure_point, measure_task

__all__ = ["LOSSLESS_PART", "STEP_LADDER", "Evaluator", "EvaluatorState", "Fitted", "Ladder", "Measure", "Point",
           "assess", "assess_layer", "compressible_layers", "encode_weight", "group_bounds", "measure_group",
           "measure_point", "measure_task"]


def assess_layer(
    evaluator: Evaluator,
    name: str,
    weight: np.ndarray,
    budget: float,
    on_point: Optional[Callable[[Point], None]] = None,
) -> list[Point]:
    """Measure one layer alone over its Ladder of bounds, here, one bound after the other; sorted by
    bound, bound 0 first. `budget` is the allowed loss summed over the samples (for top-1: samples)."""
    ladder = Ladder(name, weight, budget, evaluator.metric.discrete)
    pattern = codec.sparse_index(matrix(weight))
    while (task := ladder.next()) is not None:
        ladder.issue(task)
        point = ladder.add(task, measure_point(evaluator, name, *task, weight, pattern))
        if on_point and point:
            on_point(point)
    return ladder.points()


def assess(evaluator: Evaluator, layer_names: Sequence[str], budget: float, progress: bool = False,
           executor=None, on_point: Optional[Callable[[Point], None]] = None) -> dict[str, list[Point]]:
    """Every named layer's points (pydsz.plan.assess: each layer measured alone, or in a group where
    its evaluations would cost more than it can save), each task an evaluation on `executor`
    (pydsz.executor; default: this process), with a progress bar. The points are the same on any
    executor. on_point sees every measured point, as it comes."""
    from pydsz import plan

    return plan.assess(evaluator, layer_names, budget, progress=progress, executor=executor,
                       on_point=on_point).table
