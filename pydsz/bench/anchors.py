"""`dsz bench`: pydsz against the anchors of the field on the same pruned model, in one run.

The model is pruned once (or taken as already pruned); every method then compresses that pruned
model's FC layers and is judged the same way: its stored bytes are decoded, the decoded weights
are written into the .tflite and the interpreter measures the metric (top-1 by default) on the
validation and the test split. Losses are counted from the model as given (before pruning), so
pruning's loss is in every method's figure alike. Each method is swept over its knob, so that each is a curve:

  pydsz             `dsz compress` (pipeline.compress) at each loss budget
  DeepSZ            baselines.deepsz: the paper's grid and additive-loss optimizer, same budgets
  Deep Compression  baselines.deep_compression, over the number of clusters (32: the paper's FC)
  int per-channel   baselines.quantized, over the bit width (8: TFLite's dynamic-range int8)
  float16           baselines.quantized (one point)
  lossless          baselines.lossless: zstd -19 (one point)

Sizes: "FC bytes" are the stored bytes of the FC weight tensors, each method's tables, codebooks,
scales and headers included; the ratio is their dense float32 size over that. "File bytes" are
the rest of the model (the .tflite with those tensors zeroed, zstd -19, as a .dsz stores it) plus
the FC bytes; for pydsz it is the .dsz file's size. Encode seconds include each method's search
(pydsz's and DeepSZ's assessment); decode seconds rebuild the FC weights from the stored bytes.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Optional, Sequence, Union

import numpy as np

from pydsz.assess.evaluator import Evaluator
from pydsz.bench.baselines import deep_compression, deepsz, lossless, quantized, sz3
from pydsz.budget import metrics
from pydsz.budget.rule import Budget
from pydsz.compress.pipeline import compress
from pydsz.context import Run
from pydsz.errors import InputError
from pydsz.format import container
from pydsz.model import runtime
from pydsz.model.graph import TFLiteModel
from pydsz.model.selection import compressible_layers
from pydsz.prune.train import Retraining

OURS, DEEPSZ, DC, INT, FLOAT16, LOSSLESS = ("pydsz", "DeepSZ", "Deep Compression", "int per-channel",
                                            "float16", "lossless zstd-19")
CLUSTERS = (4, 8, 16, 32, 64)
BITS = (4, 5, 6, 8)
# the budgets swept by pydsz and DeepSZ, as multiples of --max-loss
BUDGET_FACTORS = (0.5, 0.75, 1, 1.5, 2, 4)
# what the issue asks of pydsz at equal test loss
TARGETS = {DEEPSZ: 1.3, DC: 1.5}


def budgets_for(max_loss: float, factors: Sequence[float] = BUDGET_FACTORS) -> tuple[float, ...]:
    return tuple(round(f * max_loss, 6) for f in factors)


class Judge:
    """One split and the model as given: the metric's value and loss of any model of the same graph."""

    def __init__(self, original: bytes, data, metric: metrics.Metric, num_threads: Optional[int]):
        model = TFLiteModel(original)
        self.x, self.y = runtime.fit_inputs(model.input_details(), data[0]), data[1]
        self.metric = metric = metric.knowing(model)
        self.num_threads = num_threads
        self.keys = [d["key"] for d in model.output_details()]
        self.reference = self._outputs(original)  # as every candidate is run
        metric.check(self.reference, self.y)
        self.base = metric.losses(self.reference, self.reference, self.y)
        # for a model of several outputs: the metric on each output alone, and its loss of the model as given
        outputs = list(metric.select(self.reference))
        self.alone = {}
        for key in outputs if len(outputs) > 1 else ():
            one = copy.copy(metric)
            one.output = key
            self.alone[key] = one, one.losses(self.reference, self.reference, self.y)

    def __call__(self, tflite: bytes) -> tuple[float, float]:
        """(value, loss from the model as given), the metric's unit."""
        return self._judged(self._outputs(tflite))

    def detail(self, tflite: bytes) -> tuple[float, float, dict[str, float]]:
        """(value, loss, {output: the loss of that output alone}, empty for a model of one output):
        where a model of several outputs spends its loss (the metric's loss of the worst output per
        sample can come from one of them for one method and from another for the next)."""
        out = self._outputs(tflite)
        alone = {key: float(np.mean(one.losses(out, self.reference, self.y) - base))
                 for key, (one, base) in self.alone.items()}
        return (*self._judged(out), alone)

    def _outputs(self, tflite: bytes) -> dict:
        return runtime.outputs(tflite, self.x, self.keys, num_threads=self.num_threads)

    def _judged(self, out: dict) -> tuple[float, float]:
        losses = self.metric.losses(out, self.reference, self.y)
        return self.metric.value(float(np.mean(losses))), float(np.mean(losses - self.base))


