"""DeepSZ's main job: assess -> optimize -> verify -> encode, under a budget of accuracy loss.

The loss reported is always measured: the chosen bounds are applied to all layers together, the
.dsz is written and decoded, and the decoded model is run through the interpreter. Where the
per-layer losses do not add up and the budget is exceeded, bounds are tightened one measured step
at a time, the step chosen greedily, until the measured loss fits (every layer lossless always
fits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from pydsz import container, runtime
from pydsz.assess import Evaluator, Point, assess, compressible_layers, encode_weight
from pydsz.errors import InputError
from pydsz.model import TFLiteModel
from pydsz.optimize import Option, Plan, minimize_loss, minimize_size


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
    drop: float  # measured with this layer alone compressed at `bound` (accuracy, not samples)

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
    top1_before: float  # interpreter, original model
    top1_after: float  # interpreter, the model decoded from `dsz`
    max_loss: float
    allowed_drop: int  # samples the compression may cost (after any reference adjustment)
    model_bytes: int
    reference_top1: Optional[float] = None  # what the loss budget was counted from, if not top1_before
    margin: float = 1.0  # noise margin of the decisions (standard deviations)
    attempts: list[dict] = field(default_factory=list)  # one per verification round
    fast_evaluation: bool = True
    device: str = "cpu"  # where the FC tail's evaluations ran
    cpu_reason: Optional[str] = None  # why they ran on the CPU although the GPU was asked for

    @property
    def loss(self) -> float:
        return self.top1_before - self.top1_after

    @property
    def fc_original_bytes(self) -> int:
        return sum(l.original_bytes for l in self.layers)

    @property
    def fc_compressed_bytes(self) -> int:
        return sum(l.data_bytes + l.index_bytes for l in self.layers)

    @property
    def ratio(self) -> float:
        """The paper's ratio: the layers' float32 bytes / (data bytes + index bytes)."""
        return self.fc_original_bytes / max(1, self.fc_compressed_bytes)

    @property
    def file_ratio(self) -> float:
        return self.model_bytes / max(1, len(self.dsz))


def _check_inputs(model: TFLiteModel, x: np.ndarray, y: np.ndarray, max_loss: float,
                  target_ratio: Optional[float], margin: float) -> None:
    if not (math.isfinite(margin) and margin >= 0):
        raise InputError(f"margin {margin}: must be a number >= 0")
    if not (isinstance(max_loss, (int, float)) and 0 <= max_loss < 1):
        raise InputError(f"max-loss {max_loss}: must be in [0, 1) (0.003 is 0.3 points of top-1)")
    if target_ratio is not None and not (math.isfinite(target_ratio) and target_ratio > 1):
        raise InputError(f"target ratio {target_ratio}: must be a number > 1")
    if len(x) != len(y):
        raise InputError(f"data: {len(x)} samples but {len(y)} labels")


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
    """Each point's loss as the optimizer sees it, in samples: drop + margin * sqrt(flips), made
    non-decreasing in the bound. A larger bound cannot be expected to lose less; a dip in the
    measured curve is noise, and picking it would fit the validation set instead of the data."""
    risks = [0.0 if p.bound == 0 else p.drop + margin * math.sqrt(p.lost + p.gained) for p in points]
    return _monotone(risks)


def _plan(table: dict[str, list[Point]], n: int, budget: int, max_size: Optional[int],
          margin: float) -> Optional[Plan]:
    options = {name: [Option(p.bound, p.size, loss / n) for p, loss in zip(pts, expected_losses(pts, margin))]
               for name, pts in table.items()}
    if max_size is not None:
        return minimize_loss(options, max_size, 1 / n)
    return minimize_size(options, budget / n, 1 / n)


def allowed_samples(max_loss: float, reference: float, top1: float, n: int) -> int:
    """The samples of n that compressing a model of accuracy `top1` may cost, when the loss is
    counted from `reference` (what an earlier step, e.g. pruning, spent is no longer available)."""
    # Whole samples only; the epsilon forgives float noise in max_loss * n (0.003 * 5000).
    return max(0, math.floor((max_loss - (reference - top1)) * n + 1e-6))


def compress(
    tflite_bytes: bytes,
    x: np.ndarray,
    y: np.ndarray,
    max_loss: float = 0.003,
    *,
    target_ratio: Optional[float] = None,
    layers: str = "fc",
    reference_top1: Optional[float] = None,
    margin: float = 1.0,
    progress: bool = False,
    num_threads: Optional[int] = None,
    device: str = "cpu",
) -> Result:
    """The smallest .dsz of a model whose top-1 on (x, y) is at most `max_loss` below the original's.

    reference_top1: measure the loss against this accuracy instead of the given model's (e.g. the
    unpruned model's, so that pruning and compression share one budget). target_ratio: instead,
    the best accuracy whose compressed layers are at most their original size / target_ratio.
    margin: how many standard deviations of validation noise every decision keeps in hand (0
    takes the measured drops at face value, which overfits the validation set: the chosen
    bounds then lose more on unseen data). The final measured loss is <= max_loss either way.
    device: "cpu" or "gpu" (pydsz.gpu.device.resolve), where the assessment runs the FC tail.
    """
    data = bytes(tflite_bytes)
    model = TFLiteModel(data)
    y = np.asarray(y)
    _check_inputs(model, x, y, max_loss, target_ratio, margin)
    chosen = compressible_layers(model, layers)
    names = [l.name for l in chosen]
    n = len(y)
    top1_before = runtime.accuracy(data, x, y, num_threads=num_threads)
    reference = top1_before if reference_top1 is None else reference_top1
    allowed = allowed_samples(max_loss, reference, top1_before, n)

    evaluator = Evaluator(data, x, y, names, num_threads=num_threads, device=device)
    table = assess(evaluator, model, names, allowed, progress=progress)
    max_size = None
    if target_ratio is not None:
        max_size = int(sum(l.nbytes for l in chosen) / target_ratio)

    plan = _plan(table, n, allowed, max_size, margin)
    # nothing fits (a target ratio beyond the grid): every layer lossless
    bounds = {name: plan.choice[name].bound if plan else 0.0 for name in names}
    decoded = _Decoded(model)
    attempts: list[dict] = []
    slack = 0  # samples the interpreter measured worse than the fast path (float rounding)
    while True:
        m = evaluator.drop(decoded.weights(bounds))
        attempt = {"bounds": dict(bounds), "predicted": _predicted(table, bounds, margin), "drop": m.drop,
                   "risk": m.risk(margin), "size": _size(table, bounds)}
        attempts.append(attempt)
        lossless = not any(bounds.values())
        if m.risk(margin) + slack > allowed and max_size is None and not lossless:
            bounds = _tighten(evaluator, decoded, table, bounds, allowed - slack, m.risk(margin), margin)
            continue
        dsz = container.pack_model(data, container.stored_bounds(model, bounds), layers=layers)
        top1_after = runtime.accuracy(container.load(dsz).tflite_bytes(), x, y, num_threads=num_threads)
        attempt["measured_drop"] = measured = int(round(top1_before * n)) - int(round(top1_after * n))
        if measured <= allowed or max_size is not None or lossless:
            break
        slack = max(slack, measured - m.drop)

    return Result(
        dsz=dsz, layers=_layer_results(model, chosen, bounds, table, n), curves=table, samples=n,
        top1_before=top1_before, top1_after=top1_after, max_loss=max_loss, allowed_drop=allowed,
        model_bytes=len(data), reference_top1=reference_top1, margin=margin, attempts=attempts, fast_evaluation=evaluator.fast,
        device=evaluator.device, cpu_reason=evaluator.cpu_reason,
    )


class _Decoded:
    """Each layer's weights as decoded at a bound, computed once."""

    def __init__(self, model: TFLiteModel):
        self.model, self.cache = model, {}

    def weights(self, bounds: dict) -> dict:
        out = {}
        for name, bound in bounds.items():
            if bound > 0:
                if (name, bound) not in self.cache:
                    self.cache[name, bound] = encode_weight(self.model.stored(name), bound)[0]
                out[name] = self.cache[name, bound]
        return out


