"""Step 2 of DeepSZ: each layer's accuracy drop over a range of error bounds, one layer at a time.

The range is found adaptively: a geometric ladder climbs (factor 2) until the drop clearly exceeds
the budget, then every ladder step where the drop crosses from zero into the budget is refined.
Accuracy is counted in samples (drop = correct before - correct after), so it is exact.

Evaluation is fast where it can be: when the layers from the first compressed one onwards form a
chain of ops the numpy tail supports, that layer's input is captured once through the interpreter
and the tail runs in numpy; otherwise every evaluation runs the interpreter on a patched model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Mapping, Optional, Sequence

import numpy as np
import zstandard

from pydsz import codec, runtime
from pydsz.errors import InputError
from pydsz.model import TFLiteModel

# The coarse ladder: FIRST_BOUND * 2**k, never beyond the layer's largest magnitude times 2
# (past that every value is reconstructed as zero and nothing changes any more).
FIRST_BOUND = 1e-4
# Refinement splits a ladder step (factor 2) into this many geometric sub-steps.
REFINE_STEPS = 4
# int8/uint8 weights: bounds in quantization steps, every one up to 4, then about x1.5 apart
STEP_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 255)
# The zstd level the container stores lossless tensors with (the `bound 0` option's size).
LOSSLESS_LEVEL = 19

KINDS = {"fc": ("fc",), "conv": ("conv",), "all": ("fc", "conv")}


@dataclass(frozen=True)
class Point:
    """One measurement: `layer` alone compressed at `bound` (0: kept lossless)."""

    layer: str
    bound: float
    size: int  # bytes the layer takes in the .dsz (its whole codec stream)
    data_bytes: int  # the paper's sizes: coded non-zero values and coded index
    index_bytes: int
    correct: int  # validation samples classified correctly
    drop: int  # baseline correct - correct = lost - gained (negative: an improvement)
    lost: int = 0  # samples right before and wrong now
    gained: int = 0  # samples wrong before and right now

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Measure:
    """A validation run against the uncompressed baseline: net drop and the flips behind it."""

    drop: int
    correct: int
    lost: int
    gained: int

    def risk(self, margin: float) -> float:
        """The drop plus `margin` standard deviations of its noise: of the flipped samples each is a
        coin toss between lost and gained, so the net count's deviation is about sqrt(flips)."""
        return self.drop + margin * float(np.sqrt(self.lost + self.gained))


def _matrix(w: np.ndarray) -> np.ndarray:
    """A weight tensor as the sparse codec stores it: [first axis, the rest]."""
    return codec.stored_array(w).reshape(w.shape[0] if w.ndim else 1, -1)


def encode_weight(w: np.ndarray, bound: float,
                  pattern: Optional[codec.SparseIndex] = None) -> tuple[np.ndarray, int, int, int]:
    """What the container does to a weight tensor: (decoded values, stream bytes, data, index bytes).

    The bound is absolute for float weights and in quantization steps for int8/uint8 ones (which
    are decoded to their integers). Bound 0 keeps it lossless (zstd, as the container stores it;
    integers: their entropy coding where smaller). A tensor that is mostly non-zero
    may go to the dense codec when that is smaller, as the container decides. pattern: the
    tensor's codec.sparse_index, when it is encoded at many bounds (the same answers, faster).
    """
    w = codec.stored_array(w)  # float16 and int8 weights are encoded as the model stores them
    if bound == 0:
        size = len(zstandard.ZstdCompressor(level=LOSSLESS_LEVEL).compress(w.tobytes()))
        if w.dtype.kind == "f":
            return _as_weight(w, w), size, size, 0
    stream = codec.encode_sparse(_matrix(w), bound, index=pattern)
    dense = codec.compress_array(w, bound) if np.count_nonzero(w) > w.size // 2 else None
    if dense is not None and len(dense) < len(stream):
        decoded, sizes = codec.decompress_array(dense), (len(dense), len(dense), 0)
    else:
        info = codec.sparse_info(stream)
        decoded, sizes = codec.decode_sparse(stream), (len(stream), int(info["data_bytes"]), int(info["index_bytes"]))
    if bound == 0 and size <= sizes[0]:  # integers: the container keeps the smaller of the two
        sizes = (size, size, 0)
    return _as_weight(decoded, w), *sizes


