"""The Evaluator: the metric's per-sample losses of a model with some layers' weights replaced.

Three paths, each counted against its own baseline (the same path with the original weights), so
that float rounding differences between them never show up as a loss:
- the numpy tail (pydsz.model.tail), for FC layers from which numpy (or the GPU) runs the rest of the model,
  on their input captured once;
- the cut (pydsz.model.cut, pydsz.model.chain): the ops from the earliest changed layer on, as a sub-model the
  interpreter runs, fed with the activations that cross the cut, computed once;
- the whole model through the interpreter, where the model cannot be cut (state, control flow) or a
  cut's baseline differs from the whole model's outputs (then the cut is not trusted).
The original model's outputs are computed once.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence, Union

import numpy as np

from pydsz.assess.memory import within
from pydsz.budget import metrics
from pydsz.context import Run
from pydsz.encode.tensor import DELTA, as_weight, decode, encode, encode_update
from pydsz.errors import InputError
from pydsz.format import codec, delta
from pydsz.model import activations, cache, cut, runtime
from pydsz.model.graph import TFLiteModel
from pydsz.model.sparse import CSR

# A cut whose baseline is the whole model's outputs bit for bit (the usual case: the same kernels on
# the same values) is counted against the whole model's; the others' baselines are kept up to this
# many bytes (BirdNET's outputs: 8 MB for 300 samples, 80 cuts would hold 600 MB), then computed again
BASELINE_BYTES = 64 << 20
# the faster paths an Evaluator may take where they apply: the numpy tail, sub-models from cuts
PATHS = ("tail", "cut")


@dataclass(frozen=True)
class Measure:
    """An evaluation against the uncompressed baseline: summed loss, its noise, the samples behind it."""

    loss: float
    noise: float
    lost: int
    gained: int


@dataclass(frozen=True)
class EvaluatorState:
    """What builds an Evaluator, to send to other processes (pydsz.assess.executor): pickles whole."""

    tflite: bytes
    x: object
    y: object
    layer_names: tuple
    metric: object
    run: Run  # its threads and device; never an executor (a cluster's client does not travel)
    compensator: object  # as Evaluator takes it: None or a pydsz.compress.compensation.Compensator
    paths: tuple = PATHS
    prediction: Optional[dict] = None  # Evaluator.predict_from's
    token: str = field(default_factory=lambda: uuid.uuid4().hex)  # names this state on the workers

    def build(self) -> "Evaluator":
        evaluator = Evaluator(self.tflite, self.x, self.y, self.layer_names, self.metric, run=self.run,
                              compensator=self.compensator, paths=self.paths)
        if self.prediction:
            evaluator.predict_from(self.prediction)
        return evaluator


class Evaluator:
    """The metric's per-sample losses on a data set with some layers' weights replaced.

    Weights of layers the numpy tail covers (the FC chain from the first FC layer among
    `layer_names` from which numpy runs the rest of the model) are evaluated on the tail's cached
    input; any other layer (a conv layer, or "tail" not among `paths`) goes through the interpreter,
    from the cut before the earliest changed layer ("cut" not among `paths`: the whole model). Losses are counted
    against the same path's own baseline outputs (see the module's docstring). y: integer labels,
    or None where the metric needs none.

    run: the interpreter's threads, and the device: "gpu" runs the tail on the GPU (pydsz.gpu.evaluate)
    for top1 and agreement when it holds only ops the GPU path runs; otherwise the tail stays in numpy
    and `cpu_reason` says why. `device` is what runs the tail.

    compensator (pydsz.compress.compensation): the candidates of the layers it holds are its compensated
    weights at each bound instead of the weights as they are: `candidate` says what a layer is
    encoded from, and both assessment and verification measure that; a cross-fitted one's (its `folds`)
    are measured, given the bounds, each half of the samples with the weights compensated on the other's.
    """

    def __init__(self, tflite_bytes: bytes, x, y, layer_names: Sequence[str],
                 metric: Union[str, metrics.Metric, Callable] = "top1", *, run: Run = Run(), compensator=None,
                 paths: Sequence[str] = PATHS):
        from pydsz.model.tail import Tail

        self.model = TFLiteModel(tflite_bytes)
        self.bytes = bytes(tflite_bytes)
        unknown = set(paths) - set(PATHS)
        if unknown:
            raise InputError(f"unknown evaluation path(s) {sorted(unknown)}: choose from {', '.join(PATHS)}")
        self.layer_names, self.paths = tuple(layer_names), tuple(paths)
        num_threads = self.num_threads = run.num_threads
        self.max_memory = run.max_memory
        # by position from here on: the interpreter knows the inputs by tensor name only
        self.x = runtime.fit_inputs(self.model.input_details(), x)
        self.y = None if y is None else np.asarray(y)
        self.metric = metrics.get(metric).knowing(self.model)
        self.keys = [d["key"] for d in self.model.output_details()]
        self.probe = runtime.probe(self.model, self.x)
        self.batch = max(1, min(runtime.DEFAULT_BATCH, runtime.BATCH_BYTES // max(1, self.probe.sample_bytes)))
        self.batch_note = None  # why every sample runs alone, where it does
        if self.probe.batch_dependence > runtime.BATCH_TOLERANCE:
            self.batch = 1
            self.batch_note = (f"the model's outputs depend on the batch (a sample's are {self.probe.batch_dependence:.2%} "
                               "apart in a batch of two and alone): every sample runs alone, as a user running it one "
                               "sample at a time gets it")
        fcs = sorted((self.model.layer(n) for n in layer_names if self.model.layer(n).kind == "fc"),
                     key=lambda layer: layer.op_index)
        tails = (Tail.from_model(self.model, layer.name) for layer in fcs) if "tail" in self.paths else ()
        self.tail = next((tail for tail in tails if tail is not None), None)
        self.memory_note = None  # how the batch and the caches were fitted within run.max_memory, where they were
        if run.max_memory is not None:
            self.memory_note = within(self, run.max_memory, compensator)
        start = time.perf_counter()
        self.outputs = runtime.outputs(self.bytes, self.x, self.keys, batch_size=self.batch,
                                       num_threads=num_threads)  # the original's, once
        self.seconds = time.perf_counter() - start  # one run of the whole model
        from pydsz.model.data import check_outputs, unexercised

        check_outputs(self.outputs)
        # where the samples never move an output (a quantized one's step: its values come dequantized)
        self.data_note = unexercised(self.outputs, {d["key"]: max(d["scale"]) for d in self.model.output_details()
                                                    if d["scale"] and d["dtype"] is not None and d["dtype"].kind in "iu"})
        self.metric.check(self.outputs, self.y)
        self.metric = self.metric.fitted(self.outputs, self.y)
        self.h = (activations.capture(self.bytes, self.x, self.tail.input_tensor, batch_size=self.batch,
                                  num_threads=num_threads) if self.tail else None)
        if self.tail:
            self._tail_output = self.keys[list(self.model.outputs).index(self.tail.output_tensor)]
        self._baseline: dict = {}  # path -> (its outputs, its per-sample losses)
        self._graph: Optional[cut.Graph] = None
        self._chain = None
        self._untrusted: dict = {}  # cut -> why the whole model runs instead
        self._exact: set = set()  # cuts whose baseline is the whole model's outputs
        # (layer, bound) -> its stream, kept rather than the decoded weights (a layer's size each:
        # 400 MB for VGG-16's fc1), which weights_at decodes again at each call
        self._encoded: dict[tuple, tuple] = {}
        self._inputs: dict[str, np.ndarray] = {}  # activations reaching each tail layer, original weights
        self.patterns: dict[str, tuple] = {}  # layer -> (its stored weights, their codec.sparse_index)
        self.compensator = compensator
        self.prediction: dict = {}  # layer -> the values its candidates are coded as a difference from
        self.device, self.cpu_reason, self._gpu = "cpu", None, None
        if run.device == "gpu":
            self._use_gpu()
        elif run.device != "cpu":
            raise InputError(f"device must be cpu or gpu here, not {run.device!r}")

    @property
    def notes(self) -> list[str]:
        """How the evaluation runs other than in the default batch, and what its data cannot show, for
        the user to read."""
        return [note for note in (self.batch_note, self.memory_note, self.data_note) if note]

    def state(self) -> EvaluatorState:
        """This Evaluator's making, for another process to build the same one."""
        return EvaluatorState(self.bytes, self.x, self.y, self.layer_names, self.metric,
                              Run(self.num_threads, self.device, max_memory=self.max_memory), self.compensator, self.paths, self.prediction or None)

    def predict_from(self, prediction: Mapping[str, np.ndarray]) -> None:
        """Code the candidates of the layers of `prediction` ({layer: float32 values of its shape}) as
        their difference from those values, which decoding adds back (a model update: the weights a
        device already holds, pydsz.compress.diff). Only float32 layers."""
        for name, values in prediction.items():
            if self.model.layer(name).stored_dtype != "FLOAT32":
                raise InputError(f"layer {name}: a difference is coded for float32 weights only")
            self.prediction[name] = np.asarray(values, np.float32).reshape(self.model.layer(name).shape)
        if self.compensator is not None:
            self.compensator.predict_from(self.prediction)
        self._encoded.clear()

    def candidate(self, name: str, bound: float) -> np.ndarray:
        """What layer `name` is encoded from at `bound` in the assessment: its stored weights, or, with
        compensation, compensated float32 weights (on libdsz's grid, zeros kept; cross-fitted, a fold's,
        whose bytes are the file's within a fraction of a percent: pipeline._encoded_model stores the whole
        data's)."""
        if self.compensator is not None and bound > 0 and name in self.compensator.layers:
            return self.compensator.sized(name, bound)
        return np.asarray(self.model.stored(name))

    def encode(self, name: str, bound: float, pattern=None) -> tuple[bytes, object, tuple]:
        """A candidate of layer `name` at `bound` as the file stores it: (stream, its codec: True for
        the dense one, False for the sparse one, DELTA for a predicted layer's difference, which a
        device adds to the values it holds in one pass; (stream, data, index bytes)). A predicted
        layer's candidate is the smaller of its difference and its values afresh (encode_update)."""
        if name in self.prediction and bound > 0:
            return encode_update(self.candidate(name, bound), self.prediction[name], bound,
                                 self.candidate_pattern(name, pattern))
        w = codec.stored_array(self.candidate(name, bound))
        return encode(w, bound, self.candidate_pattern(name, pattern))

    def candidate_pattern(self, name: str, pattern):
        """The index pattern a candidate of `name` is encoded with: the stored weights' one, but for a
        compensated layer, whose values may round to zero where the stored ones are not."""
        compensated = self.compensator is not None and name in self.compensator.layers
        return None if compensated else pattern

    def measure_at(self, bounds: Mapping[str, float]) -> Measure:
        """The loss with every layer of `bounds` at its bound (0: as it is)."""
        return self.measure(self.weights_at(bounds), bounds)

    def weights_at(self, bounds: Mapping[str, float]) -> dict:
        """{layer: its weights as decoded at its bound} for the layers of non-zero bound, as measure
        takes them (`decoded`: CSR where the tail multiplies the layer by its non-zeros); each
        (layer, bound) encoded once, and decoded anew for each call to what encode_weight decodes."""
        streams = {}
        for name, bound in bounds.items():
            if bound > 0:
                if (name, bound) not in self._encoded:
                    pattern = self.patterns[name][1] if name in self.patterns else None
                    self._encoded[name, bound] = *self.encode(name, bound, pattern)[:2], self.model.layer(name).shape
                streams[name] = self._encoded[name, bound]
        return self.decoded(streams)

    def decoded(self, streams: Mapping[str, tuple]) -> dict:
        """{layer: (stream, dense codec's, shape)} decoded as measure takes them together: where the
        numpy tail multiplies a layer by its non-zeros, straight into CSR, never as a dense matrix
        (VGG-16's fc1 would be 392 MiB, beside the model); otherwise the decoded array."""
        sparse = self.tail.sparse if self.path(streams) == "tail" and self._gpu is None else ()
        out = {}
        for name, (stream, dense, shape) in streams.items():
            if dense is DELTA:  # the values held plus the difference, by the device's own decoder
                out[name] = as_weight(delta.decode(stream, self.prediction[name]), shape)
            elif name in sparse and not dense:
                out[name] = CSR.from_stream(stream)
            else:
                out[name] = as_weight(decode(stream, dense), shape)
        return out

    def footprint(self) -> dict:
        """What evaluating holds beside the model's copies (pydsz.compress.footprint): the data, one batch's
        tensors with the kernels' largest temporary, the outputs."""
        # the probe ran two samples; the interpreter works in its tensors and its kernels' temporaries
        parts = {"data": sum(a.nbytes for a in self.x),
                 "batch_bytes": max(self.batch, 2) * max(self.probe.working_bytes, self.probe.sample_bytes),
                 "outputs": sum(np.asarray(v).nbytes for v in self.outputs.values())}
        return {**parts, **(self.compensator.footprint() if self.compensator is not None else {})}

    @property
    def samples(self) -> int:
        return len(next(iter(self.outputs.values())))

    def _use_gpu(self) -> None:
        if self.tail is None:
            self.cpu_reason = "no FC tail that numpy or the GPU can run: the interpreter evaluates"
            return
        from pydsz.assess.gpu_tail import GpuLosses

        try:
            self._gpu = GpuLosses(self.tail, self.h, self.metric, self.y, self.outputs, self._tail_output)
        except InputError as exc:  # another metric, or an op the GPU path does not run: the numpy tail still does
            self.cpu_reason = str(exc)
            return
        self.device = "gpu"

    @property
    def fast(self) -> bool:
        """Whether some layers are evaluated by the numpy tail."""
        return self.tail is not None

    def cut_of(self, name: str) -> Optional[int]:
        """The op of the main graph a candidate of layer `name` is evaluated from: its own, or the
        earliest of the layers that share its weights; None for a layer of another subgraph (or one
        sharing weights with one), which only the whole model runs as the entry point runs it."""
        layers = [self.model.layer(name)] + [self.model.layer(n) for n in self.model.layer(name).shared_with]
        if any(layer.subgraph for layer in layers):
            return None
        return min(layer.op_index for layer in layers)

    def path(self, names) -> object:
        """Where a candidate changing layers `names` is evaluated: "tail", the op of its cut, or "whole"."""
        if self.tail is not None and set(names) <= set(self.tail.layers):
            return "tail"
        if "cut" not in self.paths or not names:
            return "whole"
        if self._graph is None:
            self._graph = cut.Graph(self.model, self.probe.rows)
        if self._graph.reason is not None:
            return "whole"
        starts = [self.cut_of(n) for n in names]
        if None in starts:
            return "whole"
        start = min(starts)
        return "whole" if start in self._untrusted else start

    @property
    def cut_reason(self) -> Optional[str]:
        """Why candidates run the whole model rather than from their cut, or None."""
        if "cut" not in self.paths:
            return "cuts are turned off"
        if self._graph is not None and self._graph.reason is not None:
            return f"the model cannot be cut: {self._graph.reason}"
        if self._untrusted:
            return "; ".join(f"op {op}: {why}" for op, why in sorted(self._untrusted.items()))
        return None

    def reaches(self, name: str) -> bool:
        """Whether the data reaches layer `name` at all: its weights all zero change some output of some
        sample, bit for bit (a branch of an IF that no sample takes leaves every output as it is)."""
        path = self.path([name])
        if path == "tail" and self._gpu is not None:
            return True  # the GPU counts outcomes, not outputs; a tail layer is on the way to the output
        base, _ = self._base(path)
        out = self._outputs({name: np.zeros(self.model.layer(name).shape, np.float32)}, path)
        return any(not np.array_equal(out[k], base[k]) for k in self.keys)

    def measure(self, weights: Mapping[str, np.ndarray], bounds: Optional[Mapping[str, float]] = None) -> Measure:
        """The loss with `weights` ({layer name: array}) in place, against the same path's baseline.
        bounds: those the weights were encoded at ({layer: bound}), for a cross-fitted compensator."""
        path = self.path(weights)
        base, base_losses = self._base(path)
        if isinstance(path, int) and path in self._untrusted:
            return self.measure(weights, bounds)  # its baseline did not match the whole model's: "whole" now
        if not weights:
            return self._measure(base_losses, base_losses)
        folds = self._folds(weights, bounds or {})
        if folds is None:
            losses = self._losses(self._outputs(weights, path), base, weights)
        elif path == "tail" and self._gpu is not None:  # the GPU counts every sample: each fold keeps its own
            losses = np.empty(self.samples)
            for samples, fold in folds:
                losses[samples] = self._losses(None, None, fold)[samples]
        else:
            losses = self._losses(self._held_out(folds, path), base, weights)
        return self._measure(losses, base_losses)

    def _folds(self, weights: Mapping[str, np.ndarray], bounds: Mapping[str, float]) -> Optional[list]:
        """Per fold of a cross-fitted compensator: (the samples it measures, `weights` with the compensated
        layers' candidates fitted without those samples); None where no layer of weights is cross-fitted."""
        if self.compensator is None or not self.compensator.cross_fitted:
            return None
        fitted = [n for n in weights if bounds.get(n, 0) > 0 and n in self.compensator.layers]
        if not fitted:
            return None
        return [(samples, {**weights, **{n: as_weight(c.weights(n, bounds[n]), self.model.layer(n).shape)
                                         for n in fitted}}) for samples, c in self.compensator.folds]

    def _held_out(self, folds: list, path) -> dict:
        """The outputs of every sample, each fold's samples with that fold's weights."""
        parts = [(samples, self._outputs(weights, path, samples)) for samples, weights in folds]
        out = {}
        for key in self.keys:
            first = np.asarray(parts[0][1][key])
            out[key] = np.empty((self.samples, *first.shape[1:]), first.dtype)
            for samples, part in parts:
                out[key][samples] = part[key]
        return out

    def _base(self, path) -> tuple:
        if path in self._exact:
            path = "whole"
        if path not in self._baseline:
            base = self._outputs({}, path)
            if isinstance(path, int):
                why = cut.differs(base, self.outputs)
                if why:
                    self._untrusted[path] = why
                if all(np.array_equal(base[k], self.outputs[k]) for k in self.keys):
                    self._exact.add(path)
                    return self._base("whole")
                held = [p for p in self._baseline if isinstance(p, int)]
                nbytes = sum(a.nbytes for a in base.values())
                while held and nbytes * (len(held) + 1) > BASELINE_BYTES:
                    del self._baseline[held.pop(0)]
            self._baseline[path] = base, self._losses(base, base, {})
        return self._baseline[path]

    def measure_model(self, tflite_bytes: bytes) -> Measure:
        """The loss of another model of the same graph (the decoded .dsz) against the original,
        both through the interpreter: what a user would measure."""
        return self.measure_model_in(tflite_bytes, [self.metric])[0]

    def measure_model_in(self, model, judges: Sequence[metrics.Metric]) -> list[Measure]:
        """measure_model's loss in each metric of `judges` (this evaluator's, or others on the same samples
        and labels), from one run of the model: its .tflite bytes, or the outputs_of them a caller holds."""
        out = model if isinstance(model, dict) else self.outputs_of(model)
        return [self._measure(m.losses(out, self.outputs, self.y), m.losses(self.outputs, self.outputs, self.y), m)
                for m in (judge.knowing(self.model) for judge in judges)]

    def outputs_of(self, tflite_bytes: bytes) -> dict:
        """Another model of the same graph's outputs on these samples, through the interpreter."""
        return runtime.outputs(tflite_bytes, self.x, self.keys, batch_size=self.batch, num_threads=self.num_threads)

    def _measure(self, losses: np.ndarray, base: np.ndarray, metric: Optional[metrics.Metric] = None) -> Measure:
        d, metric = losses - base, metric or self.metric
        return Measure(float(np.sum(d)), metric.noise(losses, base), int(np.sum(d > 0)), int(np.sum(d < 0)))

    def _outputs(self, weights: Mapping[str, np.ndarray], path, samples: Optional[np.ndarray] = None) -> Optional[dict]:
        """The model's outputs with `weights` in place, of every sample or those of `samples` (None where
        the GPU counts outcomes itself: every sample)."""
        on_tail = path == "tail"
        if on_tail and self._gpu is not None and samples is None:
            return None
        if isinstance(path, int):
            return self._from_cut(path, weights, samples)
        original = self.outputs if samples is None else {k: v[samples] for k, v in self.outputs.items()}
        if on_tail:
            # only the layers from the first changed one on are recomputed
            first = next((name for name in self.tail.layers if name in weights), self.tail.layers[0])
            if first not in self._inputs:
                self._inputs[first] = self.h if first == self.tail.layers[0] else \
                    cache.keep(self.tail.input_of(self.h, first))
            h = self._inputs[first] if samples is None else self._inputs[first][samples]
            out = self.tail.forward_from(first, h, weights=dict(weights))
            return {**original, self._tail_output: out.reshape(original[self._tail_output].shape)}
        if not weights:
            return original
        x = self.x if samples is None else [a[samples] for a in self.x]
        return runtime.outputs(self.model.replace(dict(weights)), x, self.keys, batch_size=self.batch,
                               num_threads=self.num_threads)

    def _from_cut(self, start: int, weights: Mapping[str, np.ndarray], samples: Optional[np.ndarray] = None) -> dict:
        """The outputs with `weights` in place, running only the ops from the cut at op `start` on (of
        the samples of `samples`, or every one)."""
        from pydsz.model.chain import Chain

        if self._chain is None or start not in self._chain.tails:
            # every layer's cut, whatever is measured first: the chain's steps, and so the values fed
            # to each cut, are then the same in every process
            starts = {self.cut_of(n) for n in self.layer_names} - {None} | {start}
            self._chain = Chain(self.model, self._graph, self.x, sorted(starts), self.num_threads, self.batch)
        segment = self._chain.tails[start]
        feeds = self._chain.feeds(start)
        if samples is not None:
            feeds = [f[samples] for f in feeds]
        sub = cut.model_bytes(self.model, segment, dict(weights))
        keys = [str(t) for t in segment.outputs]
        out = runtime.outputs(sub, feeds, keys, batch_size=self.batch, num_threads=self.num_threads)
        return {key: out[str(t)] if str(t) in out else
                (self.outputs[key] if samples is None else self.outputs[key][samples])
                for t, key in zip(self.model.outputs, self.keys)}

    def _losses(self, outputs: Optional[dict], reference: Optional[dict], weights) -> np.ndarray:
        """The metric's per-sample losses of outputs; from the GPU's top-1 outcomes where outputs is None."""
        if outputs is None:
            return self._gpu.losses(weights, lambda rows: self._outputs(weights, "tail", rows)[self._tail_output])
        return self.metric.losses(outputs, reference, self.y)
