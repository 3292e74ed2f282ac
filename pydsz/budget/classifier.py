"""The metrics of classifiers: top-1, top-k and agreement count changed samples; expected-top1 prices a
change by the original model's class probabilities where there are no labels."""

from __future__ import annotations

import copy
import math
from typing import Optional

import numpy as np

from pydsz.budget.metric import Metric, Outputs
from pydsz.budget.probabilities import as_probabilities
from pydsz.errors import InputError


def share(metric: Metric, max_loss: float) -> float:
    """A budget that is a share of the samples (of accuracy)."""
    if not (isinstance(max_loss, (int, float)) and 0 <= max_loss < 1):
        raise InputError(f"max-loss {max_loss}: must be in [0, 1) for {metric.name} (0.003 is 0.3 points)")
    return float(max_loss)


def class_scores(outputs: Outputs, metric: Metric) -> np.ndarray:
    """The one output the metric reads, as a row of class scores per sample."""
    (scores,) = metric.select(outputs).values()
    return np.asarray(scores).reshape(len(scores), -1)


class _Discrete(Metric):
    """0/1 losses. Their mean's noise is McNemar's: of the samples that changed, each is a coin toss
    between lost and gained, so the net count deviates by about sqrt(changed samples)."""

    discrete = True
    classifier = True
    default_max_loss = 0.003

    def allowed_mean(self, max_loss: float) -> float:
        return share(self, max_loss)

    def noise(self, losses, base):
        return math.sqrt(float(np.sum(np.square(losses - base))))


class Top1(_Discrete):
    name, unit, needs_labels = "top1", "top-1 accuracy (0.003 = 0.3 points)", True

    def losses(self, outputs, reference, y):
        return (np.argmax(class_scores(outputs, self), axis=1) != np.asarray(y)).astype(np.float64)

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
        scores, y = class_scores(outputs, self), np.asarray(y)
        label = scores[np.arange(len(y)), y][:, None]
        earlier = np.arange(scores.shape[1])[None, :] < y[:, None]
        rank = np.sum(scores > label, axis=1) + np.sum((scores == label) & earlier, axis=1)
        return (rank >= self.k).astype(np.float64)

    def value(self, mean_loss):
        return 1.0 - mean_loss


class Agreement(_Discrete):
    name, unit = "agreement", "share of samples whose top class changes (0.003 = 0.3 points)"

    def losses(self, outputs, reference, y):
        return (np.argmax(class_scores(outputs, self), axis=1) != np.argmax(class_scores(reference, self), axis=1)
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
        return self.p if self.p is not None else as_probabilities(class_scores(reference, self), known)

    def losses(self, outputs, reference, y):
        p = self._probabilities(reference)
        chosen = np.argmax(class_scores(outputs, self), axis=1)
        return 1.0 - p[np.arange(len(chosen)), chosen]

    def allowed_mean(self, max_loss: float) -> float:
        return share(self, max_loss)

    def change_costs(self, reference):
        # the cheapest change moves a sample from the reference's top class a to its runner-up b: p(a) - p(b)
        scores, p = class_scores(reference, self), self._probabilities(reference)
        ranked, rows = np.argsort(-scores, axis=1, kind="stable"), np.arange(len(scores))  # ties as argmax's
        return p[rows, ranked[:, 0]] - p[rows, ranked[:, 1]]

    def noise(self, losses, base):
        kept, moved = 1.0 - base, 1.0 - losses  # p(a), p(b)
        changed = losses != base
        return math.sqrt(float(np.sum((kept + moved - np.square(kept - moved))[changed])))

    def value(self, mean_loss):
        return 1.0 - mean_loss

