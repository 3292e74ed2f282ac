"""The interface of every budget metric: a per-sample loss of a changed model's outputs against the
original's, the noise of their mean, and how a budget in its unit reads (pydsz.budget.metrics lists the
metrics and makes them by name)."""

from __future__ import annotations

import copy
import math
from typing import Mapping, Optional

import numpy as np

from pydsz.budget.probabilities import probability_outputs
from pydsz.errors import InputError

Outputs = Mapping[str, np.ndarray]

# Samples the mean's standard error is trusted from, for the continuous metrics.
MIN_SAMPLES = 30
# A discrete budget that resolves fewer changed samples than this (noise margin included) is noisy.
FEW_SAMPLES = 5


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
    # counts, whose noise is the flips' own (McNemar's); OUTPUT_MARGIN for the output metrics (pydsz.budget.metrics).
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


def _check_labels(y, n: int, classes: int) -> None:
    y = np.asarray(y)
    if y.ndim != 1 or y.shape[0] != n:
        raise InputError(f"y must be a vector of {n} labels, got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise InputError(f"labels must be integers, got {y.dtype}")
    if y.size and (y.min() < 0 or y.max() >= classes):
        raise InputError(f"labels range over {int(y.min())}..{int(y.max())} but the model has {classes} outputs")
