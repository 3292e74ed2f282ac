"""Model updates: from the model a device holds to a new one of the same graph, each changed layer
within an error bound chosen under the budget by the assessment `dsz compress` makes.

The update is coded against the base as the device decodes it, not against the weights the base was
made from, so that errors never accumulate over a chain of updates (a video coder predicts from the
reconstructed frame the same way). A changed float32 layer whose zeros are zeros of the base too is coded
as its difference from the base's values (Evaluator.predict_from), which the device adds in one pass
in C; any other changed layer afresh, as compress would; the smaller of the two where both apply.
As in compress, the difference is compensated (its rounding errors pushed onto the values not yet
rounded), and leaving a layer's held values as they are is a candidate of its own (_held_point):
a base compress made holds compensated values, which a difference coded finer than their own error
would partly undo. The budget is measured on the model the device will have after patching, against
the new one. An unchanged layer costs no stream: the rest of the new model goes as a zstd frame
against the base.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Optional, Union

import numpy as np

from pydsz.assess import plan, tasks
from pydsz.assess.evaluator import Evaluator
from pydsz.assess.executor import Local
from pydsz.assess.ladder import Point
from pydsz.budget.rule import Budget
from pydsz.compress.compensation import Compensation
from pydsz.compress.compensation import for_model as compensation_for
from pydsz.compress.pipeline import _encoded_model, _plan, _tighten, compress
from pydsz.context import Run
from pydsz.encode import update as writer
from pydsz.encode.tensor import DELTA, encode, encode_update
from pydsz.errors import InputError
from pydsz.format import codec
from pydsz.format.container import load
from pydsz.format.update import UpdateEntry, fill
from pydsz.model import runtime
from pydsz.model.graph import TFLiteModel
from pydsz.model.selection import Selection, compressible_layers

# an update above this share of coding its layers afresh is compared with the whole .dsz: fine-tuned
# models' updates are a few percent of it, an unrelated model's near all of it
WHOLE_SHARE = 0.3


def new_model(dsz: bytes) -> bytes:
    return load(dsz).tflite_bytes()


@dataclass
class DiffLayer:
    """One layer of an update: how it went (delta, dense, sparse: a stream; unchanged; lossless: in
    the rest), its bound and its stream's bytes."""

    name: str
    kind: str
    bound: float
    stream_bytes: int
    nbytes: int


@dataclass
class DiffResult:
    """What `diff` made: the update, the model a device has after applying it, what it cost."""

    update: bytes
    patched: bytes
    layers: list[DiffLayer]
    metric: object
    loss: float  # measured on the patched model against the new one, the metric's unit
    max_loss: float
    samples: int
    new_bytes: int
    evaluations: int = 0
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)


def same_graph(base: TFLiteModel, new: TFLiteModel) -> None:
    """InputError unless the two models have the same layers, shapes and stored types: an update
    codes a new model of the base's graph (another graph goes whole: dsz compress)."""
    a = [(l.name, tuple(l.shape), l.stored_dtype) for l in base.layers(("fc", "conv"))]
    b = [(l.name, tuple(l.shape), l.stored_dtype) for l in new.layers(("fc", "conv"))]
    if a != b or len(base.ops) != len(new.ops):
        differ = next((f"{x[0]} {x[1]} {x[2].lower()} in the base, {y[0]} {y[1]} {y[2].lower()} in the new one"
                       for x, y in zip(a, b) if x != y), f"{len(a)} layers and {len(base.ops)} ops in the base, "
                       f"{len(b)} and {len(new.ops)} in the new one")
        raise InputError(f"the new model's graph differs from the base's ({differ}): an update codes a new model "
                         "of the same graph; ship this one whole (dsz compress)")


