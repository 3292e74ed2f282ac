"""GPTQ and SparseGPT's arithmetic (Frantar & Alistarh): layers as matrices, their Hessians from
calibration inputs, and the column sweep that pushes each column's error onto the columns not yet
processed.

Per layer, H = 2XX^T of the layer's inputs on a calibration set (conv layers through im2col), damped
by 1% of its mean diagonal; the columns of the weight matrix are processed in order (or in one given:
the compensation sweeps them by decreasing H diagonal, GPTQ's act-order), and each
column's error (pruned to zero, or rounded to the codec's grid) is pushed onto the later columns
through the Cholesky factor of H^-1. No gradients and no labels. pydsz.prune.oneshot prunes with it,
pydsz.compress.compensation encodes with it.

A layer as a matrix: FC [out, in]; conv OHWI flattened to [O, KH*KW*I] (patches in (kh, kw, c)
order); depthwise [1, KH, KW, C*M] as [C*M, KH*KW], where the M outputs of input channel c share
that channel's own small H. `hessian` returns one H per such group ([G, cols, cols]).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from pydsz.errors import InputError
from pydsz.model import activations, runtime
from pydsz.model.graph import TFLiteModel
from pydsz.model.tensors import Layer

DAMP = 0.01  # share of H's mean diagonal added to it: keeps the inverse stable (SparseGPT's default)
BLOCK = 128  # columns per lazy block: updates within a block are rank-1, across blocks one matmul
PATCH_VALUES = 1 << 22  # im2col values built at once (float64: 32 MiB)
MAX_HESSIAN_BYTES = 2 << 30  # what one layer's H takes while it is inverted (hessian_bytes)
_PADDING = {0: "SAME", 1: "VALID"}  # tflite schema's Padding enum
# the codec's largest quantization index: |x / step| beyond it is stored verbatim (libdsz radius 32768)
_QMAX = 32767.0


# ---- layers as matrices ----

def _is_depthwise(layer: Layer) -> bool:
    return layer.op == "DEPTHWISE_CONV_2D"


def layer_matrix(layer: Layer, weight: np.ndarray) -> np.ndarray:
    """The layer's weights as the [rows, cols] matrix the sweep works on (a copy, float64)."""
    w = np.asarray(weight, np.float64)
    if _is_depthwise(layer):
        return np.ascontiguousarray(w.reshape(-1, w.shape[-1]).T)
    return w.reshape(w.shape[0], -1).copy()


def weight_from_matrix(layer: Layer, matrix: np.ndarray) -> np.ndarray:
    """Inverse of layer_matrix: float32, shaped as the tensor."""
    m = np.asarray(matrix, np.float32)
    return np.ascontiguousarray(m.T if _is_depthwise(layer) else m).reshape(layer.shape)


def geometry(model: TFLiteModel, layer: Layer) -> tuple:
    """(kh, kw, stride_h, stride_w, dilation_h, dilation_w, padding name) of a conv layer."""
    options = model.ops[layer.op_index].options
    _, kh, kw, _ = layer.shape
    padding = _PADDING.get(options.get("padding"))
    if padding is None:
        raise InputError(f"layer {layer.name}: unknown padding {options.get('padding')!r}")
    return (kh, kw, options.get("stride_h", 1), options.get("stride_w", 1),
            options.get("dilation_h", 1), options.get("dilation_w", 1), padding)


