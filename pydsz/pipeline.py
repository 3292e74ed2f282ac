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

from pydsz import container, metrics, runtime
from pydsz.assess import Evaluator, Point, assess, compressible_layers
from pydsz.executor import Local
from pydsz.errors import InputError
from pydsz.model import INTEGER_TYPES
from pydsz.model import TFLiteModel
from pydsz.optimize import Option, Plan, loss_unit, minimize_loss, minimize_size

SHARED_SAMPLES = ("the compensation's Hessians come from the same samples the bounds are chosen and the loss "
                  "measured on: the compensation fits them, so the loss on other data is likely larger; give a "
                  "separate calibration set (--calibration)")


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


def _check_options(target_ratio: Optional[float], margin: float) -> None:
    if not (math.isfinite(margin) and margin >= 0):
        raise InputError(f"margin {margin}: must be a number >= 0")
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
    measured curve is noise, and picking it would fit the validation set instead of the data."""
    risks = [0.0 if p.bound == 0 else p.loss + margin * p.noise for p in points]
    return _monotone(risks)


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


def allowed_loss(metric: metrics.Metric, max_loss: float, n: int, spent: float = 0.0) -> float:
    """The loss that compressing may cost, summed over n samples: the metric's budget for
    `max_loss` less what an earlier step spent (e.g. pruning, counted from a reference accuracy);
    whole samples for a discrete metric."""
    budget = metric.budget(max_loss) - spent
    if metric.discrete:
        # the epsilon forgives float noise in max_loss * n (0.003 * 5000)
        return max(0, math.floor(budget * n + 1e-6))
    return max(0.0, budget * n)


def resolution_warnings(metric: metrics.Metric, max_loss: float, n: int, margin: float) -> list[str]:
    """Whether n samples can resolve the budget: InputError where the only possible answer would be
    to keep everything lossless; a warning where the decisions rest on very few samples."""
    if metric.discrete:
        one = 1 + margin  # a single changed sample as the decisions count it, noise margin included
        budget = metric.budget(max_loss)
        resolved = math.floor(budget * n + 1e-6)
        if budget <= 0 or resolved >= metrics.FEW_SAMPLES * one:
            return []
        needed = math.ceil(metrics.FEW_SAMPLES * one / budget)
        if resolved < one:
            raise InputError(
                f"{n} samples are too few to resolve max-loss {max_loss:g} in {metric.name}: one changed sample "
                f"is {1 / n:.2g} and with the noise margin ({margin:g} sd) counts as {one:g} samples, more than the "
                f"{resolved} the budget allows, so nothing but a lossless model could pass; use at least {needed} "
                "samples (or a larger --max-loss, or --margin 0)")
        return [f"max-loss {max_loss:g} lets only {resolved} of {n} samples change ({metric.name}): the decisions "
                f"are noisy and the result is likely weaker than it could be; about {needed} samples would "
                "resolve the budget"]
    if n < 2:
        raise InputError(f"{metric.name} needs at least 2 samples to estimate its noise, got {n}")
    if n < metrics.MIN_SAMPLES:
        return [f"{n} samples: the noise of {metric.name} is estimated from very few; "
                f"use at least {metrics.MIN_SAMPLES}"]
    return []


def compress(
    tflite_bytes: bytes,
    x,
    y=None,
    max_loss: Optional[float] = None,
    *,
    metric: Union[None, str, metrics.Metric, Callable] = None,
    output: Optional[str] = None,
    target_ratio: Optional[float] = None,
    layers: str = "fc",
    spent: float = 0.0,
    margin: float = 1.0,
    progress: bool = False,
    num_threads: Optional[int] = None,
    device: str = "cpu",
    executor=None,
    compensate: bool = False,
    calibration=None,
) -> Result:
    """The smallest .dsz of a model whose loss in `metric` on (x, y) is at most `max_loss`.

    x: the inputs (one array, or one per model input); y: integer labels, or None for metrics that
    compare with the original model only. metric: a name (pydsz.metrics), a Metric or a function
    f(outputs, original_outputs, y) -> per-sample losses; None takes metrics.default (top1 with
    labels, expected-top1 without, output-error for models whose output is not class scores). output:
    restrict the metric to that model output. max_loss: in the metric's unit (None: its default).
    spent: loss an earlier step already spent, in the metric's unit, taken from the budget (e.g.
    pruning's, measured from the unpruned model, so that pruning and compression share one
    budget). target_ratio: instead, the least loss whose compressed layers are at most their
    original size / target_ratio. margin: how many standard deviations of the noise every decision
    keeps in hand (0 takes the measured losses at face value, which overfits the data: the chosen
    bounds then lose more on unseen data). The final measured loss is within the budget either way.
    device: "cpu" or "gpu" (pydsz.gpu.device.resolve), where the assessment runs the FC tail.
    executor: where the assessment's and verification's evaluations run (pydsz.executor: Local, the
    default, or Dask); the results are the same. compensate: encode GPTQ-compensated float32 weights
    (pydsz.oneshot.Compensator): each bound's errors are pushed into the weights not yet quantized,
    so the outputs move less; the bound holds on the stored values. calibration: the inputs (as x)
    whose Hessians the compensation uses, disjoint from x; without them it uses x, and a warning
    says that the measured loss is then optimistic (the compensation fits the samples it is judged on).
    """
    data = bytes(tflite_bytes)
    model = TFLiteModel(data)
    _check_options(target_ratio, margin)
    reason = ""
    if metric is None:
        metric, reason = metrics.default(model, y is not None, output)
    else:
        metric = metrics.get(metric, output)
    max_loss = metric.default_max_loss if max_loss is None else max_loss
    metric.budget(max_loss)  # checks the value before anything runs
    if calibration is not None and not compensate:
        raise InputError("calibration inputs build the Hessians of the compensation: give compensate too")
    chosen = compressible_layers(model, layers)
    names = [l.name for l in chosen]
    evaluator = Evaluator(data, x, y, names, metric=metric, num_threads=num_threads, device=device,
                          compensate=compensate if calibration is None else calibration)
    n = evaluator.samples
    warnings = resolution_warnings(metric, max_loss, n, margin)
    if evaluator.compensator is not None and evaluator.compensator.layers:
        if calibration is None:
            warnings.append(SHARED_SAMPLES)
        else:
            warnings += _overlap_warnings(evaluator.x, evaluator.compensator.x)
        warnings += evaluator.compensator.warnings
    base = float(np.mean(metric.losses(evaluator.outputs, evaluator.outputs, evaluator.y)))
    before = metric.value(base)
    allowed = allowed_loss(metric, max_loss, n, spent)

    executor = executor or Local()
    start = time.perf_counter()
    table = assess(evaluator, names, allowed, progress=progress, executor=executor)
    max_size = None
    if target_ratio is not None:
        max_size = int(sum(l.nbytes for l in chosen) / target_ratio)

    plan = _plan(table, n, allowed, max_size, margin, metric)
    # nothing fits (a target ratio beyond the grid): every layer lossless
    bounds = {name: plan.choice[name].bound if plan else 0.0 for name in names}
    attempts: list[dict] = []
    trials = 0  # evaluations of the verification's tightening steps
    slack = 0.0  # loss the interpreter measured beyond the fast path's (float rounding)
    while True:
        m = evaluator.measure(evaluator.weights_at(bounds))
        attempt = {"bounds": dict(bounds), "predicted": _predicted(table, bounds, margin), "loss": m.loss,
                   "risk": m.risk(margin), "size": _size(table, bounds)}
        attempts.append(attempt)
        lossless = not any(bounds.values())
        if m.risk(margin) + slack > allowed and max_size is None and not lossless:
            bounds, tried = _tighten(executor, table, bounds, allowed - slack, m.risk(margin), margin)
            trials += tried
            continue
        dsz = container.pack_model(_encoded_model(evaluator, bounds), container.stored_bounds(model, bounds),
                                   layers=layers)
        attempt["measured_loss"] = measured = evaluator.measure_model(container.load(dsz).tflite_bytes()).loss
        if measured <= allowed or max_size is not None or lossless:
            break
        slack = max(slack, measured - m.loss)
    seconds = time.perf_counter() - start

    return Result(
        dsz=dsz, layers=_layer_results(model, chosen, bounds, table, n), curves=table, samples=n, metric=metric,
        before=before, after=metric.value(base + measured / n), loss=measured / n, max_loss=max_loss,
        allowed=allowed, model_bytes=len(data), spent=spent, margin=margin, attempts=attempts,
        fast_evaluation=evaluator.fast, device=evaluator.device, cpu_reason=evaluator.cpu_reason,
        evaluations=(sum(len(points) for points in table.values()) + trials + len(attempts)
                     + sum("measured_loss" in a for a in attempts)),
        evaluation_seconds=seconds, metric_reason=reason, warnings=warnings,
        compensated=list(evaluator.compensator.layers) if evaluator.compensator else [],
    )


def _sample_digests(x) -> list[bytes]:
    """One digest per sample of fitted inputs (an array, or a list of one per model input)."""
    import hashlib

    arrays = [np.ascontiguousarray(a) for a in (x if isinstance(x, (list, tuple)) else [x])]
    digests = []
    for i in range(len(arrays[0])):
        h = hashlib.blake2b(digest_size=16)
        for a in arrays:
            h.update(a[i].tobytes())
        digests.append(h.digest())
    return digests


def _overlap_warnings(x, calibration) -> list[str]:
    """A warning when calibration samples also appear in x (the same file given twice, say)."""
    data, own = set(_sample_digests(x)), _sample_digests(calibration)
    shared = sum(d in data for d in own)
    if not shared:
        return []
    return [f"{shared} of the {len(own)} calibration samples are also in the data the bounds are chosen on: "
            "there the compensation fits the samples it is judged on"]


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
    return evaluator.model.replace({name: evaluator.candidate(name, bound) for name, bound in bounds.items()
                                    if bound > 0 and name in evaluator.compensator.layers})


def trial_risk(evaluator: Evaluator, bounds: dict, margin: float) -> float:
    """The risk (loss plus noise margin) of all layers compressed together at `bounds` (an executor's task)."""
    return evaluator.measure(evaluator.weights_at(bounds)).risk(margin)


def _tighten(executor, table: dict, bounds: dict, allowed: float, risk: float, margin: float) -> tuple[dict, int]:
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
    return max(trials, key=lambda t: ((risk - t[1]) / max(1, t[2]), -t[2]))[0], len(trials)


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


# The bundled reference models and how the demo and bench/reference.py prune them. lenet300-96 is
# the same model pruned harder: on the validation split it loses as little, on the test split more
# (bench/reference.py shows both: the trade-off is the point).
REFERENCE = {
    "lenet300": {"file": "lenet300.tflite", "title": "LeNet-300-100",
                 "sparsity": {"fc1": 0.94, "fc2": 0.92, "fc3": 0.5}, "epochs": 24, "distill": 0.8},
    "lenet300-96": {"file": "lenet300.tflite", "title": "LeNet-300-100 (96%)",
                    "sparsity": {"fc1": 0.96, "fc2": 0.93, "fc3": 0.7}, "epochs": 24, "distill": 0.8},
    "lenet5": {"file": "lenet5.tflite", "title": "LeNet-5",
               "sparsity": {"fc1": 0.95, "fc2": 0.7}, "epochs": 16, "distill": 0.8},
}
TRAIN_SIZE = 55000  # Fashion-MNIST's first 55,000 training images; the last 5,000 are validation


def reference_run(name: str, max_loss: float = 0.003, progress: bool = False, device: str = "cpu") -> dict:
    """Prune a bundled reference model, compress it within max_loss of the unpruned model's
    validation top-1 (pruning and compression share the budget), and measure both on the test split.

    Returns {"result": Result, "summary": the paper's table row and timings}.
    """
    import time

    from pydsz.data import bundled, fashion_mnist, load_npz
    from pydsz.prune import prune_model

    if name not in REFERENCE:
        raise InputError(f"no reference model {name!r} (have: {', '.join(REFERENCE)})")
    spec = REFERENCE[name]
    model = bundled(spec["file"]).read_bytes()
    x, y = fashion_mnist("train")
    val, test = load_npz(bundled("fmnist_val.npz")), load_npz(bundled("fmnist_test.npz"))
    start = time.perf_counter()
    pruned = prune_model(model, (x[:TRAIN_SIZE], y[:TRAIN_SIZE]), val, spec["sparsity"], epochs=spec["epochs"],
                         distill=spec["distill"], progress=progress, device=device)
    pruned_at = time.perf_counter()
    result = compress(pruned.tflite, *val, max_loss, metric="top1", spent=pruned.top1_before - pruned.top1_after,
                      progress=progress, device=device)
    done = time.perf_counter()
    decoded = container.load(result.dsz).tflite_bytes()
    summary = {
        "model": spec["title"], "sparsity": pruned.sparsity, "max_loss": max_loss,
        "val_top1": {"original": pruned.top1_before, "pruned": pruned.top1_after, "compressed": result.after},
        "test_top1": {"original": runtime.accuracy(model, *test), "pruned": runtime.accuracy(pruned.tflite, *test),
                      "compressed": runtime.accuracy(decoded, *test)},
        "fc_original_bytes": result.fc_original_bytes, "fc_compressed_bytes": result.fc_compressed_bytes,
        "ratio": result.ratio, "file_ratio": result.file_ratio,
        "seconds": {"prune": pruned_at - start, "compress": done - pruned_at},
    }
    return {"result": result, "summary": summary}


def reference_table(rows: list[dict]) -> str:
    """The paper's table: top-1 (test split), FC layers' size and ratio, original vs compressed."""
    from pydsz.tables import format_table

    lines = []
    for row in rows:
        s = row["summary"]
        t, v = s["test_top1"], s["val_top1"]
        lines.append([f"{s['model']} original", f"{100 * t['original']:.2f}%", f"{100 * v['original']:.2f}%",
                      f"{s['fc_original_bytes'] / 1024:.1f} KB", "", ""])
        lines.append([f"{s['model']} pydsz", f"{100 * t['compressed']:.2f}%", f"{100 * v['compressed']:.2f}%",
                      f"{s['fc_compressed_bytes'] / 1024:.1f} KB", f"{s['ratio']:.1f}x",
                      f"{100 * (t['original'] - t['compressed']):+.2f}"])
    return format_table(["network", "top-1 test", "top-1 val", "FC size", "ratio", "test loss (points)"], lines)
