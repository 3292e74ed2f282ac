"""The FC tail's trainer: masked retraining in numpy (Adam, softmax cross-entropy, knowledge
distillation, gradual magnitude pruning, weight averaging), or on the GPU with the same loop
(pydsz.gpu.train.GpuSteps).

The layers are Dense: y = act(x @ weight.T + bias), on activations cached at the tail's input, so the
trunk before it never runs. Memory: the trained copy of the tail, the cached activations, Adam's
moments kept at the masks' kept weights only; gradients and updates are computed in slices.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from pydsz.context import Run
from pydsz.errors import InputError
from pydsz.prune import masks

# Fewer training samples than this cannot retrain anything worth keeping.
MIN_TRAIN_SAMPLES = 100


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
            block = max(1, masks.SLICE // max(1, rows.shape[1]))
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
            self.scratch = (np.empty(masks.SLICE, np.float32), np.empty(masks.SLICE, np.float32))
        c1, c2 = 1 - self.beta1**self.t, 1 - self.beta2**self.t
        for part in masks.slices(param.size):
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
            starts = list(range(0, n, max(2, masks.SLICE // p.weight.shape[1])))
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
        scratch = self.opt.scratch[0] if self.opt.scratch else np.empty(masks.SLICE, np.float32)
        for p, idx, (mean_w, mean_b) in zip(self.params, self.kept, self.means):
            w = p.weight.reshape(-1)
            for mean, value in ((mean_w, w if idx is None else w[idx]), (mean_b, p.bias)):
                for part in masks.slices(mean.size):
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


@dataclass(frozen=True)
class Retraining:
    """How the FC tail retrains: `epochs` (fractional for the brief trials of `auto`) of Adam at
    learning rate `lr`, decaying linearly to zero, on batches of `batch_size` shuffled by `seed`;
    gradual pruning over the first `ramp` of the steps; the teacher's share `distill` of the target
    (knowledge distillation; 0 trains on the labels alone); the result the mean of the weights over
    the last `average` of the steps."""

    epochs: float = 8
    lr: float = 1e-3
    batch_size: int = 128
    seed: int = 0
    ramp: float = 0.5
    distill: float = 0.5
    average: float = 0.25


def retrain(
    layers: Sequence[Dense],
    held: Mapping[str, np.ndarray],
    h: np.ndarray,
    y: np.ndarray,
    settings: Retraining = Retraining(),
    *,
    targets: Optional[Mapping[str, float]] = None,
    teacher: Optional[Sequence[Dense]] = None,
    run: Run = Run(),
) -> list[Dense]:
    """Retrain the tail on cached inputs `h` with labels `y`; the weights outside the `held` masks
    ({layer: mask of the weights kept}) stay exactly zero.

    Returns new layers (the inputs are not modified). The learning rate decays linearly to zero,
    which settles the weights and so makes the result depend less on where the last epoch stopped.
    `targets` ({layer: sparsity}) prunes gradually while training: the layer's mask tightens by
    magnitude on a cubic schedule over the first `settings.ramp` of the steps (Zhu & Gupta 2017),
    which loses far less accuracy than pruning at once and retraining afterwards.
    `teacher` (e.g. the unpruned layers) adds knowledge distillation: the target is the labels'
    one-hot mixed with the teacher's softmax, `settings.distill` being the teacher's share. The result
    is the mean of the weights over the last `settings.average` of the steps (after the masks are
    final). run.device "gpu" runs the steps on the GPU (pydsz.gpu.train.GpuSteps): the same loop and
    arithmetic, float summation order aside; run.progress shows a bar.
    """
    epochs, lr, batch_size, seed = settings.epochs, settings.lr, settings.batch_size, settings.seed
    ramp, distill, average, device = settings.ramp, settings.distill, settings.average, run.device
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
    keep = [held.get(l.name) for l in params]
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
    bar = tqdm(total=total, desc="retrain", unit="step", disable=not run.progress, leave=False)
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
                    steps.set_mask(i, masks.magnitude_mask(steps.weight(i), targets[p.name] * (1 - (1 - done) ** 3)))
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
        if n <= max(masks.SLICE, 128):  # numpy sums up to 128 values without splitting
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


def tail_layers(tail) -> list[Dense]:
    """The numpy tail (pydsz.model.tail.Tail) as trainable Dense layers; InputError if it is not a plain MLP.

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
