"""libdsz's quantizer on the GPU: codes, code histograms for many bounds at once, reconstructions.

The answers are those of pydsz.gpu.reference (and so of libdsz/src/quantize.c, predictor none)
bit for bit; see kernels.cu for why. For the encoder of very large layers, `quantize` returns
exactly what dszi_quantize returns: symbols, the outliers in order, and the histogram.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pydsz.errors import InputError
from pydsz.gpu import _cuda
from pydsz.gpu.reference import DEFAULT_RADIUS, estimate_bytes, quant_params

__all__ = ["histograms", "quantize", "reconstruct", "estimate_bytes", "estimated_sizes"]

# the kernels count in 32-bit indices per block and 64-bit per histogram bin
MAX_VALUES = 2**31 - 1


def _values(values) -> np.ndarray:
    x = np.ascontiguousarray(values, np.float32).reshape(-1)
    if x.size > MAX_VALUES:
        raise InputError(f"{x.size} values: the GPU quantizer takes at most {MAX_VALUES} at once")
    return x


def _check_radius(radius: int) -> None:
    if not 1 <= radius <= 1 << 20:
        raise InputError(f"radius {radius}: must be in 1..{1 << 20}")


def histograms_device(x_gpu, n: int, bounds: Sequence[float], radius: int = DEFAULT_RADIUS,
                      keep_nonzero: bool = True, sym_gpu=None):
    """Code histograms [len(bounds), 2 * radius] (uint64, on the device) of n values already on the device.

    sym_gpu, when given ([len(bounds), n] uint32 on the device), receives the symbols too.
    """
    _check_radius(radius)
    eb, step, inv = quant_params(bounds)
    hist = _cuda.zeros((len(eb), 2 * radius), np.uint64)
    params = [_cuda.to_gpu(a) for a in (eb, step, inv)]  # held until the kernel has run
    if n:
        grid = (max(1, min(_cuda.blocks(n), _cuda.MAX_BLOCKS // len(eb) or 1)), len(eb))
        _cuda.kernel("dsz_quantize_many")(
            _cuda.ptr(x_gpu), np.int64(n), *(_cuda.ptr(a) for a in params), np.uint32(radius), np.int32(bool(keep_nonzero)), _cuda.ptr(sym_gpu),
            _cuda.ptr(hist), block=(_cuda.THREADS, 1, 1), grid=grid)
    return hist


def histograms(values, bounds: Sequence[float], radius: int = DEFAULT_RADIUS, keep_nonzero: bool = True) -> np.ndarray:
    """Code histograms of `values` for every bound in one pass: uint64 [len(bounds), 2 * radius]."""
    x = _values(values)
    return histograms_device(_cuda.to_gpu(x), x.size, bounds, radius, keep_nonzero).get()


def estimated_sizes(values, bounds: Sequence[float], radius: int = DEFAULT_RADIUS,
                    keep_nonzero: bool = True) -> list[int]:
    """estimate_bytes of each bound's histogram (the sweep's size per bound)."""
    return [estimate_bytes(h) for h in histograms(values, bounds, radius, keep_nonzero)]


def quantize(values, bound: float, radius: int = DEFAULT_RADIUS,
             keep_nonzero: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What dszi_quantize returns: (symbols uint32, outliers float32 in order, histogram uint64 [2 * radius])."""
    x = _values(values)
    x_gpu = _cuda.to_gpu(x)
    sym_gpu = _cuda.empty((1, max(1, x.size)), np.uint32)
    hist = histograms_device(x_gpu, x.size, [bound], radius, keep_nonzero, sym_gpu=sym_gpu).get()[0]
    sym = sym_gpu.get().reshape(-1)[: x.size]
    return sym, x[sym == 0], hist


def reconstruct_device(values_gpu, index_gpu, n: int, bound: float, dense_gpu, radius: int = DEFAULT_RADIUS,
                       keep_nonzero: bool = True) -> None:
    """dense_gpu.flat[index[i]] = the decoder's value for values[i] at `bound` (all on the device)."""
    _check_radius(radius)
    (eb,), (step,), (inv,) = quant_params([bound])
    if n:
        _cuda.kernel("dsz_reconstruct_scatter")(
            _cuda.ptr(values_gpu), _cuda.ptr(index_gpu), np.int64(n), np.float64(eb), np.float64(step),
            np.float64(inv), np.uint32(radius), np.int32(bool(keep_nonzero)), _cuda.ptr(dense_gpu),
            block=(_cuda.THREADS, 1, 1), grid=(_cuda.blocks(n), 1))


def reconstruct(weight: np.ndarray, bound: float, radius: int = DEFAULT_RADIUS, keep_nonzero: bool = True) -> np.ndarray:
    """The weight as the sparse codec rebuilds it at `bound`: non-zeros quantized, zeros kept."""
    w = np.ascontiguousarray(weight, np.float32)
    index = np.flatnonzero(w)
    values = _values(w.reshape(-1)[index])
    dense = _cuda.zeros(max(1, w.size), np.float32)
    reconstruct_device(_cuda.to_gpu(values), _cuda.to_gpu(index, np.int64), values.size, bound, dense, radius,
                       keep_nonzero)
    return dense.get()[: w.size].reshape(w.shape)
