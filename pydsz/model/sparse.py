"""Pruned FC layers multiplied at the cost of their non-zeros: x @ W.T + bias through libdsz's CSR kernel.

A layer pruned to 4-9% density does a tenth of the arithmetic of its dense product; libdsz's
dsz_csrMatmul runs it single-threaded with the GIL released, and `matmul` splits the samples over
as many threads as the machine has cores, as BLAS does. Every output is summed in a fixed order
(the row's non-zeros by column, then the bias), so the answer does not depend on the thread count;
it differs from BLAS's dense product by float rounding, which is why a caller decides per layer,
not per call, which path a layer takes (Tail does, by the density of the model's own weights).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

import numpy as np

from pydsz import _core
from pydsz.errors import InputError
from pydsz.format import codec

__all__ = ["CSR", "DENSITY_THRESHOLD", "MIN_ROWS", "matmul", "pays", "threads"]

# Below this share of non-zeros the CSR kernel beats dense BLAS at the same thread count
# (bench/tail_eval.py, 4096x4096, 1,000 samples: 2.3x at 9%, 1.45x at 15%, even at 25%).
DENSITY_THRESHOLD = 0.2
# The kernel transposes its input once per call; with few outputs that costs more than the
# product saves (a 10x4096 layer at 25% ran 5x slower than BLAS), so such layers stay dense.
MIN_ROWS = 64

# Threads split the samples in blocks of this many (the kernel's own block), so none gets a ragged share.
_SAMPLE_BLOCK = 128


def pays(w: np.ndarray) -> bool:
    """Whether a [rows, cols] weight matrix is multiplied faster by its non-zeros than densely."""
    return w.ndim == 2 and w.shape[0] >= MIN_ROWS and np.count_nonzero(w) < DENSITY_THRESHOLD * w.size


def threads() -> int:
    """The threads `matmul` uses: as many as numpy's BLAS is told to (OPENBLAS_NUM_THREADS or
    OMP_NUM_THREADS, which Dask's workers set to 1), else one per core this process may run on."""
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


_pool: Optional[ThreadPoolExecutor] = None


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=threads(), thread_name_prefix="pydsz-spmm")
    return _pool


def _forget_pool() -> None:
    global _pool
    _pool = None


# a forked child (a multiprocessing or Dask worker) has none of the parent's threads: it starts its own
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


@dataclass(frozen=True)
class CSR:
    """A [rows, cols] float32 matrix by its non-zeros: row_ptr (int64, rows + 1), col_index (int32), values."""

    shape: tuple
    row_ptr: np.ndarray
    col_index: np.ndarray
    values: np.ndarray

    @classmethod
    def from_dense(cls, w) -> "CSR":
        """The non-zeros of a 2-D matrix (values other than +-0), row by row, columns in order."""
        w = np.asarray(w, np.float32)
        if w.ndim != 2:
            raise InputError(f"a CSR matrix is 2-D; got shape {w.shape}")
        if w.shape[1] > 2 ** 31:
            raise InputError(f"a CSR matrix has at most 2^31 columns; got {w.shape[1]}")
        nnz = int(np.count_nonzero(w))
        row_ptr = np.empty(w.shape[0] + 1, np.int64)
        col_index, values = np.empty(nnz, np.int32), np.empty(nnz, np.float32)
        _core.csr_from_dense(np.ascontiguousarray(w), row_ptr, col_index, values)
        return cls(tuple(w.shape), row_ptr, col_index, values)

    @classmethod
    def from_stream(cls, buf) -> "CSR":
        """The non-zeros of an encode_sparse stream (any bytes-like object), decoded straight into
        CSR with no dense matrix: the same arrays as from_dense(codec.decode_sparse(buf))."""
        row_ptr, col_index, values = codec.decode_sparse_csr(buf)
        return cls(tuple(codec.sparse_info(buf)[k] for k in ("rows", "cols")), row_ptr, col_index, values)

    @property
    def density(self) -> float:
        size = self.shape[0] * self.shape[1]
        return len(self.values) / size if size else 1.0


def matmul(x, w: CSR, bias=None, n_threads: Optional[int] = None) -> np.ndarray:
    """x @ w.T (+ bias) as float32 [n, rows] for x [n, cols], the samples split over n_threads
    (default: threads()); the same bits whatever the split."""
    x = np.ascontiguousarray(x, np.float32)
    if x.ndim != 2 or x.shape[1] != w.shape[1]:
        raise InputError(f"x has shape {x.shape}; a [n, {w.shape[1]}] array multiplies a {w.shape} matrix")
    b = np.empty(0, np.float32) if bias is None else np.ascontiguousarray(bias, np.float32).reshape(-1)
    if bias is not None and b.shape[0] != w.shape[0]:
        raise InputError(f"bias has {b.shape[0]} values; the {w.shape} matrix needs {w.shape[0]}")
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    n_threads = threads() if n_threads is None else n_threads
    blocks = -(-x.shape[0] // _SAMPLE_BLOCK)
    parts = min(max(1, n_threads), blocks)
    if parts <= 1:
        _core.csr_matmul(x, w.row_ptr, w.col_index, w.values, b, out)
        return out
    bounds = [_SAMPLE_BLOCK * (blocks * i // parts) for i in range(parts)] + [x.shape[0]]
    jobs = [_executor().submit(_core.csr_matmul, x[lo:hi], w.row_ptr, w.col_index, w.values, b, out[lo:hi])
            for lo, hi in zip(bounds, bounds[1:])]
    for job in jobs:
        job.result()
    return out
