"""Step 1 of DeepSZ: magnitude pruning of FC layers, then retraining with the masks held.

The conv trunk stays frozen: the input of the first FC layer is captured once through the
interpreter, and the FC tail is retrained on those cached activations (pydsz.prune.train).
pydsz.prune.oneshot.prune_model is the way without training data, conv layers included.

Memory: retraining holds the model's bytes (the dense layers are views of them) and the trained copy
of the tail, i.e. 2x the FC weights, plus the cached activations (pydsz.prune.train).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence, Union

import numpy as np

from pydsz.budget import calibrated, metrics
from pydsz.budget.rule import Budget, risk
from pydsz.context import Run
from pydsz.errors import InputError
from pydsz.model import activations, runtime
from pydsz.model.graph import TFLiteModel
from pydsz.model.tail import Tail
from pydsz.prune import auto_retrain, auto_sparsity
from pydsz.prune.masks import ALREADY_SPARSE, AUTO_MARGIN, Sparsity, density, masks_for, sparsity_targets
from pydsz.prune.train import MIN_TRAIN_SAMPLES, Dense, Retraining, logits, retrain, tail_layers


@dataclass
class PruneResult:
    """A pruned model and what was done to it (accuracies on the validation set)."""

    tflite: bytes
    sparsity: dict[str, float]  # per FC layer, after pruning (already-sparse layers included)
    pruned: list[str]  # the layers pruned now
    already_sparse: list[str]  # layers found sparse and left as they were
    top1_before: Optional[float]  # None when there are no labels to measure it with
    top1_after: Optional[float]
    method: str = "retrain"  # "retrain" (masked retraining of the FC tail) or "oneshot" (pydsz.prune.oneshot)
    seconds: dict[str, float] = field(default_factory=dict)  # oneshot: time per pruned layer
    notes: list[str] = field(default_factory=list)  # oneshot auto: what it judged by, and sample warnings


# Full retrainings auto may spend bisecting its family above the plan the brief trials chose (the
# families have 10 to 40 plans: four halvings leave a sixteenth of the way above that plan unresolved).
CLIMB = 4


def _auto_budget(budget: Union[float, Budget], margin: float = AUTO_MARGIN) -> Budget:
    """`auto`'s budget with retraining: top-1 on the validation labels, set by --auto-budget; or the
    Budget a caller sets up (dsz compress --prune auto: its share of --max-loss), which must be top-1."""
    if isinstance(budget, Budget):
        if not isinstance(budget.metric, metrics.Top1):
            raise InputError(f"pruning with retraining judges by top1 on the labels, not {budget.metric.spec}")
        return budget
    return Budget(metrics.Top1(), budget, margin, option="--auto-budget", margin_option=None)


def prune_model(
    tflite_bytes: bytes, train: tuple[np.ndarray, np.ndarray], val: tuple[np.ndarray, np.ndarray],
    sparsity: Sparsity, *, settings: Retraining = Retraining(), auto_budget: Union[float, Budget] = 0.001,
    checked: Optional[float] = None, run: Run = Run(),
) -> PruneResult:
    """Prune the FC layers of a .tflite model by magnitude and retrain its FC tail with the masks held.

    sparsity: one fraction for every FC layer, {layer: fraction}, or "auto" (pydsz.prune.auto_retrain:
    the plan of the smallest predicted file whose retraining keeps the validation top-1 within
    auto_budget, a share of accuracy, or a pydsz.budget.rule.Budget in top-1 whose option name its
    errors give; `checked`, a share of accuracy too, the most the validation labels may see that plan
    lose, as counted in `_final_auto`: compress --prune auto's whole --max-loss, on which the labels check
    its file; None: auto_budget's own). Layers already at least ALREADY_SPARSE sparse are left alone. The
    trunk before the first FC layer stays frozen: its output is captured once and the tail retrains on it, as
    `settings` say (pydsz.prune.train.Retraining: epochs, the unpruned tail's share `distill` of the
    training target, seed, ...). run: the interpreter's threads, the device ("cpu" or "gpu":
    pydsz.gpu.device.resolve) where the tail retrains, progress bars.
    """
    data = bytes(tflite_bytes)
    model = TFLiteModel(data)
    (x, y), (x_val, y_val) = train, val
    fcs = _fc_layers(model, "no prunable FC layer")
    if len(x) < MIN_TRAIN_SAMPLES:
        raise InputError(f"training set of {len(x)} samples: too small to retrain (need >= {MIN_TRAIN_SAMPLES})")
    num_threads, distill = run.num_threads, settings.distill
    top1_before = runtime.accuracy(data, x_val, y_val, num_threads=num_threads)
    layers, tail_input = _trainable_tail(model, fcs[0].name)
    already = [l.name for l in layers if 1 - density(l.weight) >= ALREADY_SPARSE]
    prunable = [l.name for l in layers if l.name in {f.name for f in fcs}]
    todo = [name for name in prunable if name not in already]
    targets = sparsity_targets(prunable, sparsity)
    if isinstance(targets, dict):
        targets = {k: v for k, v in targets.items() if k not in already}
    if not todo or not targets:
        return PruneResult(data, {l.name: 1 - density(l.weight) for l in layers}, [], already,
                           top1_before, top1_before)
    runtime.accuracy(data, x[:1], y[:1], num_threads=num_threads)  # checks shape and labels up front
    h = activations.capture(data, x, tail_input, num_threads=num_threads)
    h_val = activations.capture(data, x_val, tail_input, num_threads=num_threads)
    y, y_val = np.asarray(y), np.asarray(y_val)
    teacher = [replace(l) for l in layers]
    notes: list[str] = []
    if targets == "auto":
        judged = _auto_budget(auto_budget)
        chosen = auto_retrain.choose(layers, (h, y), (h_val, y_val), todo, judged,
                                     settings=replace(settings, epochs=1), teacher=teacher if distill else None,
                                     run=run)
        labels = judged if checked is None else replace(judged, max_loss=checked)
        layers, targets, schedule = _final_auto(layers, (h, y), (h_val, y_val), chosen, judged,
                                                teacher if distill else None, settings, run, labels)
        notes += chosen.notes
        notes.append(f"auto kept {auto_sparsity.describe(targets)}, retrained by {schedule}")
    elif targets:
        layers = retrain(layers, masks_for(layers, {}), h, y, settings, targets=targets,
                         teacher=teacher if distill else None, run=run)
    del h, h_val  # the new model's bytes need not sit beside the activations
    out, sparsities = _written(model, layers)
    del layers  # written into `out`: the interpreter measuring it need not sit beside them
    return PruneResult(out, sparsities, sorted(targets), already, top1_before,
                       runtime.accuracy(out, x_val, y_val, num_threads=num_threads), notes=notes)


def _final_auto(dense, train: tuple, val: tuple, chosen, judged: Budget, teacher, settings: Retraining,
                run: Run, labels: Optional[Budget] = None) -> tuple[list[Dense], dict, str]:
    """The full retraining of auto's plan, checked on the validation set against the unpruned tail: its loss
    counted by what the two tails know together within `judged`, and the labels' own count of it within
    `labels` (None: `judged`), which the plan's top-1 on them then shows.
    The brief trials only rank plans: a retraining compressed into one epoch loses many times what the
    full one loses (LeNet-300-100 at 94/92/50%: 150 validation samples after one epoch, 65 after four,
    about 20 after 24), so their choice is a floor. A plan that loses more than the budget allows steps
    down its family by doubling strides until one does (nothing pruned at the bottom), then bisects the plans
    it stepped over; one that keeps within it bisects the rest of the family above it, where it keeps within
    by the margin a step up needs. Each bisection is a full retraining of the same schedule a step (at most
    CLIMB); a step above the brief choice is kept only within the budget with its margin of noise (the most
    pruned of several noisy passes would otherwise be the luckiest: on 500 validation samples such a plan lost
    2.15 test points for 0.8 measured), a margin widened for the CLIMB looks where the budget is noisy (below).
    Returns the layers, the plan kept and its schedule."""
    (h_val, y_val), device = val, run.device
    allowed, checked = judged.allowed(len(y_val)), (labels or judged).allowed(len(y_val))
    before = logits(dense, h_val, device)
    q, reference = calibrated.calibrate(before, y_val), np.argmax(before, axis=1) == y_val
    common = dict(settings=settings, teacher=teacher, run=run)

    def measured(layers) -> tuple[float, float, int]:
        """The validation samples' correct answers lost against the unpruned tail, counted by what the two
        tails know together (calibrated.changes), that count's noise, and the labels' count (lost net of
        gained). By the labels alone the noise is a whole sample a moved prediction (McNemar's): on 500 labels
        and a share of 3 samples, full retrainings that lost a few tenths of a point on 10,000 unseen images
        failed by it and stepped 3 of 10 mlp-d draws down to 60-75% (20-24x); judged by both counts, the
        labels' within the whole budget, one of them keeps 90/90% (51x at +0.33 test points)."""
        out = logits(layers, h_val, device)
        d = calibrated.changes(q, out, y_val)
        hits = np.argmax(out, axis=1) == y_val
        by_labels = int(np.sum(reference & ~hits) - np.sum(~reference & hits))
        return float(np.sum(d)), math.sqrt(float(np.sum(d * d))), by_labels

    def lost(layers):
        return measured(layers)[0]

    def holds(layers, margin: float = 0.0) -> bool:
        count, noise, by_labels = measured(layers)
        return risk(count, noise, margin) <= allowed and by_labels <= checked

    # the climb keeps the most pruned of up to CLIMB passes. Where the budget lets only a handful of
    # samples change, a pass's noise is as large as the budget and the most pruned passing is mostly the
    # luckiest: each pass is then judged at the margin that gives them together the confidence one pass
    # has at the budget's own (500 validation samples, 1-point budgets, one sd a pass: cnn-b climbed to
    # 99% and lost 2.59 points on 10,000 test images, mlp-c 1.59; at 1.75 sd, cnn-b 0.78). Where it
    # resolves the budget, one sd a pass holds on test data (LeNet-300-100, 5,000 samples: 45.4x at +0.41
    # for 0.53 allowed), and the wider margin would only cost ratio (25.4x at +0.42)
    climb_margin = judged.margin_of(CLIMB) if judged.noisy(len(y_val)) else judged.margin

    def within_margin(layers):  # within the budget with that margin of its noise
        return holds(layers, climb_margin)

    def bisect(lo: int, hi: int, layers, targets, passes) -> tuple[int, list, dict, int]:
        """The most pruned of family[lo..hi] whose full retraining by `schedule` passes, family[lo] (trained as
        `layers` at `targets`) passing already: at most CLIMB retrainings. Returns its index, layers, plan and
        the retrainings spent."""
        tried = 0
        while lo < hi and tried < CLIMB:
            mid = (lo + hi + 1) // 2
            more = dict(chosen.family[mid])
            trained = auto_retrain.retrain_as(schedule, dense, train, more, **common)
            tried += 1
            if passes(trained):
                lo, layers, targets = mid, trained, more
            else:
                hi = mid - 1
        return lo, layers, targets, tried

    index, stride, failed = chosen.index, 1, None
    while index > 0:
        targets = dict(chosen.family[index])
        layers, schedule, _ = auto_retrain.final(dense, train, targets, lost, **common)
        if holds(layers):
            break
        failed = index
        index, stride = index - stride, 2 * stride  # a few full retrainings at most, not one per plan
    else:
        # nothing pruned: where that is the validation set's noise, not the model's, say so (1,000 samples and a
        # budget of 2: a brief trial passed by luck of its flips, every full retraining lost more)
        chosen.resolvable()
        return dense, {}, "nothing"
    if failed is not None:
        # the doubling strides overshoot: the plans between the last that failed and the first that passed are
        # bisected, each judged as the step down judged them (mlp-d, 500 labels: 7 of 10 brief choices failed their
        # full retraining, and on three draws this gained 4-30% of the ratio with every draw within 1 test point)
        lo, layers, targets, tried = bisect(index, failed - 1, layers, targets, holds)
        between = failed - 1 - index
        chosen.notes.append(f"auto's choice lost more than its budget after full retraining: stepped down "
                            f"{chosen.index - index} plan(s)" + (f", then bisected the {between} plan(s) below the last "
                            f"that failed by {tried} full retraining(s): {lo - index} step(s) up" if between else ""))
    elif within_margin(layers):
        lo, layers, targets, tried = bisect(index, len(chosen.family) - 1, layers, targets, within_margin)
        chosen.notes.append(f"auto bisected the {len(chosen.family) - 1 - index} plan(s) above the brief trials' "
                            f"choice by {tried} full retraining(s): {lo - index} step(s) up")
    else:
        # the plans above prune more: beside this one, they would pass the climb's margin only by luck (500 labels:
        # mlp-d's climbs from such plans went up no step and took half of dsz prune's time; mlp-b's went up to a
        # plan that lost 1.44 test points against 1 allowed)
        chosen.notes.append("auto kept the brief trials' choice without bisecting above it: its full retraining is "
                            f"within the budget but not by the margin of noise ({climb_margin:.2f} sd) a step up needs")
    return layers, targets, schedule


def _fc_layers(model, none: str) -> list:
    """The model's FC layers that pruning may change; InputError, saying the model has `none`, where
    there are none."""
    fcs = [l for l in model.layers(("fc",)) if l.compressible and not l.shared_with and not l.subgraph]
    if not fcs:
        raise InputError(f"the model has {none} (float32 constant weights used by one layer)")
    return fcs


def _trainable_tail(model, first: str) -> tuple[list[Dense], int]:
    """The tail from FC layer `first` on as Dense layers, each training its bias where the bias's
    buffer is its own; and the tail's input tensor. The layers' weights are the model's (read-only
    views of its bytes) and retrain copies what it trains, so they take no memory of their own."""
    tail = Tail.from_model(model, first, strict=True)
    layers = tail_layers(tail)
    storable = _bias_buffers(model, layers)
    for l in layers:
        l.train_bias = model.layer(l.name).bias is not None and model.tensors[model.layer(l.name).bias].buffer in storable
    return layers, tail.input_tensor


def _written(model, layers: Sequence[Dense]) -> tuple[bytes, dict[str, float]]:
    """The model with the layers' weights (and their own biases) written in; each layer's sparsity."""
    biases = {buffer: l.bias for buffer, l in _bias_buffers(model, layers).items()}
    out = model.replace({**{l.name: l.weight for l in layers}, **biases})
    return out, {l.name: 1 - density(l.weight) for l in layers}


def _bias_buffers(model, layers: Sequence[Dense]) -> dict[int, Dense]:
    """The layers whose bias can be retrained, by bias buffer: those whose buffer no other tensor
    reads (the converter merges identical constants, e.g. zero biases; a shared one stays frozen)."""
    readers: dict[int, int] = {}
    for t in model.tensors:
        if t.buffer:
            readers[t.buffer] = readers.get(t.buffer, 0) + 1
    out = {}
    for l in layers:
        layer = model.layer(l.name)
        if layer.bias is not None:
            buffer = model.tensors[layer.bias].buffer
            if buffer and readers.get(buffer) == 1 and model.constant(layer.bias) is not None:
                out[buffer] = l
    return out


def retrain_masked(tflite_bytes: bytes, teacher_bytes: bytes, train: tuple[np.ndarray, np.ndarray],
                   val: tuple[np.ndarray, np.ndarray], *, settings: Retraining = Retraining(),
                   run: Run = Run()) -> PruneResult:
    """Retrain the FC tail of a model pruned elsewhere (one-shot: pydsz.prune.oneshot), its zeros held as
    the masks, distilling from `teacher_bytes` (the unpruned model of the same graph). Where one-shot
    pruning chose the masks and compensated the weights, this starts from there rather than from
    magnitude masks on the dense weights."""
    model = TFLiteModel(bytes(tflite_bytes))
    first = _fc_layers(model, "no FC layer to retrain")[0].name
    (x, y), (x_val, y_val) = train, val
    layers, tail_input = _trainable_tail(model, first)
    teacher = tail_layers(Tail.from_model(TFLiteModel(bytes(teacher_bytes)), first, strict=True))
    num_threads = run.num_threads
    h = activations.capture(model.data, x, tail_input, num_threads=num_threads)
    layers = retrain(layers, masks_for(layers, {}), h, np.asarray(y), settings,
                     teacher=teacher if settings.distill else None, run=run)
    out, sparsities = _written(model, layers)
    return PruneResult(out, sparsities, [], [],
                       runtime.accuracy(model.data, x_val, y_val, num_threads=num_threads),
                       runtime.accuracy(out, x_val, y_val, num_threads=num_threads), "oneshot+retrain")
