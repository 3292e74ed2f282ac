"""pycuda plumbing: the context, the compiled kernels (kernels.cu), launches and device arrays.

Everything pycuda is imported inside functions: importing this module needs numpy only, so that
tests/test_gpu_compile.py can read COMPILE_OPTIONS on a machine without pycuda.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Optional

import numpy as np

from pydsz.errors import InputError

KERNELS = Path(__file__).with_name("kernels.cu")
# -fmad=false: no multiply-add contraction anywhere, so the quantizer's double arithmetic is that
# of libdsz/src/quantize.c (the kernels also spell it with _rn intrinsics); -ftz=false keeps float
# subnormals as the CPU keeps them. pycuda adds -arch for the device it compiles for.
COMPILE_OPTIONS = ["-fmad=false", "-ftz=false", "-prec-div=true", "-prec-sqrt=true"]

# activation codes of kernels.cu (ACT_*), by the names pydsz.model.tail and pydsz.prune.retraining use
ACTIVATIONS = {"NONE": 0, "RELU": 1, "RELU6": 2, "RELU_N1_TO_1": 3, "TANH": 4, "LOGISTIC": 5, "LEAKY_RELU": 6}

THREADS = 256
MAX_BLOCKS = 8192  # grid-stride kernels: enough blocks to fill any current GPU
GEMM_TILE = 128


def activation_code(name: str) -> int:
    """kernels.cu's code for an activation named as pydsz.model.tail ("RELU") or pydsz.prune.retraining ("relu") names it."""
    code = ACTIVATIONS.get(str(name).upper())
    if code is None:
        raise InputError(f"activation {name!r} is not supported on the GPU ({', '.join(ACTIVATIONS)})")
    return code


@functools.lru_cache(maxsize=None)
def context() -> None:
    """Make device 0's primary context current (once): every allocation and every module needs one,
    and the first GPU call may be an upload (pycuda then fails with "invalid device context")."""
    from pydsz.gpu.device import missing

    why = missing()
    if why is not None:
        raise InputError(f"no GPU: {why}")
    try:
        import pycuda.autoprimaryctx  # noqa: F401  (retains device 0's primary context)
    except ImportError:  # pycuda < 2021.1
        import pycuda.autoinit  # noqa: F401


@functools.lru_cache(maxsize=None)
def module():
    """The compiled kernels, in the primary context of device 0."""
    context()
    from pycuda.compiler import SourceModule

    return SourceModule(KERNELS.read_text(), options=list(COMPILE_OPTIONS), no_extern_c=True)


def kernel(name: str):
    return module().get_function(name)


def ptr(a, offset: int = 0) -> np.uintp:
    """Device address of GPUArray `a` plus `offset` elements; NULL for None."""
    if a is None:
        return np.uintp(0)
    return np.uintp(int(a.gpudata) + offset * a.dtype.itemsize)


def blocks(n: int) -> int:
    return int(max(1, min(MAX_BLOCKS, -(-n // THREADS))))


def to_gpu(a: np.ndarray, dtype=None):
    context()
    from pycuda import gpuarray

    return gpuarray.to_gpu(np.ascontiguousarray(a, dtype=dtype))


def empty(shape, dtype=np.float32):
    context()
    from pycuda import gpuarray

    return gpuarray.empty(shape, dtype)


def zeros(shape, dtype=np.float32):
    context()
    from pycuda import gpuarray

    return gpuarray.zeros(shape, dtype)


def gemm(a, b, c, rows: int, cols: int, k: int, *, a_off: int = 0, b_off: int = 0, c_off: int = 0,
         sai: Optional[int] = None, sak: int = 1, sbj: Optional[int] = None, sbk: int = 1, ldc: Optional[int] = None,
         bias=None, act: int = 0, alpha: float = 0.0) -> None:
    """c[i, j] = act(sum_k A(i, k) B(j, k) + bias[j]); A(i, k) = a[a_off + i*sai + k*sak], likewise B.

    The defaults are a dense layer: a [rows, k] activations, b [cols, k] weights, c [rows, cols].
    """
    if rows == 0 or cols == 0:
        return
    grid = (-(-cols // GEMM_TILE), -(-rows // GEMM_TILE))
    kernel("dsz_gemm")(
        ptr(a, a_off), np.int64(k if sai is None else sai), np.int64(sak),
        ptr(b, b_off), np.int64(k if sbj is None else sbj), np.int64(sbk),
        ptr(bias), ptr(c, c_off), np.int64(cols if ldc is None else ldc),
        np.int32(rows), np.int32(cols), np.int32(k), np.int32(act), np.float32(alpha),
        block=(THREADS, 1, 1), grid=grid)


def activation(v, n: int, act: int, alpha: float = 0.0, offset: int = 0) -> None:
    """v[offset:offset + n] = act(v[...]) in place."""
    if n:
        kernel("dsz_activation")(ptr(v, offset), np.int64(n), np.int32(act), np.float32(alpha),
                                 block=(THREADS, 1, 1), grid=(blocks(n), 1))


def top1_count(scores, rows: int, cols: int, labels, label_off: int = 0, counter=None, hits=None) -> None:
    """counter[0] += rows of scores [rows, cols] whose argmax (numpy's, first of ties) is the label;
    hits (uint8 on the device, from label_off), unless None, gets each row's 1 (right) or 0."""
    warps_per_block = THREADS // 32
    grid = int(max(1, min(MAX_BLOCKS, -(-rows // warps_per_block))))
    kernel("dsz_top1_count")(ptr(scores), np.int32(rows), np.int32(cols), ptr(labels, label_off), ptr(counter),
                             ptr(hits, label_off), block=(THREADS, 1, 1), grid=(grid, 1))
