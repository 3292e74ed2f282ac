"""The assessment sweep on the GPU: each layer alone quantized at many bounds, top-1 counted.

Same arguments and answers as pydsz.gpu.reference.sweep (the numpy path): identical codes,
histograms and size estimates, correct counts equal up to float summation order. Per layer,
its input is computed once on the device; per bound, the layer's non-zeros are quantized and
scattered into a dense matrix on the device and the rest of the tail runs there, chunk by chunk.
Nothing but the counts comes back.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np

from pydsz.errors import InputError
from pydsz.gpu import _cuda
from pydsz.gpu.quantize import histograms_device, reconstruct_device
from pydsz.gpu.reference import DEFAULT_RADIUS, SweepPoint, check_sweep, estimate_bytes, plan

__all__ = ["GpuTail", "SweepPoint", "sweep"]

CHUNK = 8192  # samples per pass through the tail: bounds the device workspace


def check_samples(n: int) -> None:
    """InputError for more samples than the kernels' 32-bit row counts address."""
    if n >= 2**31:
        raise InputError(f"{n} samples: the GPU path takes fewer than 2**31")


class GpuTail:
    """A tail's ops with their weights on the device; runs batches of cached activations."""

    def __init__(self, layers, chunk: int = CHUNK):
        if chunk < 1:
            raise InputError(f"chunk must be >= 1, got {chunk}")
        self.ops = plan(layers)
        _cuda.module()  # InputError saying what is missing when there is no GPU
        self.chunk = chunk
        self.weights = {op.name: _cuda.to_gpu(op.weight) for op in self.ops if op.kind == "fc"}
        self.biases = {op.name: _cuda.to_gpu(op.bias) for op in self.ops if op.kind == "fc"}
        widest = max([op.weight.shape[0] for op in self.ops if op.kind == "fc"] or [1])
        self._work = [_cuda.empty(chunk * widest, np.float32) for _ in range(2)]
        self._count = _cuda.zeros(1, np.uint64)

    def _fc(self, op, x, x_off: int, rows: int, out, out_off: int = 0, weight=None) -> None:
        w = self.weights[op.name] if weight is None else weight
        cols, k = op.weight.shape
        _cuda.gemm(x, w, out, rows, cols, k, a_off=x_off, c_off=out_off, bias=self.biases[op.name],
                   act=_cuda.activation_code(op.activation), alpha=op.alpha)

    def _count_chunk(self, start: int, x, x_off: int, rows: int, labels, label_off: int,
                     overrides: Mapping, hits) -> None:
        """ops[start:] on rows of x (width = ops[start]'s input), adding top-1 hits to the counter."""
        cur, cur_off, width, flip = x, x_off, None, 0
        for op in self.ops[start:]:
            if op.kind == "fc":
                out = self._work[flip]
                flip ^= 1
                self._fc(op, cur, cur_off, rows, out, weight=overrides.get(op.name))
                cur, cur_off, width = out, 0, op.weight.shape[0]
            else:
                if width is None:
                    raise InputError("a swept tail must start with a dense layer")
                _cuda.activation(cur, rows * width, _cuda.activation_code(op.activation), op.alpha, cur_off)
        _cuda.top1_count(cur, rows, width, labels, label_off, self._count, hits)

    def correct(self, x, n: int, labels, start: int = 0, overrides: Optional[Mapping] = None, hits=None) -> int:
        """Top-1 hits of ops[start:] over n samples x (on the device). overrides: {layer: dense
        weight on the device} in place of the original ones; hits: a uint8 device array of n that
        receives each sample's outcome, or None."""
        self._count.fill(0)
        width = self.ops[start].weight.shape[1]
        for i in range(0, n, self.chunk):
            self._count_chunk(start, x, i * width, min(self.chunk, n - i), labels, i, overrides or {}, hits)
        return int(self._count.get()[0])

    def advance(self, index: int, x, n: int):
        """ops[index] applied to n samples x (on the device), with the original weights: a new device array."""
        op = self.ops[index]
        if op.kind != "fc":
            width = x.size // max(1, n)
            _cuda.activation(x, n * width, _cuda.activation_code(op.activation), op.alpha)
            return x
        cols, k = op.weight.shape
        out = _cuda.empty(max(1, n * cols), np.float32)
        for i in range(0, n, self.chunk):
            self._fc(op, x, i * k, min(self.chunk, n - i), out, out_off=i * cols)
        return out


def sweep(layers, h: np.ndarray, y: np.ndarray, bounds: Mapping[str, Sequence[float]], *,
          radius: int = DEFAULT_RADIUS, keep_nonzero: bool = True, chunk: int = CHUNK) -> dict[str, list[SweepPoint]]:
    """pydsz.gpu.reference.sweep on the GPU: {layer: [SweepPoint per bound]} for the named layers."""
    ops = plan(layers)
    h = np.asarray(h, np.float32)
    h = h.reshape(len(h), -1)
    y = np.asarray(y)
    check_sweep(ops, h, y, bounds)
    check_samples(len(h))
    tail = GpuTail(layers, chunk)
    n = len(h)
    labels = _cuda.to_gpu(y.astype(np.int32, copy=False) if n else np.zeros(1, np.int32), np.int32)
    cache = _cuda.to_gpu(h if n else np.zeros(1, np.float32))
    out: dict[str, list[SweepPoint]] = {}
    for i, op in enumerate(tail.ops):
        if op.kind == "fc" and op.name in bounds:
            out[op.name] = _sweep_layer(tail, i, op, cache, n, labels, list(bounds[op.name]), radius, keep_nonzero)
        if len(out) == len(bounds):
            break
        cache = tail.advance(i, cache, n)
    return out


def _sweep_layer(tail: GpuTail, i: int, op, cache, n: int, labels, bounds: list, radius: int,
                 keep_nonzero: bool) -> list[SweepPoint]:
    index = np.flatnonzero(op.weight)
    values = _cuda.to_gpu(op.weight.reshape(-1)[index] if index.size else np.zeros(1, np.float32))
    index_gpu = _cuda.to_gpu(index if index.size else np.zeros(1, np.int64), np.int64)
    hists = histograms_device(values, index.size, bounds, radius, keep_nonzero).get()
    dense = _cuda.empty(op.weight.size, np.float32)
    points = []
    for bound, hist in zip(bounds, hists):
        dense.fill(0)
        reconstruct_device(values, index_gpu, index.size, bound, dense, radius, keep_nonzero)
        count = tail.correct(cache, n, labels, start=i, overrides={op.name: dense})
        points.append(SweepPoint(op.name, float(bound), count, estimate_bytes(hist), int(hist[0])))
    return points
