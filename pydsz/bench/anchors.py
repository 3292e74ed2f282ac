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
import json
import time
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from pydsz.assess.evaluator import Evaluator
from pydsz.bench.baselines import deep_compression, deepsz, lossless, quantized, sz3
from pydsz.budget import metrics
from pydsz.budget.rule import Budget
from pydsz.compress.pipeline import compress
from pydsz.context import Run
from pydsz.errors import InputError
from pydsz.format import container, files
from pydsz.model import runtime
from pydsz.model.graph import TFLiteModel
from pydsz.model.selection import compressible_layers
from pydsz.tables import format_table

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
        self.metric, self.num_threads = metric, num_threads
        self.keys = [d["key"] for d in model.output_details()]
        self.reference = runtime.outputs(original, self.x, self.keys, num_threads=num_threads)
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
    """pydsz at each budget; a budget the validation data cannot resolve goes to `skipped` with why."""
    out = []
    for budget in budgets:
        start = time.perf_counter()
        try:
            result = compress(bench.pruned, *bench.val, budget, metric=bench.metric, spent=spent,
                              num_threads=bench.run.num_threads, device=bench.run.device)
        except InputError as exc:
            skipped.append({"method": OURS, "setting": budget, "reason": str(exc)})
            bar.update()
            continue
        encode_s = time.perf_counter() - start
        layers = result.layers
        # a layer kept lossless lives in the .dsz's zstd rest; it counts with its zstd size
        out.append(bench.point(OURS, "max-loss", budget, {l.name: l.stream_bytes for l in layers},
                               lambda: container.load(result.dsz).weights(), encode_s, file_bytes=len(result.dsz),
                               detail={"bounds": {l.name: l.bound for l in layers},
                                       "data_index_bytes": {l.name: [l.data_bytes, l.index_bytes] for l in layers}}))
        bar.update()
    return out


def _deepsz(bench: _Bench, budgets, spent: float, bar) -> list[dict]:
    evaluator = Evaluator(bench.pruned, *bench.val, bench.names, metric=bench.metric,
                          num_threads=bench.run.num_threads, device=bench.run.device)
    n = evaluator.samples
    start = time.perf_counter()
    table, streams = deepsz.assess(evaluator, bench.weights)
    assess_s = time.perf_counter() - start
    out = []
    for budget in budgets:
        start = time.perf_counter()
        allowed = Budget(bench.metric, budget, spent=spent).allowed(n)
        bounds = deepsz.choose(table, allowed, n, bench.metric.discrete)
        chosen = {name: streams[name, bound] for name, bound in bounds.items()}
        sections = {name: next([p.data_bytes, p.index_bytes] for p in table[name] if p.bound == bound)
                    for name, bound in bounds.items()}
        out.append(bench.point(DEEPSZ, "max-loss", budget, _sizes(chosen), _decoder(deepsz, chosen),
                               assess_s + time.perf_counter() - start,
                               detail={"bounds": bounds, "data_index_bytes": sections}))
        bar.update()
    return out


