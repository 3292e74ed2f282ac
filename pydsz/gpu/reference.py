"""The CPU (numpy) side of the GPU path: what the GPU kernels must reproduce.

- `quantize`: libdsz's quantizer (libdsz/src/quantize.c, predictor none) in numpy, with the same
  IEEE double operations in the same order, so its codes are libdsz's codes bit for bit
  (tests/test_gpu.py checks both against the codec). numpy's element-wise operations are never
  fused, so they round exactly where the C code rounds.
- `estimate_bytes`: a layer's size from its code histogram (zero-order entropy + outliers).
- `plan`, `correct`, `sweep`: the one-layer-at-a-time assessment sweep over an FC tail, the
  numpy baseline of pydsz.gpu.sweep (same arguments, same answers up to float summation order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np

from pydsz.errors import InputError

DEFAULT_RADIUS = 32768  # DSZ_RADIUS_DEFAULT
STEP_MAX = 1e300  # quantize.c: a larger step is as good as infinite
FLT_MAX = 3.4028234663852886e38
ROUND_OFFSET = 4194304  # quantize.c round_half_up
CHUNK = 4096  # samples per matrix product, as pydsz.model.tail


# ---------------------------------------------------------------- quantization

def quant_params(bounds) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(eb, step, inv) as float64 arrays, computed as dszi_quant_init computes them."""
    eb = np.atleast_1d(np.asarray(bounds, np.float64))
    if eb.ndim != 1 or not np.all(np.isfinite(eb)) or np.any(eb <= 0):
        raise InputError(f"error bounds must be finite and > 0, got {bounds!r}")
    step = np.minimum(2.0 * eb, STEP_MAX)
    return eb, step, 1.0 / step


def _dequant(step: float, qi: np.ndarray) -> np.ndarray:
    r = qi.astype(np.float64) * step
    return np.where((r > FLT_MAX) | (r < -FLT_MAX), 0.0, r).astype(np.float32)