def _point(table: dict, name: str, bound: float) -> Point:
    return next(p for p in table[name] if p.bound == bound)


def _size(table: dict, bounds: dict) -> int:
    return sum(_point(table, name, b).size for name, b in bounds.items())


def _predicted(table: dict, bounds: dict, margin: float) -> float:
    """The optimizer's view of a choice: the sum of the layers' expected losses (samples)."""
    total = 0.0
    for name, bound in bounds.items():
        points = table[name]
        total += max(0.0, expected_losses(points, margin)[points.index(_point(table, name, bound))])
    return total


def _tighten(evaluator: Evaluator, decoded: _Decoded, table: dict, bounds: dict, allowed: float, risk: float,
             margin: float) -> dict:
    """One greedy step down: move one layer to its next smaller measured bound.

    Every layer's step is measured with all layers compressed together. If some step brings the
    risk (drop plus noise margin) within `allowed`, the one giving the smallest total size wins;
    otherwise the one that removes the most risk per added byte. Bound 0 (lossless) is the last step of every layer, so
    repeated steps always end within budget.
    """
    trials = []
    for name, bound in bounds.items():
        smaller = [p.bound for p in table[name] if p.bound < bound]
        if not smaller:
            continue
        trial = {**bounds, name: max(smaller)}
        trial_risk = evaluator.drop(decoded.weights(trial)).risk(margin)
        added = _size(table, trial) - _size(table, bounds)
        trials.append((trial, trial_risk, added))
    fitting = [t for t in trials if t[1] <= allowed]
    if fitting:
        return min(fitting, key=lambda t: t[2])[0]
    return max(trials, key=lambda t: ((risk - t[1]) / max(1, t[2]), -t[2]))[0]


def _layer_results(model: TFLiteModel, chosen: list, bounds: dict, table: dict, n: int) -> list[LayerResult]:
    out = []
    for layer in chosen:
        point = next(p for p in table[layer.name] if p.bound == bounds[layer.name])
        w = model.weight(layer)
        out.append(LayerResult(
            name=layer.name, shape=tuple(layer.shape), density=float(np.count_nonzero(w)) / w.size,
            bound=point.bound, original_bytes=layer.nbytes, data_bytes=point.data_bytes,
            index_bytes=point.index_bytes, stream_bytes=point.size, drop=point.drop / n,
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
    result = compress(pruned.tflite, *val, max_loss, reference_top1=pruned.top1_before, progress=progress,
                      device=device)
    done = time.perf_counter()
    decoded = container.load(result.dsz).tflite_bytes()
    summary = {
        "model": spec["title"], "sparsity": pruned.sparsity, "max_loss": max_loss,
        "val_top1": {"original": pruned.top1_before, "pruned": pruned.top1_after, "compressed": result.top1_after},
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
