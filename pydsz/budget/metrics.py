"""What an accuracy budget is measured in: a metric gives every sample a loss from the model's outputs.

A metric compares the outputs of a model whose weights were changed with the original model's
outputs on the same samples, and with labels where it needs them, and gives each sample a loss
(lower is better): 0 or 1 for top-1 (right or wrong), the relative L2 error of the outputs for
output-error, and so on. The budget bounds the mean over samples of the paired difference
(changed minus original); the decisions keep a noise margin of that mean's standard error.

    top1, topk:K        labels needed: is the label the top class (among the top K)?
    agreement           is the top class the original model's? (no labels)
    expected-top1       the top-1 loss to expect without labels, the original model's class
                        probabilities standing in for the labels (a calibrated classifier's); a
                        classifier's default without labels
    output-error[:max|:mean]
                        relative L2 error of each output against the original's, per sample; with
                        several outputs the largest (max, default) or their mean (non-classifiers'
                        default); --max-loss 0.01 is 1% relative error
    psnr                PSNR of the outputs against the original's, in dB; --max-loss is the lowest
                        PSNR allowed (40 = 40 dB); the per-sample loss is the normalized MSE
    cosine              cosine distance (1 - cosine similarity) of each output to the original's
    module:function     a function of yours: f(outputs, original_outputs, y_or_None) -> per-sample
                        losses, where outputs map output names to arrays [n, ...]

Outputs are known by the names of the model's serving signature, else by tensor name (output<i>
where a name is missing or repeats: TFLiteModel.output_details()'s "key"); a metric made with
`output=NAME` sees that output only.
"""

from __future__ import annotations

import copy
import importlib
import math
from typing import Callable, Mapping, Optional, Union

import numpy as np

from pydsz.budget.probabilities import as_probabilities, probability_outputs
from pydsz.errors import InputError

Outputs = Mapping[str, np.ndarray]

# Samples the mean's standard error is trusted from, for the continuous metrics.
MIN_SAMPLES = 30
# A discrete budget that resolves fewer changed samples than this (noise margin included) is noisy.
FEW_SAMPLES = 5
# The output metrics' default margin. Their per-sample losses are heavy-tailed and a user's samples come
# from a few sources (crops of a handful of photos, windows of a few recordings), so the standard error
# of 32-128 of them understates how far another set's mean lies: at 1, bench/zoo.py's 14 models by others
# held their budget on test in 5; at 2 in 9, for 1.5% more bytes at the median (doc/results.md). In
# standard errors of a mean, the cost is small where the budget is resolved (unlike a 5-sample top-1 budget).
OUTPUT_MARGIN = 2.0


