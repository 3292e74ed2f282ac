"""One-shot pruning from calibration inputs alone: SparseGPT (pydsz.gptq) on every selected layer.

No gradients and no labels: anything the interpreter runs can be pruned this way. Each layer is
pruned on the inputs the layers already pruned produce, in execution order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Union

import numpy as np

from pydsz import metrics, runtime
from pydsz.budget import Budget
from pydsz.context import Run
from pydsz.errors import InputError
from pydsz.gptq import DAMP, MAX_HESSIAN_BYTES, check_memory, hessian, inverse_factor, selectable, solve
from pydsz.masks import ALREADY_SPARSE, AUTO_LADDER, AUTO_MARGIN, by_size, density, sparsity_targets
from pydsz.model import TFLiteModel
from pydsz.prune import PruneResult


@dataclass
class OneShotResult:
    """A model pruned one-shot and what was done to it."""

    tflite: bytes
    sparsity: dict[str, float]  # per selected layer, after pruning
    pruned: list[str]  # the layers pruned now, in execution order
    already_sparse: list[str]  # layers found sparse and left as they were
    seconds: dict[str, float]  # per pruned layer: capture, Hessian and sweep


def prune_layers(tflite_bytes: bytes, x: np.ndarray, sparsity: Union[float, Mapping[str, float]] = 0.5, *,
                 kinds: Sequence[str] = ("fc",), nm: Optional[tuple[int, int]] = None, damp: float = DAMP,
                 max_hessian_bytes: int = MAX_HESSIAN_BYTES, progress: bool = False,
                 num_threads: Optional[int] = None) -> OneShotResult:
    """SparseGPT on every selected layer, in execution order, each on the inputs the layers already
    pruned produce. sparsity: one fraction, or {layer: fraction}; nm=(n, m) prunes n of every m
    consecutive inputs instead (sparsity n/m). x: calibration inputs, no labels needed."""
    from tqdm import tqdm

    model = TFLiteModel(tflite_bytes)
    layers = selectable(model, kinds)
    if not layers:
        raise InputError(f"the model has no prunable {'/'.join(kinds)} layer "
                         "(float32 constant weights used by one layer)")
    if nm is not None and not 0 < nm[0] < nm[1]:
        raise InputError(f"n:m pattern {nm[0]}:{nm[1]}: need 0 < n < m")
    if len(np.shape(x)) < 1 or np.shape(x)[0] < 1:
        raise InputError("the calibration set is empty")
    targets = sparsity_targets([l.name for l in layers], nm[0] / nm[1] if nm else sparsity)
    already = [l.name for l in layers if 1 - density(model.weight(l)) >= ALREADY_SPARSE]
    todo = [l for l in layers if l.name in targets and targets[l.name] > 0 and l.name not in already]
    check_memory(todo, max_hessian_bytes)
    seconds: dict[str, float] = {}
    for layer in tqdm(todo, desc="one-shot pruning", unit="layer", disable=not progress, leave=False):
        start = time.perf_counter()
        h = hessian(model, layer, x, num_threads=num_threads)
        factors = [inverse_factor(g, damp) for g in h]
        weight = solve(layer, model.weight(layer), factors, sparsity=targets[layer.name], nm=nm)
        model = TFLiteModel(model.replace({layer.name: weight}))
        seconds[layer.name] = time.perf_counter() - start
    return OneShotResult(model.data, {l.name: 1 - density(model.weight(l)) for l in layers},
                         [l.name for l in todo], already, seconds)


def prune_model(
    tflite_bytes: bytes, calibration: np.ndarray, val: tuple[np.ndarray, Optional[np.ndarray]],
    sparsity: Union[float, Mapping[str, float], tuple[int, int], str], *, kinds: Sequence[str] = ("fc",),
    auto_budget: float = 0.001, metric=None, output: Optional[str] = None, progress: bool = False,
    num_threads: int | None = None,
) -> PruneResult:
    """Prune the layers of `kinds` one-shot (pydsz.oneshot: SparseGPT from calibration inputs, no
    training). sparsity: a fraction, {layer: fraction}, an n:m pattern (n, m), or "auto" (as
    auto_sparsity decides, on one-shot trials judged on `val` by `metric`: a pydsz.metrics spec, by
    default top1 with labels, expected-top1 without for a classifier, output-error otherwise;
    auto_budget is in the metric's unit). The labels, when given, also measure top-1 before and after."""
    x_val, y_val = val

    def top1(model: bytes) -> Optional[float]:
        return None if y_val is None else runtime.accuracy(model, x_val, y_val, num_threads=num_threads)

    nm = sparsity if isinstance(sparsity, tuple) else None
    notes: list[str] = []
    if sparsity == "auto":
        if metric is None:
            judge_by, why = metrics.default(TFLiteModel(tflite_bytes), y_val is not None, output)
            notes.append(f"auto judged by {judge_by.spec} ({why})")
        else:
            judge_by = metrics.get(metric, output)
            notes.append(f"auto judged by {judge_by.spec}")
        judged = Budget(judge_by, auto_budget, AUTO_MARGIN, option="--auto-budget", margin_option=None)
        sparsity, warnings = _oneshot_auto(tflite_bytes, calibration, val, kinds, judged,
                                           Run(num_threads, progress=progress))
        notes += warnings
    elif isinstance(sparsity, str):
        raise InputError(f"sparsity {sparsity!r}: give a fraction, name=value pairs, n:m or auto")
    result = prune_layers(tflite_bytes, calibration, 0.0 if nm else sparsity, kinds=kinds, nm=nm,
                          progress=progress, num_threads=num_threads)
    return PruneResult(result.tflite, result.sparsity, result.pruned, result.already_sparse,
                       top1(bytes(tflite_bytes)), top1(result.tflite), "oneshot", result.seconds, notes)


def _oneshot_auto(tflite_bytes: bytes, calibration: np.ndarray, val: tuple, kinds: Sequence[str], judged: Budget,
                  run: Run) -> tuple[dict[str, float], list[str]]:
    """auto_sparsity's search with one-shot trials: per layer, largest first, the highest rung of
    AUTO_LADDER whose loss on `val` (pydsz.metrics, paired with the unpruned model's per sample)
    stays within the budget with its margin of noise in hand, the noise as
    compress counts it (McNemar's for top-1). Nothing retrains, so every trial is judged against the
    unpruned model: the layers share one budget. Returns the sparsities and the warnings about
    samples too few to resolve the budget (InputError where they cannot resolve it at all)."""
    from tqdm import tqdm

    x_val, y_val = val
    metric, num_threads = judged.metric, run.num_threads
    model = TFLiteModel(tflite_bytes)
    keys = [d["key"] for d in model.output_details()]
    reference = runtime.outputs(tflite_bytes, x_val, keys, num_threads=num_threads)
    if metric.needs_labels and y_val is None:
        raise InputError(f"sparsity auto judged by {metric.name} needs labels (an .npz with 'y'); without them "
                         "judge by a metric that compares with the unpruned model (expected-top1, output-error)")
    metric.check(reference, y_val)
    base = metric.losses(reference, reference, y_val)
    n = len(base)
    warnings = judged.warnings(n)
    allowed = judged.allowed(n)
    layers = [l for l in selectable(model, kinds) if 1 - density(model.weight(l)) < ALREADY_SPARSE]

    def trial(targets: dict) -> tuple[bool, float]:
        """(within the budget with the margin, the noise of the summed loss)."""
        pruned = prune_layers(tflite_bytes, calibration, targets, kinds=kinds, num_threads=num_threads).tflite
        losses = metric.losses(runtime.outputs(pruned, x_val, keys, num_threads=num_threads), reference, y_val)
        noise = metric.noise(losses, base)
        return judged.within(float(np.sum(losses - base)), noise, allowed), noise

    order = by_size([l.name for l in layers], {l.name: int(np.prod(l.shape)) for l in layers})
    chosen: dict[str, float] = {}
    for name in tqdm(order, desc="auto sparsity", unit="layer", disable=not run.progress, leave=False):
        lo, hi = 0, len(AUTO_LADDER)  # AUTO_LADDER[:lo] passed, [hi:] failed
        while lo < hi:
            mid = (lo + hi) // 2
            safe, noise = trial({**chosen, name: AUTO_LADDER[mid]})
            lo, hi = (mid + 1, hi) if safe else (lo, mid)
        if lo:
            chosen[name] = AUTO_LADDER[lo - 1]
        elif name == order[0] and judged.risk(0, noise) > allowed:
            # the last trial was the ladder's first rung: its noise alone exceeds the budget
            raise judged.noise_error(f"pruning {name}, the largest layer, by {AUTO_LADDER[0]}", n, noise)
    return chosen, warnings