class _Bench:
    """The pruned model, its FC weights and the evaluation every method shares."""

    def __init__(self, pruned: bytes, val, test, judges, run: Run):
        self.pruned, self.val, self.test, self.run = pruned, val, test, run
        self.judges = judges
        self.model = TFLiteModel(pruned)
        self.names = [layer.name for layer in compressible_layers(self.model, "fc")]
        self.weights = {name: np.array(self.model.weight(name), np.float32) for name in self.names}
        self.fc_original_bytes = sum(w.nbytes for w in self.weights.values())
        zeroed = self.model.replace({name: np.zeros_like(w) for name, w in self.weights.items()})
        self.rest_bytes = len(lossless.zstd19(zeroed))

    @property
    def metric(self) -> metrics.Metric:
        return self.judges[0].metric

    def measure(self, tflite: bytes) -> dict:
        """The metric's value and loss (from the model as given) on the validation and test splits."""
        (val, val_loss), (test, test_loss) = (judge(tflite) for judge in self.judges)
        return {"val_value": val, "test_value": test, "val_loss": val_loss, "test_loss": test_loss}

    def point(self, method: str, knob: str, setting, layer_bytes: Mapping[str, int],
              decode: Callable[[], dict], encode_s: float, file_bytes: Optional[int] = None,
              detail: Optional[dict] = None) -> dict:
        """Decode (timed: `decode` returns the weights by layer name), measure, and describe one
        point of a method's curve; `layer_bytes`: what each layer takes stored."""
        start = time.perf_counter()
        decoded = decode()
        decode_s = time.perf_counter() - start
        fc = sum(layer_bytes.values())
        return {
            "method": method, "knob": knob, "setting": setting, "fc_bytes": fc,
            "file_bytes": self.rest_bytes + fc if file_bytes is None else file_bytes,
            "ratio": self.fc_original_bytes / fc, **self.measure(self.model.replace(decoded)),
            "encode_s": encode_s, "decode_s": decode_s,
            "max_error": max(float(np.max(np.abs(decoded[n] - self.weights[n]), initial=0)) for n in decoded),
            "layer_bytes": dict(layer_bytes), "detail": detail or {},
        }


def _sizes(streams: Mapping[str, bytes]) -> dict[str, int]:
    return {name: len(stream) for name, stream in streams.items()}


def _decoder(module, streams: Mapping[str, bytes]) -> Callable[[], dict]:
    return lambda: {name: module.decode(stream) for name, stream in streams.items()}


def _codec_points(bench: _Bench, method: str, knob: str, module, settings, bar) -> list[dict]:
    out = []
    for setting in settings:
        start = time.perf_counter()
        streams = {name: module.encode(w, setting) for name, w in bench.weights.items()}
        out.append(bench.point(method, knob, setting, _sizes(streams), _decoder(module, streams),
                               time.perf_counter() - start))
        bar.update()
    return out


def _ours(bench: _Bench, budgets, spent: float, bar, skipped: list) -> list[dict]:
    """pydsz at each max-loss of `budgets`; one the validation data cannot resolve goes to `skipped` with why."""
    out = []
    for max_loss in budgets:
        start = time.perf_counter()
        try:
            result = compress(bench.pruned, *bench.val, Budget(bench.metric, max_loss, spent=spent), run=bench.run)
        except InputError as exc:
            skipped.append({"method": OURS, "setting": max_loss, "reason": str(exc)})
            bar.update()
            continue
        encode_s = time.perf_counter() - start
        layers = result.layers
        # a layer kept lossless lives in the .dsz's zstd rest; it counts with its zstd size
        out.append(bench.point(OURS, "max-loss", max_loss, {l.name: l.stream_bytes for l in layers},
                               lambda: container.load(result.dsz).weights(), encode_s, file_bytes=len(result.dsz),
                               detail={"bounds": {l.name: l.bound for l in layers}, "compensated": result.compensated,
                                       "data_index_bytes": {l.name: [l.data_bytes, l.index_bytes] for l in layers}}))
        bar.update()
    return out


def _deepsz(bench: _Bench, budgets, spent: float, bar) -> list[dict]:
    evaluator = Evaluator(bench.pruned, *bench.val, bench.names, bench.metric, run=bench.run)
    n = evaluator.samples
    start = time.perf_counter()
    table, streams = deepsz.assess(evaluator, bench.weights)
    assess_s = time.perf_counter() - start
    out = []
    for max_loss in budgets:
        start = time.perf_counter()
        allowed = Budget(bench.metric, max_loss, spent=spent).allowed(n)
        bounds = deepsz.choose(table, allowed, n, bench.metric.discrete)
        chosen = {name: streams[name, bound] for name, bound in bounds.items()}
        sections = {name: next([p.data_bytes, p.index_bytes] for p in table[name] if p.bound == bound)
                    for name, bound in bounds.items()}
        out.append(bench.point(DEEPSZ, "max-loss", max_loss, _sizes(chosen), _decoder(deepsz, chosen),
                               assess_s + time.perf_counter() - start,
                               detail={"bounds": bounds, "data_index_bytes": sections}))
        bar.update()
    return out