def quantize_values(values: np.ndarray, bound: float, radius: int = DEFAULT_RADIUS,
                    keep_nonzero: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(symbols uint32, reconstructions float32) of float32 values at one bound.

    Symbol 0: stored verbatim (NaN, Inf, |code| >= radius, or a reconstruction outside the bound);
    its reconstruction is the value itself. keep_nonzero: a non-zero must not rebuild as 0 (the
    sparse codec's setting).
    """
    xf = np.ascontiguousarray(values, np.float32).reshape(-1)
    (eb,), (step,), (inv,) = quant_params([bound])
    x = xf.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        d = x * inv
        ok = np.abs(d) < float(radius) - 1.0
        qi = np.where(ok, d, 0.0)
        qi = (qi + (0.5 + ROUND_OFFSET)).astype(np.int64) - ROUND_OFFSET
        r = _dequant(step, qi)
        zeroed = (r == 0.0) & (xf != 0.0)
        if keep_nonzero and np.any(zeroed):
            qi = np.where(zeroed, np.where(x > 0, 1, -1), qi)
            r = _dequant(step, qi)
            zeroed = (r == 0.0) & (xf != 0.0)
        good = ok & (np.abs(x - r.astype(np.float64)) <= eb)
        if keep_nonzero:
            good &= ~zeroed
    sym = np.where(good, qi + radius, 0).astype(np.uint32)
    return sym, np.where(good, r, xf)


def quantize(values: np.ndarray, bound: float, radius: int = DEFAULT_RADIUS,
             keep_nonzero: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What dszi_quantize returns: (symbols uint32, outliers float32 in order, histogram uint64 [2 * radius])."""
    xf = np.ascontiguousarray(values, np.float32).reshape(-1)
    sym, _ = quantize_values(xf, bound, radius, keep_nonzero)
    hist = np.bincount(sym, minlength=2 * radius).astype(np.uint64)
    return sym, xf[sym == 0], hist


def estimate_bytes(hist: np.ndarray) -> int:
    """Estimated coded size of a layer's values: the zero-order entropy of the symbols plus 4 bytes per outlier."""
    h = np.asarray(hist, np.float64).reshape(-1)
    total = h.sum()
    if total == 0:
        return 0
    c = h[h > 0]
    bits = float(np.sum(c * np.log2(total / c)))
    return int(np.ceil(bits / 8)) + 4 * int(h[0])


# ---------------------------------------------------------------- the FC tail

@dataclass(frozen=True)
class Op:
    """One op of a tail as both devices run it: a dense layer ("fc") or an activation ("act")."""

    kind: str
    activation: str = "NONE"
    name: str = ""
    weight: Optional[np.ndarray] = None  # [out, in] float32
    bias: Optional[np.ndarray] = None  # [out] float32
    alpha: float = 0.0  # LEAKY_RELU slope


def plan(layers) -> list[Op]:
    """The ops of a tail: a pydsz.model.tail.Tail, or dense layers with .name/.weight/.bias/.activation
    (pydsz.prune.train.Dense). InputError for what the sweep does not run (binary ops, a softmax that
    is not the last op); a final softmax is dropped since it keeps the top-1 class."""
    steps = getattr(layers, "steps", None)
    if steps is None:
        return [Op("fc", str(l.activation).upper(), l.name, np.ascontiguousarray(l.weight, np.float32),
                   np.ascontiguousarray(l.bias, np.float32)) for l in layers]
    ops = []
    for i, step in enumerate(steps):
        if step.kind == "fc":
            ops.append(Op("fc", step.activation, step.name, np.ascontiguousarray(layers.weights[step.name], np.float32),
                          np.ascontiguousarray(layers.biases[step.name], np.float32)))
        elif step.kind == "activation":
            ops.append(Op("act", step.op, alpha=step.alpha))
        elif step.kind == "softmax" and i == len(steps) - 1:
            continue
        elif step.kind != "reshape":
            raise InputError(f"the sweep does not run {step.op} (op {i} of the tail); use the CPU path")
    return ops


def _activate(v: np.ndarray, name: str, alpha: float) -> np.ndarray:
    if name == "NONE":
        return v
    if name == "RELU":
        return np.maximum(v, 0, out=v)
    if name == "RELU6":
        return np.clip(v, 0, 6, out=v)
    if name == "RELU_N1_TO_1":
        return np.clip(v, -1, 1, out=v)
    if name == "TANH":
        return np.tanh(v, out=v)
    if name == "LOGISTIC":
        return (1 / (1 + np.exp(-v))).astype(np.float32)
    if name == "LEAKY_RELU":
        return np.where(v >= 0, v, v * np.float32(alpha))
    raise InputError(f"activation {name!r} is not supported")


def run(ops: Sequence[Op], h: np.ndarray, weights: Optional[Mapping[str, np.ndarray]] = None) -> np.ndarray:
    """The ops on a batch h [n, in]: float32 output [n, out]."""
    v = np.ascontiguousarray(h, np.float32).reshape(len(h), -1)
    owned = False  # activations run in place, but never on the caller's array
    for op in ops:
        if op.kind == "fc":
            w = (weights or {}).get(op.name, op.weight)
            v = v @ w.T
            v += op.bias
        elif not owned:
            v = v.copy()
        owned = True
        v = _activate(v, op.activation, op.alpha)
    return v


def correct(ops: Sequence[Op], h: np.ndarray, y: np.ndarray, weights: Optional[Mapping[str, np.ndarray]] = None,
            chunk: int = CHUNK) -> int:
    """Samples whose top-1 class is their label."""
    h = np.asarray(h).reshape(len(h), -1)
    return sum(int(np.sum(np.argmax(run(ops, h[i:i + chunk], weights), axis=1) == y[i:i + chunk]))
               for i in range(0, len(h), chunk))


@dataclass(frozen=True)
class SweepPoint:
    """Layer `layer` alone quantized at `bound`: correct samples, estimated bytes, outliers."""

    layer: str
    bound: float
    correct: int
    est_bytes: int
    outliers: int


def check_sweep(ops: Sequence[Op], h: np.ndarray, y: np.ndarray, bounds: Mapping[str, Sequence[float]]) -> None:
    """InputError unless h, y and bounds fit the ops (shared by both devices)."""
    names = [op.name for op in ops if op.kind == "fc"]
    if not names:
        raise InputError("the tail has no dense layer")
    unknown = sorted(set(bounds) - set(names))
    if unknown:
        raise InputError(f"no layer {unknown[0]!r} in the tail (layers: {', '.join(names)})")
    first = next(op for op in ops if op.kind == "fc")
    if h.ndim < 2 or int(np.prod(h.shape[1:])) != first.weight.shape[1]:
        raise InputError(f"h has samples of shape {h.shape[1:]} but {first.name} takes {first.weight.shape[1]} values")
    if np.ndim(y) != 1 or len(y) != len(h):
        raise InputError(f"y must be a vector of {len(h)} labels, got shape {np.shape(y)}")
    for name, bs in bounds.items():
        quant_params(list(bs))


def sweep(layers, h: np.ndarray, y: np.ndarray, bounds: Mapping[str, Sequence[float]], *,
          radius: int = DEFAULT_RADIUS, keep_nonzero: bool = True, chunk: int = CHUNK) -> dict[str, list[SweepPoint]]:
    """For each named layer and each of its bounds: that layer alone quantized, the rest as is.

    The layer's input is computed once with the original weights; only its non-zeros are
    quantized (the pruned zeros stay zero, as the sparse codec keeps them).
    """
    ops = plan(layers)
    h = np.asarray(h, np.float32)
    h = h.reshape(len(h), -1)
    y = np.asarray(y)
    check_sweep(ops, h, y, bounds)
    out: dict[str, list[SweepPoint]] = {}
    cache = h
    for i, op in enumerate(ops):
        if op.kind == "fc" and op.name in bounds:
            index = np.flatnonzero(op.weight)
            values = op.weight.reshape(-1)[index]
            points = []
            for bound in bounds[op.name]:
                sym, recon = quantize_values(values, bound, radius, keep_nonzero)
                hist = np.bincount(sym, minlength=2 * radius)
                dense = np.zeros(op.weight.size, np.float32)
                dense[index] = recon
                count = correct(ops[i:], cache, y, {op.name: dense.reshape(op.weight.shape)}, chunk)
                points.append(SweepPoint(op.name, float(bound), count, estimate_bytes(hist), int(hist[0])))
            out[op.name] = points
        if len(out) == len(bounds):
            break
        cache = np.concatenate([run([op], cache[j:j + chunk]) for j in range(0, len(cache), chunk)])
    return out
