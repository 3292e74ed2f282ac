"""Step 1 of DeepSZ: magnitude pruning of FC layers, then retraining with the masks held.

The conv trunk stays frozen: the input of the first FC layer is captured once through the
interpreter, and the FC tail is retrained on those cached activations in numpy (Adam, softmax
cross-entropy on the tail's output, masks re-applied after every step, fixed seed).
pydsz.oneshot.prune_model is the way without training data, conv layers included.

Memory: retraining holds the model's bytes (the dense layers are views of them) and the trained copy
of the tail, i.e. 2x the FC weights, plus the cached activations; Adam's two moments and the running
mean are kept at the masks' kept weights only, and gradients, updates, masks' thresholds and the
input's scale are computed in slices, so they add nothing layer-sized.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Optional, Sequence, Union

import numpy as np

from pydsz.errors import InputError

# Fewer training samples than this cannot retrain anything worth keeping.
MIN_TRAIN_SAMPLES = 100
# A layer whose weights are at least this sparse is taken as already pruned and left alone.
ALREADY_SPARSE = 0.5
# The ladder `auto` climbs, layer by layer.
AUTO_LADDER = (0.5, 0.7, 0.8, 0.85, 0.9, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98)
# Standard deviations of validation noise `auto` keeps in hand (compress's default margin).
AUTO_MARGIN = 1.0

# Elements per slice of _Adam's and NumpySteps.average's elementwise arithmetic and of magnitude_mask:
# they run slice by slice through small scratch buffers, so a step allocates no temporary the size
# of a layer.
SLICE = 1 << 18

Sparsity = Union[float, Mapping[str, float], str]


def _slices(n: int):
    return (slice(i, min(n, i + SLICE)) for i in range(0, n, SLICE))


@dataclass
class Dense:
    """One FC layer of the tail: y = act(x @ weight.T + bias), weight stored [out, in] as in TFLite."""

    name: str
    weight: np.ndarray
    bias: np.ndarray
    activation: str = "NONE"  # TFLite's name: NONE, RELU, RELU6, RELU_N1_TO_1, TANH, LOGISTIC
    train_bias: bool = True  # False where the model cannot store a retrained bias (absent or shared)


def _relu6_grad(z: np.ndarray, a: np.ndarray) -> np.ndarray:
    return ((z > 0) & (z < 6)).astype(z.dtype)


# name -> (forward, derivative given pre-activation z and activation a)
ACTIVATIONS: dict[str, tuple[Callable, Callable]] = {
    "NONE": (lambda z: z, lambda z, a: np.ones_like(z)),
    "RELU": (lambda z: np.maximum(z, 0), lambda z, a: (z > 0).astype(z.dtype)),
    "RELU6": (lambda z: np.clip(z, 0, 6), _relu6_grad),
    "RELU_N1_TO_1": (lambda z: np.clip(z, -1, 1), lambda z, a: ((z > -1) & (z < 1)).astype(z.dtype)),
    "TANH": (np.tanh, lambda z, a: 1 - a * a),
    "LOGISTIC": (lambda z: 1 / (1 + np.exp(-z)), lambda z, a: a * (1 - a)),
}


def density(weight: np.ndarray) -> float:
    """Fraction of non-zero entries."""
    return float(np.count_nonzero(weight)) / max(1, weight.size)


def magnitude_mask(weight: np.ndarray, sparsity: float) -> np.ndarray:
    """Boolean mask keeping the largest-magnitude (1 - sparsity) share of the entries."""
    if not 0 <= sparsity < 1:
        raise InputError(f"sparsity {sparsity}: must be in [0, 1)")
    n_prune = int(round(sparsity * weight.size))
    if not n_prune:
        return np.ones(weight.shape, bool)
    flat = weight.ravel()
    mask = flat != 0
    zeros = flat.size - int(np.count_nonzero(mask))
    # zeros are the smallest magnitudes; among the non-zeros the threshold is found without a copy
    threshold = _smallest(flat, n_prune - zeros) if n_prune > zeros else np.zeros((), flat.dtype)
    scratch = np.empty(min(SLICE, flat.size), flat.dtype)
    for part in _slices(flat.size):
        s = scratch[: part.stop - part.start]
        np.greater(np.abs(flat[part], out=s), threshold, out=mask[part])
    # ties at the threshold: prune exactly n_prune entries, keeping the first of the tied ones
    missing = (weight.size - n_prune) - int(np.count_nonzero(mask))
    for part in _slices(flat.size):
        if missing <= 0:
            break
        tied = np.flatnonzero(np.abs(flat[part]) == threshold)[:missing]
        mask[part.start + tied] = True
        missing -= len(tied)
    return mask.reshape(weight.shape)


def _smallest(flat: np.ndarray, k: int) -> np.ndarray:
    """The k-th smallest magnitude among the non-zeros of `flat` (k >= 1), in two passes over slices
    instead of a sorted copy of the layer: non-negative floats order as their bits, so a histogram of
    the top 16 bits finds the bin that holds it, and only that bin's values are sorted."""
    if flat.dtype.kind != "f":
        members = np.abs(flat[flat != 0])
        members.partition(k - 1)
        return members[k - 1]
    as_bits = np.dtype(f"u{flat.dtype.itemsize}")
    shift = 8 * flat.dtype.itemsize - 16
    scratch = np.empty(min(SLICE, flat.size), flat.dtype)
    counts = np.zeros(1 << 16, np.int64)
    for part in _slices(flat.size):
        top = np.abs(flat[part], out=scratch[: part.stop - part.start]).view(as_bits) >> shift
        counts += np.bincount(top, minlength=1 << 16)
    counts[0] -= flat.size - int(np.count_nonzero(flat))  # the zeros (+0 and -0) are not among them
    below = np.cumsum(counts)
    b = int(np.searchsorted(below, k))
    k -= int(below[b - 1]) if b else 0
    members = []
    for part in _slices(flat.size):
        m = np.abs(flat[part], out=scratch[: part.stop - part.start])
        members.append(m[(m.view(as_bits) >> shift == b) & (m != 0)])
    members = np.concatenate(members)
    members.partition(k - 1)
    return members[k - 1]


