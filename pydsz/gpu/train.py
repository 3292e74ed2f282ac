"""Retraining on the GPU, operation for operation that of pydsz.prune.retraining (numpy).

`GpuSteps` is train.NumpySteps on the device: the tail's weights, masks, Adam state and running
mean stay there, and each step uploads only its mini-batch and targets. train.retrain's loop drives
either one. `adam_step` is train._Adam.step followed by re-applying the mask, with the same float32
operations in the same order (kernels.cu dsz_masked_adam), so its result equals numpy's bit for bit
and a pruned weight stays exactly zero. `gradients` is train._gradients and `forward` train.forward
(float summation order aside).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional, Sequence

import numpy as np

from pydsz.errors import InputError
from pydsz.gpu import _cuda

__all__ = ["GpuSteps", "adam_step", "adam_step_device", "forward", "gradients"]

CHUNK = 8192  # samples per pass of forward(): bounds the device workspace


def adam_step_device(param, grad, moments: tuple, mask, t: int, lr: float, betas: tuple = (0.9, 0.999),
                     eps: float = 1e-8) -> None:
    """One masked Adam step in place on device arrays (grad is masked in place too; mask may be None).

    moments: (m, v), which start as zeros; betas: (beta1, beta2); t is the step number (from 1), as
    train._Adam.t.
    """
    (m, v), (beta1, beta2) = moments, betas
    if t < 1:
        raise InputError(f"Adam step number {t}: must be >= 1")
    n = param.size
    if any(a.size != n for a in (grad, m, v) + ((mask,) if mask is not None else ())):
        raise InputError("adam_step: param, grad, m, v and mask must have the same size")
    # numpy rounds each Python scalar to float32 where it meets a float32 array
    scalars = [np.float32(s) for s in (lr, beta1, 1 - beta1, beta2, 1 - beta2, 1 - beta1**t, 1 - beta2**t, eps)]
    if n:
        _cuda.kernel("dsz_masked_adam")(
            _cuda.ptr(param), _cuda.ptr(grad), _cuda.ptr(m), _cuda.ptr(v), _cuda.ptr(mask), np.int64(n), *scalars,
            block=(_cuda.THREADS, 1, 1), grid=(_cuda.blocks(n), 1))


def adam_step(param: np.ndarray, grad: np.ndarray, moments: tuple, mask: Optional[np.ndarray], t: int, lr: float,
              betas: tuple = (0.9, 0.999), eps: float = 1e-8) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """adam_step_device on host arrays: returns the new (param, m, v); the inputs are not changed."""
    arrays = [_cuda.to_gpu(a, np.float32) for a in (param, grad, *moments)]
    mask_gpu = None if mask is None else _cuda.to_gpu(mask, np.float32)
    adam_step_device(arrays[0], arrays[1], (arrays[2], arrays[3]), mask_gpu, t, lr, betas, eps)
    p, _, m_new, v_new = (a.get().reshape(np.shape(param)) for a in arrays)
    return p, m_new, v_new


def _check_batch(x: np.ndarray, target: np.ndarray, layers) -> tuple[np.ndarray, np.ndarray]:
    x = np.ascontiguousarray(x, np.float32).reshape(len(x), -1)
    target = np.ascontiguousarray(target, np.float32)
    classes = layers[-1].weight.shape[0]
    if len(x) == 0 or target.shape != (len(x), classes):
        raise InputError(f"gradients need a non-empty batch and a row of {classes} class probabilities per sample, "
                         f"got {len(x)} samples, targets {target.shape}")
    if x.shape[1] != layers[0].weight.shape[1]:
        raise InputError(f"the batch has {x.shape[1]} values per sample, {layers[0].name} takes {layers[0].weight.shape[1]}")
    return x, target


def _gradients_device(weights, biases, acts: Sequence[int], shapes: Sequence[tuple], x_gpu, target_gpu,
                      rows: int) -> list:
    """train._gradients on device arrays: [(weight gradient, bias gradient)] per layer, on the device."""
    inputs, pre, post = [x_gpu], [], []
    for w, b, act, (out, k) in zip(weights, biases, acts, shapes):
        z = _cuda.empty(rows * out)
        _cuda.gemm(inputs[-1], w, z, rows, out, k, bias=b)
        a = z.copy()
        _cuda.activation(a, rows * out, act)
        pre.append(z)
        post.append(a)
        inputs.append(a)
    classes = shapes[-1][0]
    delta = _cuda.empty(rows * classes)
    warps = _cuda.THREADS // 32
    _cuda.kernel("dsz_softmax_xent_grad")(
        _cuda.ptr(post[-1]), np.int32(rows), np.int32(classes), _cuda.ptr(target_gpu), _cuda.ptr(delta),
        block=(_cuda.THREADS, 1, 1), grid=(max(1, min(_cuda.MAX_BLOCKS, -(-rows // warps))), 1))
    grads = []
    for i in range(len(shapes) - 1, -1, -1):
        out, k = shapes[i]
        _cuda.kernel("dsz_activation_grad")(
            _cuda.ptr(delta), _cuda.ptr(pre[i]), _cuda.ptr(post[i]), np.int64(rows * out), np.int32(acts[i]),
            block=(_cuda.THREADS, 1, 1), grid=(_cuda.blocks(rows * out), 1))
        gw = _cuda.empty(out * k)
        # gw[o, j] = sum_r delta[r, o] * input[r, j]
        _cuda.gemm(delta, inputs[i], gw, out, k, rows, sai=1, sak=out, sbj=1, sbk=k)
        gb = _cuda.empty(out)
        _cuda.kernel("dsz_column_sum")(_cuda.ptr(delta), np.int32(rows), np.int32(out), _cuda.ptr(gb),
                                       block=(_cuda.THREADS, 1, 1), grid=(-(-out // _cuda.THREADS), 1))
        grads.append((gw, gb))
        if i:
            # delta[r, j] = sum_o delta[r, o] * weight[o, j]
            nxt = _cuda.empty(rows * k)
            _cuda.gemm(delta, weights[i], nxt, rows, k, out, sai=out, sak=1, sbj=1, sbk=k)
            delta = nxt
    return grads[::-1]


def gradients(layers: Sequence, x: np.ndarray, target: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """train._gradients on the device: (weight gradient, bias gradient) per layer of the mean softmax
    cross-entropy between the tail's output and `target` (rows of class probabilities); layers have
    .weight [out, in], .bias, .activation."""
    x, target = _check_batch(x, target, layers)
    grads = _gradients_device([_cuda.to_gpu(l.weight, np.float32) for l in layers],
                              [_cuda.to_gpu(l.bias, np.float32) for l in layers],
                              [_cuda.activation_code(l.activation) for l in layers],
                              [l.weight.shape for l in layers], _cuda.to_gpu(x), _cuda.to_gpu(target), len(x))
    return [(gw.get().reshape(l.weight.shape), gb.get()) for (gw, gb), l in zip(grads, layers)]


def forward(layers: Sequence, h: np.ndarray, chunk: int = CHUNK) -> np.ndarray:
    """train.forward on the device: the tail's logits [n, classes] for inputs h, float32."""
    h = np.ascontiguousarray(h, np.float32).reshape(len(h), -1)
    if h.shape[1] != layers[0].weight.shape[1]:
        raise InputError(f"h has {h.shape[1]} values per sample, {layers[0].name} takes {layers[0].weight.shape[1]}")
    weights = [_cuda.to_gpu(l.weight, np.float32) for l in layers]
    biases = [_cuda.to_gpu(l.bias, np.float32) for l in layers]
    acts = [_cuda.activation_code(l.activation) for l in layers]
    out = np.empty((len(h), layers[-1].weight.shape[0]), np.float32)
    for start in range(0, len(h), chunk):
        rows = min(chunk, len(h) - start)
        cur = _cuda.to_gpu(h[start:start + rows])
        for w, b, act, layer in zip(weights, biases, acts, layers):
            cols, k = layer.weight.shape
            nxt = _cuda.empty(rows * cols)
            _cuda.gemm(cur, w, nxt, rows, cols, k, bias=b, act=act)
            cur = nxt
        out[start:start + rows] = cur.get().reshape(rows, -1)
    return out