def _out_size(size: int, k: int, stride: int, dilation: int, padding: str) -> tuple[int, int]:
    """(output size, padding before) along one axis, as TFLite computes them."""
    span = (k - 1) * dilation + 1
    if padding == "VALID":
        return (size - span) // stride + 1, 0
    out = -(-size // stride)
    return out, max((out - 1) * stride + span - size, 0) // 2


def im2col(x: np.ndarray, kh: int, kw: int, stride_h: int = 1, stride_w: int = 1, dilation_h: int = 1,
           dilation_w: int = 1, padding: str = "VALID") -> np.ndarray:
    """Patches of NHWC inputs as [N*OH*OW, KH*KW, C] (a conv's weight OHWI flattens the same way)."""
    n, h, w, c = x.shape
    oh, top = _out_size(h, kh, stride_h, dilation_h, padding)
    ow, left = _out_size(w, kw, stride_w, dilation_w, padding)
    bottom = max((oh - 1) * stride_h + (kh - 1) * dilation_h + 1 - h - top, 0)
    right = max((ow - 1) * stride_w + (kw - 1) * dilation_w + 1 - w - left, 0)
    xp = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
    cols = [xp[:, i * dilation_h:i * dilation_h + (oh - 1) * stride_h + 1:stride_h,
               j * dilation_w:j * dilation_w + (ow - 1) * stride_w + 1:stride_w, :]
            for i in range(kh) for j in range(kw)]
    return np.stack(cols, axis=3).reshape(n * oh * ow, kh * kw, c)


def _patches(model: TFLiteModel, layer: Layer, inputs: np.ndarray):
    """The rows each output of the layer is a dot product with, in float64 pieces of at most
    PATCH_VALUES: [rows, cols] for FC and conv, [channels, rows, KH*KW] for depthwise. A conv's
    patches are built a few samples at a time in the inputs' dtype, and one sample's cut by rows
    where they are more than that (basic-pitch's conv28: 162 MiB of float32 patches a sample, which
    whole in float64, with their product, took 800 MiB)."""
    if layer.kind == "fc":
        flat = inputs.reshape(-1, layer.shape[1])
        step = max(1, PATCH_VALUES // flat.shape[1])
        for i in range(0, len(flat), step):
            yield flat[i:i + step].astype(np.float64)
        return
    kh, kw, stride_h, stride_w, dilation_h, dilation_w, padding = shape = geometry(model, layer)
    oh, _ = _out_size(inputs.shape[1], kh, stride_h, dilation_h, padding)
    ow, _ = _out_size(inputs.shape[2], kw, stride_w, dilation_w, padding)
    per_sample = oh * ow * kh * kw * inputs.shape[3]
    step = max(1, PATCH_VALUES // per_sample)
    for i in range(0, len(inputs), step):
        p = im2col(inputs[i:i + step], *shape)
        rows = max(1, PATCH_VALUES // max(1, p[:1].size))
        for j in range(0, len(p), rows):
            q = p[j:j + rows].astype(np.float64)
            yield q.transpose(2, 0, 1) if _is_depthwise(layer) else q.reshape(len(q), -1)


# ---- the Hessian ----

def factor_bytes(layer: Layer) -> int:
    """Float64 bytes of one layer's H, or of its factor (inputs x inputs per group): what is kept per
    layer once it is factored."""
    cols = layer.shape[1] * layer.shape[2] if _is_depthwise(layer) else int(np.prod(layer.shape[1:]))
    groups = layer.shape[-1] if _is_depthwise(layer) else 1
    return 8 * groups * cols * cols


def hessian_bytes(layer: Layer) -> int:
    """Float64 bytes one layer's factoring holds at once (inverse_factor, overwrite=True): H and numpy's
    inversion of it (LAPACK's copy of H, the identity it solves for, the inverse): four layer-sized
    squares (oww_timer's fc1, 3264 inputs: 4 x 81 MiB, measured); the Cholesky factor comes after,
    from the inverse alone, in three."""
    return 4 * factor_bytes(layer)


def check_memory(layers: Sequence[Layer], limit: int = MAX_HESSIAN_BYTES) -> None:
    """InputError when the largest layer's H would not fit in `limit` bytes, naming it and its need."""
    if not layers:
        return
    largest = max(layers, key=hessian_bytes)
    need = hessian_bytes(largest)
    if need > limit:
        raise InputError(f"layer {largest.name} ({largest.shape}) needs {need / 2**30:.2f} GiB for its Hessian "
                         f"(float64, inputs x inputs, four copies), more than the {limit / 2**30:.2f} GiB allowed: "
                         "leave it out (--layers) or raise the limit")


def hessian_note(tflite_bytes: bytes, names: Sequence[str]) -> str:
    """Which of the named layers needs the most memory for its Hessian, and how much."""
    model = TFLiteModel(tflite_bytes)
    largest = max((model.layer(name) for name in names), key=hessian_bytes)
    return f"the largest, {largest.name}, needs {hessian_bytes(largest) / 2**20:.1f} MiB"


class HessianSum:
    """The outer products of a layer's input rows, summed batch by batch (`add`), and their count: 2/n
    times the sum is H (`result`); sums over disjoint samples add up to the sum over them all (`absorb`)."""

    def __init__(self, model: TFLiteModel, layer: Layer):
        self.model, self.layer = model, layer
        self.h, self.rows = None, 0

    def add(self, inputs: np.ndarray) -> None:
        for p in _patches(self.model, self.layer, inputs):
            if p.ndim == 2:
                p = p[None]
            part = np.matmul(p.transpose(0, 2, 1), p)
            self.h = part if self.h is None else self.h + part
            self.rows += p.shape[1]

    def absorb(self, other: "HessianSum") -> None:
        """Add the sum over other samples (before either's `result`)."""
        if self.h is None:
            self.h = other.h.copy()
        else:
            self.h += other.h
        self.rows += other.rows

    def result(self) -> np.ndarray:
        """H, made of the sum in place: the sum is spent (it holds it no more, so that H is let go where
        its taker lets it go)."""
        h, self.h = self.h, None
        h *= 2.0 / self.rows
        return h


def hessian(model: TFLiteModel, layer: Layer, x: np.ndarray, num_threads: Optional[int] = None) -> np.ndarray:
    """2/n * sum of the outer products of the layer's input rows over the calibration set x (one
    array, or a list of one per model input), float64, accumulated batch by batch as the layer's
    input streams past (runtime.stream: no sample's input is kept, and the input need not hold one
    row per sample): [groups, cols, cols] (one group but for depthwise)."""
    return _streamed(model, layer, x, num_threads).result()


def _streamed(model: TFLiteModel, layer: Layer, x, num_threads: Optional[int]) -> HessianSum:
    total = HessianSum(model, layer)
    activations.stream(model, x, layer.input, total.add, num_threads=num_threads)
    return total


class Sequential:
    """The Hessians of layers changed one after the other in execution order (SparseGPT's sequential
    pruning), each on the inputs the layers changed before it now produce. What crosses the cut
    before each layer is carried from cut to cut (pydsz.model.chain), so the ops before a layer run once
    in all rather than once per layer (BirdNET's spectrogram front end took 8 s of every one of its
    78 layers' Hessians); a model that cannot be cut streams each layer's input from the model
    inputs. Hand it the model after each change: only layers at or after the current one may have
    changed."""

    def __init__(self, model: TFLiteModel, x, layers: Sequence[Layer], num_threads: Optional[int] = None):
        from pydsz.model import cut
        from pydsz.model.chain import Chain

        self.x = runtime.fit_inputs(model.input_details(), x, finite=False)
        self.num_threads = num_threads
        self.graph = cut.Graph(model, runtime.probe(model, self.x).rows)
        self.chain = None
        if self.graph.reason is None:
            self.chain = Chain(model, self.graph, self.x, [l.op_index for l in layers], num_threads)

    def hessian(self, model: TFLiteModel, layer: Layer) -> np.ndarray:
        return self.sums(model, layer).result()

    def sums(self, model: TFLiteModel, layer: Layer) -> HessianSum:
        """The layer's HessianSum over the inputs, before it is made H."""
        from pydsz.model import cut

        if self.chain is None:
            return _streamed(model, layer, self.x, self.num_threads)
        self.chain.model = model  # the tensors held come from ops before the cut: none has changed
        held = dict(zip(self.chain.tails[layer.op_index].inputs, self.chain.feeds(layer.op_index)))
        total = HessianSum(model, layer)
        if layer.input in held:
            values = held[layer.input]
            step = max(1, runtime.CAPTURE_BYTES // max(1, values[:1].nbytes))
            for i in range(0, len(values), step):
                total.add(np.asarray(values[i:i + step]))
        else:  # the input holds no row per sample (a reshape of frames): computed from what is held
            segment = self.graph.segment([], set(held), [layer.input])
            activations.stream(cut.model_bytes(model, segment), [held[t] for t in segment.inputs], None, total.add,
                           batch_size=self.chain.batch_size, num_threads=self.num_threads)
        return total


def inverse_factor(h: np.ndarray, damp: float, overwrite: bool = False) -> np.ndarray:
    """Upper Cholesky factor of (H + damp * mean(diag H) * I)^-1; inputs never seen (zero diagonal)
    get a unit diagonal so that H stays invertible and their columns pass nothing on. overwrite: h
    may be changed and, where the caller holds no other reference, is let go before the factor is
    made (a layer's H is as large as its factor: oww_timer's fc1, 81 MiB)."""
    if not overwrite:
        h = h.copy()
    diag = np.diagonal(h).copy()
    dead = diag == 0
    diag[dead] = 1.0
    np.fill_diagonal(h, diag + damp * float(np.mean(diag)))
    inverse = np.linalg.inv(h)
    del h
    inverse += inverse.T  # numpy reads the transposed view from a copy: (H^-1 + H^-T) / 2 as before
    inverse /= 2
    return np.linalg.cholesky(inverse).T


# ---- the sweep ----

def grid(values: np.ndarray, bound: float) -> np.ndarray:
    """libdsz's reconstruction of non-zero values quantized with no predictor at absolute `bound`
    (quantize.c, keepNonzero): q = round_half_up(x / 2eb), a non-zero value never becomes zero,
    r = float32(q * 2eb) computed in double; values beyond the codec's range stay as they are."""
    x = np.asarray(values, np.float64)
    step = 2.0 * bound
    d = x * (1.0 / step)  # as quantize.c: multiplied by the stored inverse
    q = np.floor(d + 0.5)
    q = np.where((q == 0) & (x != 0), np.sign(x), q)
    r = (q * step).astype(np.float32).astype(np.float64)
    return np.where(np.abs(d) < _QMAX, r, x.astype(np.float32).astype(np.float64))


def _block_mask(w: np.ndarray, d: np.ndarray, sparsity: float) -> np.ndarray:
    """SparseGPT's choice within a block: prune the lowest w^2 / [H^-1]_ii^2 (True = pruned)."""
    saliency = (w / d) ** 2
    count = int(round(sparsity * saliency.size))
    mask = np.zeros(saliency.shape, bool)
    if count:
        mask.ravel()[np.argpartition(saliency.ravel(), count - 1)[:count]] = True
    return mask


def sweep(w: np.ndarray, factor: np.ndarray, *, sparsity: float = 0.0, nm: Optional[tuple[int, int]] = None,
          pruned: Optional[np.ndarray] = None, quantize: Optional[Callable] = None,
          block: int = BLOCK) -> np.ndarray:
    """The compensated weights of matrix w [rows, cols] given the Cholesky factor of H^-1.

    Prunes `sparsity` of each block of columns (unstructured) or n of every m columns of each row
    (nm=(n, m); a trailing group of fewer than m columns stays dense), or keeps the positions given
    by `pruned` (True = zero) at zero; `quantize` maps the surviving values to what will be stored.
    """
    w = np.array(w, np.float64)
    cols = w.shape[1]
    d_all = np.diagonal(factor)
    if nm is not None:
        block -= block % nm[1]  # an n:m group never straddles two blocks
    for i1 in range(0, cols, block):
        i2 = min(i1 + block, cols)
        w1, f1 = w[:, i1:i2], factor[i1:i2, i1:i2]
        err = np.zeros_like(w1)
        if pruned is not None:
            mask = pruned[:, i1:i2].copy()
        elif nm is None and sparsity > 0:
            mask = _block_mask(w1, d_all[i1:i2], sparsity)
        else:
            mask = np.zeros(w1.shape, bool)
        for i in range(i2 - i1):
            if nm is not None and i % nm[1] == 0 and i1 + i + nm[1] <= cols:
                # chosen on the values compensated so far, as SparseGPT does
                saliency = (w1[:, i:i + nm[1]] / d_all[i1 + i:i1 + i + nm[1]]) ** 2
                chosen = np.argpartition(saliency, nm[0] - 1, axis=1)[:, :nm[0]]
                np.put_along_axis(mask[:, i:i + nm[1]], chosen, True, axis=1)
            q = np.where(mask[:, i], 0.0, w1[:, i])
            if quantize is not None:
                keep = ~mask[:, i]
                q[keep] = quantize(q[keep])
            e = (w1[:, i] - q) / f1[i, i]
            w1[:, i:] -= np.outer(e, f1[i, i:])
            w1[:, i] = q
            err[:, i] = e
        w[:, i2:] -= err @ factor[i1:i2, i2:]
    return w


def compensate(w: np.ndarray, h: np.ndarray, bound: float, pruned: Optional[np.ndarray] = None,
               damp: float = DAMP) -> np.ndarray:
    """GPTQ with libdsz's grid: w [rows, cols] quantized column by column at absolute `bound`, each
    column's rounding error pushed onto the later columns through H [cols, cols]; positions where
    `pruned` (default: w == 0) stay zero. float32: the values to encode, each on the codec's grid."""
    w = np.asarray(w, np.float64)
    pruned = w == 0 if pruned is None else np.asarray(pruned, bool)
    factor = inverse_factor(np.asarray(h, np.float64), damp)
    return sweep(w, factor, pruned=pruned, quantize=lambda v: grid(v, bound)).astype(np.float32)


def solve(layer: Layer, weight: np.ndarray, factors: Sequence[np.ndarray], orders: Optional[Sequence] = None,
          **options) -> np.ndarray:
    """sweep() over each row group of the layer with its own factor; the new weight tensor. orders: per
    group, the order its columns are swept in (the factor is then that of H permuted the same way)."""
    m = layer_matrix(layer, weight)
    per = m.shape[0] // len(factors)
    pruned = options.pop("pruned", None)
    for g, factor in enumerate(factors):
        rows = slice(g * per, (g + 1) * per)
        order = slice(None) if orders is None else orders[g]
        m[rows, order] = sweep(m[rows][:, order], factor,
                               pruned=None if pruned is None else pruned[rows][:, order], **options)
    return weight_from_matrix(layer, m)


def selectable(model: TFLiteModel, kinds: Sequence[str]) -> list[Layer]:
    """The layers of `kinds` of the main graph whose float32 weights one layer alone reads, in execution
    order: those the sweep can change (their inputs are captured where the entry point computes them)."""
    return [layer for layer in model.layers(kinds) if not layer.subgraph
            and layer.compressible and layer.stored_dtype == "FLOAT32" and not layer.shared_with]


def rank_deficient(model: TFLiteModel, layers: Sequence[Layer], samples: int) -> list[tuple[Layer, int, int]]:
    """(layer, rows, inputs) of each layer whose H `samples` calibration inputs leave singular: fewer
    input rows (samples x the layer's output positions) than the layer has inputs. Damping keeps H
    invertible, but along the directions no sample spans it is the damping alone, so the
    compensation fits those samples and is blind elsewhere."""
    found = []
    for layer in layers:
        out = model.tensors[layer.output].shape
        rows = samples * int(np.prod(out[:-1], dtype=np.int64))
        cols = layer.shape[1] * layer.shape[2] if _is_depthwise(layer) else int(np.prod(layer.shape[1:]))
        if rows < cols:
            found.append((layer, rows, cols))
    return found


def rank_warnings(model: TFLiteModel, layers: Sequence[Layer], samples: int) -> list[str]:
    """One line per rank-deficient layer (rank_deficient)."""
    return [f"layer {layer.name}: {samples} calibration samples give its Hessian rank {rows} at most, "
            f"of {cols} inputs: damping keeps it invertible, but the compensation fits these samples "
            f"only; give at least {-(-cols * samples // rows)} samples"
            for layer, rows, cols in rank_deficient(model, layers, samples)]
