"""Masked retraining steps on the GPU, operation for operation those of pydsz.prune (numpy).

`adam_step` is prune._Adam.step followed by re-applying the mask, as prune.retrain does after
every step: the same float32 operations in the same order (kernels.cu dsz_masked_adam), so the
result equals numpy's bit for bit and a pruned weight stays exactly zero. `gradients` is
prune._gradients on the device (float summation order aside).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from pydsz.errors import InputError
from pydsz.gpu import _cuda

__all__ = ["adam_step", "adam_step_device", "gradients"]


def adam_step_device(param, grad, m, v, mask, t: int, lr: float, beta1: float = 0.9, beta2: float = 0.999,
                     eps: float = 1e-8) -> None:
    """One masked Adam step in place on device arrays (grad is masked in place too; mask may be None).

    t is the step number (from 1), as prune._Adam.t; m and v start as zeros.
    """
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


def adam_step(param: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray, mask: Optional[np.ndarray],
              t: int, lr: float, beta1: float = 0.9, beta2: float = 0.999,
              eps: float = 1e-8) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """adam_step_device on host arrays: returns the new (param, m, v); the inputs are not changed."""
    arrays = [_cuda.to_gpu(a, np.float32) for a in (param, grad, m, v)]
    mask_gpu = None if mask is None else _cuda.to_gpu(mask, np.float32)
    adam_step_device(*arrays, mask_gpu, t, lr, beta1, beta2, eps)
    p, _, m_new, v_new = (a.get().reshape(np.shape(param)) for a in arrays)
    return p, m_new, v_new


def gradients(layers: Sequence, x: np.ndarray, y: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """prune._gradients on the device: (weight gradient, bias gradient) per layer of the mean
    softmax cross-entropy of the tail's output; layers have .weight [out, in], .bias, .activation."""
    x = np.ascontiguousarray(x, np.float32).reshape(len(x), -1)
    y = np.asarray(y)
    rows = len(x)
    if rows == 0 or np.ndim(y) != 1 or len(y) != rows:
        raise InputError(f"gradients need a non-empty batch and one label per row, got {rows} rows, labels {np.shape(y)}")
    weights = [_cuda.to_gpu(l.weight, np.float32) for l in layers]
    biases = [_cuda.to_gpu(l.bias, np.float32) for l in layers]
    acts = [_cuda.activation_code(l.activation) for l in layers]
    inputs, pre, post = [_cuda.to_gpu(x)], [], []
    for w, b, act, layer in zip(weights, biases, acts, layers):
        out, k = layer.weight.shape
        z = _cuda.empty(rows * out)
        _cuda.gemm(inputs[-1], w, z, rows, out, k, bias=b)
        a = z.copy()
        _cuda.activation(a, rows * out, act)
        pre.append(z)
        post.append(a)
        inputs.append(a)
    classes = layers[-1].weight.shape[0]
    labels = _cuda.to_gpu(y, np.int32)
    delta = _cuda.empty(rows * classes)
    warps = _cuda.THREADS // 32
    _cuda.kernel("dsz_softmax_xent_grad")(
        _cuda.ptr(post[-1]), np.int32(rows), np.int32(classes), _cuda.ptr(labels), _cuda.ptr(delta),
        block=(_cuda.THREADS, 1, 1), grid=(max(1, min(_cuda.MAX_BLOCKS, -(-rows // warps))), 1))
    grads = []
    for i in range(len(layers) - 1, -1, -1):
        out, k = layers[i].weight.shape
        _cuda.kernel("dsz_activation_grad")(
            _cuda.ptr(delta), _cuda.ptr(pre[i]), _cuda.ptr(post[i]), np.int64(rows * out), np.int32(acts[i]),
            block=(_cuda.THREADS, 1, 1), grid=(_cuda.blocks(rows * out), 1))
        gw = _cuda.empty(out * k)
        # gw[o, j] = sum_r delta[r, o] * input[r, j]
        _cuda.gemm(delta, inputs[i], gw, out, k, rows, sai=1, sak=out, sbj=1, sbk=k)
        gb = _cuda.empty(out)
        _cuda.kernel("dsz_column_sum")(_cuda.ptr(delta), np.int32(rows), np.int32(out), _cuda.ptr(gb),
                                       block=(_cuda.THREADS, 1, 1), grid=(-(-out // _cuda.THREADS), 1))
        grads.append((gw.get().reshape(out, k), gb.get()))
        if i:
            # delta[r, j] = sum_o delta[r, o] * weight[o, j]
            nxt = _cuda.empty(rows * k)
            _cuda.gemm(delta, weights[i], nxt, rows, k, out, sai=out, sak=1, sbj=1, sbk=k)
            delta = nxt
    return grads[::-1]