def diff(base: bytes, new: bytes, x, y=None, budget: Union[None, float, Budget] = None, *,
         layers: Union[str, Selection] = "fc", compensation: Compensation = Compensation(),
         run: Run = Run()) -> DiffResult:
    """The update from `base` (the .tflite bytes a device holds: a .tflite, or a .dsz's decoded) to
    `new`, the loss of the patched model against `new` within `budget` on (x, y) (pipeline.compress's
    arguments). Compensated as compress is: a delta-coded layer's difference from the held values is
    compensated (Compensator.predict_from), and its bound holds on the values it stores. Where the update would cost a sizeable share of coding every changed layer afresh
    (an unrelated model of the same graph), the whole .dsz `dsz compress` makes is tried too, and
    the update carries it instead where that is smaller."""
    base, new = bytes(base), bytes(new)
    held, model = TFLiteModel(base), TFLiteModel(new)
    same_graph(held, model)
    budget = Budget.of(budget).for_model(model, y is not None)
    choice = Selection.of(layers)
    chosen = compressible_layers(model, choice.spec, choice.min_bytes)
    changed = [l.name for l in chosen if not np.array_equal(model.stored(l), held.stored(l))]
    start = time.perf_counter()
    unchanged = [DiffLayer(l.name, "unchanged", 0.0, 0, l.nbytes) for l in chosen if l.name not in changed]
    if not changed:
        return DiffResult(writer.write(base, new, new, []), new, unchanged, budget.metric, 0.0, budget.max_loss, 0,
                          len(new), seconds=time.perf_counter() - start)
    x = runtime.fit_inputs(model.input_details(), x)
    # compensated as dsz compress is (cross-fitted on the data), each delta-coded layer's difference from
    # the held values (Compensator.predict_from)
    compensator, notes = (
        compensation_for(new, changed, x, compensation.calibration, run.num_threads, compensation.groups)
        if compensation.on(len(x[0])) else (None, []))
    evaluator = Evaluator(new, x, y, changed, budget.metric, run=run, compensator=compensator)
    evaluator.predict_from({n: held.weight(n) for n in changed if _delta_coded(held, model, n)})
    n = evaluator.samples
    warnings = budget.warnings(n, evaluator.metric.change_costs(evaluator.outputs)) + notes + evaluator.notes
    made = _update(held, model, evaluator, budget, run)
    result = DiffResult(made.update, made.patched, [
        DiffLayer(name, made.kinds.get(name, "lossless"), bound, made.sizes.get(name, 0), model.layer(name).nbytes)
        for name, bound in made.bounds.items()] + unchanged, budget.metric, made.loss / n, budget.max_loss, n,
        len(new), made.evaluations, 0.0, warnings)
    if len(made.update) > WHOLE_SHARE * made.afresh:
        whole = compress(new, x, y, budget, layers=choice, compensation=compensation, run=run)
        update = writer.write_whole(base, whole.dsz, new_model(whole.dsz))
        if len(update) < len(made.update):
            result = replace(result, update=update, patched=new_model(whole.dsz), loss=whole.loss,
                             layers=[replace(l, kind="whole", stream_bytes=0) for l in result.layers],
                             evaluations=result.evaluations + whole.evaluations, warnings=warnings + whole.warnings)
    result.seconds = time.perf_counter() - start
    return result


@dataclass
class _Made:
    """An update as `_update` made it: its bytes, the patched model, each coded layer's bound, kind
    and stream bytes, the loss measured on the patched model (summed over the samples), what coding
    each changed layer afresh would have cost."""

    update: bytes
    patched: bytes
    bounds: dict
    kinds: dict
    sizes: dict
    loss: float
    afresh: int
    evaluations: int


