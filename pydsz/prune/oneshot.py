"""One-shot pruning from calibration inputs alone: SparseGPT (pydsz.prune.gptq) on every selected layer.

No gradients and no labels: anything the interpreter runs can be pruned this way. Each layer is
pruned on the inputs the layers already pruned produce, in execution order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Union

import numpy as np

from pydsz.budget import metrics, probabilities
from pydsz.budget.rule import Budget
from pydsz.context import Run
from pydsz.errors import InputError
from pydsz.model import runtime
from pydsz.model.data import CROSSFIT_SAMPLES, sample_digests, take_samples, two_halves
from pydsz.model.graph import TFLiteModel
from pydsz.prune import auto_sparsity
from pydsz.prune.gptq import (
    DAMP,
    MAX_HESSIAN_BYTES,
    Sequential,
    check_memory,
    factor_bytes,
    hessian_bytes,
    inverse_factor,
    selectable,
    solve,
)
from pydsz.prune.masks import ALREADY_SPARSE, AUTO_MARGIN, density, sparsity_targets
from pydsz.prune.retraining import PruneResult


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
                 max_hessian_bytes: int = MAX_HESSIAN_BYTES, run: Run = Run()) -> OneShotResult:
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
    inputs = Sequential(model, x, todo, run.num_threads)
    for layer in tqdm(todo, desc="one-shot pruning", unit="layer", disable=not run.progress, leave=False):
        start = time.perf_counter()
        factors = [inverse_factor(g, damp, overwrite=True) for g in inputs.hessian(model, layer)]  # H let go
        weight = solve(layer, model.weight(layer), factors, sparsity=targets[layer.name], nm=nm)
        model = TFLiteModel(model.replace({layer.name: weight}))
        seconds[layer.name] = time.perf_counter() - start
    return OneShotResult(model.data, {l.name: 1 - density(model.weight(l)) for l in layers},
                         [l.name for l in todo], already, seconds)


def prune_model(
    tflite_bytes: bytes, calibration: np.ndarray, val: tuple[np.ndarray, Optional[np.ndarray]],
    sparsity: Union[float, Mapping[str, float], tuple[int, int], str], *, kinds: Sequence[str] = ("fc",),
    auto_budget: Union[float, Budget] = 0.001, run: Run = Run(), groups: Optional[np.ndarray] = None,
) -> PruneResult:
    """Prune the layers of `kinds` one-shot (SparseGPT from calibration inputs, no training).
    sparsity: a fraction, {layer: fraction}, an n:m pattern (n, m), or "auto" (as auto_sparsity
    decides, on one-shot trials judged on `val`). auto_budget: a pydsz.budget.rule.Budget (its metric,
    by default top1 with labels, expected-top1 without for a classifier, output-error otherwise; its
    margin and option name), or a number as max_loss in that default metric with auto's margin. The
    labels, when given, also measure top-1 before and after; without them the budget's metric says
    what pruning cost. groups: each sample of val's source (pydsz.model.data.load_groups), which auto's
    trials, cross-fitted where the calibration inputs are val's, keep within one half."""
    x_val, y_val = val

    def top1(model: bytes) -> Optional[float]:
        return None if y_val is None else runtime.accuracy(model, x_val, y_val, num_threads=run.num_threads)

    nm = sparsity if isinstance(sparsity, tuple) else None
    judged = Budget.of(auto_budget, margin=AUTO_MARGIN, option="--auto-budget", margin_option=None) \
        .for_model(TFLiteModel(tflite_bytes), y_val is not None)
    notes: list[str] = []
    if sparsity == "auto":
        notes.append(f"auto judged by {judged.metric.spec}" + (f" ({judged.reason})" if judged.reason else ""))
        sparsity, warnings = _oneshot_auto(tflite_bytes, calibration, val, kinds, judged, run, groups)
        notes += warnings
    elif isinstance(sparsity, str):
        raise InputError(f"sparsity {sparsity!r}: give a fraction, name=value pairs, n:m or auto")
    result = prune_layers(tflite_bytes, calibration, 0.0 if nm else sparsity, kinds=kinds, nm=nm, run=run)
    if y_val is None and not judged.metric.needs_labels:  # no top-1 says what pruning cost: the metric does
        notes.append(_loss_note(bytes(tflite_bytes), result.tflite, x_val, judged.metric, run.num_threads))
    return PruneResult(result.tflite, result.sparsity, result.pruned, result.already_sparse,
                       top1(bytes(tflite_bytes)), top1(result.tflite), "oneshot", result.seconds, notes)