def _as_weight(decoded: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Decoded values as the evaluator takes them: float32 (float16 widened exactly), or the stored
    integers, which TFLiteModel.replace() writes as they are."""
    decoded = decoded.reshape(w.shape)
    return decoded.astype(np.float32, copy=False) if decoded.dtype.kind == "f" else decoded


class Evaluator:
    """Counts correct top-1 predictions on the validation set with some layers' weights replaced.

    Weights of layers the numpy tail covers (the FC chain from the first FC layer among
    `layer_names`, when the model allows one) are evaluated on the tail's cached input; any other
    layer (a conv layer, or use_tail=False) goes through the interpreter. Drops are counted
    against the same path's own baseline, so float rounding differences between the paths never
    show up as a loss.

    device "gpu" runs the tail on the GPU (pydsz.gpu.evaluate) when it holds only ops the GPU
    path runs; otherwise the tail stays in numpy and `cpu_reason` says why. `device` is what runs
    the tail.
    """

    def __init__(self, tflite_bytes: bytes, x: np.ndarray, y: np.ndarray, layer_names: Sequence[str],
                 num_threads: Optional[int] = None, use_tail: bool = True, device: str = "cpu"):
        from pydsz.tail import Tail

        self.model = TFLiteModel(tflite_bytes)
        self.bytes = bytes(tflite_bytes)
        self.x, self.y = x, np.asarray(y)
        self.num_threads = num_threads
        fcs = sorted((self.model.layer(n) for n in layer_names if self.model.layer(n).kind == "fc"),
                     key=lambda layer: layer.op_index)
        self.tail = Tail.from_model(self.model, fcs[0].name) if use_tail and fcs else None
        self.h = runtime.capture(self.bytes, x, self.tail.input_tensor, num_threads=num_threads) if self.tail else None
        self._baseline: dict[bool, np.ndarray] = {}
        self.device, self.cpu_reason, self._gpu = "cpu", None, None
        if device == "gpu":
            self._use_gpu()
        elif device != "cpu":
            raise InputError(f"device must be cpu or gpu here, not {device!r}")

    def _use_gpu(self) -> None:
        if self.tail is None:
            self.cpu_reason = "no FC tail that numpy or the GPU can run: the interpreter evaluates"
            return
        from pydsz.gpu.evaluate import TailHits

        try:
            self._gpu = TailHits(self.tail, self.h, self.y)
        except InputError as exc:  # an op the GPU path does not run: the numpy tail still does
            self.cpu_reason = str(exc)
            return
        self.device = "gpu"

    @property
    def fast(self) -> bool:
        """Whether some layers are evaluated by the numpy tail."""
        return self.tail is not None

    def _on_tail(self, weights: Mapping[str, np.ndarray]) -> bool:
        return self.tail is not None and set(weights) <= set(self.tail.layers)

    def correct(self, weights: Mapping[str, np.ndarray]) -> int:
        """Correct predictions with `weights` ({layer name: array}) in place of the model's own."""
        return int(self._hits(weights, self._on_tail(weights)).sum())

    def drop(self, weights: Mapping[str, np.ndarray]) -> Measure:
        """The drop with `weights` in place, against the same path's baseline."""
        on_tail = self._on_tail(weights)
        if on_tail not in self._baseline:
            self._baseline[on_tail] = self._hits({}, on_tail)
        base = self._baseline[on_tail]
        hits = self._hits(weights, on_tail) if weights else base
        lost, gained = int(np.sum(base & ~hits)), int(np.sum(~base & hits))
        return Measure(lost - gained, int(hits.sum()), lost, gained)

    def _hits(self, weights: Mapping[str, np.ndarray], on_tail: bool) -> np.ndarray:
        """Per sample: is the top-1 prediction right?"""
        if on_tail and self._gpu is not None:
            return self._gpu.hits(weights)
        if on_tail:
            out = self.tail.forward(self.h, weights=dict(weights))
        else:
            model = self.model.replace(dict(weights)) if weights else self.bytes
            out = runtime.predict(model, self.x, num_threads=self.num_threads)
        scores = out.reshape(len(out), -1)
        runtime.top1(scores, self.y)  # checks the labels against the outputs
        return np.argmax(scores, axis=1) == self.y


def compressible_layers(model: TFLiteModel, layers: str = "fc") -> list:
    """The compressible layers of the chosen kinds ("fc", "conv", "all"); InputError if none."""
    if layers not in KINDS:
        raise InputError(f"layers must be fc, conv or all, not {layers!r}")
    found = [layer for layer in model.layers(kinds=KINDS[layers]) if layer.compressible]
    if not found:
        skipped = [f"{l.name} ({l.skip_reason})" for l in model.layers(kinds=KINDS[layers])]
        raise InputError(f"the model has no compressible {layers} layer"
                         + (f": {', '.join(skipped)}" if skipped else ""))
    # a buffer shared by several layers is assessed once, under its first layer's name
    seen, unique = set(), []
    for layer in found:
        if layer.buffer not in seen:
            seen.add(layer.buffer)
            unique.append(layer)
    return unique


def assess_layer(
    evaluator: Evaluator,
    name: str,
    weight: np.ndarray,
    budget: int,
    on_point: Optional[Callable[[Point], None]] = None,
) -> list[Point]:
    """Measure one layer alone over an adaptive range of bounds; sorted by bound, bound 0 first.

    `budget` is the allowed drop in samples. The ladder stops once the drop exceeds max(2 * budget, budget + 10): clearly beyond,
    with margin for noise (a single point may overshoot and the next fall back).
    """
    stop = max(2 * budget, budget + 10)
    # the index section depends on where the non-zeros are, not on the bound: chosen once
    pattern = codec.sparse_index(_matrix(weight))

    def measure(bound: float) -> Point:
        decoded, size, data, index = encode_weight(weight, bound, pattern)
        m = evaluator.drop({} if bound == 0 else {name: decoded})
        point = Point(name, bound, size, data, index, m.correct, m.drop, m.lost, m.gained)
        if on_point:
            on_point(point)
        return point

    points = [measure(0.0)]
    if weight.dtype.kind in "iu":  # int8/uint8 weights: bounds in whole quantization steps
        for steps in STEP_LADDER:
            points.append(measure(float(steps)))
            if points[-1].drop > stop:
                break
        return points
    top = 2 * float(np.max(np.abs(weight))) if weight.size else FIRST_BOUND
    bound = FIRST_BOUND
    while True:
        points.append(measure(bound))
        if points[-1].drop > stop or bound >= top:
            break
        bound *= 2
    coarse = points[1:]
    for lo, hi in zip(coarse, coarse[1:]):
        # refine where the drop leaves zero and while it is still within reach of the budget
        if hi.drop > 0 and lo.drop <= budget:
            for k in range(1, REFINE_STEPS):
                points.append(measure(lo.bound * 2 ** (k / REFINE_STEPS)))
    return sorted(points, key=lambda p: p.bound)


def assess(
    evaluator: Evaluator,
    model: TFLiteModel,
    layer_names: Sequence[str],
    budget: int,
    progress: bool = False,
) -> dict[str, list[Point]]:
    """assess_layer for every named layer, with a progress bar."""
    from tqdm import tqdm

    table = {}
    with tqdm(desc="assess", unit="eval", disable=not progress, leave=False) as bar:
        for name in layer_names:
            bar.set_postfix_str(name)
            table[name] = assess_layer(evaluator, name, np.asarray(model.stored(name)), budget,
                                       on_point=lambda p: bar.update())
    return table
