"""The Evaluator's FC tail on the GPU (pydsz.gpu.evaluate's TailHits): the per-sample losses of the metrics
that read top-1 outcomes. top1 and agreement are the outcomes themselves (against the labels, the original
tail's classes); calibrated-top1 looks first at which samples' class moved from the original's, and the
numpy tail gives those few their new class, whose calibrated probability is the loss."""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from pydsz.budget import metrics
from pydsz.budget.calibrated import CalibratedTop1
from pydsz.errors import InputError


class GpuLosses:
    """TailHits on `tail` and its cached input h, for `metric` judging the tail's output `key` among the
    original model's `outputs`, with labels y. InputError where the GPU cannot count this metric's losses
    (another metric, another output) or run the tail (pydsz.gpu.reference.plan says which op)."""

    def __init__(self, tail, h: np.ndarray, metric: metrics.Metric, y, outputs: Mapping, key: str):
        if not isinstance(metric, (metrics.Top1, metrics.Agreement, CalibratedTop1)) or list(metric.select(outputs)) != [key]:
            raise InputError(f"the GPU tail counts top-1 outcomes of the tail's output; metric {metric.spec} runs in numpy")
        from pydsz.gpu.evaluate import TailHits

        self.metric, self.y, self.outputs = metric, y, outputs
        self.classes = np.argmax(tail.forward(h).reshape(len(h), -1), axis=1)
        self.hits = TailHits(tail, h, y if isinstance(metric, metrics.Top1) else self.classes)

    def losses(self, weights: Mapping[str, np.ndarray], tail_output: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """Per sample, the metric's loss with `weights` in place; tail_output(samples): the tail's output of
        those samples with the same weights, by numpy (calibrated-top1's moved samples)."""
        hit = self.hits.hits(weights)
        if not isinstance(self.metric, CalibratedTop1):
            return (~hit).astype(np.float64)
        classes, moved = self.classes.copy(), np.flatnonzero(~hit)
        if moved.size:
            classes[moved] = np.argmax(np.asarray(tail_output(moved)).reshape(len(moved), -1), axis=1)
        q = self.metric.calibrated(self.outputs, self.y)
        return 1.0 - q[np.arange(len(classes)), classes]
