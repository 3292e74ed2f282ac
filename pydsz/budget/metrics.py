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

import importlib
import math
from typing import Callable, Optional, Union

import numpy as np

from pydsz.budget.classifier import Agreement, ExpectedTop1, Top1, TopK  # noqa: F401  (the metrics by name)
from pydsz.budget.metric import FEW_SAMPLES, MIN_SAMPLES, Metric, Outputs  # noqa: F401
from pydsz.budget.probabilities import probability_outputs
from pydsz.errors import InputError

# The output metrics' default margin. Their per-sample losses are heavy-tailed and a user's samples come
# from a few sources (crops of a handful of photos, windows of a few recordings), so the standard error
# of 32-128 of them understates how far another set's mean lies: at 1, bench/zoo.py's 14 models by others
# held their budget on test in 5; at 2 in 9, for 1.5% more bytes at the median (doc/results.md). In
# standard errors of a mean, the cost is small where the budget is resolved (unlike a 5-sample top-1 budget).
OUTPUT_MARGIN = 2.0


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
