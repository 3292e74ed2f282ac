"""calibrated-top1: the top-1 loss to expect, the original model's class probabilities calibrated on the
labels; what a top1 budget's decisions measure in (`deciding`), the labels then checking the file.

A sample whose correctness changes is a coin toss between lost and gained, so top-1's noise on few labels
is McNemar's: on 400 labels a file that changes 16 samples' correctness has a noise of 4 samples, the whole
of a 1-point budget, and decisions that keep that much in hand give a quarter of the ratio deciding on
9,600 labels gives (bench/zoo.py's classifiers), within the budget on test all the same. Counted by its
calibrated probabilities, a change costs q(a) - q(b) of a correct answer, and the noise is how far those
costs spread over the samples, not the labels' coin tosses.
"""

from __future__ import annotations

import copy
from typing import Optional

import numpy as np

from pydsz.budget import metrics, probabilities
from pydsz.budget.classifier import class_scores, share

# the weights of the first model in `change`'s mixture that are tried
MIXTURES = np.linspace(0.0, 1.0, 101)


def deciding(metric: metrics.Metric) -> metrics.Metric:
    """The metric the decisions on a budget in `metric` measure in, given labels: calibrated-top1 for top1,
    otherwise `metric` itself."""
    return CalibratedTop1(metric.output) if type(metric) is metrics.Top1 else metric


class CalibratedTop1(metrics.Metric):
    """The top-1 loss to expect on samples like these: a sample whose prediction moves from class a to
    class b loses q(a) - q(b) of a correct answer, q the original model's class probabilities calibrated
    on the labels (their log divided by the one temperature that gives the labels the largest
    likelihood). Its noise is the samples', as the output metrics': the labels are used once, for the
    temperature. Fitted to a data set's original outputs (`fitted`, as an Evaluator does), every loss counts
    from their calibrated probabilities (`q`), whatever reference it is given: the interpreter's, the same
    in every process to the last bit, where a path's own baseline (numpy's tail, a cut) may differ in its
    last digits from process to process."""

    name, unit, needs_labels, classifier = "calibrated-top1", "calibrated top-1 accuracy (0.003 = 0.3 points)", True, True
    default_max_loss = 0.003

    def __init__(self, output: Optional[str] = None):
        super().__init__(output)
        self.t: Optional[float] = None  # the fitted temperature
        self.q: Optional[np.ndarray] = None  # the fitted data's calibrated probabilities [n, classes]

    def fitted(self, reference, y) -> "CalibratedTop1":
        told = copy.copy(self)
        log_p = self._log_probabilities(reference)
        told.t = probabilities.temperature(log_p, y)
        told.q = probabilities.softmax(log_p / told.t)
        return told

    def pooled_change(self, outputs, y) -> float:
        """`change` from the original (its fitted probabilities) to another model's `outputs` of the same
        classes on the fitted samples: for a model retrained on the labels, which learned there what the
        original did not know."""
        return change(self.q, self._log_probabilities(outputs), y)

    def _log_probabilities(self, reference) -> np.ndarray:
        (key, ref), = self.select(reference).items()
        scores = np.asarray(ref, np.float64).reshape(len(ref), -1)
        return np.log(np.maximum(probabilities.as_probabilities(scores, key in self.probabilities), 1e-300))

    def calibrated(self, reference, y) -> np.ndarray:
        """The original model's calibrated class probabilities: the fitted data's, else `reference`'s
        calibrated on `y` now."""
        return self.q if self.q is not None else self.fitted(reference, y).q

    def losses(self, outputs, reference, y):
        q = self.calibrated(reference, y)
        chosen = np.argmax(class_scores(outputs, self), axis=1)
        return 1.0 - q[np.arange(len(chosen)), chosen]

    def allowed_mean(self, max_loss: float) -> float:
        return share(self, max_loss)

    def value(self, mean_loss):
        return 1.0 - mean_loss


def calibrate(log_p: np.ndarray, y) -> np.ndarray:
    """Class probabilities from log-probabilities (or logits) [n, classes], calibrated on labels `y` by
    the one temperature that gives them the largest likelihood."""
    return probabilities.softmax(log_p / probabilities.temperature(log_p, y))


def change(q: np.ndarray, after: np.ndarray, y) -> float:
    """The correct answers a model whose calibrated probabilities on some samples are `q` (`calibrate`)
    loses where another's log-probabilities (or logits) are `after`, summed (`changes`)."""
    return float(np.sum(changes(q, after, y)))


def changes(q: np.ndarray, after: np.ndarray, y) -> np.ndarray:
    """Each sample's share of `change`, judged by what the two models know together: a sample whose class
    moves from a to b loses p(a) - p(b), p the mixture of the two models' calibrated probabilities that
    gives the labels `y` the largest likelihood. The sum's noise is the root of their sum of squares:
    a moved sample whose two classes the mixture finds about as likely counts little either way, where
    the labels count it a whole coin toss.

    By one model's probabilities alone every prediction the other makes differently is a loss. That holds
    for a copy of the model (compressed, pruned one-shot), not for one retrained on the labels: on mlp-d's
    plans retrained that lose nothing (60/60%, 85/70%), 8 draws of 500 labels each, the original's alone
    counted 0.1-1.2 points where 10,000 unseen images lost none (-0.1 to -0.3 points), the mixture -0.3 to
    +0.5, about the labels' own mean at 60% of their spread."""
    rows, labels = np.arange(len(y)), np.asarray(y)
    other = calibrate(after, y)
    w = MIXTURES[:, None]
    # the likelihood is concave in the weight: a fine grid is as good as a search
    likelihood = np.log(np.maximum(w * q[rows, labels] + (1 - w) * other[rows, labels], 1e-300)).sum(axis=1)
    best = float(MIXTURES[int(np.argmax(likelihood))])
    truth = best * q + (1 - best) * other
    a, b = np.argmax(q, axis=1), np.argmax(after, axis=1)
    return truth[rows, a] - truth[rows, b]
