"""pydsz.assess.Evaluator's numpy tail on the GPU: per-sample top-1 outcomes with some layers' weights replaced.

The assessment and the pipeline's verification rounds run the FC tail over the cached validation
activations once per candidate; this keeps those activations, the labels and the original weights
on the device and uploads only the replaced matrices. The outcome of every sample comes back (one
byte each), since the Evaluator counts the samples a change flips either way, not only the net.
Answers are numpy's up to float summation order; drops are counted against this path's own
baseline (the Evaluator does that), so the difference never shows as a loss.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from pydsz.errors import InputError
from pydsz.gpu import _cuda
from pydsz.gpu.sweep import CHUNK, GpuTail, check_samples

__all__ = ["TailHits"]


class TailHits:
    """A pydsz.model.tail.Tail and its cached input h [n, ...] with labels y, on the device.

    InputError when the tail holds an op the GPU path does not run (pydsz.gpu.reference.plan
    says which), when the labels do not fit the tail's classes, or for 2**31 samples or more.
    """

    def __init__(self, tail, h: np.ndarray, y: np.ndarray, chunk: int = CHUNK):
        self.gpu = GpuTail(tail, chunk)
        fcs = [op for op in self.gpu.ops if op.kind == "fc"]  # a Tail starts with one
        h = np.ascontiguousarray(h, np.float32).reshape(len(h), -1)
        y = np.asarray(y)
        self.n = len(h)
        check_samples(self.n)
        if y.shape != (self.n,):
            raise InputError(f"y must be a vector of {self.n} labels, got shape {y.shape}")
        classes = fcs[-1].weight.shape[0]
        if self.n and (y.min() < 0 or y.max() >= classes):
            raise InputError(f"labels span {y.min()}..{y.max()}: the tail has {classes} classes")
        self.shapes = {op.name: op.weight.shape for op in fcs}
        self.x = _cuda.to_gpu(h if self.n else np.zeros((1, fcs[0].weight.shape[1]), np.float32))
        self.labels = _cuda.to_gpu(y.astype(np.int32) if self.n else np.zeros(1, np.int32))
        self.flags = _cuda.empty(max(1, self.n), np.uint8)

    def hits(self, weights: Mapping[str, np.ndarray]) -> np.ndarray:
        """Per sample, bool: is the top-1 class the label, with `weights` ({layer: matrix}) in place?"""
        overrides = {}
        for name, w in weights.items():
            if name not in self.shapes:
                raise InputError(f"no layer {name!r} in the tail (layers: {', '.join(self.shapes)})")
            w = np.asarray(w, np.float32)
            if w.shape != self.shapes[name]:
                raise InputError(f"weights for {name}: shape {w.shape} instead of {self.shapes[name]}")
            overrides[name] = _cuda.to_gpu(w)
        if not self.n:
            return np.zeros(0, bool)
        self.gpu.correct(self.x, self.n, self.labels, overrides=overrides, hits=self.flags)
        return self.flags.get()[: self.n].astype(bool)