def run(
    tflite_bytes: bytes,
    val: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    max_loss: Optional[float] = None,
    *,
    metric="top1",
    train: Optional[tuple[np.ndarray, np.ndarray]] = None,
    sparsity=None,
    epochs: float = 8,
    distill: float = 0.5,
    budgets: Optional[Sequence[float]] = None,
    clusters: Sequence[int] = CLUSTERS,
    bits: Sequence[int] = BITS,
    title: str = "model",
    progress: bool = False,
    num_threads: Optional[int] = None,
    device: str = "cpu",
    pruned: Optional[bytes] = None,
) -> dict:
    """Prune (when `train` and `sparsity` are given; or take `pruned`, the model as pruned elsewhere,
    e.g. one-shot, its losses still counted from `tflite_bytes`), then run every method; returns the results,
    JSON-ready: the models' values in the metric (pydsz.budget.metrics; top-1 by default, max_loss in its
    unit, None: its default), every point of every curve, the main rows and the comparisons.
    device ("cpu" or "gpu"): where pruning retrains and pydsz's and DeepSZ's assessments run the tail."""
    from tqdm import tqdm

    from pydsz.prune.retraining import prune_model

    metric = metrics.get(metric)
    max_loss = metric.default_max_loss if max_loss is None else max_loss
    if (train is None) != (sparsity is None):
        raise InputError("pruning needs both the training data (--train) and the sparsity (--sparsity); "
                         "give neither to bench an already pruned model")
    budgets = sorted(set(budgets_for(max_loss) if budgets is None else budgets) | {max_loss})
    for b in budgets:
        metric.budget(b)
        if b <= 0:
            raise InputError(f"budget {b}: every budget must be > 0")
    sz3.compress(np.zeros(1, np.float32), 1.0)  # fail early, before pruning, without h5py/hdf5plugin
    original = bytes(tflite_bytes)
    judges = [Judge(original, d, metric, num_threads) for d in (val, test)]
    info: dict = {"model": title, "metric": {"name": metric.name, "unit": metric.unit, "discrete": metric.discrete},
                  "max_loss": max_loss, "budgets": budgets, "device": device,
                  "samples": {"val": len(judges[0].base), "test": len(judges[1].base)}}
    info["original"] = {"val_value": metric.value(float(np.mean(judges[0].base))),
                        "test_value": metric.value(float(np.mean(judges[1].base))), "file_bytes": len(original)}
    if pruned is not None and train is not None:
        raise InputError("give the training data to prune with, or a model pruned elsewhere, not both")
    pruned, prune_s = (original if pruned is None else bytes(pruned)), 0.0
    if train is not None:
        start = time.perf_counter()
        pruned = prune_model(original, train, val, sparsity, epochs=epochs, distill=distill, progress=progress,
                             num_threads=num_threads, device=device).tflite
        prune_s = time.perf_counter() - start
    bench = _Bench(pruned, val, test, judges, Run(num_threads, device))
    info["pruned"] = {
        **bench.measure(pruned), "prune_s": prune_s, "file_bytes": len(pruned),
        "zstd19_file_bytes": len(lossless.zstd19(pruned)),
        "sparsity": {name: 1 - np.count_nonzero(w) / w.size for name, w in bench.weights.items()},
    }
    info.update(fc_original_bytes=bench.fc_original_bytes, rest_bytes=bench.rest_bytes,
                layers={name: list(w.shape) for name, w in bench.weights.items()})

    total = 2 * len(budgets) + len(clusters) + len(bits) + 2
    with tqdm(total=total, desc="bench", unit="point", disable=not progress, leave=False) as bar:
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
    info["comparisons"] = compare(points, _main(info))
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


def _setting(p: dict) -> str:
    if p["knob"] == "-":
        return "-"
    return f"{p['knob']} {p['setting']:g}" if isinstance(p["setting"], float) else f"{p['knob']} {p['setting']}"


def _main(info: dict) -> list[dict]:
    return [info["points"][i] for i in info["main"]]


def _value(info: dict, value: float) -> str:
    return f"{100 * value:.2f}%" if info["metric"]["discrete"] else f"{value:.4g}"


def _loss(info: dict, loss: float) -> str:
    """A loss as people read it: points of a discrete metric, else in the metric's own unit."""
    return f"{100 * loss:+.2f}" if info["metric"]["discrete"] else f"{loss:.3g}"


def main_table(info: dict) -> str:
    """One row per method at its main setting."""
    name = info["metric"]["name"]
    rows = []
    for p in _main(info):
        rows.append([p["method"], _setting(p), p["fc_bytes"], p["file_bytes"], f"{p['ratio']:.1f}x",
                     _value(info, p["val_value"]), _value(info, p["test_value"]), _loss(info, p["test_loss"]),
                     f"{p['encode_s']:.2f}", f"{p['decode_s']:.4f}"])
    return format_table(["method", "setting", "FC bytes", "file bytes", "ratio", f"val {name}", f"test {name}",
                         "test loss", "encode s", "decode s"], rows)


def sweep_table(info: dict) -> str:
    """Every point of every curve: ratio and losses (from the model as given)."""
    rows = [[p["method"], _setting(p), f"{p['ratio']:.1f}x", _loss(info, p["val_loss"]), _loss(info, p["test_loss"])]
            for p in info["points"]]
    return format_table(["method", "setting", "ratio", "val loss", "test loss"], rows)