@dataclass(frozen=True)
class Pruned:
    """Where the pruned model every method shares comes from: retrained here on `train` = (x, y) to
    `sparsity` as `settings` say (pydsz.prune.retraining.prune_model), or `model`, pruned elsewhere
    (e.g. one-shot; its losses still counted from the model as given); neither: the model as given."""

    train: Optional[tuple] = None
    sparsity: object = None
    settings: Retraining = Retraining()
    model: Optional[bytes] = None


@dataclass(frozen=True)
class Sweep:
    """What `dsz bench` measures each method at: pydsz's and DeepSZ's budgets (None: budgets_for the
    max_loss), Deep Compression's cluster counts, int-b's bits; `title` names the model in the report."""

    budgets: Optional[Sequence[float]] = None
    clusters: Sequence[int] = CLUSTERS
    bits: Sequence[int] = BITS
    title: str = "model"


def benchmark(tflite_bytes: bytes, val: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
              budget: Union[None, float, Budget] = None, *, pruned: Pruned = Pruned(), sweep: Sweep = Sweep(),
              run: Run = Run()) -> dict:
    """Prune as `pruned` says, then run every method; returns the results, JSON-ready: the models' values
    in the budget's metric (pydsz.budget.metrics; top-1 where the budget names none, max_loss in its
    unit, None: its default), every point of every curve, the main rows and the comparisons.
    run.device ("cpu" or "gpu"): where pruning retrains and pydsz's and DeepSZ's assessments run the tail."""
    from tqdm import tqdm

    from pydsz.prune.retraining import prune_model

    budget = Budget.of(budget)
    budget = budget if budget.metric is not None else replace(budget, metric="top1")
    metric, max_loss, train = budget.metric, budget.max_loss, pruned.train
    clusters, bits, num_threads, device = sweep.clusters, sweep.bits, run.num_threads, run.device
    if (train is None) != (pruned.sparsity is None):
        raise InputError("pruning needs both the training data (--train) and the sparsity (--sparsity); "
                         "give neither to bench an already pruned model")
    budgets = sorted(set(budgets_for(max_loss) if sweep.budgets is None else sweep.budgets) | {max_loss})
    for b in budgets:
        metric.allowed_mean(b)
        if b <= 0:
            raise InputError(f"budget {b}: every budget must be > 0")
    sz3.compress(np.zeros(1, np.float32), 1.0)  # fail early, before pruning, without h5py/hdf5plugin
    original = bytes(tflite_bytes)
    judges = [Judge(original, d, metric, num_threads) for d in (val, test)]
    info: dict = {"model": sweep.title, "metric": {"name": metric.name, "unit": metric.unit, "discrete": metric.discrete},
                  "max_loss": max_loss, "budgets": budgets, "device": device,
                  "samples": {"val": len(judges[0].base), "test": len(judges[1].base)}}
    info["original"] = {"val_value": metric.value(float(np.mean(judges[0].base))),
                        "test_value": metric.value(float(np.mean(judges[1].base))), "file_bytes": len(original)}
    if pruned.model is not None and train is not None:
        raise InputError("give the training data to prune with, or a model pruned elsewhere, not both")
    model, prune_s = (original if pruned.model is None else bytes(pruned.model)), 0.0
    if train is not None:
        start = time.perf_counter()
        model = prune_model(original, train, val, pruned.sparsity, settings=pruned.settings,
                            run=replace(run, executor=None)).tflite
        prune_s = time.perf_counter() - start
    pruned = model
    bench = _Bench(pruned, val, test, judges, Run(num_threads, device))
    info["pruned"] = {
        **bench.measure(pruned), "prune_s": prune_s, "file_bytes": len(pruned),
        "zstd19_file_bytes": len(lossless.zstd19(pruned)),
        "sparsity": {name: 1 - np.count_nonzero(w) / w.size for name, w in bench.weights.items()},
    }
    info.update(fc_original_bytes=bench.fc_original_bytes, rest_bytes=bench.rest_bytes,
                layers={name: list(w.shape) for name, w in bench.weights.items()})

    total = 2 * len(budgets) + len(clusters) + len(bits) + 2
    with tqdm(total=total, desc="bench", unit="point", disable=not run.progress, leave=False) as bar:
        info["skipped"] = []
        points = _ours(bench, budgets, info["pruned"]["val_loss"], bar, info["skipped"])
        if not points:
            raise InputError("the validation data resolves none of the budgets: "
                             + "; ".join(s["reason"] for s in info["skipped"]))
        points += _deepsz(bench, budgets, info["pruned"]["val_loss"], bar)
        points += _codec_points(bench, DC, "clusters", deep_compression, clusters, bar)
        points += _codec_points(bench, INT, "bits", quantized, bits, bar)
        points += _codec_points(bench, FLOAT16, "-", quantized, [quantized.FLOAT16], bar)
        points += _codec_points(bench, LOSSLESS, "-", lossless, [None], bar)
    info["points"] = points
    ours_main = max_loss if any(p["setting"] == max_loss for p in points if p["method"] == OURS) else \
        max(p["setting"] for p in points if p["method"] == OURS)
    main = {OURS: ours_main, DEEPSZ: max_loss, DC: 32 if 32 in clusters else clusters[-1],
            INT: 8 if 8 in bits else bits[-1], FLOAT16: quantized.FLOAT16, LOSSLESS: None}
    info["main"] = [next(i for i, p in enumerate(points) if p["method"] == m and p["setting"] == s)
                    for m, s in main.items()]
    info["comparisons"] = compare(points, main_points(info))
    return info