class Metric:
    """A per-sample loss: `losses(outputs, reference, y)` -> float array [n], lower is better.

    name and unit describe it; needs_labels: y is required; discrete: losses are 0 or 1, so the
    budget is counted in whole samples; classifier: it reads class scores of one output.
    """

    name = ""
    unit = ""
    needs_labels = False
    discrete = False
    classifier = False
    default_max_loss = 0.01
    quadrature = False  # the losses of several layers' changes add in quadrature (L2 errors), not linearly
    # Standard errors of the mean loss a budget keeps in hand unless told (--margin). 1 for the labels'
    # counts, whose noise is the flips' own (McNemar's); OUTPUT_MARGIN for the output metrics below.
    default_margin = 1.0
    # the outputs the model makes class probabilities of (a SOFTMAX's): `knowing` says which
    probabilities: frozenset = frozenset()

    def __init__(self, output: Optional[str] = None):
        self.output = output

    def fitted(self, reference: Outputs, y) -> "Metric":
        """This metric fitted to the original model's outputs on the data and their labels, for a metric
        that learns from them (calibrated-top1's temperature): itself, or a copy. An Evaluator fits its
        metric once, so that every evaluation, in any process, counts with the same fit."""
        return self

    def knowing(self, model) -> "Metric":
        """This metric told which of `model`'s outputs are class probabilities (probability_outputs): a
        copy where that changes anything. model: a pydsz.model.graph.TFLiteModel."""
        known = probability_outputs(model)
        if known == self.probabilities:
            return self
        told = copy.copy(self)
        told.probabilities = known
        return told

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"

    @property
    def spec(self) -> str:
        """The name as `--metric` takes it, with the output it is restricted to."""
        return self.name + (f" (output {self.output})" if self.output else "")

    def select(self, outputs: Outputs) -> dict:
        """The outputs this metric reads (all, or the one named by `output`); InputError if none fits."""
        if self.output is not None:
            if self.output not in outputs:
                raise InputError(f"the model has no output {self.output!r} (outputs: {', '.join(outputs)})")
            return {self.output: outputs[self.output]}
        if self.classifier and len(outputs) != 1:
            raise InputError(f"metric {self.name} reads the class scores of one output, but the model has "
                             f"{len(outputs)} ({', '.join(outputs)}): choose one with --output")
        return dict(outputs)

    def check(self, outputs: Outputs, y) -> None:
        """InputError where the metric cannot judge these outputs with these labels."""
        if self.needs_labels and y is None:
            raise InputError(f"metric {self.name} needs labels: the data has no array 'y' "
                             "(without labels use agreement or output-error)")
        selected = self.select(outputs)
        if self.classifier:
            (name, scores), = selected.items()
            classes = int(np.prod(scores.shape[1:]))
            if classes < 2:
                raise InputError(f"metric {self.name} needs class scores, but output {name} has {classes} value(s) per sample")
            if y is not None and self.needs_labels:
                _check_labels(y, len(scores), classes)

    def losses(self, outputs: Outputs, reference: Outputs, y) -> np.ndarray:
        raise NotImplementedError

    def allowed_mean(self, max_loss: float) -> float:
        """The bound on the mean per-sample loss difference that `--max-loss` stands for."""
        if not (isinstance(max_loss, (int, float)) and math.isfinite(max_loss) and max_loss >= 0):
            raise InputError(f"max-loss {max_loss}: must be a number >= 0 ({self.unit})")
        return float(max_loss)

    def value(self, mean_loss: float) -> float:
        """What people read for a mean loss (top-1 shows accuracy, psnr dB)."""
        return mean_loss

    def counted_from(self, reference: Outputs) -> "Metric":
        """This metric with its losses priced by the original model (`reference`: its outputs), whatever model
        it compares with, so that a later step's losses add to an earlier one's; itself where there are none."""
        return self

    def change_costs(self, reference: Outputs) -> Optional[np.ndarray]:
        """Per sample, its loss where its prediction changes the cheapest way, for a metric whose losses move
        only where predictions change, by less than a sample (expected-top1; Budget.warnings). None for the
        others: a discrete metric's change costs a sample, an output metric's losses move with any change."""
        return None

    def noise(self, losses: np.ndarray, base: np.ndarray) -> float:
        """The standard deviation of the summed paired differences losses - base (divided by the
        number of samples: the standard error of their mean)."""
        if len(losses) < 2:
            return 0.0
        return float(np.std(losses - base, ddof=1) * math.sqrt(len(losses)))


def _share(metric: Metric, max_loss: float) -> float:
    """A budget that is a share of the samples (of accuracy)."""
    if not (isinstance(max_loss, (int, float)) and 0 <= max_loss < 1):
        raise InputError(f"max-loss {max_loss}: must be in [0, 1) for {metric.name} (0.003 is 0.3 points)")
    return float(max_loss)