def summary_lines(info: dict) -> list[str]:
    o, p = info["original"], info["pruned"]
    lines = [f"{info['model']}: {info['metric']['name']} val/test {_value(info, o['val_value'])}/"
             f"{_value(info, o['test_value'])} as given, {_value(info, p['val_value'])}/{_value(info, p['test_value'])} "
             "pruned (" + ", ".join(f"{k}={v:.3f}" for k, v in p["sparsity"].items())
             + f"); FC layers {info['fc_original_bytes']} bytes dense float32; the rest of the model "
             f"{info['rest_bytes']} bytes (zstd-19); zstd-19 of the whole pruned file {p['zstd19_file_bytes']} bytes"]
    ours = [p for p in info["points"] if p["method"] == OURS]
    least = min(ours, key=lambda p: (p["test_loss"], -p["ratio"]))
    lines += [f"skipped: {s['method']} at budget {s['setting']:g}: {s['reason']}" for s in info.get("skipped", [])]
    for t in info["comparisons"]["targets"]:
        if "advantage" in t:
            main = next(p for p in info["points"] if p["method"] == t["method"] and p in _main(info))
            adv = (f"{t['advantage']:.2f}x" if t["advantage"] is not None else
                   f"no pydsz point loses as little as {_loss(info, main['test_loss'])} "
                   f"(the least: {least['ratio']:.1f}x at {_loss(info, least['test_loss'])}, "
                   f"{main['ratio']:.1f}x for {t['method']})")
            if t["advantage_interpolated"] is not None:
                adv += f" ({t['advantage_interpolated']:.2f}x on pydsz's curve interpolated to that loss)"
            lines.append(f"{'MET' if t['met'] else 'NOT MET'}  {t['target']}: {adv}")
        else:
            where = [f"{what}: {', '.join(t[key])}" for key, what in
                     (("not_above", "below it"), ("loses_less_than_any_pydsz_point", "losing less than any pydsz point"))
                     if t[key]]
            lines.append(f"{'MET' if t['met'] else 'NOT MET'}  {t['target']}" + (f" ({'; '.join(where)})" if where else ""))
    return lines


def plot(info: dict, path) -> None:
    """Ratio (log) vs test loss, one curve per method, each point labelled with its setting."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    scale = 100 if info["metric"]["discrete"] else 1  # points, or the metric's own unit
    for method in dict.fromkeys(p["method"] for p in info["points"]):
        pts = [p for p in info["points"] if p["method"] == method]
        knob = pts[0]["knob"]
        label = method if knob == "-" else f"{method} (over {knob})"
        xs, ys = [scale * p["test_loss"] for p in pts], [p["ratio"] for p in pts]
        ax.plot(xs, ys, "o-" if len(pts) > 1 else "s", ms=4, lw=2.2 if method == OURS else 1.2, label=label)
        if knob != "-":
            for p, x, y in zip(pts, xs, ys):
                ax.annotate(f"{p['setting']:g}", (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.axvline(scale * info["max_loss"], color="gray", ls="--", lw=1, label=f"--max-loss {info['max_loss']:g}")
    ax.axvline(scale * info["pruned"]["test_loss"], color="gray", ls=":", lw=1, label="pruned, uncompressed")
    ax.set_yscale("log")
    ax.set_xlabel(f"{info['metric']['name']} loss on the test split ({'points, ' if scale == 100 else ''}"
                  "from the model before pruning)")
    ax.set_ylabel("FC layers: dense float32 bytes / stored bytes")
    ax.set_title(f"{info['model']}: every method on the same pruned model")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", lw=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    files.write_atomic(path, buf.getvalue())


def write_report(info: dict, json_path, png_path) -> list[Path]:
    """The results as JSON and the curves as PNG (each written whole or not at all)."""
    for path in (json_path, png_path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    files.write_atomic(json_path, json.dumps(info, indent=1).encode())
    plot(info, png_path)
    return [Path(json_path), Path(png_path)]