# logits' batches: the widest activation of a batch takes at most this many values (16 MiB: the
# AlexNet-shaped tail's 4096-wide layers run 1,024 samples at a time, two activations of 8,192 were
# 256 MiB at the peak of `dsz prune`; LeNets keep 8,192)
BATCH_VALUES = 1 << 22


def forward(layers: Sequence[Dense], h: np.ndarray) -> np.ndarray:
    """The tail's output (logits, before any final softmax) for a batch of cached inputs."""
    h = h.reshape(len(h), -1).astype(np.float32, copy=False)
    for layer in layers:
        z = h @ layer.weight.T
        z += layer.bias
        del h  # each activation is freed as soon as the next is computed: two of them at most
        h = ACTIVATIONS[layer.activation][0](z)
        del z
    return h


def count_correct(layers: Sequence[Dense], h: np.ndarray, y: np.ndarray, batch: Optional[int] = None,
                  device: str = "cpu") -> int:
    """How many samples the tail classifies correctly (top-1)."""
    return int(np.sum(np.argmax(logits(layers, h, device, batch), axis=1) == y))


@dataclass
class _Adam:
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    t: int = 0
    state: dict = field(default_factory=dict)  # key -> moments (m, v): every entry's, or the held mask's
    held: dict = field(default_factory=dict)  # key -> (mask, each row's first entry in the moments)
    scratch: tuple = ()

    def hold(self, key: str, mask: np.ndarray) -> None:
        """Keep `key`'s moments from now on only where `mask` [rows, ...] is True, and step only there.

        A masked weight's gradient is zero and the weight is re-zeroed after every step, so its
        moments never reach a kept weight: at 4-9% density this drops most of Adam's 2x the layer.
        Entries the mask adds start from zero moments (a magnitude mask over masked weights only adds
        entries that were never kept: their moments were zero too)."""
        rows = mask.reshape(len(mask), -1)
        first = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(np.count_nonzero(rows, axis=1), out=first[1:])
        before = self.held.get(key)
        if key in self.state:
            # one moment at a time, each old one freed once regathered: the peak holds one new one
            moments = list(self.state.pop(key))
            block = max(1, SLICE // max(1, rows.shape[1]))
            for j, old in enumerate(moments):
                new = np.zeros(first[-1], np.float32)
                for r in range(0, len(rows), block):
                    end = min(len(rows), r + block)
                    if before is None:
                        dense = old.reshape(rows.shape)[r:end]
                    else:
                        dense = np.zeros((end - r, rows.shape[1]), np.float32)
                        dense[before[0][r:end]] = old[before[1][r]:before[1][end]]
                    new[first[r]:first[end]] = dense[rows[r:end]]
                moments[j] = new
                old = dense = None  # dense may be a view of old
            self.state[key] = tuple(moments)
        self.held[key] = rows, first

    def step(self, key: str, param: np.ndarray, grad: np.ndarray, lr: float, rows: slice = slice(None)) -> None:
        """In place: param -= lr * m_hat / (sqrt(v_hat) + eps), the moments m and v updated; with
        `rows`, only those rows of param (grad holds just them); where `key` is held, only the mask's
        entries (the others stay as they are).

        The same float32 operations in the same order as pydsz.gpu's dsz_masked_adam kernel (whose
        result must equal this one bit for bit), one slice at a time."""
        r0, r1, _ = rows.indices(len(param))
        held = self.held.get(key)
        if key not in self.state:
            n = param.size if held is None else int(held[1][-1])
            self.state[key] = (np.zeros(n, np.float32), np.zeros(n, np.float32))
        m, v = self.state[key]
        if held is None:
            row = param.size // max(1, len(param))
            p, g, m, v = param[r0:r1].reshape(-1), grad.reshape(-1), m[r0 * row:r1 * row], v[r0 * row:r1 * row]
        else:
            mask, first = held[0][r0:r1], held[1]
            block = param[r0:r1].reshape(mask.shape)
            p, g, m, v = block[mask], grad.reshape(mask.shape)[mask], m[first[r0]:first[r1]], v[first[r0]:first[r1]]
        self._update(p, g, m, v, lr)
        if held is not None:
            block[mask] = p

    def _update(self, param: np.ndarray, grad: np.ndarray, m_all: np.ndarray, v_all: np.ndarray, lr: float) -> None:
        """step's arithmetic on flat arrays of the same length."""
        if not self.scratch:
            self.scratch = (np.empty(SLICE, np.float32), np.empty(SLICE, np.float32))
        c1, c2 = 1 - self.beta1**self.t, 1 - self.beta2**self.t
        for part in _slices(param.size):
            p, g, m, v = (a[part] for a in (param, grad, m_all, v_all))
            s, d = (a[: len(p)] for a in self.scratch)
            m *= self.beta1
            m += np.multiply(g, 1 - self.beta1, out=s)
            v *= self.beta2
            np.multiply(g, 1 - self.beta2, out=s)
            v += np.multiply(s, g, out=s)
            np.divide(m, c1, out=s)
            np.multiply(s, lr, out=s)
            np.divide(v, c2, out=d)
            np.sqrt(d, out=d)
            d += self.eps
            p -= np.divide(s, d, out=s)


class NumpySteps:
    """retrain's arithmetic in numpy: the tail's parameters, masks, Adam state and running mean.

    pydsz.gpu.train.GpuSteps does the same on the device, with the same methods; retrain's loop
    (batches, learning rate, pruning schedule) drives either.
    """

    def __init__(self, params: list[Dense], keep: list[Optional[np.ndarray]]):
        self.params, self.keep = params, keep
        self.opt = _Adam()
        for p, m in zip(params, keep):
            if m is not None:
                self.opt.hold(p.name + ".w", m)
        self.kept: list[Optional[np.ndarray]] = []  # per layer, flat indices of the weights averaged (None: all)
        self.means: list[tuple[np.ndarray, np.ndarray]] = []  # per layer, running means of those weights and the bias

    def weight(self, i: int) -> np.ndarray:
        return self.params[i].weight

    def set_mask(self, i: int, mask: np.ndarray) -> None:
        self.keep[i] = mask
        self.params[i].weight *= mask
        self.opt.hold(self.params[i].name + ".w", mask)

    def step(self, x: np.ndarray, target: np.ndarray, lr: float) -> None:
        """One masked Adam step on a batch x with target class probabilities (masked weights are
        held by the optimizer: it neither stores nor steps them)."""
        self.opt.t += 1
        for p, (delta, inputs) in zip(self.params, _backward(self.params, x, target)):
            # the weight gradient delta.T @ inputs a block of rows at a time, each block stepped at
            # once: no gradient the size of the layer is ever held
            n = p.weight.shape[0]
            starts = list(range(0, n, max(2, SLICE // p.weight.shape[1])))
            if len(starts) > 1 and n - starts[-1] == 1:
                # a 1-row block would be numpy's matrix-vector product, whose sums differ in the
                # last bit from the matrix product's: it joins the block before
                starts.pop()
            for r, end in zip(starts, starts[1:] + [n]):
                rows = slice(r, end)
                self.opt.step(p.name + ".w", p.weight, delta[:, rows].T @ inputs, lr, rows)
            if p.train_bias:
                self.opt.step(p.name + ".b", p.bias, delta.sum(axis=0), lr)

    def average(self, k: int) -> None:
        """Fold the current parameters into the running mean as its k-th term."""
        if not self.means:
            # The masks are final once averaging starts: a sparse layer's mean is kept over its
            # kept weights only, as a dense one would add a layer's bytes to the peak memory.
            for p, m in zip(self.params, self.keep):
                idx = None
                if m is not None and np.count_nonzero(m) < m.size // 2:
                    idx = np.flatnonzero(m).astype(np.int32 if m.size < 2**31 else np.int64)
                self.kept.append(idx)
                self.means.append((np.zeros(p.weight.size if idx is None else len(idx), np.float32),
                                   np.zeros(p.bias.shape, np.float32)))
        scratch = self.opt.scratch[0] if self.opt.scratch else np.empty(SLICE, np.float32)
        for p, idx, (mean_w, mean_b) in zip(self.params, self.kept, self.means):
            w = p.weight.reshape(-1)
            for mean, value in ((mean_w, w if idx is None else w[idx]), (mean_b, p.bias)):
                for part in _slices(mean.size):
                    m, s = mean[part], scratch[: part.stop - part.start]
                    np.subtract(value[part], m, out=s)
                    m += np.divide(s, k, out=s)

    def result(self) -> list[Dense]:
        """The running means as layers (the pruned weights zero). The Adam state goes first, and each
        layer's trained weights before its mean is spread to the layer's size: the means take the trained
        weights' place instead of adding to them."""
        self.opt.state.clear()
        out = []
        for i, (idx, (mean_w, mean_b)) in enumerate(zip(self.kept, self.means)):
            p, self.params[i] = self.params[i], None
            shape, p.weight = p.weight.shape, None
            if idx is not None:
                mean_w, dense = np.zeros(int(np.prod(shape)), np.float32), mean_w
                mean_w[idx] = dense
            out.append(replace(p, weight=mean_w.reshape(shape), bias=mean_b))
        return out


def logits(layers: Sequence[Dense], h: np.ndarray, device: str = "cpu", batch: Optional[int] = None) -> np.ndarray:
    """forward() over h in batches (default: as many samples, up to 8,192, as keep the widest layer's
    output within BATCH_VALUES), in numpy or on the GPU (pydsz.gpu.train.forward)."""
    if device == "gpu":
        from pydsz.gpu.train import forward as gpu_forward

        return gpu_forward(layers, h)
    if batch is None:
        batch = max(1, min(8192, BATCH_VALUES // max(layer.weight.shape[0] for layer in layers)))
    h = h.reshape(len(h), -1)
    parts = [forward(layers, h[i:i + batch]) for i in range(0, len(h), batch)]
    return np.concatenate(parts) if parts else np.zeros((0, layers[-1].weight.shape[0]), np.float32)


def retrain(
    layers: Sequence[Dense],
    masks: Mapping[str, np.ndarray],
    h: np.ndarray,
    y: np.ndarray,
    *,
    epochs: float = 4,
    lr: float = 1e-3,
    batch_size: int = 128,
    seed: int = 0,
    progress: bool = False,
    targets: Optional[Mapping[str, float]] = None,
    ramp: float = 0.5,
    teacher: Optional[Sequence[Dense]] = None,
    distill: float = 0.5,
    average: float = 0.25,
    device: str = "cpu",
) -> list[Dense]:
    """Retrain the tail on cached inputs `h` with labels `y`; masked weights stay exactly zero.

    Returns new layers (the inputs are not modified). `epochs` may be fractional (short
    retraining for the `auto` search). The learning rate decays linearly to zero, which settles
    the weights and so makes the result depend less on where the last epoch stopped.
    `targets` ({layer: sparsity}) prunes gradually while training: the layer's mask tightens by
    magnitude on a cubic schedule over the first `ramp` of the steps (Zhu & Gupta 2017), which
    loses far less accuracy than pruning at once and retraining afterwards.
    `teacher` (e.g. the unpruned layers) adds knowledge distillation: the target is the labels'
    one-hot mixed with the teacher's softmax, `distill` being the teacher's share. The result is
    the mean of the weights over the last `average` of the steps (after the masks are final).
    device "gpu" runs the steps on the GPU (pydsz.gpu.train.GpuSteps): the same loop and
    arithmetic, float summation order aside.
    """
    from tqdm import tqdm

    if len(h) < MIN_TRAIN_SAMPLES:
        raise InputError(f"training set of {len(h)} samples: too small to retrain (need >= {MIN_TRAIN_SAMPLES})")
    h = h.reshape(len(h), -1).astype(np.float32, copy=False)
    n_out = layers[-1].weight.shape[0]
    if y.min() < 0 or y.max() >= n_out:
        raise InputError(f"training labels span {y.min()}..{y.max()}: the model has {n_out} classes")
    # Scale the input to unit RMS and the first weights inversely: the same function, but Adam's
    # per-weight steps are then comparable across layers (inputs may be raw pixels 0..255).
    scale = float(np.sqrt(_mean_square(h[: min(len(h), 10000)]))) or 1.0
    params = [replace(l, weight=np.array(l.weight, np.float32), bias=np.array(l.bias, np.float32)) for l in layers]
    params[0].weight *= scale
    keep = [masks.get(l.name) for l in params]
    for p, m in zip(params, keep):
        if m is not None:
            p.weight *= m
    soft = None
    if teacher is not None:
        soft = _softmax(logits(teacher, h, device))
    rng = np.random.default_rng(seed)
    steps_per_epoch = max(1, len(h) // batch_size)
    total = max(1, int(round(epochs * steps_per_epoch)))
    ramp_steps = int(ramp * total) if targets else 0
    average_from = max(ramp_steps, total - max(1, int(average * total)))
    prune_every = max(1, steps_per_epoch // 8)
    if device == "gpu":
        from pydsz.gpu.train import GpuSteps

        steps = GpuSteps(params, keep)
    else:
        steps = NumpySteps(params, keep)
    bar = tqdm(total=total, desc="retrain", unit="step", disable=not progress, leave=False)
    order = rng.permutation(len(h))
    pos = 0
    for step in range(total):
        if pos + batch_size > len(h):
            order, pos = rng.permutation(len(h)), 0
        idx = order[pos : pos + batch_size]
        pos += batch_size
        if ramp_steps and step % prune_every == 0 and step <= ramp_steps:
            done = min(1.0, (step + prune_every) / ramp_steps)
            for i, p in enumerate(params):
                if p.name in targets:
                    steps.set_mask(i, magnitude_mask(steps.weight(i), targets[p.name] * (1 - (1 - done) ** 3)))
        target = np.eye(n_out, dtype=np.float32)[y[idx]]
        if soft is not None:
            target = (1 - distill) * target + distill * soft[idx]
        steps.step(h[idx] / scale, target, lr * (1 - step / total))
        if step >= average_from:
            # Averaging the last steps' weights settles the noise of the final mini-batches: the
            # result is flatter and depends less on float rounding (e.g. the BLAS thread count).
            steps.average(step - average_from + 1)
        bar.update()
    bar.close()
    params = steps.result()
    params[0].weight /= scale
    if keep[0] is not None:
        params[0].weight *= keep[0]
    return params


def _mean_square(a: np.ndarray) -> float:
    """np.mean(np.square(a, dtype=np.float64)) to the last bit, without its float64 copy of `a` (2 GB
    for 10,000 VGG-16 features): the slices are summed as numpy's pairwise summation splits the
    whole (halves rounded down to a multiple of 8), so the tree of additions is the same."""
    flat = np.ascontiguousarray(a).reshape(-1)

    def total(lo: int, n: int) -> float:
        if n <= max(SLICE, 128):  # numpy sums up to 128 values without splitting
            return np.add.reduce(np.square(flat[lo:lo + n], dtype=np.float64))
        half = n // 2 - (n // 2) % 8
        return total(lo, half) + total(lo + half, n - half)

    return total(0, flat.size) / flat.size if flat.size else np.nan


def _softmax(z: np.ndarray) -> np.ndarray:
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def _gradients(layers: Sequence[Dense], x: np.ndarray, target: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Gradients of the mean softmax cross-entropy between the tail's output and `target`
    (rows of class probabilities) w.r.t. each weight and bias."""
    return [(delta.T @ inputs, delta.sum(axis=0)) for delta, inputs in _backward(layers, x, target)]


def _backward(layers: Sequence[Dense], x: np.ndarray, target: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per layer, (delta, input) of the loss _gradients differentiates: the weight gradient is
    delta.T @ input, the bias gradient delta's column sums. Batch-sized arrays only."""
    inputs, pre, post = [], [], []
    h = x
    for layer in layers:
        inputs.append(h)
        z = h @ layer.weight.T + layer.bias
        h = ACTIVATIONS[layer.activation][0](z)
        pre.append(z)
        post.append(h)
    delta = (_softmax(h) - target) / len(target)
    out = []
    for i in range(len(layers) - 1, -1, -1):
        delta = delta * ACTIVATIONS[layers[i].activation][1](pre[i], post[i])
        out.append((delta, inputs[i]))
        if i:
            delta = delta @ layers[i].weight
    return out[::-1]


@dataclass
class PruneResult:
    """A pruned model and what was done to it (accuracies on the validation set)."""

    tflite: bytes
    sparsity: dict[str, float]  # per FC layer, after pruning (already-sparse layers included)
    pruned: list[str]  # the layers pruned now
    already_sparse: list[str]  # layers found sparse and left as they were
    top1_before: Optional[float]  # None when there are no labels to measure it with
    top1_after: Optional[float]
    method: str = "retrain"  # "retrain" (masked retraining of the FC tail) or "oneshot" (pydsz.oneshot)
    seconds: dict[str, float] = field(default_factory=dict)  # oneshot: time per pruned layer
    notes: list[str] = field(default_factory=list)  # oneshot auto: what it judged by, and sample warnings


def tail_layers(tail) -> list[Dense]:
    """The numpy tail (pydsz.tail.Tail) as trainable Dense layers; InputError if it is not a plain MLP.

    The layers share the tail's arrays. Reshapes are no-ops on flattened activations, a standalone activation op folds into the FC
    layer before it, and a final SOFTMAX is the loss's own softmax.
    """
    layers: list[Dense] = []
    for i, step in enumerate(tail.steps):
        if step.kind == "fc":
            layers.append(Dense(step.name, tail.weights[step.name], tail.biases[step.name], step.activation))
        elif step.kind == "reshape":
            continue
        elif step.kind == "activation" and layers and layers[-1].activation == "NONE" and step.op in ACTIVATIONS:
            layers[-1].activation = step.op
        elif step.kind == "softmax" and step.op == "SOFTMAX" and step.beta == 1.0 and i == len(tail.steps) - 1:
            continue
        else:
            raise InputError(f"cannot retrain the FC tail: op {step.op} after {layers[-1].name if layers else 'the input'} "
                             "is not supported by the numpy trainer")
        if layers[-1].activation not in ACTIVATIONS:
            raise InputError(f"cannot retrain {layers[-1].name}: activation {layers[-1].activation} is not supported")
    return layers


def sparsity_targets(names: Sequence[str], sparsity: Sparsity) -> dict[str, float] | str:
    """The sparsity of each named layer: one for all, or name=value pairs ("auto" as it is); InputError
    for a name that is not among `names` or a sparsity outside [0, 1)."""
    if isinstance(sparsity, str):
        if sparsity != "auto":
            raise InputError(f"sparsity {sparsity!r}: give a number, name=value pairs or 'auto'")
        return "auto"
    if isinstance(sparsity, Mapping):
        unknown = sorted(set(sparsity) - set(names))
        if unknown:
            raise InputError(f"no prunable layer named {', '.join(unknown)} (have: {', '.join(names)})")
        targets = {k: float(v) for k, v in sparsity.items()}
    else:
        targets = {name: float(sparsity) for name in names}
    for name, s in targets.items():
        if not 0 <= s < 1:
            raise InputError(f"layer {name}: sparsity {s} must be in [0, 1)")
    return targets


def _masks(layers: Sequence[Dense], targets: Mapping[str, float]) -> dict[str, np.ndarray]:
    """Magnitude masks for the targeted layers; every other layer keeps its own zeros, and has no mask
    where it has none (retraining it unmasked is the same, and an all-true mask takes a quarter of
    the layer's bytes for the whole retraining)."""
    out = {}
    for l in layers:
        mask = magnitude_mask(l.weight, targets[l.name]) if l.name in targets else l.weight != 0
        if l.name in targets or not mask.all():
            out[l.name] = mask
    return out


def judge(reference: np.ndarray, candidate: np.ndarray, allowed: int, margin: float) -> tuple[bool, int]:
    """A candidate's per-sample hits against the reference's: (within `allowed` samples with `margin`
    standard deviations of noise in hand, samples flipped). The noise of a paired count is about
    sqrt(flips), as compress counts it (assess.Measure.risk)."""
    lost, gained = int(np.sum(reference & ~candidate)), int(np.sum(~reference & candidate))
    return lost - gained + margin * float(np.sqrt(lost + gained)) <= allowed, lost + gained


def noise_error(name: str, n: int, budget: float, flips: int, margin: float) -> InputError:
    """The validation set cannot tell the smallest pruning of the largest layer from noise."""
    # flips grow with the samples, their noise with its square root, the budget linearly
    need = int(np.ceil(margin**2 * flips / (n * budget**2)))
    return InputError(f"validation set of {n} samples too small for a budget of {100 * budget:g} points "
                      f"({int(budget * n + 1e-6)} samples): pruning {name}, the largest layer, by {AUTO_LADDER[0]} "
                      f"flips {flips} predictions, a noise of {margin * np.sqrt(flips):.1f} samples; give about "
                      f"{need} validation samples or a larger budget")


def by_size(names: Sequence[str], sizes: Mapping[str, int]) -> list[str]:
    """The largest layers first: they hold most of the bytes, so they get the budget first."""
    return sorted(names, key=lambda name: -sizes[name])


def auto_sparsity(
    layers: list[Dense], h: np.ndarray, y: np.ndarray, h_val: np.ndarray, y_val: np.ndarray,
    names: Sequence[str], budget: float, epochs: float = 1, seed: int = 0, progress: bool = False,
    teacher: Optional[Sequence[Dense]] = None, distill: float = 0.5, device: str = "cpu",
    margin: float = AUTO_MARGIN,
) -> tuple[dict[str, float], list[Dense]]:
    """Per layer in turn, largest first, the highest sparsity of AUTO_LADDER whose validation loss
    stays within `budget` (accuracy) with `margin` standard deviations of noise in hand; returns
    the sparsities and the layers retrained at them. InputError when the validation set is too small
    to tell even the smallest pruning of the largest layer from noise.

    Each trial retrains briefly, pruning gradually and distilling from `teacher` as the final
    retraining does. A brief retraining moves a converged model by itself, so a trial is compared
    with the same brief retraining at the sparsities already chosen, not with the model as it came.
    The ladder is searched by bisection (the loss grows with the sparsity): a few trials per layer.
    """
    from tqdm import tqdm

    allowed = int(budget * len(y_val) + 1e-6)
    chosen: dict[str, float] = {}

    def trial(targets):
        return retrain(layers, _masks(layers, {}), h, y, epochs=epochs, seed=seed, targets=targets or None,
                       teacher=teacher, distill=distill, device=device)

    def hits(candidate):
        return np.argmax(logits(candidate, h_val, device), axis=1) == y_val

    order = by_size(names, {l.name: l.weight.size for l in layers})
    steps = int(np.ceil(np.log2(len(AUTO_LADDER) + 1))) + 1
    with tqdm(total=len(names) * steps, desc="auto sparsity", disable=not progress, leave=False) as bar:
        for name in order:
            reference = hits(trial(chosen))
            bar.update()
            lo, hi, best = 0, len(AUTO_LADDER), None  # AUTO_LADDER[:lo] passed, [hi:] failed
            while lo < hi:
                mid = (lo + hi) // 2
                candidate = trial({**chosen, name: AUTO_LADDER[mid]})
                bar.update()
                safe, flips = judge(reference, hits(candidate), allowed, margin)
                if safe:
                    lo, best = mid + 1, candidate
                else:
                    hi = mid
            if best is not None:
                chosen[name], layers = AUTO_LADDER[lo - 1], best
            elif name == order[0] and margin * np.sqrt(flips) > allowed:
                # the last trial was the ladder's first rung: its noise alone exceeds the budget
                raise noise_error(name, len(y_val), budget, flips, margin)
    return chosen, layers


def prune_model(
    tflite_bytes: bytes, train: tuple[np.ndarray, np.ndarray], val: tuple[np.ndarray, np.ndarray],
    sparsity: Sparsity, *, epochs: float = 8, auto_budget: float = 0.001, distill: float = 0.5, seed: int = 0,
    progress: bool = False, num_threads: int | None = None, device: str = "cpu",
) -> PruneResult:
    """Prune the FC layers of a .tflite model by magnitude and retrain its FC tail with the masks held.

    sparsity: one fraction for every FC layer, {layer: fraction}, or "auto" (per layer as high as
    the validation accuracy allows within auto_budget). Layers already at least ALREADY_SPARSE
    sparse are left alone. The trunk before the first FC layer stays frozen: its output is
    captured once and the tail retrains on it. `distill`: the unpruned tail's share of the
    training target (knowledge distillation; 0 trains on the labels alone). device: "cpu" or
    "gpu" (pydsz.gpu.device.resolve), where the tail retrains.
    """
    from pydsz import runtime
    from pydsz.model import TFLiteModel

    data = bytes(tflite_bytes)
    model = TFLiteModel(data)
    (x, y), (x_val, y_val) = train, val
    fcs = _fc_layers(model, "no prunable FC layer")
    if len(x) < MIN_TRAIN_SAMPLES:
        raise InputError(f"training set of {len(x)} samples: too small to retrain (need >= {MIN_TRAIN_SAMPLES})")
    top1_before = runtime.accuracy(data, x_val, y_val, num_threads=num_threads)
    layers, tail_input = _trainable_tail(model, fcs[0].name)
    already = [l.name for l in layers if 1 - density(l.weight) >= ALREADY_SPARSE]
    prunable = [l.name for l in layers if l.name in {f.name for f in fcs}]
    todo = [name for name in prunable if name not in already]
    targets = sparsity_targets(prunable, sparsity)
    if isinstance(targets, dict):
        targets = {k: v for k, v in targets.items() if k not in already}
    if not todo or not targets:
        return PruneResult(data, {l.name: 1 - density(l.weight) for l in layers}, [], already,
                           top1_before, top1_before)
    runtime.accuracy(data, x[:1], y[:1], num_threads=num_threads)  # checks shape and labels up front
    h = runtime.capture(data, x, tail_input, num_threads=num_threads)
    h_val = runtime.capture(data, x_val, tail_input, num_threads=num_threads)
    y, y_val = np.asarray(y), np.asarray(y_val)
    teacher = [replace(l) for l in layers]
    auto = targets == "auto"
    if auto:
        targets, _ = auto_sparsity(layers, h, y, h_val, y_val, todo, auto_budget, seed=seed,
                                   progress=progress, teacher=teacher if distill else None, distill=distill,
                                   device=device)
    dense = layers
    while True:
        if not targets:  # auto found no sparsity within the budget: the layers stay as they came
            layers = dense
            break
        layers = retrain(dense, _masks(dense, {}), h, y, epochs=epochs, seed=seed, progress=progress,
                         targets=targets, teacher=teacher if distill else None, distill=distill, device=device)
        # the brief trials of `auto` only estimate what the full retraining keeps: check it, and
        # step the sparsest layer one rung down the ladder while the budget is exceeded
        lost = count_correct(dense, h_val, y_val, device=device) - count_correct(layers, h_val, y_val, device=device)
        if not auto or lost <= int(auto_budget * len(y_val) + 1e-6):
            break
        name = max(targets, key=targets.get)
        lower = [s for s in AUTO_LADDER if s < targets[name]]
        if lower:
            targets[name] = lower[-1]
        else:
            del targets[name]
    del h, h_val  # the new model's bytes need not sit beside the activations
    out, sparsities = _written(model, layers)
    del layers  # written into `out`: the interpreter measuring it need not sit beside them
    return PruneResult(out, sparsities, sorted(targets), already,
                       top1_before, runtime.accuracy(out, x_val, y_val, num_threads=num_threads))


def _fc_layers(model, none: str) -> list:
    """The model's FC layers that pruning may change; InputError, saying the model has `none`, where
    there are none."""
    fcs = [l for l in model.layers(("fc",)) if l.compressible and not l.shared_with]
    if not fcs:
        raise InputError(f"the model has {none} (float32 constant weights used by one layer)")
    return fcs


def _trainable_tail(model, first: str) -> tuple[list[Dense], int]:
    """The tail from FC layer `first` on as Dense layers, each training its bias where the bias's
    buffer is its own; and the tail's input tensor. The layers' weights are the model's (read-only
    views of its bytes) and retrain copies what it trains, so they take no memory of their own."""
    from pydsz.tail import Tail

    tail = Tail.from_model(model, first, strict=True)
    layers = tail_layers(tail)
    storable = _bias_buffers(model, layers)
    for l in layers:
        l.train_bias = model.layer(l.name).bias is not None and model.tensors[model.layer(l.name).bias].buffer in storable
    return layers, tail.input_tensor


def _written(model, layers: Sequence[Dense]) -> tuple[bytes, dict[str, float]]:
    """The model with the layers' weights (and their own biases) written in; each layer's sparsity."""
    biases = {buffer: l.bias for buffer, l in _bias_buffers(model, layers).items()}
    out = model.replace({**{l.name: l.weight for l in layers}, **biases})
    return out, {l.name: 1 - density(l.weight) for l in layers}


def _bias_buffers(model, layers: Sequence[Dense]) -> dict[int, Dense]:
    """The layers whose bias can be retrained, by bias buffer: those whose buffer no other tensor
    reads (the converter merges identical constants, e.g. zero biases; a shared one stays frozen)."""
    readers: dict[int, int] = {}
    for t in model.tensors:
        if t.buffer:
            readers[t.buffer] = readers.get(t.buffer, 0) + 1
    out = {}
    for l in layers:
        layer = model.layer(l.name)
        if layer.bias is not None:
            buffer = model.tensors[layer.bias].buffer
            if buffer and readers.get(buffer) == 1 and model.constant(layer.bias) is not None:
                out[buffer] = l
    return out


def retrain_masked(tflite_bytes: bytes, teacher_bytes: bytes, train: tuple[np.ndarray, np.ndarray],
                   val: tuple[np.ndarray, np.ndarray], *, epochs: float = 8, distill: float = 0.5, seed: int = 0,
                   progress: bool = False, num_threads: int | None = None, device: str = "cpu") -> PruneResult:
    """Retrain the FC tail of a model pruned elsewhere (one-shot: pydsz.oneshot), its zeros held as
    the masks, distilling from `teacher_bytes` (the unpruned model of the same graph). Where one-shot
    pruning chose the masks and compensated the weights, this starts from there rather than from
    magnitude masks on the dense weights."""
    from pydsz import runtime
    from pydsz.model import TFLiteModel
    from pydsz.tail import Tail

    model = TFLiteModel(bytes(tflite_bytes))
    first = _fc_layers(model, "no FC layer to retrain")[0].name
    (x, y), (x_val, y_val) = train, val
    layers, tail_input = _trainable_tail(model, first)
    teacher = tail_layers(Tail.from_model(TFLiteModel(bytes(teacher_bytes)), first, strict=True))
    h = runtime.capture(model.data, x, tail_input, num_threads=num_threads)
    layers = retrain(layers, _masks(layers, {}), h, np.asarray(y), epochs=epochs, seed=seed, progress=progress,
                     teacher=teacher if distill else None, distill=distill, device=device)
    out, sparsities = _written(model, layers)
    return PruneResult(out, sparsities, [], [],
                       runtime.accuracy(model.data, x_val, y_val, num_threads=num_threads),
                       runtime.accuracy(out, x_val, y_val, num_threads=num_threads), "oneshot+retrain")