def _update(held: TFLiteModel, model: TFLiteModel, evaluator: Evaluator, budget: Budget, run: Run) -> _Made:
    """The assessment and verification of `dsz compress` on the changed layers, their candidates
    coded as differences from the held values, the loss measured on the model the device will have."""
    n, changed = evaluator.samples, evaluator.layer_names
    allowed, margin = budget.allowed(n), budget.margin
    executor = run.executor or Local()

    def choose(table: dict) -> Optional[dict]:
        found = _plan(table, n, allowed, None, margin, budget.metric)
        return {name: option.bound for name, option in found.choice.items()} if found else None

    assessment = plan.assess(evaluator, changed, allowed, progress=run.progress, executor=executor, choose=choose)
    table = assessment.table
    for name in evaluator.prediction:
        point = _held_point(evaluator, name)
        table[name] = [p for p in table[name] if p.bound < point.bound] + [point]
    bounds = choose(table) or {name: 0.0 for name in changed}
    evaluations, slack = assessment.evaluations + len(evaluator.prediction), 0.0
    while True:
        m = evaluator.measure_at(bounds)
        evaluations += 1
        lossless = not any(bounds.values())
        if budget.risk(m.loss, m.noise) + slack > allowed and not lossless:
            bounds, tried = _tighten(executor, table, bounds, allowed - slack, budget.risk(m.loss, m.noise), margin)
            evaluations += tried
            continue
        entries, afresh = _entries(held, model, TFLiteModel(_encoded_model(evaluator, bounds)), bounds,
                                   evaluator.prediction)
        patched = _patched(held.data, model.data, entries)
        measured = evaluator.measure_model(patched).loss
        evaluations += 1
        if measured <= allowed or lossless:
            break
        slack = max(slack, measured - m.loss)  # the interpreter's loss beyond the assessment's
    return _Made(writer.write(held.data, model.data, patched, entries), patched, bounds,
                 {e.name: e.kind for e in entries}, {e.name: len(e.stream) for e in entries}, measured, afresh,
                 evaluations)


def _held_point(evaluator: Evaluator, name: str) -> Point:
    """A predicted layer's candidate that keeps the values the device holds: its difference coded at a
    bound beyond every difference, all zeros, a stream of some 100 bytes. The bounds below it move the
    values towards the new ones, and the outputs need not follow: where the held values were
    compensated (a .dsz compress made), moving part of them undoes part of the compensation
    (LeNet-300-100 fine-tuned in fc2-fc3: its unchanged fc1 held, 0.04 points for 97 bytes; its
    difference coded at a quarter of the base's bound, 78 KB and more loss), so this point is
    measured on its own and kept off the curve's smoothing (expected_losses)."""
    new, held = np.asarray(evaluator.model.stored(name), np.float32), evaluator.prediction[name]
    largest = max(float(np.abs(new).max(initial=0.0)), float(np.abs(held).max(initial=0.0)))
    # beyond the largest difference by more than the ulps delta.encode takes off the bound
    bound = 1.001 * float(np.abs(new - held).max(initial=0.0)) + 8 * float(np.spacing(np.float32(largest)))
    return replace(tasks.measure_point(evaluator, name, bound), held=True)


def _patched(base: bytes, new: bytes, entries: list[UpdateEntry]) -> bytes:
    """The bytes a device has after applying the entries: the new model with their decoded values."""
    out = np.frombuffer(new, np.uint8).copy()
    fill(out, base, entries)
    return out.tobytes()


def _delta_coded(held: TFLiteModel, model: TFLiteModel, name: str) -> bool:
    """Whether a changed layer may be coded as its difference from the held values: float32 weights
    whose zeros (pruned ones) are zeros of the held values too, where a zero difference keeps them
    exactly (a difference would not bring a new zero back exactly: such a layer goes afresh)."""
    layer = model.layer(name)
    new_zero = np.asarray(model.stored(name)) == 0
    return layer.stored_dtype == "FLOAT32" and not np.any(new_zero & (np.asarray(held.stored(name)) != 0))


def _entries(held: TFLiteModel, model: TFLiteModel, encoded: TFLiteModel, bounds: dict,
             prediction: dict) -> tuple[list, int]:
    """Each changed layer of a bound > 0 as the update stores it, the candidate the assessment
    measured (from `encoded`: the new model with the compensated weights at the bounds): a predicted
    layer's difference from the held values or its values afresh, whichever is smaller
    (encode_update), any other afresh; and the bytes of coding them all afresh."""
    entries, afresh = [], 0
    for name, bound in bounds.items():
        if bound <= 0:
            continue  # lossless: the rest carries the new bytes
        layer, stored = model.layer(name), codec.stored_array(np.asarray(encoded.stored(name)))
        afresh += len(encode(stored, bound, None)[0])
        stream, dense, _ = encode_update(stored, prediction.get(name), bound)
        kind = "delta" if dense is DELTA else "dense" if dense else "sparse"
        entries.append(UpdateEntry(name, layer.offset, held.layer(name).offset, layer.nbytes, kind,
                                   stored.dtype.name, tuple(stored.shape), bound, stream))
    return entries, afresh
