"""DeepSZ's main job: assess -> optimize -> verify -> encode, under a budget of loss in a metric.

The loss reported is always measured: the chosen bounds are applied to all layers together, the
.dsz is written and decoded, and the decoded model is run through the interpreter and judged by
the metric. Where the per-layer losses do not add up and the budget is exceeded, bounds are
tightened one measured step at a time, the step chosen greedily, until the measured loss fits
(every layer lossless always fits).

Losses inside are sums over the samples of the metric's per-sample loss difference (for top-1,
samples), as assess measures them; the Result reports means, in the metric's unit.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import numpy as np

from pydsz.assess import plan
from pydsz.assess.evaluator import Evaluator
from pydsz.assess.executor import Local
from pydsz.assess.ladder import Point
from pydsz.budget import metrics
from pydsz.budget.knapsack import Option, Plan, loss_unit, minimize_loss, minimize_size
from pydsz.budget.rule import Budget, risk
from pydsz.compress.compensation import Compensation
from pydsz.compress.compensation import for_model as compensation_for
from pydsz.compress.unreached import by_analogy, unreached_layers
from pydsz.context import Run
from pydsz.encode import constants, pack
from pydsz.encode.tensor import as_weight
from pydsz.errors import InputError
from pydsz.format import container
from pydsz.model import runtime, selection
from pydsz.model.graph import TFLiteModel
from pydsz.model.selection import Selection, compressible_layers
from pydsz.model.tensors import INTEGER_TYPES


@dataclass
class LayerResult:
    """One compressed layer as written: the paper's per-layer table row."""

    name: str
    shape: tuple
    density: float
    bound: float  # 0: kept lossless
    original_bytes: int
    data_bytes: int
    index_bytes: int
    stream_bytes: int
    loss: float  # measured with this layer alone compressed at `bound`, in the metric's unit
    bound_unit: str = "absolute"  # "steps": the bound counts quantization steps of an int8/uint8 layer

    @property
    def ratio(self) -> float:
        return self.original_bytes / max(1, self.data_bytes + self.index_bytes)


@dataclass
class Result:
    """What `compress` did: the .dsz bytes, the per-layer choices, the measurements behind them."""

    dsz: bytes
    layers: list[LayerResult]
    curves: dict[str, list[Point]]
    samples: int
    metric: metrics.Metric
    before: float  # the metric's value (metric.value) for the original model, by the interpreter
    after: float  # the same for the model decoded from `dsz`
    loss: float  # measured: mean per-sample loss of the decoded model minus the original's
    max_loss: float  # as given, in the metric's unit
    allowed: float  # the loss compression may cost, summed over the samples (after any reference)
    model_bytes: int
    spent: float = 0.0  # loss an earlier step (pruning) took from the budget, the metric's unit
    margin: float = 1.0  # noise margin of the decisions (standard deviations)
    attempts: list[dict] = field(default_factory=list)  # one per verification round
    fast_evaluation: bool = True
    device: str = "cpu"  # where the FC tail's evaluations ran
    cpu_reason: Optional[str] = None  # why they ran on the CPU although the GPU was asked for
    evaluations: int = 0  # candidate evaluations (assessment and verification)
    evaluation_seconds: float = 0.0
    metric_reason: str = ""  # why this metric, when it was chosen by default
    warnings: list[str] = field(default_factory=list)
    compensated: list[str] = field(default_factory=list)  # layers encoded from compensated weights
    # per layer: how it was assessed (pydsz.assess.plan.Assessment.layers), and the layers the size floor left out
    assessment: dict = field(default_factory=dict)
    below_floor: list[str] = field(default_factory=list)
    memory: dict = field(default_factory=dict)  # what evaluating held (Evaluator.footprint)
    # the gathered constants (biases, PReLU slopes: pydsz.encode.constants): each within this fraction of its
    # largest magnitude; 0 when they are kept lossless
    constants_rel: float = 0.0
    # compensation cross-fitted on the data: the loss with each half's weights compensated on the other half
    # (what holds on data the compensation did not see; within the budget too; in `decided`'s metric where
    # there is one), else None
    held_out_loss: Optional[float] = None
    # where the decisions measured in another metric than the budget's (Budget.decisions: top1's in
    # calibrated-top1): that metric, its measured loss of the file (mean) and what it allows, else None
    decided: Optional[dict] = None

    @property
    def fc_original_bytes(self) -> int:
        return sum(l.original_bytes for l in self.layers)

    @property
    def fc_compressed_bytes(self) -> int:
        return sum(l.data_bytes + l.index_bytes for l in self.layers)

    @property
    def ratio(self) -> float:
        """The paper's ratio: the layers' stored bytes / (data bytes + index bytes)."""
        return self.fc_original_bytes / max(1, self.fc_compressed_bytes)

    @property
    def file_ratio(self) -> float:
        return self.model_bytes / max(1, len(self.dsz))

    @property
    def allowed_loss(self) -> float:
        """The loss compression may cost, in the metric's unit."""
        return self.allowed / self.samples

    @property
    def evaluations_per_second(self) -> float:
        return self.evaluations / self.evaluation_seconds if self.evaluation_seconds > 0 else 0.0