def ours_at(points: Sequence[dict], loss: float) -> Optional[dict]:
    """pydsz's point of highest ratio whose test loss is at most `loss` (None if none is)."""
    # the tolerance absorbs float noise in differences of accuracies (0.9145 - 0.9115 > 0.003)
    within = [p for p in points if p["method"] == OURS and p["test_loss"] <= loss + 1e-9]
    return max(within, key=lambda p: p["ratio"], default=None)


def ours_interpolated(points: Sequence[dict], loss: float) -> Optional[float]:
    """pydsz's ratio at `loss` read off its curve: the upper envelope of its points (ratio against
    test loss), linear between them; None below its least loss. Test losses are noisy (a sample
    in 10,000 is 0.01 points), so this complements ours_at, which needs a point at or below."""
    envelope: list[tuple[float, float]] = []
    for p in sorted((p for p in points if p["method"] == OURS), key=lambda p: p["test_loss"]):
        if not envelope or p["ratio"] > envelope[-1][1]:
            envelope.append((p["test_loss"], p["ratio"]))
    if not envelope or loss < envelope[0][0] - 1e-9:
        return None
    for (l0, r0), (l1, r1) in zip(envelope, envelope[1:]):
        if loss < l1:
            return r0 + (r1 - r0) * max(0.0, loss - l0) / (l1 - l0)
    return envelope[-1][1]


def compare(points: Sequence[dict], main: Sequence[dict]) -> dict:
    """pydsz's ratio over each baseline's at equal test loss (pydsz's best point losing no more),
    at the baselines' main settings, and over every point of every other curve."""
    rows = []
    for p in points:
        if p["method"] == OURS:
            continue
        ours = ours_at(points, p["test_loss"])
        rows.append({"method": p["method"], "setting": p["setting"], "ratio": p["ratio"],
                     "test_loss": p["test_loss"], "main": any(p is m for m in main),
                     "ours_ratio": ours["ratio"] if ours else None, "ours_setting": ours["setting"] if ours else None,
                     "advantage": ours["ratio"] / p["ratio"] if ours else None,
                     "advantage_interpolated": _over(ours_interpolated(points, p["test_loss"]), p["ratio"])})
    targets = []
    for method, factor in TARGETS.items():
        row = next(r for r in rows if r["method"] == method and r["main"])
        targets.append({"target": f"pydsz >= {factor:g}x {method} at equal test loss", "method": method,
                        "advantage": row["advantage"], "advantage_interpolated": row["advantage_interpolated"],
                        "met": row["advantage"] is not None and row["advantage"] >= factor})
    below = [f"{r['method']} {r['setting']}" for r in rows if r["advantage"] is not None and r["advantage"] < 1]
    outside = [f"{r['method']} {r['setting']}" for r in rows if r["advantage"] is None]
    targets.append({"target": "pydsz's curve above every other curve", "met": not below and not outside,
                    "not_above": below, "loses_less_than_any_pydsz_point": outside})
    return {"points": rows, "targets": targets}


def _over(ratio: Optional[float], other: float) -> Optional[float]:
    return None if ratio is None else ratio / other




def main_points(info: dict) -> list[dict]:
    """Each method's point at its main setting."""
    return [info["points"][i] for i in info["main"]]















