"""`dsz bench --layers conv|all`: pydsz against what a user would pick instead, on the model as given.

No labels, no pruning step: every method turns the model into a file, the file is decoded into a
.tflite where it needs decoding, and the interpreter runs that .tflite on the validation and the
test data, judged by the metric against the model as given (output-error by default: drift).

  float16          every compressible float32 weight as IEEE half (the converter's float16 option)
  int-b            symmetric per-output-channel int-b along the axis TFLite quantizes for the op
                   (pydsz.bench.baselines.quantized.per_channel: the LiteRT Quantizer's CHANNELWISE scheme),
                   swept over b; b > 8 is wider than any LiteRT type, a point of the curve where int8
                   already drifts more than pydsz
  int4 blockwise   one scale per 32 weights along the input axis (its BLOCKWISE_32 scheme); layers whose
                   input axis is not a multiple of 32, and depthwise kernels, take per-channel int4
  LiteRT Quantizer its recipes through litert-quantizer (pydsz.bench.baselines.litert), where installed
  pydsz          `dsz compress` at each budget; with --compensate --calibration; and one-shot pruned
                   (SparseGPT on the 1x1 convolutions and FC layers) then compressed with compensation
  lossless         the file as given

Sizes are zstd -19 of each method's whole file, what a download costs: for the reproduced schemes the
model with its compressible weights zeroed followed by the codes and scales in layer order; for pydsz
the .dsz. The comparison is at equal test drift: each baseline curve's size interpolated at pydsz's
measured test loss (geometric in size, linear in loss, between the neighbours of its lower envelope).
A budget the validation data cannot resolve is skipped and reported, not fatal.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Optional, Sequence, Union

import numpy as np

from pydsz.bench.anchors import Judge, budgets_for
from pydsz.bench.baselines import litert, lossless, quantized
from pydsz.budget import metrics
from pydsz.budget.rule import Budget
from pydsz.compress.compensation import Compensation
from pydsz.context import Run
from pydsz.errors import InputError
from pydsz.format import container
from pydsz.model import runtime
from pydsz.model.graph import TFLiteModel
from pydsz.model.selection import compressible_layers
from pydsz.model.tensors import INTEGER_TYPES
from pydsz.tables import format_table

OURS, COMPENSATED, PRUNED = "pydsz", "pydsz compensated", "pydsz pruned+compensated"
FLOAT16, INTB, BLOCKWISE, LITERT, LOSSLESS = ("float16", "int-b per-channel", "int4 blockwise", "LiteRT Quantizer",
                                              "lossless")
OUR_METHODS = (OURS, COMPENSATED, PRUNED)
BITS = (12, 10, 9, 8, 7, 6, 5, 4)
BLOCK = 32
FACTORS = (0.5, 1, 2)
PRUNE_SPARSITY = 0.1


class Files:
    """The model as given and the whole files the reproduced schemes make of it."""

    def __init__(self, tflite: bytes, layers: str):
        self.tflite = bytes(tflite)
        self.model = TFLiteModel(self.tflite)
        self.layers = compressible_layers(self.model, layers)
        zeroed = bytearray(self.tflite)
        for layer in self.layers:
            zeroed[layer.offset:layer.offset + layer.nbytes] = bytes(layer.nbytes)
        self.zeroed = bytes(zeroed)

    def float_layers(self) -> list:
        return [layer for layer in self.layers if layer.stored_dtype not in INTEGER_TYPES]

    def scheme(self, quantize) -> tuple[bytes, int, list[str]]:
        """(the decoded .tflite, zstd -19 bytes of the whole file, notes) of a scheme: quantize(layer,
        float32 weights) -> (payload bytes, dequantized weights, note or "")."""
        payloads, arrays, notes = [], {}, []
        for layer in self.layers:
            if layer.stored_dtype in INTEGER_TYPES:  # already integers: stored as they are
                payloads.append(np.asarray(self.model.stored(layer)).tobytes())
                continue
            payload, decoded, note = quantize(layer, np.asarray(self.model.weight(layer), np.float32))
            payloads.append(payload)
            arrays[layer.name] = decoded
            if note:
                notes.append(note)
        return self.model.replace(arrays), len(lossless.zstd19(self.zeroed + b"".join(payloads))), notes


def int_b(bits: int):
    """Symmetric per-output-channel int-b of a layer (Files.scheme's quantize): its bytes (codes as byte
    planes, then the scales), its decoded values."""
    def quantize(layer, w):
        codes, scales, decoded = quantized.per_channel(w, bits, quantized.channel_axis(layer.op, w.ndim))
        # int16 codes as two byte planes, low bytes then high: zstd then sees each plane's own statistics
        raw = codes.reshape(-1).view(np.uint8).reshape(-1, codes.itemsize).T.tobytes()
        return raw + scales.tobytes(), decoded, ""
    return quantize


def _blockwise(layer, w):
    if layer.op != "DEPTHWISE_CONV_2D" and w.shape[-1] % BLOCK == 0:
        packed, scales, decoded = quantized.blockwise(w, 4, BLOCK)
        return packed.tobytes() + scales.tobytes(), decoded, ""
    codes, scales, decoded = quantized.per_channel(w, 4, quantized.channel_axis(layer.op, w.ndim))
    packed = (codes.reshape(-1) & 0xF).astype(np.uint8)  # per channel, two codes a byte
    packed = np.append(packed, np.uint8(0))[: packed.size + packed.size % 2]
    return (packed[0::2] | (packed[1::2] << 4)).tobytes() + scales.tobytes(), decoded, layer.name


class HeadToHead:
    """One model, its data and the judges every method is measured by."""

    def __init__(self, tflite: bytes, val, test, metric: metrics.Metric, layers: str, num_threads: Optional[int]):
        self.files = Files(tflite, layers)
        self.val, self.test, self.metric, self.layers = val, test, metric, layers
        self.num_threads = num_threads
        self.judges = [Judge(self.files.tflite, d, metric, num_threads) for d in (val, test)]

    def point(self, method: str, setting, tflite: bytes, file_bytes: int, encode_s: float, **extra) -> dict:
        val, val_loss = self.judges[0](tflite)
        test, test_loss, alone = self.judges[1].detail(tflite)
        if alone:  # a model of several outputs: which output the drift is on
            extra = {"test_loss_by_output": alone, **extra}
        return {"method": method, "setting": setting, "file_bytes": file_bytes, "val_value": val,
                "test_value": test, "val_loss": val_loss, "test_loss": test_loss, "encode_s": encode_s, **extra}

    def reproduced(self, method: str, setting, quantize) -> dict:
        start = time.perf_counter()
        tflite, size, notes = self.files.scheme(quantize)
        extra = {"note": f"per-channel int4 in {len(notes)} layers: " + ",".join(notes)} if notes else {}
        return self.point(method, setting, tflite, size, time.perf_counter() - start, **extra)

    def quantizer(self, recipe: str) -> dict:
        start = time.perf_counter()
        outcome = litert.quantize(self.files.tflite, recipe)
        seconds = time.perf_counter() - start
        extra = {"quantized_layers": outcome.quantized, "layers": outcome.layers, "note": outcome.note}
        if outcome.tflite is None:
            return {"method": LITERT, "setting": recipe, "skipped": outcome.note, **extra}
        return self.point(LITERT, recipe, outcome.tflite, len(lossless.zstd19(outcome.tflite)), seconds, **extra)

    def ours(self, method: str, max_loss: float, tflite: bytes, spent: float = 0.0, compensate: bool = False,
             calibration=None, progress: bool = False) -> dict:
        """pydsz.compress.pipeline.compress of `tflite` (the model, or the model pruned) at `max_loss`, judged from
        the model as given; a max_loss the data cannot resolve comes back as a skipped point."""
        from pydsz.compress.pipeline import compress

        start = time.perf_counter()
        try:
            result = compress(tflite, self.val[0], self.val[1], Budget(self.metric, max_loss, spent=spent),
                              layers=self.layers,
                              compensation=Compensation(enabled=compensate, calibration=calibration),
                              run=Run(progress=progress, num_threads=self.num_threads))
        except InputError as exc:
            return {"method": method, "setting": max_loss, "skipped": str(exc)}
        seconds = time.perf_counter() - start
        decoded = container.load(result.dsz).tflite_bytes()
        return self.point(method, max_loss, decoded, len(lossless.zstd19(result.dsz)), seconds,
                          dsz_bytes=len(result.dsz), bounds={l.name: l.bound for l in result.layers},
                          stream_bytes={l.name: l.stream_bytes for l in result.layers},
                          # each layer's loss measured alone at its bound: where the drift goes
                          loss_alone={l.name: l.loss for l in result.layers}, compensated=result.compensated,
                          evaluations=result.evaluations, warnings=result.warnings)


def _prune_targets(files: Files) -> dict[str, float]:
    """The layers one-shot pruning takes: FULLY_CONNECTED and 1x1 CONV_2D (a 3x3 depthwise kernel has
    9 weights a channel: pruning it costs more drift than it saves bytes, bench/oneshot_conv.py)."""
    return {layer.name: PRUNE_SPARSITY for layer in files.float_layers()
            if layer.stored_dtype == "FLOAT32" and (layer.kind == "fc" or (
                layer.op == "CONV_2D" and tuple(layer.shape[1:3]) == (1, 1)))}


@dataclass(frozen=True)
class Sweep:
    """What `dsz bench --layers conv|all` measures: pydsz's budgets (None: budgets_for the max_loss),
    int-b's bits, the LiteRT Quantizer's recipes, which pydsz variants (OUR_METHODS) run and the
    sparsity of the pruned one; `title` names the model in the report."""

    budgets: Optional[Sequence[float]] = None
    bits: Sequence[int] = BITS
    recipes: Sequence[str] = litert.RECIPES
    methods: Sequence[str] = OUR_METHODS
    prune_sparsity: float = PRUNE_SPARSITY
    title: str = "model"


def benchmark(tflite: bytes, val, test, budget: Union[None, float, Budget] = None, *, layers: str = "all",
              calibration=None, sweep: Sweep = Sweep(), run: Run = Run()) -> dict:
    """Every method on the model as given; JSON-ready results: every point, the skipped ones with why,
    and the comparisons at equal test loss. val, test: (x, y or None). budget: its metric is
    output-error where it names none. calibration: inputs for the compensation's Hessians and the
    one-shot pruning, disjoint from val (without them those two pydsz variants are skipped)."""
    from tqdm import tqdm

    budget = Budget.of(budget)
    budget = budget if budget.metric is not None else replace(budget, metric="output-error")
    metric, max_loss, methods, bits = budget.metric, budget.max_loss, sweep.methods, sweep.bits
    recipes, progress, num_threads = sweep.recipes, run.progress, run.num_threads
    budgets = sorted(set(budgets_for(max_loss, FACTORS) if sweep.budgets is None else sweep.budgets) | {max_loss})
    unknown = set(methods) - set(OUR_METHODS)
    if unknown:
        raise InputError(f"unknown pydsz variant(s) {sorted(unknown)}: choose from {', '.join(OUR_METHODS)}")
    h = HeadToHead(tflite, val, test, metric, layers, num_threads)
    files = h.files
    base = [float(np.mean(j.base)) for j in h.judges]
    info: dict = {"model": sweep.title, "metric": {"name": metric.name, "unit": metric.unit, "discrete": metric.discrete},
                  "max_loss": max_loss, "budgets": budgets, "layers": layers,
                  "samples": {"val": len(h.judges[0].base), "test": len(h.judges[1].base),
                              "calibration": None if calibration is None else len(np.asarray(calibration))},
                  "file_bytes": len(files.tflite), "zstd19_bytes": len(lossless.zstd19(files.tflite)),
                  "rest_bytes": len(lossless.zstd19(files.zeroed)),
                  "compressible_layers": len(files.layers), "weights": sorted({l.stored_dtype for l in files.layers}),
                  "original": {"val_value": metric.value(base[0]), "test_value": metric.value(base[1])}}
    variants = [m for m in OUR_METHODS if m in methods]
    total = 1 + (1 if files.float_layers() and "FLOAT32" in info["weights"] else 0) + len(bits) + 1 + len(recipes) \
        + len(variants) * len(budgets)
    points: list[dict] = []
    with tqdm(total=total, desc="bench", unit="point", disable=not progress, leave=False) as bar:
        def add(p):
            points.append(p)
            bar.update()

        add(h.point(LOSSLESS, "-", files.tflite, info["zstd19_bytes"], 0.0))
        if "FLOAT32" in info["weights"]:
            add(h.reproduced(FLOAT16, "-", lambda layer, w: (w.astype("<f2").tobytes(),
                                                              w.astype(np.float16).astype(np.float32), "")))
        for b in bits:
            add(h.reproduced(INTB, b, int_b(b)))
        add(h.reproduced(BLOCKWISE, BLOCK, _blockwise))
        for recipe in recipes:
            add(h.quantizer(recipe))
        pruned = None
        for method in variants:
            for level in budgets:
                if method != OURS and calibration is None:
                    add({"method": method, "setting": level, "skipped": "needs calibration inputs (--calibration)"})
                    continue
                if method == PRUNED and "FLOAT32" not in info["weights"]:
                    add({"method": method, "setting": level,
                         "skipped": "one-shot pruning changes float32 weights; this model has none"})
                    continue
                if method == PRUNED:
                    pruned = pruned or _pruned(h, calibration, sweep.prune_sparsity, num_threads)
                    if isinstance(pruned, str):
                        add({"method": method, "setting": level, "skipped": pruned})
                        continue
                    if pruned["val_loss"] >= level:
                        add({"method": method, "setting": level, "skipped": f"one-shot pruning alone loses "
                             f"{pruned['val_loss']:.4g} on the validation data, the whole budget"})
                        continue
                    spent, left = _after_pruning(metric, level, pruned["val_loss"])
                    p = h.ours(method, left, pruned["tflite"], spent, True, calibration, progress)
                    p.update(setting=level, pruning={k: v for k, v in pruned.items() if k != "tflite"})
                    add(p)
                else:
                    add(h.ours(method, level, files.tflite, compensate=method == COMPENSATED,
                               calibration=calibration if method == COMPENSATED else None, progress=progress))
    info["points"] = points
    info["comparisons"] = compare(points)
    return info


def _pruned(h: HeadToHead, calibration, sparsity: float, num_threads) -> dict | str:
    """The model pruned one-shot (pydsz.prune.oneshot) and its loss on the validation data, or why not."""
    from pydsz.prune.oneshot import prune_layers

    targets = {name: sparsity for name in _prune_targets(h.files)}
    if not targets:
        return "no FULLY_CONNECTED or 1x1 CONV_2D layer with float32 weights to prune"
    start = time.perf_counter()
    x = runtime.fit_inputs(h.files.model.input_details(), calibration, source="calibration")
    result = prune_layers(h.files.tflite, x[0] if len(x) == 1 else x, targets, kinds=("fc", "conv"),
                          run=Run(num_threads=num_threads))
    _, val_loss = h.judges[0](result.tflite)
    return {"tflite": result.tflite, "val_loss": val_loss, "sparsity": sparsity, "layers": sorted(targets),
            "seconds": time.perf_counter() - start}


def _after_pruning(metric: metrics.Metric, budget: float, loss: float) -> tuple[float, float]:
    """(spent, max_loss) for compressing a pruned model within `budget` from the model as given: a
    metric whose perturbations add in quadrature leaves sqrt(budget^2 - loss^2), any other budget - loss."""
    if metric.quadrature:
        return 0.0, math.sqrt(budget * budget - max(loss, 0.0) ** 2)
    return max(loss, 0.0), budget


def size_at(points: Sequence[dict], loss: float) -> Optional[float]:
    """A curve's file size at test loss `loss`: its lower envelope (the smallest size at each loss
    or less), geometric in size and linear in loss between neighbours; None where the curve loses
    more than `loss` everywhere. Beyond its largest loss, its smallest size."""
    ordered = sorted((p["test_loss"], p["file_bytes"]) for p in points if "skipped" not in p)
    envelope: list[tuple[float, float]] = []
    for l, s in ordered:
        if not envelope or s < envelope[-1][1]:
            envelope.append((l, s))
    if not envelope or loss < envelope[0][0] - 1e-12:
        return None
    for (l0, s0), (l1, s1) in zip(envelope, envelope[1:]):
        if loss < l1:
            return s0 * (s1 / s0) ** ((loss - l0) / (l1 - l0))
    return envelope[-1][1]


def compare(points: Sequence[dict]) -> list[dict]:
    """For every measured pydsz point: each other method's size at its test loss (size_at), the
    advantage (their size over ours), the smallest of them, and zstd -19 of the file over ours."""
    measured = [p for p in points if "skipped" not in p]
    curves: dict[str, list[dict]] = {}
    for p in measured:
        if p["method"] not in OUR_METHODS:
            key = p["method"] if p["method"] in (INTB, FLOAT16, LOSSLESS, BLOCKWISE) else f"{p['method']} {p['setting']}"
            curves.setdefault(key, []).append(p)
    lossless_bytes = next((p["file_bytes"] for p in measured if p["method"] == LOSSLESS), None)
    rows = []
    for p in measured:
        if p["method"] not in OUR_METHODS:
            continue
        against = {name: size_at(pts, p["test_loss"]) for name, pts in curves.items()}
        reached = {name: s for name, s in against.items() if s is not None}
        best = min(reached, key=reached.get, default=None)
        rows.append({"method": p["method"], "setting": p["setting"], "file_bytes": p["file_bytes"],
                     "test_loss": p["test_loss"], "val_loss": p["val_loss"],
                     "sizes_at_equal_loss": against,
                     "advantage": {name: (s / p["file_bytes"] if s is not None else None) for name, s in against.items()},
                     "best_baseline": best, "best_advantage": reached[best] / p["file_bytes"] if best else None,
                     "vs_zstd19": lossless_bytes / p["file_bytes"] if lossless_bytes else None})
    return rows


def _loss(info: dict, loss: Optional[float]) -> str:
    if loss is None:
        return "-"
    return f"{100 * loss:+.2f}" if info["metric"]["discrete"] else f"{100 * loss:.3f}%" \
        if info["metric"]["name"].startswith("output-error") else f"{loss:.4g}"


def table(info: dict) -> str:
    """Every point: method, setting, zstd -19 bytes of the file, the file's ratio, val and test loss (and
    each output's alone, for a model of several)."""
    by_output = any("test_loss_by_output" in p for p in info["points"])
    rows = []
    for p in info["points"]:
        if "skipped" in p:
            rows.append([p["method"], str(p["setting"]), "-", "-", "-", "-"] + ["-"] * by_output
                        + ["skipped: " + p["skipped"][:90]])
            continue
        alone = p.get("test_loss_by_output", {})
        rows.append([p["method"], str(p["setting"]), p["file_bytes"], f"{info['file_bytes'] / p['file_bytes']:.2f}x",
                     _loss(info, p["val_loss"]), _loss(info, p["test_loss"])]
                    + [", ".join(f"{k} {_loss(info, v)}" for k, v in alone.items())] * by_output
                    + [p.get("note", "")[:60]])
    return format_table(["method", "setting", "zstd-19 bytes", "file ratio", "val loss", "test loss"]
                        + ["test loss by output"] * by_output + ["note"], rows)


