"""GPTQ-compensated encoding: the weights a layer is encoded from at a bound, its rounding errors pushed
into the weights not yet rounded (pydsz.prune.gptq), so that the outputs move less at the same bound.

The assessment is handed a Compensator (pydsz.assess.Evaluator's `compensator`) and measures each
layer's candidates as this module makes them; the bound holds on the values stored. Its Hessians
come from calibration inputs, which should share no sample with the data the bounds are chosen on:
`for_model` builds one and says where they overlap. Without them it cross-fits (CrossFit): the loss
of each half of the data is measured with weights compensated on the other half's Hessians, and the
file stores the weights compensated on all of it, so that the data alone gets compensation's
smaller files without the loss fitting the samples it is measured on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np

from pydsz.errors import InputError
from pydsz.format import delta
from pydsz.model import runtime
from pydsz.model.data import CROSSFIT_SAMPLES, sample_count, sample_digests, take_samples, two_halves
from pydsz.model.graph import TFLiteModel
from pydsz.prune.gptq import (
    DAMP,
    MAX_HESSIAN_BYTES,
    PATCH_VALUES,
    HessianSum,
    Sequential,
    check_memory,
    factor_bytes,
    grid,
    inverse_factor,
    layer_matrix,
    rank_deficient,
    rank_warnings,
    solve,
)

# libdsz's largest quantization index at its default radius: |x / step| beyond it is stored verbatim
QMAX = 32767.0
SHARED_SAMPLES = ("the compensation's Hessians come from the same samples the bounds are chosen and the loss "
                  "measured on: the compensation fits them, so the loss on other data is likely larger; give a "
                  "separate calibration set (--calibration)")
# Compensated weights kept for the next call at the same (layer, bound), up to this many bytes per
# Compensator: verification's trials measure every layer's bound again with one of them changed
SOLVED_BYTES = 64 << 20
# A layer's solve holds about this many float64 copies of it at its peak (the sweep's working matrix, its
# columns in act-order, the error blocks' products and the results: 4.8 measured on BirdNET's 6522x1024
# location head, besides what the allocator keeps)
SOLVE_COPIES = 6


@dataclass(frozen=True)
class Compensation:
    """Whether compress encodes GPTQ-compensated weights, and what their Hessians come from.

    enabled None compensates wherever it can (calibration inputs, or data enough to cross-fit:
    CROSSFIT_SAMPLES), False never. calibration: the inputs (as the data takes them) whose Hessians
    the compensation uses, disjoint from the decisions' data; without them the data is cross-fitted
    (CrossFit), or, below CROSSFIT_SAMPLES and asked for, the Hessians fit the very samples the loss
    is measured on, and a warning says that it is then optimistic. groups: each sample's source in the
    data (pydsz.model.data.load_groups), which cross-fitting keeps within one half (two_halves), or None:
    each sample its own."""

    enabled: Optional[bool] = None
    calibration: object = None
    groups: object = None

    def __post_init__(self):
        if self.calibration is not None and self.enabled is False:
            raise InputError("calibration inputs build the Hessians of the compensation, which is turned off: "
                             "give compensate too")

    def on(self, samples: int) -> bool:
        """Whether data of this many samples is compensated."""
        if self.enabled is None:
            return self.calibration is not None or samples >= CROSSFIT_SAMPLES
        return self.enabled


class Compensator:
    """Compensated candidate weights per (layer, bound) for the assessment.

    H is taken on the model as given, from the calibration inputs x: the assessment varies one layer
    at a time with the others intact. Each layer's factor is computed on first use and kept; pruned
    positions stay zero. `warnings` names the layers whose H x leaves singular (rank_warnings).
    """

    def __init__(self, tflite_bytes: bytes, x: np.ndarray, layers: Sequence[str], damp: float = DAMP,
                 max_hessian_bytes: int = MAX_HESSIAN_BYTES, num_threads: Optional[int] = None):
        self.model = TFLiteModel(tflite_bytes)
        self.layers = {name: self.model.layer(name) for name in layers}
        check_memory(list(self.layers.values()), max_hessian_bytes)
        self.x, self.damp, self.num_threads = x, damp, num_threads
        self.warnings = rank_warnings(self.model, list(self.layers.values()), sample_count(x))
        # per layer, for each of its groups: the order its columns are swept in, and the factor for it
        self._sweeps: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        self._hessians: Optional[Sequential] = None  # made on first use: the cuts' activations it carries
        self._solved: dict[tuple, np.ndarray] = {}  # (layer, bound) -> its weights, the least recently used first
        # what verification's trials use again: every layer at its bound, and one of them at another (kept
        # up to SOLVED_BYTES, the assessment's rungs filled it: fmnist_mlp_50k peaked 316 MiB, 14 beyond
        # its printed bound, where this keeps it to 200 MiB and the same file)
        sizes = [l.nbytes for l in self.layers.values()]
        self.keep = min(SOLVED_BYTES, sum(sizes) + max(sizes, default=0))
        self.held: dict[str, np.ndarray] = {}  # layer -> the values its difference is coded from (predict_from)

    def footprint(self) -> dict:
        """What compensating holds at most (pydsz.compress.footprint): the calibration inputs, the
        factors kept for every layer, and one Hessian being made (H, its inverse and factor, and a
        piece of the layer's input patches in float32 and float64 with its product)."""
        layers = list(self.layers.values())
        inputs = self.x if isinstance(self.x, (list, tuple)) else [self.x]
        return {"calibration data": sum(np.asarray(a).nbytes for a in inputs),
                "compensation factors": sum(map(factor_bytes, layers)),
                "compensated weights kept": self.keep,
                # a layer's Hessian is made, then solved with: the larger of the two at a time; while
                # it is factored, three copies beside its factor (counted above), which comes last
                "a Hessian at work": max(3 * max(map(factor_bytes, layers), default=0) + 3 * 8 * PATCH_VALUES,
                                         max((SOLVE_COPIES * 8 * int(np.prod(l.shape)) for l in layers), default=0))}

    def __getstate__(self) -> dict:
        # another process (a Dask worker) computes the factors it needs: they are layer-sized squared,
        # and the activations carried from cut to cut are the calibration set's
        return {**self.__dict__, "_sweeps": {}, "_hessians": None, "_solved": {}}

    cross_fitted = False  # the loss measured on the very samples the Hessians came from

    def predict_from(self, prediction: Mapping[str, np.ndarray]) -> None:
        """Solve the layers of `prediction` ({layer: the float32 values a device holds}) as their
        difference from those values, on pydsz.format.delta.encode's grid (a model update's delta-coded layers,
        pydsz.compress.diff): the weights the device will have are the held values plus the compensated
        difference. Uncompensated, a difference coded at a bound below the held values' own error
        undoes part of that error's compensation (the base's .dsz was compensated too), and the
        output moves more than with the held values left alone (LeNet-300-100's fc1, left as held:
        0.04 points; its difference at a quarter of the base's bound, 78 KB, more)."""
        self.held = {name: np.asarray(values, np.float32) for name, values in prediction.items() if name in self.layers}
        self._solved = {key: w for key, w in self._solved.items() if key[0] not in self.held}

    def sized(self, name: str, bound: float) -> np.ndarray:
        """The weights a candidate's bytes are counted on in the assessment: those stored."""
        return self.weights(name, bound)

    def weights(self, name: str, bound: float) -> np.ndarray:
        """The layer's weights compensated at absolute `bound`, on the codec's grid, in the dtype the
        model stores them in (float32, or float16 behind a DEQUANTIZE op); bound 0 (lossless) gives
        them back as float32, unchanged."""
        if name not in self.layers:
            raise InputError(f"layer {name!r} is not one the compensator was built for ({', '.join(self.layers)})")
        layer = self.layers[name]
        weight = np.array(self.model.weight(layer), np.float32)
        if bound == 0:
            return weight
        solved = self._solved.pop((name, bound), None)  # put back last: the least recently used go first
        if solved is None:
            while self._solved and sum(a.nbytes for a in self._solved.values()) + weight.nbytes > self.keep:
                del self._solved[next(iter(self._solved))]
            solved = self._solve(name, weight, bound)
        self._solved[name, bound] = solved
        return solved.copy()

    # the CrossFit this is a part of, which makes its parts' factors together (CrossFit.factor)
    pool: Optional["CrossFit"] = None

    def sweeps(self, name: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per group of the layer: the order its columns are swept in and the factor for it, made once."""
        if name not in self._sweeps:
            if self.pool is not None:
                self.pool.factor(name)
            else:
                self.factor_from(name, self.hessian_sum(name).result())
        return self._sweeps[name]

    def hessian_sum(self, name: str) -> HessianSum:
        """The layer's Hessian summed over this compensator's inputs."""
        if self._hessians is None:  # the layers' inputs along the cuts: the ops before one run once in all
            self._hessians = Sequential(self.model, self.x, list(self.layers.values()), self.num_threads)
        return self._hessians.sums(self.model, self.layers[name])

    def factor_from(self, name: str, h: np.ndarray) -> None:
        """The layer's sweeps made from its Hessian h, which is spent."""
        # GPTQ's act-order: the columns whose inputs are largest are rounded first, while the most
        # columns are left to take their error (iris_landmark at a 1% budget: 1.3% smaller at 13%
        # less drift on unseen photos; face_detection_short_range 4.4% smaller at the same drift)
        orders = [np.argsort(-np.diagonal(g), kind="stable") for g in h]
        # H let go once permuted, each group's copy once factored: no more than the footprint's "a
        # Hessian at work" beside the factor being made (oww_timer's fc1 peaked 54 MiB past it)
        permuted = [g[np.ix_(o, o)] for g, o in zip(h, orders)]
        del h
        self._sweeps[name] = orders, [inverse_factor(permuted.pop(0), self.damp, overwrite=True) for _ in orders]

    def _solve(self, name: str, weight: np.ndarray, bound: float) -> np.ndarray:
        layer = self.layers[name]
        orders, factors = self.sweeps(name)
        pruned = layer_matrix(layer, weight) == 0
        dtype = np.float16 if layer.stored_dtype == "FLOAT16" else np.float32
        held = self.held.get(name)
        if held is not None:
            # the sweep is linear in the weights: sweeping the difference from the held values minimises
            # the same output error as sweeping the weights, with the difference's grid as the rounding
            held = held.reshape(weight.shape)
            step_bound = delta.bound_of(weight, held, bound)
            moved = weight - held
            if float(np.abs(moved).max(initial=0.0)) < step_bound:
                # every difference rounds to zero: the held values, which feeding the first columns' errors
                # onto the later ones would only move (a model update's held point: pydsz.compress.diff)
                return held.copy()
            difference = solve(layer, moved, factors, orders, pruned=pruned, quantize=lambda v: rounded(v, step_bound))
            return held + difference.astype(np.float32)  # the device's float32 sum
        if pruned.any():
            # a pruned layer goes to the sparse stream, whose encoder keeps every non-zero non-zero
            quantize = lambda v: grid(v, bound).astype(dtype).astype(np.float64)  # noqa: E731
        else:
            quantize = lambda v: rounded(v, bound, dtype)  # noqa: E731
        return solve(layer, weight, factors, orders, pruned=pruned, quantize=quantize).astype(dtype)


class CrossFit:
    """Compensation cross-fitted on the decisions' own data: the samples split in two halves at random
    (seeded: the same data, the same split; each source whole where `groups` gives the samples' sources),
    each half's loss measured with weights compensated on the other half's Hessians (`folds`: (the samples
    measured, the Compensator fitted without them)), and the weights stored (`weights`) compensated on all
    of them. The measured loss is then that of a compensation meeting data it was not fitted on, as the
    file does after it; the stored weights, their Hessians from twice the samples, do no worse there."""

    def __init__(self, tflite_bytes: bytes, x, layers: Sequence[str], num_threads: Optional[int] = None,
                 groups=None):
        halves = two_halves(sample_count(x), groups)
        self.whole = Compensator(tflite_bytes, x, layers, num_threads=num_threads)
        self.folds = [(halves[1 - k], Compensator(tflite_bytes, take_samples(x, halves[k]), layers, num_threads=num_threads))
                      for k in (0, 1)]
        for part in (self.whole, *(c for _, c in self.folds)):
            part.pool = self
        # the Hessians' rank (rank_warnings) needs no warning: a compensation that fits its samples only
        # shows as loss on the other half, where the choice of bounds weighs it
        self.layers, self.warnings = self.whole.layers, []

    cross_fitted = True

    def predict_from(self, prediction: Mapping[str, np.ndarray]) -> None:
        for compensator in (self.whole, *(c for _, c in self.folds)):
            compensator.predict_from(prediction)

    def weights(self, name: str, bound: float) -> np.ndarray:
        return self.whole.weights(name, bound)

    def sized(self, name: str, bound: float) -> np.ndarray:
        """The first fold's weights: as many bytes as the stored ones within a fraction of a percent, and
        already solved for its loss, so that the whole data's solve is made only at the bounds chosen
        (a third of the assessment's solves: hand_landmark_full's 10 minutes were mostly them)."""
        return self.folds[0][1].weights(name, bound)

    def factor(self, name: str) -> None:
        """Every part's sweeps of the layer, made together where the first is needed: the folds' Hessians
        from their own samples, the whole data's as their pooled sum, rather than from the data again (half
        of the Hessians' time: on basic-pitch, whose conv layers' patches are many, the Hessians were half
        of the command's). Made with the first, as the footprint counts them: at the end, beside the file
        being packed, the whole data's would not be within it (oww_timer peaked 3 MiB beyond its printed
        bound)."""
        pooled = HessianSum(self.whole.model, self.whole.layers[name])
        for _, part in self.folds:
            fold = part.hessian_sum(name)
            pooled.absorb(fold)
            part.factor_from(name, fold.result())
        self.whole.factor_from(name, pooled.result())

    def footprint(self) -> dict:
        """The three Compensators' (each half's data a copy; one Hessian at work at a time, beside the
        pooled sum of the folds' that makes the whole data's)."""
        parts = [c.footprint() for c in (self.whole, *(c for _, c in self.folds))]
        pooled = max(map(factor_bytes, self.layers.values()), default=0)
        return {"the data's halves": sum(p["calibration data"] for p in parts[1:]),
                "compensation": sum(p["compensation factors"] + p["compensated weights kept"] for p in parts)
                + parts[0]["a Hessian at work"] + pooled}


def rounded(values: np.ndarray, bound: float, dtype=np.float32) -> np.ndarray:
    """libdsz's reconstruction of values quantized at absolute `bound` with no predictor (quantize.c):
    q = round_half_up(x / 2eb), r = q * 2eb computed in double and rounded once to the stored dtype;
    values beyond the codec's range stay as they are (stored verbatim). Unlike the sparse encoder's
    rule (pydsz.prune.gptq.grid), which pruned layers keep, a value may become zero: forcing a dense
    layer's small values to +-1 step instead doubles their error (on
    face_detection_short_range's dense float16 kernels, at one bound for all layers, the output
    drift was 5-10x that of rounding to nearest)."""
    x = np.asarray(values, np.float64)
    step = 2.0 * bound
    d = x * (1.0 / step)  # as quantize.c: multiplied by the stored inverse
    r = (np.floor(d + 0.5) * step).astype(dtype).astype(np.float64)
    return np.where(np.abs(d) < QMAX, r, x.astype(dtype).astype(np.float64))


def compensable(model: TFLiteModel) -> list:
    """The layers compensation can change: float32 or float16 weights (float16: the constant behind the
    DEQUANTIZE op) that one layer of the main graph alone reads (its inputs are captured there)."""
    return [layer for layer in model.layers(("fc", "conv")) if not layer.subgraph
            and layer.compressible and layer.stored_dtype in ("FLOAT32", "FLOAT16") and not layer.shared_with]


def for_model(tflite_bytes: bytes, layer_names: Sequence[str], x: list, calibration=None,
              num_threads: Optional[int] = None, groups=None) -> tuple[object, list[str]]:
    """The Compensator of the named layers that it can change (float32 weights of one layer each), and
    the warnings about its data. x: the decisions' inputs, fitted (runtime.fit_inputs); calibration:
    the inputs its Hessians come from (as x takes them), or None to take x: cross-fitted (CrossFit, its
    halves keeping x's `groups` apart) where it has CROSSFIT_SAMPLES, else fitted on the very samples the
    loss is measured on, which a warning then says.

    Where most of the decisions' samples are calibration samples too, a layer whose Hessian those
    samples leave singular is not compensated: its compensation fits them exactly, and the loss
    measured on them cannot see that it fits nothing else (face_landmark, Hessians and bounds on
    the same 64 faces: the 1404x288 mesh head took a bound 14x coarser, and on unseen faces the
    mesh moved 1.9% for 0.8% measured; encoded plainly, 0.92% for 0.88%). Where the loss is
    measured on other samples, such a fit shows as loss and the choice weighs it (iris_landmark,
    Hessians on their own photos: compensating its four singular layers gives 6% fewer bytes at
    less drift on unseen photos)."""
    model = TFLiteModel(tflite_bytes)
    chosen = [layer for layer in compensable(model) if layer.name in layer_names]
    own = x if calibration is None else runtime.fit_inputs(model.input_details(), calibration, source="calibration")
    own = own[0] if len(own) == 1 else own
    if not chosen:
        return Compensator(tflite_bytes, own, [], num_threads=num_threads), []
    if calibration is None and sample_count(own) >= CROSSFIT_SAMPLES:
        # each half's loss is measured with weights fitted on the other: a fit that holds on nothing else
        # shows as loss there, so no layer needs leaving out
        crossfit = CrossFit(tflite_bytes, own, [l.name for l in chosen], num_threads=num_threads, groups=groups)
        return crossfit, list(crossfit.warnings)
    decisions = sample_count(x)
    shared = decisions if calibration is None else _shared(x, own)
    warnings = [SHARED_SAMPLES] if calibration is None else _overlap_warnings(shared, sample_count(own))
    singular = {l.name for l, _, _ in rank_deficient(model, chosen, sample_count(own))} if 2 * shared >= decisions else ()
    if singular:
        warnings.append("layers not compensated: " + ", ".join(sorted(singular)) + ": the calibration samples leave "
                        "their Hessians singular and are most of the data the loss is measured on, where that fit "
                        "cannot be seen; give more calibration samples, other than the data (--calibration)")
    compensator = Compensator(tflite_bytes, own, [l.name for l in chosen if l.name not in singular],
                              num_threads=num_threads)
    return compensator, warnings + compensator.warnings


def _shared(x, calibration) -> int:
    """How many calibration samples also appear in x (the same file given twice, say)."""
    data = set(sample_digests(x))
    return sum(d in data for d in sample_digests(calibration))


def _overlap_warnings(shared: int, samples: int) -> list[str]:
    if not shared:
        return []
    return [f"{shared} of the {samples} calibration samples are also in the data the bounds are chosen on: "
            "there the compensation fits the samples it is judged on"]