def footprint(model: TFLiteModel, probe, samples: int, kinds: Sequence[str], auto: bool = False) -> dict:
    """What one-shot pruning holds beside evaluating (pydsz.compress.footprint): the largest layer's H while
    it is factored (gptq.hessian_bytes) and its input for one streamed batch (runtime.stream: within
    CAPTURE_BYTES unless one sample is larger), float32 and the float64 copy it is summed in; auto: every
    layer's factor, kept while the plan's curves are measured. probe: runtime.probe's on the model's
    inputs; samples: how many calibration inputs."""
    chosen = selectable(model, kinds)
    one = max((probe.tensors or {}).get(layer.input, 0) for layer in chosen) if chosen else 0
    streamed = min(min(samples, runtime.DEFAULT_BATCH) * one, max(runtime.CAPTURE_BYTES, one))
    parts = {"Hessian": max((hessian_bytes(layer) for layer in chosen), default=0),
             "streamed layer inputs (float32 + float64)": 3 * streamed}
    if auto:
        parts["the factors kept for the plan"] = sum(map(factor_bytes, chosen))
    return parts


def _oneshot_auto(tflite_bytes: bytes, calibration: np.ndarray, val: tuple, kinds: Sequence[str], judged: Budget,
                  run: Run, groups: Optional[np.ndarray] = None) -> tuple[dict[str, float], list[str]]:
    """auto's plan with one-shot trials (pydsz.prune.auto_sparsity): per layer, SparseGPT on that layer alone at each
    rung (its Hessian from the calibration inputs, once, along the cuts), the loss of each measured on `val` and its
    bytes from libdsz; the knapsack's family of plans; then the most pruned plan whose one-shot pruning
    of every layer together stays within the budget on `val` (pydsz.budget.metrics, paired with the unpruned
    model's per sample, the noise as compress counts it) with its margin of noise in hand. Nothing
    retrains, so every trial is judged against the unpruned model. Returns the sparsities and the notes
    (what was chosen; samples too few to resolve the budget, an InputError where they cannot resolve it
    at all)."""
    from pydsz.assess.evaluator import Evaluator

    x_val, y_val = val
    metric, num_threads = judged.metric, run.num_threads
    model = TFLiteModel(tflite_bytes)
    if metric.needs_labels and y_val is None:
        raise InputError(f"sparsity auto judged by {metric.name} needs labels (an .npz with 'y'); without them "
                         "judge by a metric that compares with the unpruned model (expected-top1, output-error)")
    layers = [l for l in selectable(model, kinds) if 1 - density(model.weight(l)) < ALREADY_SPARSE]
    names = [l.name for l in layers]
    if not layers:
        return {}, []
    check_memory(layers)
    quiet = Run(num_threads)  # the evaluators and trials run on the CPU, without bars of their own
    # a top1 budget's trials are decided in calibrated-top1, as compress's bounds are (Budget.decisions),
    # and checked on the labels as measured: a one-shot pruned model is a copy of the original that knows
    # nothing more, judged by its probabilities without the labels' coin tosses, whose noise as a margin
    # stopped mlp-d at 50-60% where 80/60% held within the budget on unseen images
    decisions = judged.decisions(y_val is not None)
    deciding = decisions.metric
    judge = Evaluator(tflite_bytes, x_val, y_val, names, deciding, run=quiet)
    n = judge.samples
    warnings = judged.checked_warnings(n, decisions, judge.metric.change_costs(judge.outputs))
    checked = judged.allowed(n)
    judged, allowed = decisions, decisions.allowed(n)
    # the curves rank by a smooth loss where the budget's moves by whole samples
    proxy = Evaluator(tflite_bytes, x_val, y_val, names, Divergence(metric.output), run=quiet) if metric.classifier else judge
    factors = {}
    hessians = Sequential(model, calibration, layers, num_threads)  # the model never changes here

    def prune(name: str, s: float) -> np.ndarray:
        layer = model.layer(name)
        if name not in factors:
            factors[name] = [inverse_factor(g, DAMP, overwrite=True) for g in hessians.hessian(model, layer)]
        return solve(layer, model.weight(layer), factors[name], sparsity=s)

    curves = auto_sparsity.measure_curves({l.name: model.weight(l) for l in layers}, prune,
                                    lambda name, w: proxy.measure({name: w}).loss, progress=run.progress)
    factors.clear()
    family = auto_sparsity.plans(curves)

    folds = _crossfit(calibration, x_val, groups)

    def trial(plan: dict) -> auto_sparsity.Trial:
        # the plan as it will be pruned, on every calibration sample; cross-fitted, also each half of the data
        # pruned on the calibration samples outside it, as other data meets it: within where both are (as
        # compress's cross-fitted compensation counts the larger of the file's loss and the halves')
        outputs = [judge.outputs_of(prune_layers(tflite_bytes, calibration, plan, kinds=kinds, run=quiet).tflite)]
        if folds is not None:
            held_out = {key: out.copy() for key, out in outputs[0].items()}
            for measured, fitting in folds:
                part = judge.outputs_of(prune_layers(tflite_bytes, fitting, plan, kinds=kinds, run=quiet).tflite)
                for key in held_out:
                    held_out[key][measured] = part[key][measured]
            outputs.append(held_out)
        measures = [judge.measure_model_in(out, [deciding, metric]) for out in outputs]
        within = all(judged.within(m.loss, m.noise, allowed) and labelled.loss <= checked for m, labelled in measures)
        m = max((m for m, _ in measures), key=lambda m: judged.risk(m.loss, m.noise))
        return auto_sparsity.Trial(plan, within, m.loss, m.noise)

    index, trials = auto_sparsity.search(family, trial, run.progress)
    if index == 0:
        auto_sparsity.check_resolvable(trial, {l.name: int(np.prod(l.shape)) for l in layers}, judged, n, allowed)
    plan = family[index]
    note = (f"auto chose {auto_sparsity.describe(plan)} of {len(family)} plans (predicted "
            f"{auto_sparsity.predicted_bytes(curves, plan)} bytes; {len(trials)} one-shot trials)")
    return dict(plan), [note, *warnings]