def _check_target(target_ratio: Optional[float]) -> None:
    if target_ratio is not None and not (math.isfinite(target_ratio) and target_ratio > 1):
        raise InputError(f"target ratio {target_ratio}: must be a number > 1")


def _monotone(values: list[float]) -> list[float]:
    """The closest non-decreasing sequence (least squares; pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, c2), (m1, c1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    return [m for m, c in blocks for _ in range(int(c))]


def expected_losses(points: list[Point], margin: float) -> list[float]:
    """Each point's loss as the optimizer sees it (summed over samples): loss + margin * noise, made
    non-decreasing in the bound. A larger bound cannot be expected to lose less; a dip in the
    measured curve is noise, and picking it would fit the validation set instead of the data. A held
    point (a model update's values left as the device holds them) is off that curve: its own risk."""
    risks = [0.0 if p.bound == 0 else risk(p.loss, p.noise, margin) for p in points]
    curve = [k for k, p in enumerate(points) if not p.held]
    out = list(risks)
    for k, smoothed in zip(curve, _monotone([risks[k] for k in curve])):
        out[k] = smoothed
    return out


def _plan(table: dict[str, list[Point]], n: int, allowed: float, max_size: Optional[int],
          margin: float, metric: metrics.Metric) -> Optional[Plan]:
    expected = {name: expected_losses(pts, margin) for name, pts in table.items()}
    if metric.quadrature:
        # the layers' errors are independent perturbations of the outputs: they add in quadrature
        expected = {name: [e * e / n for e in losses] for name, losses in expected.items()}
        allowed = allowed * allowed / n
    unit = loss_unit(n, metric.discrete, allowed if max_size is None else sum(max(e) for e in expected.values()))
    options = {name: [Option(p.bound, p.size, loss / n) for p, loss in zip(pts, expected[name])]
               for name, pts in table.items()}
    if max_size is not None:
        return minimize_loss(options, max_size, unit)
    return minimize_size(options, allowed / n, unit)


def compress(
    tflite_bytes: bytes,
    x,
    y=None,
    budget: Union[None, float, Budget] = None,
    *,
    layers: Union[str, Selection] = "fc",
    target_ratio: Optional[float] = None,
    compensation: Compensation = Compensation(),
    run: Run = Run(),
) -> Result:
    """The smallest .dsz of a model whose loss in the budget's metric on (x, y) is within the budget.

    x: the inputs (one array, or one per model input); y: integer labels, or None for metrics that
    compare with the original model only. budget: a pydsz.budget.rule.Budget (its metric, max_loss,
    margin, spent), or a number as the max_loss of the model's default metric, or None for every
    default. The budget's `spent` is loss an earlier step already spent (e.g. pruning's, measured
    from the unpruned model, so that pruning and compression share one budget); its `margin` how many
    standard deviations of the noise every decision keeps in hand (0 takes the measured losses at face
    value, which overfits the data: the chosen bounds then lose more on unseen data). The final
    measured loss is within the budget either way.
    layers: fc, conv, all, or layer names (fc3, conv12,conv13), or a pydsz.model.selection.Selection
    (its size floor). target_ratio: instead, the least loss whose compressed layers are at most
    their original size / target_ratio.
    compensation: encode GPTQ-compensated float32 weights (pydsz.compress.compensation.Compensation):
    each bound's errors are pushed into the weights not yet quantized, so the outputs move less; the
    bound holds on the stored values. On by default: without calibration inputs cross-fitted on x
    (each half's loss measured with the weights compensated on the other half), the loss reported
    then the larger of that and the file's own on x (bench/zoo.py measures what it pays on data
    neither holds).
    run: the threads, device ("cpu" or "gpu": where the assessment runs the FC tail), executor (where
    the assessment's and verification's evaluations run: pydsz.assess.executor's Local, the default,
    or Dask; the results are the same) and progress bars (pydsz.context.Run).
    """
    data = bytes(tflite_bytes)
    model = TFLiteModel(data)
    _check_target(target_ratio)
    budget = Budget.of(budget).for_model(model, y is not None)
    metric, margin, spent = budget.metric, budget.margin, budget.spent
    # the decisions measure in `deciding`, its noise margin kept; the file's loss in the budget's metric, on
    # the labels, is then checked as measured (its noise is what the decisions' metric does without)
    decisions = budget.decisions(y is not None)
    deciding = decisions.metric
    choice = Selection.of(layers)
    layers = choice.spec
    chosen = compressible_layers(model, layers, choice.min_bytes)
    names = [l.name for l in chosen]
    x = runtime.fit_inputs(model.input_details(), x)
    compensator, compensation_warnings = (
        compensation_for(data, names, x, compensation.calibration, run.num_threads, compensation.groups)
        if compensation.on(len(x[0])) else (None, []))
    evaluator = Evaluator(data, x, y, names, deciding, run=run, compensator=compensator)
    n = evaluator.samples
    checks = budget.checked_warnings(n, decisions, evaluator.metric.change_costs(evaluator.outputs))
    warnings = checks + compensation_warnings + evaluator.notes
    base = float(np.mean(metric.losses(evaluator.outputs, evaluator.outputs, evaluator.y)))
    before = metric.value(base)
    allowed = decisions.allowed(n)
    checked = budget.allowed(n) if deciding is not metric else math.inf

    def file_loss(tflite: bytes):
        """The decisions' measurement of a decoded model, and its loss in the budget's metric (summed)."""
        if deciding is metric:
            m = evaluator.measure_model(tflite)
            return m, m.loss
        m, labelled = evaluator.measure_model_in(tflite, [evaluator.metric, metric])
        return m, labelled.loss

    executor = run.executor or Local()
    start = time.perf_counter()
    max_size = None
    if target_ratio is not None:
        max_size = int(sum(l.nbytes for l in chosen) / target_ratio)

    def choose(table: dict) -> Optional[dict]:
        found = _plan(table, n, allowed, max_size, margin, deciding)
        return {name: option.bound for name, option in found.choice.items()} if found else None

    assessment = plan.assess(evaluator, names, allowed, progress=run.progress, executor=executor, choose=choose)
    table = assessment.table
    chosen_plan = _plan(table, n, allowed, max_size, margin, deciding)
    # nothing fits (a target ratio beyond the grid): every layer lossless
    bounds = {name: chosen_plan.choice[name].bound if chosen_plan else 0.0 for name in names}
    unreached = unreached_layers(evaluator, table)
    if unreached:
        bounds, note = by_analogy(evaluator, table, bounds, unreached)
        warnings.append(note)
    attempts: list[dict] = []
    trials = 0  # evaluations of the verification's tightening steps
    slack = 0.0  # loss the interpreter measured beyond the fast path's (float rounding)
    kind = selection.container_kind(layers)
    crossfit = evaluator.compensator is not None and evaluator.compensator.cross_fitted
    while True:
        m = evaluator.measure_at(bounds)
        at_risk = decisions.risk(m.loss, m.noise)
        attempt = {"bounds": dict(bounds), "predicted": _predicted(table, bounds, margin), "loss": m.loss,
                   "risk": at_risk, "size": _size(table, bounds)}
        attempts.append(attempt)
        lossless = not any(bounds.values())
        if at_risk + slack > allowed and max_size is None and not lossless:
            bounds, tried = _tighten(executor, table, bounds, allowed - slack, at_risk, margin)
            trials += tried
            continue
        packed = pack.encode_tensors(_encoded_model(evaluator, bounds), pack.stored_bounds(model, bounds),
                                          kind)
        dsz = pack.assemble(*packed, kind, gather_small=True)
        file_m, labelled = file_loss(container.load(dsz).tflite_bytes())
        attempt["measured_loss"] = measured = file_m.loss
        if deciding is not metric:
            attempt["labelled_loss"] = labelled
        if (measured <= allowed and labelled <= checked) or max_size is not None or lossless:
            break
        if measured <= allowed:  # the labels see more than the decisions' metric: one step down
            bounds, tried = _tighten(executor, table, bounds, allowed - slack, at_risk, margin)
            trials += tried
            continue
        if not crossfit:
            slack = max(slack, measured - m.loss)
            continue
        # cross-fitted, m measured each half with the other half's compensation, the file holds the whole
        # data's: other weights, whose loss differs from m by their own noise (on 10,000 labels, 3 samples
        # for the halves and 33 for the file, with 20 allowed), not by an offset every later bound would
        # carry (as slack, it drove mlp-d's one-shot 0.6/0.6 plan to lossless: 2.3x where 15x held). The
        # slack is what the interpreter adds to the fast path on the file's own weights; the bounds step down
        # one layer at a time until the file itself is within
        slack = max(slack, measured - evaluator.measure(_file_weights(evaluator, bounds)).loss)
        bounds, tried = _tighten(executor, table, bounds, allowed - slack, at_risk, margin)
        trials += tried
    # cross-fitted, the file's weights were compensated on these very samples, whose loss flatters them by
    # what each half's loss with the other half's compensation (m) shows more: that is what holds elsewhere
    optimism = max(0.0, m.loss - measured) if crossfit else 0.0
    constants_rel, tries = 0.0, 0
    if max_size is None:
        tries, found = _gather_constants(file_loss, packed, chosen, bounds, layers, decisions, allowed, checked,
                                         decisions.risk(measured + optimism, m.noise), dsz, optimism)
        if found:
            dsz, measured, labelled, constants_rel = found
            attempts.append({"constants_rel": constants_rel, "measured_loss": measured,
                             **({"labelled_loss": labelled} if deciding is not metric else {})})
    seconds = time.perf_counter() - start

    decided = None
    if deciding is not metric:
        decided = {"metric": deciding.spec, "loss": measured / n, "allowed": allowed / n}
    return Result(
        dsz=dsz, layers=_layer_results(model, chosen, bounds, table, n), curves=table, samples=n, metric=metric,
        before=before, after=metric.value(base + labelled / n), loss=labelled / n, max_loss=budget.max_loss,
        held_out_loss=(measured + optimism) / n if crossfit else None,
        decided=decided, allowed=budget.allowed(n), model_bytes=len(data), spent=spent, margin=margin, attempts=attempts,
        fast_evaluation=evaluator.fast, device=evaluator.device, cpu_reason=evaluator.cpu_reason,
        evaluations=(assessment.evaluations + trials + sum("bounds" in a for a in attempts)
                     + sum("bounds" in a and "measured_loss" in a for a in attempts) + tries),
        evaluation_seconds=seconds, metric_reason=budget.reason, warnings=warnings,
        compensated=list(evaluator.compensator.layers) if evaluator.compensator else [],
        assessment=assessment.layers, below_floor=selection.below_floor(model, layers, choice.min_bytes),
        memory=evaluator.footprint(), constants_rel=constants_rel,
    )


def _gather_constants(file_loss: Callable, packed: tuple, chosen: list, bounds: dict, layers: str,
                      budget: Budget, allowed: float, checked: float, risk_before: float, dsz: bytes,
                      optimism: float = 0.0) -> tuple[int, Optional[tuple]]:
    """The verified .dsz with the model's small constants gathered too (pydsz.encode.constants), each within
    the coarsest relative bound tried whose decoded model is still within the budget, its margin
    included (or, where the weights alone already measured beyond the margin, no riskier than they
    were), and its loss in the budget's metric within `checked` (file_loss: compress's, the decisions'
    Measure and that loss): (bounds tried, (dsz, measured loss, the budget metric's, relative bound) or None
    where none is or the file is not smaller than `dsz`, the one without them). packed: pack.encode_tensors' model and entries of
    `dsz`, assembled again with each bound instead of encoded again. Each bound tried is one evaluation
    of the decoded model, `optimism` added (what a cross-fitted compensation's file loss on its own samples
    flatters it by). Layers chosen by name change nothing else: their selection gathers nothing."""
    if layers not in selection.KINDS:
        return 0, None
    floats = {l.name for l in chosen if l.stored_dtype not in INTEGER_TYPES}
    tries = 0
    for rel in constants.candidates(bounds, floats):
        smaller = pack.assemble(*packed, layers, gather_small=True, constants_rel=rel)
        if len(smaller) >= len(dsz):
            break  # nothing to gather, or not worth it at the coarsest bound
        tries += 1
        m, labelled = file_loss(container.load(smaller).tflite_bytes())
        held_out = m.loss + optimism
        if held_out <= allowed and labelled <= checked and budget.risk(held_out, m.noise) <= max(allowed, risk_before):
            return tries, (smaller, m.loss, labelled, rel)
    return tries, None


def _point(table: dict, name: str, bound: float) -> Point:
    return next(p for p in table[name] if p.bound == bound)


def _size(table: dict, bounds: dict) -> int:
    return sum(_point(table, name, b).size for name, b in bounds.items())


def _predicted(table: dict, bounds: dict, margin: float) -> float:
    """The optimizer's view of a choice: the sum of the layers' expected losses."""
    total = 0.0
    for name, bound in bounds.items():
        points = table[name]
        total += max(0.0, expected_losses(points, margin)[points.index(_point(table, name, bound))])
    return total


def _encoded_model(evaluator: Evaluator, bounds: dict) -> bytes:
    """The model whose weights pack_model encodes: as given, or with the compensated candidates."""
    if evaluator.compensator is None:
        return evaluator.bytes
    return evaluator.model.replace({name: evaluator.compensator.weights(name, bound) for name, bound in bounds.items()
                                    if bound > 0 and name in evaluator.compensator.layers})


def _file_weights(evaluator: Evaluator, bounds: dict) -> dict:
    """The weights a cross-fitted file holds at `bounds`, as the fast path takes them: the compensated layers'
    compensated on the whole data (on the codec's grid, as they decode), the others' candidates decoded."""
    compensator = evaluator.compensator
    weights = evaluator.weights_at({name: b for name, b in bounds.items() if name not in compensator.layers})
    weights.update({name: as_weight(compensator.weights(name, b), evaluator.model.layer(name).shape)
                    for name, b in bounds.items() if b > 0 and name in compensator.layers})
    return weights


def trial_risk(evaluator: Evaluator, bounds: dict, margin: float) -> float:
    """The risk (loss plus noise margin) of all layers compressed together at `bounds` (an executor's task)."""
    m = evaluator.measure_at(bounds)
    return risk(m.loss, m.noise, margin)


def _tighten(executor, table: dict, bounds: dict, allowed: float, current: float, margin: float) -> tuple[dict, int]:
    """One greedy step down: move one layer to its next smaller measured bound; (new bounds, trials).

    Every layer's step is measured with all layers compressed together. If some step brings the
    risk (loss plus noise margin) within `allowed`, the one giving the smallest total size wins;
    otherwise the one that removes the most risk per added byte. Bound 0 (lossless) is the last
    step of every layer, so repeated steps always end within budget.
    """
    steps = []
    for name, bound in bounds.items():
        smaller = [p.bound for p in table[name] if p.bound < bound]
        if smaller:
            steps.append({**bounds, name: max(smaller)})
    risks = executor.map(trial_risk, [(trial, margin) for trial in steps])
    trials = [(trial, trial_risk, _size(table, trial) - _size(table, bounds)) for trial, trial_risk in zip(steps, risks)]
    fitting = [t for t in trials if t[1] <= allowed]
    if fitting:
        return min(fitting, key=lambda t: t[2])[0], len(trials)
    return max(trials, key=lambda t: ((current - t[1]) / max(1, t[2]), -t[2]))[0], len(trials)


def _layer_results(model: TFLiteModel, chosen: list, bounds: dict, table: dict, n: int) -> list[LayerResult]:
    out = []
    for layer in chosen:
        point = next(p for p in table[layer.name] if p.bound == bounds[layer.name])
        w = model.weight(layer)
        out.append(LayerResult(
            name=layer.name, shape=tuple(layer.shape), density=float(np.count_nonzero(w)) / w.size,
            bound=point.bound, original_bytes=layer.nbytes, data_bytes=point.data_bytes,
            index_bytes=point.index_bytes, stream_bytes=point.size, loss=point.loss / n,
            bound_unit="steps" if layer.stored_dtype in INTEGER_TYPES else "absolute",
        ))
    return out