def _check_labels(y, n: int, classes: int) -> None:
    y = np.asarray(y)
    if y.ndim != 1 or y.shape[0] != n:
        raise InputError(f"y must be a vector of {n} labels, got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise InputError(f"labels must be integers, got {y.dtype}")
    if y.size and (y.min() < 0 or y.max() >= classes):
        raise InputError(f"labels range over {int(y.min())}..{int(y.max())} but the model has {classes} outputs")


def _scores(outputs: Outputs, metric: Metric) -> np.ndarray:
    (scores,) = metric.select(outputs).values()
    return np.asarray(scores).reshape(len(scores), -1)


class _Discrete(Metric):
    """0/1 losses. Their mean's noise is McNemar's: of the samples that changed, each is a coin toss
    between lost and gained, so the net count deviates by about sqrt(changed samples)."""

    discrete = True
    classifier = True
    default_max_loss = 0.003

    def allowed_mean(self, max_loss: float) -> float:
        return _share(self, max_loss)

    def noise(self, losses, base):
        return math.sqrt(float(np.sum(np.square(losses - base))))


class Top1(_Discrete):
    name, unit, needs_labels = "top1", "top-1 accuracy (0.003 = 0.3 points)", True

    def losses(self, outputs, reference, y):
        return (np.argmax(_scores(outputs, self), axis=1) != np.asarray(y)).astype(np.float64)

    def value(self, mean_loss):
        return 1.0 - mean_loss


class TopK(_Discrete):
    unit, needs_labels = "top-k accuracy (0.003 = 0.3 points)", True

    def __init__(self, k: int, output: Optional[str] = None):
        super().__init__(output)
        self.k = k
        self.name = f"topk:{k}"

    def losses(self, outputs, reference, y):
        # the label's rank, ties going to the lower class index as argmax's do (topk:1 is top1)
        scores, y = _scores(outputs, self), np.asarray(y)
        label = scores[np.arange(len(y)), y][:, None]
        earlier = np.arange(scores.shape[1])[None, :] < y[:, None]
        rank = np.sum(scores > label, axis=1) + np.sum((scores == label) & earlier, axis=1)
        return (rank >= self.k).astype(np.float64)

    def value(self, mean_loss):
        return 1.0 - mean_loss


class Agreement(_Discrete):
    name, unit = "agreement", "share of samples whose top class changes (0.003 = 0.3 points)"

    def losses(self, outputs, reference, y):
        return (np.argmax(_scores(outputs, self), axis=1) != np.argmax(_scores(reference, self), axis=1)
                ).astype(np.float64)

    def value(self, mean_loss):
        return 1.0 - mean_loss


class ExpectedTop1(Metric):
    """The top-1 loss to expect without labels: the original model's class probabilities stand in for
    the labels' distribution (a calibrated classifier's), so a sample whose prediction moves from
    class a to class b loses p(a) - p(b) of a correct answer in expectation. Its noise is McNemar's
    for such labels: the changed samples' outcome differences vary by p(a) + p(b) - (p(a) - p(b))^2.
    Outputs that are not probabilities (logits) go through a softmax first."""

    name, unit, classifier, default_max_loss = "expected-top1", "expected top-1 accuracy (0.003 = 0.3 points)", True, 0.003

    def __init__(self, output: Optional[str] = None):
        super().__init__(output)
        self.p: Optional[np.ndarray] = None  # the original's probabilities where fixed (counted_from)

    def counted_from(self, reference):
        # priced by the pruned model, LeNet-5's bounds after --prune auto (1 point, 128 unlabelled images) changed
        # a sample pruning had moved next to its runner-up for 0.09 of a sample: 0.86 by the original's price
        told = copy.copy(self)
        told.p = self._probabilities(reference)
        return told

    def _probabilities(self, reference) -> np.ndarray:
        known = next(iter(self.select(reference))) in self.probabilities
        return self.p if self.p is not None else as_probabilities(_scores(reference, self), known)

    def losses(self, outputs, reference, y):
        p = self._probabilities(reference)
        chosen = np.argmax(_scores(outputs, self), axis=1)
        return 1.0 - p[np.arange(len(chosen)), chosen]

    def allowed_mean(self, max_loss: float) -> float:
        return _share(self, max_loss)

    def change_costs(self, reference):
        # the cheapest change moves a sample from the reference's top class a to its runner-up b: p(a) - p(b)
        scores, p = _scores(reference, self), self._probabilities(reference)
        ranked, rows = np.argsort(-scores, axis=1, kind="stable"), np.arange(len(scores))  # ties as argmax's
        return p[rows, ranked[:, 0]] - p[rows, ranked[:, 1]]

    def noise(self, losses, base):
        kept, moved = 1.0 - base, 1.0 - losses  # p(a), p(b)
        changed = losses != base
        return math.sqrt(float(np.sum((kept + moved - np.square(kept - moved))[changed])))

    def value(self, mean_loss):
        return 1.0 - mean_loss


def _flat(a) -> np.ndarray:
    a = np.asarray(a, np.float64)
    return a.reshape(len(a), -1)


def _norms(rows: np.ndarray) -> np.ndarray:
    """Each row's L2 norm: np.linalg.norm(rows, axis=1) without its temporaries (a segmentation
    model's 64 x 65536 outputs: 5x faster), in float64 as the rows come."""
    return np.sqrt(np.einsum("ij,ij->i", rows, rows))


def _per_output(metric: Metric, outputs: Outputs, reference: Outputs, score, reduce: str) -> np.ndarray:
    """score(name, changed [n, m], original [n, m]) -> [n] for each selected output, reduced over outputs."""
    ref = metric.select(reference)
    out = metric.select(outputs)
    per = np.stack([score(name, _flat(out[name]), _flat(ref[name])) for name in ref])
    return per.max(axis=0) if reduce == "max" else per.mean(axis=0)


FLOOR = 0.1  # output-error's least denominator, as a share of the output's typical norm


class OutputError(Metric):
    """||changed - original|| / ||original|| per sample and output. Several layers' errors are
    independent perturbations of the outputs, so they add in quadrature (measured: at 1% the plan
    then spends 0.90-0.97% where adding them linearly spent 0.50-0.79%, for 4-12% higher ratios on
    lenet300, lenet5 and multitask). A sample whose original output is smaller than a tenth of the
    output's typical (RMS) norm over the data is measured against that tenth (FLOOR): relative to
    itself, a score near zero or a nearly empty mask would turn a change no one sees into the
    largest error of the data set (face_landmark's face-presence logit: the same absolute change,
    0.034 on average, read as 0.33% on faces and 1.24% on profile crops whose logit is near 0, where
    the probability moved by less than 0.02). An output that is zero on every sample has no scale and
    counts its absolute L2 error."""

    unit = "relative L2 error of the outputs (0.01 = 1%)"
    quadrature = True
    default_margin = OUTPUT_MARGIN

    def __init__(self, reduce: str = "max", output: Optional[str] = None):
        super().__init__(output)
        if reduce not in ("max", "mean"):
            raise InputError(f"output-error aggregates outputs by max or mean, not {reduce!r}")
        self.reduce = reduce
        self.name = "output-error" if reduce == "max" else "output-error:mean"

    def losses(self, outputs, reference, y):
        def relative(name, a, r):
            norms = _norms(r)
            typical = float(np.sqrt(np.mean(np.square(norms)))) if norms.size else 0.0
            return _norms(a - r) / np.maximum(norms, FLOOR * typical if typical > 0 else 1.0)
        return _per_output(self, outputs, reference, relative, self.reduce)


class Cosine(Metric):
    name, unit, default_max_loss = "cosine", "cosine distance of the outputs (0.001 = 0.999 similarity)", 0.001
    default_margin = OUTPUT_MARGIN

    def losses(self, outputs, reference, y):
        def distance(name, a, r):
            norms = np.linalg.norm(a, axis=1) * np.linalg.norm(r, axis=1)
            cos = np.einsum("ij,ij->i", a, r) / np.maximum(norms, np.finfo(np.float64).tiny)
            return np.where(norms > 0, 1.0 - cos, np.where(np.all(a == r, axis=1), 0.0, 1.0))
        return _per_output(self, outputs, reference, distance, "max")


class PSNR(Metric):
    """Per sample the normalized MSE (MSE / peak^2, peak: the original output's range over the data
    set); the mean of those is the budget's quantity, and -10 log10 of it the PSNR people read."""

    name, unit, default_max_loss = "psnr", "dB of PSNR, the lowest allowed (40 = 40 dB)", 40.0
    default_margin = OUTPUT_MARGIN

    def losses(self, outputs, reference, y):
        def nmse(name, a, r):
            peak = float(np.ptp(r)) if r.size else 0.0
            return np.mean(np.square(a - r), axis=1) / max(peak * peak, np.finfo(np.float64).tiny)
        return _per_output(self, outputs, reference, nmse, "max")

    def allowed_mean(self, max_loss: float) -> float:
        if not (isinstance(max_loss, (int, float)) and math.isfinite(max_loss) and max_loss > 0):
            raise InputError(f"max-loss {max_loss}: for psnr give the lowest PSNR allowed, in dB (e.g. 40)")
        return 10.0 ** (-max_loss / 10.0)

    def value(self, mean_loss):
        return math.inf if mean_loss <= 0 else -10.0 * math.log10(mean_loss)


class UserMetric(Metric):
    """A function f(outputs, original_outputs, y_or_None) -> per-sample losses [n] (lower is better)."""

    unit = "the function's own unit"

    def __init__(self, function: Callable, name: Optional[str] = None, output: Optional[str] = None):
        super().__init__(output)
        self.function = function
        self.name = name or getattr(function, "__name__", "user metric")

    def losses(self, outputs, reference, y):
        n = len(next(iter(reference.values())))
        try:
            result = self.function(self.select(outputs), self.select(reference), y)
        except Exception as exc:  # the user's code: say whose failure it is, and where
            raise InputError(f"metric {self.name} failed: {type(exc).__name__}: {exc}") from exc
        result = np.asarray(result, np.float64)
        if result.shape != (n,) or not np.all(np.isfinite(result)):
            raise InputError(f"metric {self.name} must return {n} finite per-sample losses, "
                             f"got shape {result.shape}")
        return result


BUILTIN = ("top1", "topk:K", "agreement", "expected-top1", "output-error", "output-error:max", "output-error:mean", "psnr", "cosine")


def get(spec: Union[str, Metric, Callable], output: Optional[str] = None) -> Metric:
    """A metric from its name (see the module's docstring), a Metric, or a function (UserMetric)."""
    if isinstance(spec, Metric):
        if output is not None:
            spec.output = output
        return spec
    if callable(spec):
        return UserMetric(spec, output=output)
    if not isinstance(spec, str):
        raise InputError(f"metric {spec!r}: give a name, a Metric or a function")
    simple = {"top1": Top1, "agreement": Agreement, "expected-top1": ExpectedTop1, "psnr": PSNR, "cosine": Cosine}
    if spec in simple:
        return simple[spec](output=output)
    if spec in ("output-error", "output-error:max", "output-error:mean"):
        return OutputError(spec.partition(":")[2] or "max", output=output)
    if spec.startswith("topk:"):
        k = spec[5:]
        if not k.isdigit() or int(k) < 1:
            raise InputError(f"metric {spec!r}: topk takes a whole number >= 1 (topk:5)")
        return TopK(int(k), output=output)
    module, sep, function = spec.partition(":")
    if not sep or not module or not function:
        raise InputError(f"unknown metric {spec!r}: use one of {', '.join(BUILTIN)}, or module:function")
    try:
        found = getattr(importlib.import_module(module), function)
    except ImportError as exc:
        raise InputError(f"metric {spec!r}: cannot import module {module!r} ({exc})") from None
    except AttributeError:
        raise InputError(f"metric {spec!r}: module {module!r} has no {function!r}") from None
    if not callable(found):
        raise InputError(f"metric {spec!r}: {function!r} is not a function")
    return UserMetric(found, name=spec, output=output)


def default(model, has_labels: bool, output: Optional[str] = None) -> tuple[Metric, str]:
    """The metric to use when none is given, and why: top1 with labels, expected-top1 without, for a
    model whose (chosen) output is class scores; output-error for any other model.

    Without labels expected-top1 rather than agreement: agreement counts every changed prediction as
    lost, where top-1 nets the ones that became right against the ones that became wrong, so at the
    same budget it keeps far larger streams (bench/label_free.py measures both)."""
    outputs = model.output_details()
    chosen = [d for d in outputs if output is None or d["key"] == output]
    if len(chosen) == 1:
        index = chosen[0]["index"]
        producer = next((op.name for op in model.ops if index in op.outputs), None)
        values = int(np.prod(chosen[0]["shape"][1:])) if len(chosen[0]["shape"]) > 1 else 1
        scores = producer == "LOG_SOFTMAX" or chosen[0]["key"] in probability_outputs(model)
        if values >= 2 and (scores or (has_labels and len(chosen[0]["shape"]) == 2)):
            if has_labels:
                return Top1(output), "the data has labels and the model outputs class scores"
            return ExpectedTop1(output), ("the data has no labels and the model outputs class scores; "
                                          "agreement is the stricter choice")
    return OutputError(output=output), "the model's outputs are not class scores"