def comparison_table(info: dict) -> str:
    """pydsz's points against the int-b curve, the best baseline and zstd -19, at equal test loss."""
    rows = []
    for r in info["comparisons"]:
        intb = r["advantage"].get(INTB)
        rows.append([r["method"], str(r["setting"]), r["file_bytes"], _loss(info, r["test_loss"]),
                     f"{r['sizes_at_equal_loss'].get(INTB):.0f}" if intb else "not reached",
                     f"{intb:.2f}x" if intb else "-",
                     f"{r['best_baseline']} {r['best_advantage']:.2f}x" if r["best_baseline"] else "-",
                     f"{r['vs_zstd19']:.2f}x" if r["vs_zstd19"] else "-"])
    return format_table(["pydsz", "budget", "zstd-19 bytes", "test loss", "int-b bytes there", "vs int-b",
                         "vs best baseline", "vs zstd-19 file"], rows)


# one colour per method in every panel
_METHOD_ORDER = (LOSSLESS, FLOAT16, INTB, BLOCKWISE, LITERT, OURS, COMPENSATED, PRUNED)


def plot(infos: Sequence[dict]) -> bytes:
    """File size (log) against test loss, one panel per model and one curve per method, as PNG bytes."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(infos))
    rows = -(-len(infos) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.0 * rows), squeeze=False)
    for ax, info in zip(axes.flat, infos):
        scale = 100 if info["metric"]["name"].startswith("output-error") else 1
        measured = [p for p in info["points"] if "skipped" not in p]
        for method in dict.fromkeys(p["method"] for p in measured):
            pts = sorted((p for p in measured if p["method"] == method), key=lambda p: p["test_loss"])
            xs, ys = [scale * p["test_loss"] for p in pts], [p["file_bytes"] for p in pts]
            ours = method in OUR_METHODS
            ax.plot(xs, ys, "o-" if len(pts) > 1 else "s", ms=5 if ours else 4, lw=2.2 if ours else 1.0, label=method,
                    color=f"C{_METHOD_ORDER.index(method)}" if method in _METHOD_ORDER else None)
            if method == INTB:
                for p, x, y in zip(pts, xs, ys):
                    ax.annotate(f"{p['setting']}", (x, y), fontsize=6, xytext=(3, 2), textcoords="offset points")
        ax.axvline(scale * info["max_loss"], color="gray", ls="--", lw=0.8)
        ax.set_xscale("symlog", linthresh=scale * info["max_loss"] / 10)
        if scale == 100:
            ax.set_xlim(left=0)  # output drift from the model as given is never below zero
        ax.set_yscale("log")
        ax.set_xlabel(f"test {info['metric']['name']}" + (" (%)" if scale == 100 else ""))
        ax.set_ylabel("zstd -19 bytes of the file")
        ax.set_title(info["model"], fontsize=9)
        ax.grid(True, which="both", lw=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(infos):]:
        ax.axis("off")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