def _crossfit(calibration, x_val, groups=None) -> Optional[list]:
    """The trials' folds where the calibration inputs include samples they are judged on: per half of the
    judged samples (data.two_halves, each of the `groups` whole), (its indices, the calibration samples outside it) to prune on, so that
    each half is judged pruned on Hessians that never saw it. None where fewer than CROSSFIT_SAMPLES are
    shared. Fitted on its own samples, one-shot pruning keeps their outputs where a layer has more inputs
    than there are samples: LeNet-5 pruned 80/50% by --prune auto at 1 point on 128 unlabelled images
    changed none of them and 5.2% of the test images (1.90 points lost)."""
    judged, own = sample_digests(x_val), sample_digests(calibration)
    if len(set(judged) & set(own)) < CROSSFIT_SAMPLES:
        return None
    folds = []
    for measured in two_halves(len(judged), groups):
        held = {judged[i] for i in measured}
        folds.append((measured, take_samples(calibration, np.array([i for i, d in enumerate(own) if d not in held]))))
    return folds


def _loss_note(original: bytes, pruned: bytes, x, metric, num_threads: Optional[int]) -> str:
    keys = [d["key"] for d in TFLiteModel(original).output_details()]
    reference = runtime.outputs(original, x, keys, num_threads=num_threads)
    out = runtime.outputs(pruned, x, keys, num_threads=num_threads)
    metric = metric.knowing(TFLiteModel(original))
    losses = metric.losses(out, reference, None) - metric.losses(reference, reference, None)
    return (f"{metric.spec} against the unpruned model on the validation data: {float(np.mean(losses)):.4g} "
            f"({metric.unit}; {len(losses)} samples)")


class Divergence(metrics.Metric):
    """Per sample, the KL divergence of the class probabilities from the unpruned model's (summed over
    the outputs): smooth where top-1 moves by whole samples."""

    name, unit = "divergence", "KL divergence of the class probabilities from the unpruned model's"

    def losses(self, outputs, reference, y):
        total = 0.0
        for key, out in self.select(outputs).items():
            p, q = (probabilities.as_probabilities(np.asarray(a, np.float64).reshape(len(a), -1), key in self.probabilities)
                    for a in (reference[key], out))
            total = total + np.sum(p * (np.log(p + 1e-12) - np.log(q + 1e-12)), axis=1)
        return np.asarray(total, np.float64)
