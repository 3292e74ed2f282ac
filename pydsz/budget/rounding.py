"""`--max-loss input`: a budget that means "no more than the inputs' own rounding".

Data carries a precision of its own: an 8-bit photo is rounded to a gray level, 16-bit audio to a
sample step. Moving every input value by less than half that step (uniform noise, seeded) changes the
model's outputs by some loss in the budget's metric, measured on the user's data; that loss, as the
budget, says the compressed model drifts no more than a camera's own rounding already makes it.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from pydsz.budget import metrics
from pydsz.errors import InputError
from pydsz.model import runtime

# Values sampled to find the data's step; a grid's step is its smallest gap between distinct values
SAMPLE_VALUES = 1 << 20
# How far from the grid a value may lie (in steps) and still be on it: float rounding of k * step
ON_GRID = 1e-3
# The finest grid told from float32 values: their own rounding at most this share of a step (16-bit audio's
# 1/32768 on +-1 is 0.004 of one; a random float's smallest gap is one rounding step)
MAX_ROUNDING = 1 / 64


def input_step(x: np.ndarray, name: str = "the data") -> float:
    """The step the values of `x` are rounded to: 1 for integers, else the smallest gap between its
    distinct values where every value lies on that grid (x / 255 of 8-bit images: 1/255). An InputError
    where the values are on no grid (float data of unknown precision) or all equal."""
    a = np.asarray(x)
    if a.dtype.kind in "iub":
        return 1.0
    flat = a.reshape(-1)
    flat = flat[:: max(1, flat.size // SAMPLE_VALUES)].astype(np.float64)
    values = np.unique(flat[np.isfinite(flat)])
    if values.size < 2:
        raise InputError(f"{name}: every value is the same, so its rounding step cannot be told: give --max-loss "
                         "a number")
    span, gaps = values[-1] - values[0], np.diff(values)
    # the neighbouring levels' mean gap, refined over the whole span: float32 values k * step carry
    # rounding of their own, as large as a few float32 steps of the largest value
    near = gaps[gaps < 1.5 * np.min(gaps)]
    step = float(span / np.round(span / np.mean(near)))
    offset = (values - values[0]) / step
    # float32 rounding of the values, in steps: a grid as fine as that is no precision of the data's own
    rounding = float(np.finfo(np.float32).eps) * float(np.max(np.abs(values))) / step
    if rounding > MAX_ROUNDING or np.max(np.abs(offset - np.round(offset))) > ON_GRID + 8 * rounding:
        raise InputError(f"{name}: its values lie on no grid of one step (float data of unknown precision), so "
                         "--max-loss input has no rounding to measure: give --max-loss a number")
    return step


def input_rounding_loss(tflite: bytes, x: Sequence[np.ndarray], y, metric: metrics.Metric,
                        steps: Optional[Sequence[float]] = None, num_threads: Optional[int] = None) -> tuple[float, list]:
    """The metric's mean loss of the model with every float input value moved by uniform noise within
    half its step (input_step of each input, or `steps`), against its outputs on x as it is; and the
    steps. x: the fitted inputs (runtime.fit_inputs); y: labels, for the metrics that need them. Runs
    every sample alone where the outputs depend on the batch, as the assessment does."""
    from pydsz.model.graph import TFLiteModel

    model = TFLiteModel(tflite)
    details = model.input_details()
    if not any(np.dtype(d["dtype"]).kind == "f" for d in details):
        raise InputError("--max-loss input: the model takes integer inputs, which are their own rounding; give "
                         "--max-loss a number")
    names = [d["key"] for d in details]
    steps = list(steps) if steps is not None else [input_step(a, f"--data's {n}") for a, n in zip(x, names)]
    rng = np.random.default_rng(0)
    noisy = []
    for a, d, step in zip(x, details, steps):
        if np.dtype(d["dtype"]).kind != "f":
            noisy.append(a)
            continue
        a = np.asarray(a, np.float32)
        noisy.append(a + rng.uniform(-step / 2, step / 2, a.shape).astype(np.float32))
    probe = runtime.probe(model, x)
    batch = 1 if probe.batch_dependence > runtime.BATCH_TOLERANCE else runtime.batch_size(model, x)
    keys = [d["key"] for d in model.output_details()]
    original = runtime.outputs(tflite, list(x), keys, batch_size=batch, num_threads=num_threads)
    moved = runtime.outputs(tflite, noisy, keys, batch_size=batch, num_threads=num_threads)
    metric = metrics.get(metric).knowing(model)
    loss = float(np.mean(metric.losses(moved, original, y)) - np.mean(metric.losses(original, original, y)))
    if not loss > 0:
        raise InputError(f"--max-loss input: rounding the inputs within half their step ({', '.join(map(str, steps))}) "
                         f"changes no {metric.spec} on --data: give --max-loss a number")
    return loss, steps