class GpuSteps:
    """train.NumpySteps on the device: same methods, same arithmetic (float summation order aside).

    params: the tail's layers (train.Dense); keep: their masks (bool arrays or None), a list this
    object updates as set_mask is called, as NumpySteps does.
    """

    def __init__(self, params: list, keep: list):
        self.params, self.keep = params, keep
        self.shapes = [p.weight.shape for p in params]
        self.acts = [_cuda.activation_code(p.activation) for p in params]
        self.w = [_cuda.to_gpu(p.weight, np.float32) for p in params]
        self.b = [_cuda.to_gpu(p.bias, np.float32) for p in params]
        self.state = [[_cuda.zeros(a.size, np.float32) for a in (w, w, b, b)] for w, b in zip(self.w, self.b)]
        self.avg = [(_cuda.zeros(w.size, np.float32), _cuda.zeros(b.size, np.float32)) for w, b in zip(self.w, self.b)]
        self.masks = [None if m is None else _cuda.to_gpu(m, np.float32) for m in keep]
        self.t = 0

    def weight(self, i: int) -> np.ndarray:
        return self.w[i].get().reshape(self.shapes[i])

    def set_mask(self, i: int, mask: np.ndarray) -> None:
        self.keep[i] = mask
        self.w[i] = _cuda.to_gpu(self.weight(i) * mask, np.float32)
        self.masks[i] = _cuda.to_gpu(mask, np.float32)

    def step(self, x: np.ndarray, target: np.ndarray, lr: float) -> None:
        """One masked Adam step on a batch x with target class probabilities."""
        x, target = _check_batch(x, target, self.params)
        grads = _gradients_device(self.w, self.b, self.acts, self.shapes, _cuda.to_gpu(x), _cuda.to_gpu(target),
                                  len(x))
        self.t += 1
        for i, (p, (gw, gb)) in enumerate(zip(self.params, grads)):
            mw, vw, mb, vb = self.state[i]
            adam_step_device(self.w[i], gw, (mw, vw), self.masks[i], self.t, lr)
            if p.train_bias:
                adam_step_device(self.b[i], gb, (mb, vb), None, self.t, lr)

    def average(self, k: int) -> None:
        """Fold the current parameters into the running mean as its k-th term."""
        for (aw, ab), w, b in zip(self.avg, self.w, self.b):
            for a, p in ((aw, w), (ab, b)):
                _cuda.kernel("dsz_running_mean")(_cuda.ptr(a), _cuda.ptr(p), np.int64(a.size), np.float32(k),
                                                 block=(_cuda.THREADS, 1, 1), grid=(_cuda.blocks(a.size), 1))

    def result(self) -> list:
        return [replace(p, weight=aw.get().reshape(shape), bias=ab.get())
                for p, (aw, ab), shape in zip(self.params, self.avg, self.shapes)]
