"""A classifier's outputs read as class probabilities: which outputs a SOFTMAX makes, rows made
probabilities (or a softmax of logits), and the temperature that calibrates them on labels."""

from __future__ import annotations

import math

import numpy as np

# how far from 1 a row of probabilities may sum where the model does not say what the output is: a
# quantized output's (8 bits: each within half of 1/256 of the real one, 10 classes within 0.02) rounds
# each value
PROBABILITY_SUM = 0.03
# ops between a SOFTMAX and a model output that leave its values probabilities (requantized, reshaped)
_KEEP_PROBABILITIES = ("QUANTIZE", "DEQUANTIZE", "RESHAPE", "SQUEEZE")
# the temperatures a calibration searches: an overconfident model's are 1.2-3 on data it did not train on
TEMPERATURES = (0.05, 20.0)


def probability_outputs(model) -> frozenset:
    """The keys of `model`'s outputs that a SOFTMAX makes, through ops that only requantize or reshape
    its values: class probabilities whatever their rows sum to. An 8-bit softmax over 1,000 classes
    rounds away the classes below half a step (or up those just above it), so its rows sum to anywhere
    from about 0.8 to 1.2 on uncertain samples, which no tolerance on the values can tell from logits."""
    producer = {t: op for op in model.ops for t in op.outputs}
    known = set()
    for d in model.output_details():
        op = producer.get(d["index"])
        while op is not None and op.name in _KEEP_PROBABILITIES and op.inputs:
            op = producer.get(op.inputs[0])
        if op is not None and op.name == "SOFTMAX":
            known.add(d["key"])
    return frozenset(known)


def as_probabilities(scores: np.ndarray, known: bool = False) -> np.ndarray:
    """Rows of class probabilities (made to sum to 1), or the softmax of rows that are not (logits).
    known: the model makes them probabilities (probability_outputs); otherwise the values must say so,
    non-negative and summing to 1 within PROBABILITY_SUM. A row of probabilities all rounded to 0 is
    taken as uniform."""
    scores = scores.astype(np.float64)
    sums = scores.sum(axis=1, keepdims=True)
    if known or (scores.min() >= 0 and np.allclose(sums, 1, atol=PROBABILITY_SUM)):
        return np.where(sums > 0, scores / np.where(sums > 0, sums, 1.0), 1.0 / scores.shape[1])
    return softmax(scores)


def softmax(z: np.ndarray) -> np.ndarray:
    """Row by row; softmax(log_p / t) is probabilities at temperature t."""
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def temperature(log_p: np.ndarray, y) -> float:
    """The temperature t of log-probabilities `log_p` [n, classes] whose softmax(log_p / t) gives the labels
    `y` the largest likelihood: golden section over TEMPERATURES in log space (the likelihood is unimodal
    in it)."""
    rows, labels = np.arange(len(log_p)), np.asarray(y)

    def nll(log_t: float) -> float:
        z = log_p / math.exp(log_t)
        z = z - z.max(axis=1, keepdims=True)
        return float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[rows, labels]))

    lo, hi = (math.log(t) for t in TEMPERATURES)
    golden = (math.sqrt(5) - 1) / 2
    a, b = hi - golden * (hi - lo), lo + golden * (hi - lo)
    fa, fb = nll(a), nll(b)
    for _ in range(40):  # the interval shrinks to 1e-8 of its width
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - golden * (hi - lo)
            fa = nll(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + golden * (hi - lo)
            fb = nll(b)
    return math.exp((lo + hi) / 2)
