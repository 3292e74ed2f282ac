"""Step 2 of DeepSZ: each layer's loss in the chosen metric over a range of error bounds, one layer at a time.

The range is found adaptively: a geometric ladder climbs (factor 2) until the loss clearly exceeds
the budget, then every ladder step where the loss crosses from zero into the budget is refined.
Losses are sums over the samples of the metric's per-sample loss, compressed minus original (for
top-1, samples lost minus samples gained: whole numbers, so exact).

Evaluation is fast where it can be: when the layers from the first compressed one onwards form a
chain of ops the numpy tail supports, that layer's input is captured once through the interpreter
and the tail runs in numpy; otherwise every evaluation runs the interpreter on a patched model. The
original model's outputs are computed once.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from typing import Callable, Mapping, Optional, Sequence, Union

import numpy as np

from pydsz import cache, codec, container, metrics, runtime
from pydsz.errors import InputError
from pydsz.model import TFLiteModel
from pydsz.sparse import CSR

# The coarse ladder: FIRST_BOUND * 2**k, never beyond the layer's largest magnitude times 2
# (past that every value is reconstructed as zero and nothing changes any more).
FIRST_BOUND = 1e-4
# Refinement splits a ladder step (factor 2) into this many geometric sub-steps.
REFINE_STEPS = 4
# int8/uint8 weights: bounds in quantization steps, every one up to 4, then about x1.5 apart
STEP_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 255)
# A float layer's `bound 0` option is its bytes in the container's zstd section, sized in parts of
# this many bytes, each its own task: compressing them is the slowest single step of a large layer's
# assessment (AlexNet's fc6, 151 MB: ~45 s), which a cluster then shares out. Their sizes add up to
# the whole's to within ~0.1% (container.lossless_size).
LOSSLESS_PART = 16 << 20

KINDS = {"fc": ("fc",), "conv": ("conv",), "all": ("fc", "conv")}


@dataclass(frozen=True)
class Point:
    """One measurement: `layer` alone compressed at `bound` (0: kept lossless).

    loss and noise are summed over the samples (divide by their number for the metric's unit): for
    top-1, loss is samples lost minus samples gained and noise sqrt(lost + gained).
    """

    layer: str
    bound: float
    size: int  # bytes the layer takes in the .dsz (its whole codec stream)
    data_bytes: int  # the paper's sizes: coded non-zero values and coded index
    index_bytes: int
    loss: float  # sum over samples of the per-sample loss, compressed minus original
    noise: float = 0.0  # the standard deviation of `loss`
    lost: int = 0  # samples whose loss grew
    gained: int = 0  # samples whose loss shrank

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Measure:
    """An evaluation against the uncompressed baseline: summed loss, its noise, the samples behind it."""

    loss: float
    noise: float
    lost: int
    gained: int


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
    if bound == 0 and w.dtype.kind == "f":
        size = sum(container.lossless_size(part) for part in _lossless_parts(w))
        return _as_weight(w, w.shape), size, size, 0
    stream, dense, sizes = _encode(w, bound, pattern)
    if bound == 0 and (size := container.lossless_size(w)) <= sizes[0]:
        sizes = (size, size, 0)  # integers: the container keeps the smaller of the two
    return _as_weight(_decode(stream, dense), w.shape), *sizes


def _encode(w: np.ndarray, bound: float, pattern: Optional[codec.SparseIndex]) -> tuple[bytes, bool, tuple]:
    """encode_weight's stream of stored weights w: (its bytes, whether the dense codec's rather than
    the sparse one's, (stream, data, index bytes))."""
    stream = codec.encode_sparse(_matrix(w), bound, index=pattern)
    dense = codec.compress_array(w, bound) if np.count_nonzero(w) > w.size // 2 else None
    if dense is not None and len(dense) < len(stream):
        return dense, True, (len(dense), len(dense), 0)
    info = codec.sparse_info(stream)
    return stream, False, (len(stream), int(info["data_bytes"]), int(info["index_bytes"]))


def _decode(stream: bytes, dense: bool) -> np.ndarray:
    return codec.decompress_array(stream) if dense else codec.decode_sparse(stream)


def _lossless_parts(w: np.ndarray) -> list:
    """The tensor's bytes in LOSSLESS_PART pieces (views, no copy), at least one."""
    data = memoryview(np.ascontiguousarray(w)).cast("B")
    return [data[i:i + LOSSLESS_PART] for i in range(0, max(len(data), 1), LOSSLESS_PART)]


def _as_weight(decoded: np.ndarray, shape: tuple) -> np.ndarray:
    """Decoded values as the evaluator takes them: float32 (float16 widened exactly), or the stored
    integers, which TFLiteModel.replace() writes as they are."""
    decoded = decoded.reshape(shape)
    return decoded.astype(np.float32, copy=False) if decoded.dtype.kind == "f" else decoded


@dataclass(frozen=True)
class EvaluatorState:
    """What builds an Evaluator, to send to other processes (pydsz.executor): pickles whole."""

    tflite: bytes
    x: object
    y: object
    layer_names: tuple
    metric: object
    num_threads: Optional[int]
    use_tail: bool
    device: str
    compensator: object  # as Evaluator takes it: None or a pydsz.compensate.Compensator
    token: str = field(default_factory=lambda: uuid.uuid4().hex)  # names this state on the workers

    def build(self) -> "Evaluator":
        return Evaluator(self.tflite, self.x, self.y, self.layer_names, self.metric, self.num_threads,
                         self.use_tail, self.device, self.compensator)


class Evaluator:
    """The metric's per-sample losses on a data set with some layers' weights replaced.

    Weights of layers the numpy tail covers (the FC chain from the first FC layer among
    `layer_names`, when the model allows one) are evaluated on the tail's cached input; any other
    layer (a conv layer, or use_tail=False) goes through the interpreter. Losses are counted
    against the same path's own baseline outputs, so float rounding differences between the paths
    never show up as a loss. y: integer labels, or None where the metric needs none.

    device "gpu" runs the tail on the GPU (pydsz.gpu.evaluate) for top1 and agreement when it holds
    only ops the GPU path runs; otherwise the tail stays in numpy and `cpu_reason` says why.
    `device` is what runs the tail.

    compensator (pydsz.compensate): the candidates of the layers it holds are its compensated
    weights at each bound instead of the weights as they are: `candidate` says what a layer is
    encoded from, and both assessment and verification measure that.
    """

    def __init__(self, tflite_bytes: bytes, x, y, layer_names: Sequence[str],
                 metric: Union[str, metrics.Metric, Callable] = "top1", num_threads: Optional[int] = None,
                 use_tail: bool = True, device: str = "cpu", compensator=None):
        from pydsz.tail import Tail

        self.model = TFLiteModel(tflite_bytes)
        self.bytes = bytes(tflite_bytes)
        self.layer_names, self.use_tail = tuple(layer_names), use_tail
        # by position from here on: the interpreter knows the inputs by tensor name only
        self.x = runtime.fit_inputs(self.model.input_details(), x)
        self.y = None if y is None else np.asarray(y)
        self.metric = metrics.get(metric)
        self.num_threads = num_threads
        self.keys = [d["key"] for d in self.model.output_details()]
        self.outputs = runtime.outputs(self.bytes, self.x, self.keys, num_threads=num_threads)  # the original's, once
        self.metric.check(self.outputs, self.y)
        fcs = sorted((self.model.layer(n) for n in layer_names if self.model.layer(n).kind == "fc"),
                     key=lambda layer: layer.op_index)
        self.tail = Tail.from_model(self.model, fcs[0].name) if use_tail and fcs else None
        self.h = runtime.capture(self.bytes, self.x, self.tail.input_tensor, num_threads=num_threads) if self.tail else None
        if self.tail:
            self._tail_output = self.keys[list(self.model.outputs).index(self.tail.output_tensor)]
        self._baseline: dict[bool, tuple] = {}
        # (layer, bound) -> its stream, kept rather than the decoded weights (a layer's size each:
        # 400 MB for VGG-16's fc1), which weights_at decodes again at each call
        self._encoded: dict[tuple, tuple] = {}
        self._inputs: dict[str, np.ndarray] = {}  # activations reaching each tail layer, original weights
        self.patterns: dict[str, tuple] = {}  # layer -> (its stored weights, their codec.sparse_index)
        self.compensator = compensator
        self.device, self.cpu_reason, self._gpu = "cpu", None, None
        if device == "gpu":
            self._use_gpu()
        elif device != "cpu":
            raise InputError(f"device must be cpu or gpu here, not {device!r}")

    def state(self) -> EvaluatorState:
        """This Evaluator's making, for another process to build the same one."""
        return EvaluatorState(self.bytes, self.x, self.y, self.layer_names, self.metric, self.num_threads,
                              self.use_tail, self.device, self.compensator)

    def candidate(self, name: str, bound: float) -> np.ndarray:
        """What layer `name` is encoded from at `bound`: its stored weights, or, with compensation, its
        compensated float32 weights (on libdsz's grid, zeros kept)."""
        if self.compensator is not None and bound > 0 and name in self.compensator.layers:
            return self.compensator.weights(name, bound)
        return np.asarray(self.model.stored(name))

    def weights_at(self, bounds: Mapping[str, float]) -> dict:
        """{layer: its weights as decoded at its bound} for the layers of non-zero bound, as measure
        takes them (`decoded`: CSR where the tail multiplies the layer by its non-zeros); each
        (layer, bound) encoded once, and decoded anew for each call to what encode_weight decodes."""
        streams = {}
        for name, bound in bounds.items():
            if bound > 0:
                if (name, bound) not in self._encoded:
                    w = codec.stored_array(self.candidate(name, bound))
                    self._encoded[name, bound] = *_encode(w, bound, None)[:2], w.shape
                streams[name] = self._encoded[name, bound]
        return self.decoded(streams)

    def decoded(self, streams: Mapping[str, tuple]) -> dict:
        """{layer: (stream, dense codec's, shape)} decoded as measure takes them together: where the
        numpy tail multiplies a layer by its non-zeros, straight into CSR, never as a dense matrix
        (VGG-16's fc1 would be 392 MiB, beside the model); otherwise the decoded array."""
        sparse = self.tail.sparse if self._on_tail(streams) and self._gpu is None else ()
        return {name: CSR.from_stream(stream) if name in sparse and not dense
                else _as_weight(_decode(stream, dense), shape)
                for name, (stream, dense, shape) in streams.items()}

    @property
    def samples(self) -> int:
        return len(next(iter(self.outputs.values())))

    def _use_gpu(self) -> None:
        if self.tail is None:
            self.cpu_reason = "no FC tail that numpy or the GPU can run: the interpreter evaluates"
            return
        if not isinstance(self.metric, (metrics.Top1, metrics.Agreement)) or \
                list(self.metric.select(self.outputs)) != [self._tail_output]:
            self.cpu_reason = f"the GPU tail counts top-1 outcomes of the tail's output; metric {self.metric.spec} runs in numpy"
            return
        from pydsz.gpu.evaluate import TailHits

        # agreement is top-1 against the classes the original tail predicts
        labels = self.y if self.metric.needs_labels else np.argmax(
            self.tail.forward(self.h).reshape(len(self.h), -1), axis=1)
        try:
            self._gpu = TailHits(self.tail, self.h, labels)
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

    def measure(self, weights: Mapping[str, np.ndarray]) -> Measure:
        """The loss with `weights` ({layer name: array}) in place, against the same path's baseline."""
        on_tail = self._on_tail(weights)
        if on_tail not in self._baseline:
            base = self._outputs({}, on_tail)
            self._baseline[on_tail] = base, self._losses(base, base, {})
        base, base_losses = self._baseline[on_tail]
        losses = self._losses(self._outputs(weights, on_tail), base, weights) if weights else base_losses
        return self._measure(losses, base_losses)

    def measure_model(self, tflite_bytes: bytes) -> Measure:
        """The loss of another model of the same graph (the decoded .dsz) against the original,
        both through the interpreter: what a user would measure."""
        out = runtime.outputs(tflite_bytes, self.x, self.keys, num_threads=self.num_threads)
        base = self.metric.losses(self.outputs, self.outputs, self.y)
        return self._measure(self.metric.losses(out, self.outputs, self.y), base)

    def _measure(self, losses: np.ndarray, base: np.ndarray) -> Measure:
        d = losses - base
        return Measure(float(np.sum(d)), self.metric.noise(losses, base), int(np.sum(d > 0)), int(np.sum(d < 0)))

    def _outputs(self, weights: Mapping[str, np.ndarray], on_tail: bool) -> Optional[dict]:
        """The model's outputs with `weights` in place (None where the GPU counts outcomes itself)."""
        if on_tail and self._gpu is not None:
            return None
        if on_tail:
            # only the layers from the first changed one on are recomputed
            first = next((name for name in self.tail.layers if name in weights), self.tail.layers[0])
            if first not in self._inputs:
                self._inputs[first] = self.h if first == self.tail.layers[0] else \
                    cache.keep(self.tail.input_of(self.h, first))
            out = self.tail.forward_from(first, self._inputs[first], weights=dict(weights))
            return {**self.outputs, self._tail_output: out.reshape(self.outputs[self._tail_output].shape)}
        if not weights:
            return self.outputs
        return runtime.outputs(self.model.replace(dict(weights)), self.x, self.keys, num_threads=self.num_threads)

    def _losses(self, outputs: Optional[dict], reference: Optional[dict], weights) -> np.ndarray:
        """The metric's per-sample losses of outputs; top-1 outcomes from the GPU where outputs is None."""
        if outputs is None:
            return (~self._gpu.hits(weights)).astype(np.float64)
        return self.metric.losses(outputs, reference, self.y)


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


class Ladder:
    """The bounds one layer is measured at, decided as the measurements come in.

    Bound 0, then a geometric ladder (factor 2 from FIRST_BOUND; int8/uint8: STEP_LADDER steps)
    climbing until the loss exceeds `stop` or every value would be reconstructed as zero, then every
    ladder step where the loss leaves zero while still within the budget split into REFINE_STEPS.
    Tasks are (bound, part): a float layer's bound 0 is measured in parts (LOSSLESS_PART), any
    other bound in one, part 0. `next()` may hand out a ladder bound before the ones below it are
    measured (so that parallel executors have work); `points()` is what measuring one bound after
    the other gives, whatever else was measured and in whichever order the results came.
    """

    def __init__(self, name: str, weight: np.ndarray, budget: float, discrete: bool):
        self.name, self.budget = name, budget
        # clearly beyond the budget, with margin for noise (a point may overshoot and the next fall back)
        self.stop = max(2 * budget, budget + 10) if discrete else 2 * budget
        self.integer = weight.dtype.kind in "iu"
        if self.integer:
            self.ladder = [float(steps) for steps in STEP_LADDER]
        else:
            # the largest magnitude without np.abs's copy of the layer (392 MiB for VGG-16's fc1)
            top = 2 * max(float(weight.max()), -float(weight.min())) if weight.size else FIRST_BOUND
            self.ladder = [FIRST_BOUND]
            while self.ladder[-1] < top:
                self.ladder.append(self.ladder[-1] * 2)
        self.parts = 1 if self.integer else len(_lossless_parts(codec.stored_array(weight)))
        self.measured: dict[float, Point] = {}
        self._lossless: dict[int, Point] = {}  # bound 0's parts, until all are in
        self.issued: set[tuple[float, int]] = set()

    def _climbed(self) -> tuple[list, bool]:
        """The ladder's points as far as they are known and count; whether the climb is settled."""
        kept = []
        for bound in self.ladder:
            point = self.measured.get(bound)
            if point is None:
                return kept, False
            kept.append(point)
            if point.loss > self.stop:
                break
        return kept, True

    def _refinements(self, climbed: list) -> list:
        if self.integer:
            return []
        return [lo.bound * 2 ** (k / REFINE_STEPS) for lo, hi in zip(climbed, climbed[1:])
                if hi.loss > 0 and lo.loss <= self.budget for k in range(1, REFINE_STEPS)]

    def next(self) -> Optional[tuple[float, int]]:
        """A task, (bound, part), to measure now, or None: all handed out, or waiting for results."""
        wanted = [(0.0, part) for part in range(self.parts)]
        for bound in self.ladder:
            wanted.append((bound, 0))
            point = self.measured.get(bound)
            if point is not None and point.loss > self.stop:
                break
        climbed, settled = self._climbed()
        if settled:
            wanted += [(bound, 0) for bound in self._refinements(climbed)]
        return next((task for task in wanted if task not in self.issued), None)

    def issue(self, task: tuple[float, int]) -> None:
        self.issued.add(task)

    def add(self, task: tuple[float, int], point: Point) -> Optional[Point]:
        """The result of a task; returns the point it completes (bound 0's once all of its parts are
        in), else None."""
        bound, part = task
        if bound == 0 and self.parts > 1:
            self._lossless[part] = point
            if len(self._lossless) < self.parts:
                return None
            size = sum(p.size for p in self._lossless.values())
            point = Point(self.name, 0.0, size, size, 0, 0.0)
        self.measured[bound] = point
        return point

    @property
    def done(self) -> bool:
        climbed, settled = self._climbed()
        return settled and 0.0 in self.measured and all(b in self.measured for b in self._refinements(climbed))

    def points(self) -> list[Point]:
        """The measured points, sorted by bound, bound 0 first (once done)."""
        climbed, _ = self._climbed()
        refined = [self.measured[b] for b in self._refinements(climbed)]
        return sorted([self.measured[0.0]] + climbed + refined, key=lambda p: p.bound)


def measure_point(evaluator: Evaluator, name: str, bound: float, part: int = 0, weight: Optional[np.ndarray] = None,
                  pattern: Optional[codec.SparseIndex] = None) -> Point:
    """Layer `name` alone compressed at `bound` (an executor's task; a Ladder's (bound, part)).
    weight: what bound 0 keeps, with its codec.sparse_index as `pattern` (default: the layer's stored
    weights, whose pattern the evaluator keeps: the index section depends on where the non-zeros
    are, not on the bound); a bound > 0 encodes evaluator.candidate(name, bound). Bound 0 is the
    original, so its loss is 0 without evaluating; a float layer's is the size of one of its
    lossless parts (`part`)."""
    if weight is None:
        if name not in evaluator.patterns:
            stored = np.asarray(evaluator.model.stored(name))
            evaluator.patterns[name] = stored, codec.sparse_index(_matrix(stored))
        weight, pattern = evaluator.patterns[name]
    if bound == 0:
        stored = codec.stored_array(weight)
        if stored.dtype.kind == "f":
            size = container.lossless_size(_lossless_parts(stored)[part])
        else:
            _, size, _, _ = encode_weight(stored, 0.0, pattern)
        return Point(name, 0.0, size, size, 0, 0.0)
    w = codec.stored_array(evaluator.candidate(name, bound))
    if evaluator.compensator is not None and name in evaluator.compensator.layers:
        pattern = None  # compensated values of a dense layer may round to zero: not the stored pattern
    stream, dense, (size, data, index) = _encode(w, bound, pattern)
    m = evaluator.measure(evaluator.decoded({name: (stream, dense, w.shape)}))
    return Point(name, bound, size, data, index, m.loss, m.noise, m.lost, m.gained)


def assess_layer(
    evaluator: Evaluator,
    name: str,
    weight: np.ndarray,
    budget: float,
    on_point: Optional[Callable[[Point], None]] = None,
) -> list[Point]:
    """Measure one layer alone over its Ladder of bounds, here, one bound after the other; sorted by
    bound, bound 0 first. `budget` is the allowed loss summed over the samples (for top-1: samples)."""
    ladder = Ladder(name, weight, budget, evaluator.metric.discrete)
    pattern = codec.sparse_index(_matrix(weight))
    while (task := ladder.next()) is not None:
        ladder.issue(task)
        point = ladder.add(task, measure_point(evaluator, name, *task, weight, pattern))
        if on_point and point:
            on_point(point)
    return ladder.points()


def assess(evaluator: Evaluator, layer_names: Sequence[str], budget: float, progress: bool = False,
           executor=None, on_point: Optional[Callable[[Point], None]] = None) -> dict[str, list[Point]]:
    """Every named layer over its Ladder of bounds, each (layer, bound) an evaluation on `executor`
    (pydsz.executor; default: this process), with a progress bar. The points are the same on any
    executor; a parallel one measures some bounds early, a few of which are then not needed.
    on_point sees every measured point, as it comes."""
    from tqdm import tqdm

    from pydsz.executor import Local

    executor = executor or Local()
    executor.start(evaluator)
    ladders = {name: Ladder(name, np.asarray(evaluator.model.stored(name)), budget, evaluator.metric.discrete)
               for name in layer_names}
    with tqdm(total=len(ladders), desc="assess", unit="layer", disable=not progress, leave=False) as bar:
        def task():
            # layer by layer, so that a worker keeps evaluating the layer whose inputs it has cached
            for ladder in ladders.values():
                task = ladder.next()
                if task is not None:
                    ladder.issue(task)
                    return (ladder.name, *task)
            return None

        def done(args, point):
            name, bound, part = args
            ladder = ladders[name]
            point = ladder.add((bound, part), point)
            if on_point and point:
                on_point(point)
            if ladder.done:
                bar.set_postfix_str(f"{ladder.name}: {len(ladder.measured)} evaluations")
                bar.update()

        executor.stream(measure_point, task, done)
    return {name: ladder.points() for name, ladder in ladders.items()}
