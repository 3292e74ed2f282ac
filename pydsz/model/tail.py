"""The FC tail of a model in numpy: the chain of ops from one FC layer to the model output.

Assessment and retraining run the part of the network after the convolutional trunk many times
with different weights. Capturing the tail's input once with the interpreter
(activations.capture(model, x, tail.input_tensor)) and running the tail in numpy is far faster
than invoking the whole model each time, and agrees with the interpreter to float32 rounding.

Supported ops: FULLY_CONNECTED (float32 constant weights, default weight format, fused activation
NONE / RELU / RELU_N1_TO_1 / RELU6, as for every op here), RELU, RELU6, RELU_N1_TO_1, TANH, LOGISTIC,
LEAKY_RELU, SOFTMAX, LOG_SOFTMAX, RESHAPE / SQUEEZE / EXPAND_DIMS, and ADD / SUB / MUL / DIV with
a float32 constant operand. The chain must not branch: each intermediate tensor feeds only the
next op (a RESHAPE whose shape is computed from its input, as a dynamic Flatten's is, does not
qualify; one before the start layer does not matter). `Tail.from_model` returns None when the
tail is anything else (the caller then falls back to the interpreter); with strict=True it
raises InputError saying why.

Pruned layers are multiplied by their non-zeros (pydsz.model.sparse, libdsz's CSR kernel) when the
model's own weights are sparse enough to gain from it. That choice is made once per layer, from
the model's weights, never per call: a layer's baseline and its candidates then go through the
same kernel, and the rounding of one against the other's never shows up as a loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np

from pydsz.errors import InputError
from pydsz.model.graph import TFLiteModel
from pydsz.model.runtime import top1
from pydsz.model.sparse import CSR, matmul, pays

__all__ = ["Step", "Tail"]

# Samples per matmul: large chunks keep BLAS efficient (512-row chunks run several times slower
# than 10,000 on LeNet-300-100); this bounds one chunk's widest activation to 256 MiB.
CHUNK_VALUES = 1 << 26

# Fused activations as the float kernels apply them (they clamp; FULLY_CONNECTED refuses TANH and
# ADD/MUL ignore it, so a fused TANH is left unsupported). TANH as an op of its own is supported.
_ACTIVATIONS = {
    "NONE": None,
    "RELU": lambda v: np.maximum(v, 0, out=v),
    "RELU6": lambda v: np.clip(v, 0, 6, out=v),
    "RELU_N1_TO_1": lambda v: np.clip(v, -1, 1, out=v),
}
_OP_ACTIVATIONS = dict(_ACTIVATIONS, TANH=lambda v: np.tanh(v, out=v))
_ACTIVATION_OPS = {"RELU", "RELU6", "RELU_N1_TO_1", "TANH", "LOGISTIC", "LEAKY_RELU"}
_SHAPE_OPS = {"RESHAPE", "SQUEEZE", "EXPAND_DIMS"}
_BINARY_OPS = {"ADD", "SUB", "MUL", "DIV"}


def _sigmoid(v: np.ndarray) -> np.ndarray:
    np.negative(v, out=v)
    np.exp(v, out=v)
    v += 1
    return np.reciprocal(v, out=v)


def _softmax(v: np.ndarray, beta: float, log: bool) -> np.ndarray:
    v = v - v.max(axis=-1, keepdims=True)
    if beta != 1.0:
        v *= np.float32(beta)
    if log:
        return v - np.log(np.exp(v).sum(axis=-1, keepdims=True))
    np.exp(v, out=v)
    v /= v.sum(axis=-1, keepdims=True)
    return v


@dataclass(frozen=True)
class Step:
    """One op of the tail. kind: "fc", "activation", "softmax", "reshape" or "binary"."""

    kind: str
    op: str  # the TFLite op name
    name: str = ""  # layer name of an "fc" step
    activation: str = "NONE"  # fused activation of fc and binary steps; the function of "activation" steps
    shape: tuple = ()  # sample shape (batch axis left out) of the step's output
    constant: Optional[np.ndarray] = None  # the constant operand of a binary step
    constant_first: bool = False  # binary step computes constant <op> x (matters for SUB, DIV)
    alpha: float = 0.0  # LEAKY_RELU slope
    beta: float = 1.0  # SOFTMAX beta


class _Unsupported(Exception):
    pass


class Tail:
    """The ops from a FULLY_CONNECTED layer to the model output, run in numpy on float32 arrays.

    input_tensor: the tensor to capture (the first layer's input); input_shape: its sample shape;
    output_tensor: the model output the tail computes; layers: the FC layer names in order;
    weights / biases: float32 by layer name ([out, in] and [out]; zero biases where the model has
    none); the weights are the model's own, read-only (views of its bytes where it stores float32:
    a large model's tail then takes no memory of its own); steps: the ops in order; sparse: the layers multiplied as CSR matrices (those
    whose own weights sparse.pays for; assign another set to choose others, as a benchmark
    comparing the paths does).
    """

    def __init__(self, input_tensor: int, input_shape: tuple, output_tensor: int, steps: list,
                 weights: dict, biases: dict):
        self.input_tensor = input_tensor
        self.input_shape = tuple(input_shape)
        self.output_tensor = output_tensor
        self.steps = tuple(steps)
        self.layers = tuple(step.name for step in self.steps if step.kind == "fc")
        self.weights = weights
        self.biases = biases
        self.sparse = frozenset(name for name, w in weights.items() if pays(w))
        self._csr: dict = {}  # the model's own weights as CSR, built on first use

    @classmethod
    def from_model(cls, model: TFLiteModel, start: str, strict: bool = False) -> Optional["Tail"]:
        """The tail from FC layer `start` to the model output, or None if numpy cannot run it.

        An unknown layer name always raises InputError; strict=True also raises InputError
        (with the reason) instead of returning None.
        """
        layer = model.layer(start)
        try:
            if layer.kind != "fc":
                raise _Unsupported(f"{start} is a {layer.op} layer; the tail starts at a FULLY_CONNECTED one")
            if layer.subgraph:
                raise _Unsupported(f"{start} is in subgraph {layer.subgraph}, which only the whole model runs")
            return cls._build(model, layer)
        except _Unsupported as exc:
            if strict:
                raise InputError(f"the tail from {start} cannot run in numpy: {exc}") from None
            return None

    @classmethod
    def _build(cls, model: TFLiteModel, first) -> "Tail":
        fc_names = {layer.op_index: layer.name for layer in model.layers(("fc",)) if not layer.subgraph}
        steps, weights, biases = [], {}, {}
        current = first.input
        tensor = model.tensors[current]
        if tensor.type != "FLOAT32":
            raise _Unsupported(f"input tensor {current} is {tensor.type}, not FLOAT32")
        input_shape = tensor.shape[1:]
        op = model.ops[first.op_index]
        while True:
            if len(op.outputs) != 1:
                raise _Unsupported(f"op {op.index} ({op.name}) has {len(op.outputs)} outputs")
            out = model.tensors[op.outputs[0]]
            if out.type != "FLOAT32":
                raise _Unsupported(f"op {op.index} ({op.name}) outputs {out.type}")
            shape = out.shape[1:]
            if op.name not in _BINARY_OPS and op.inputs[0] != current:
                raise _Unsupported(f"op {op.index} ({op.name}) reads tensor {current} as a parameter")
            if op.name == "FULLY_CONNECTED":
                step = cls._fc_step(model, op, fc_names[op.index], current, shape, weights, biases)
            elif op.name in _ACTIVATION_OPS:
                step = Step("activation", op.name, activation=op.name, shape=shape,
                            alpha=float(op.options.get("alpha", 0.0)))
            elif op.name in ("SOFTMAX", "LOG_SOFTMAX"):
                step = Step("softmax", op.name, shape=shape, beta=float(op.options.get("beta", 1.0)))
            elif op.name in _SHAPE_OPS:
                if np.prod(shape) != np.prod(model.tensors[current].shape[1:]):
                    raise _Unsupported(f"op {op.index} ({op.name}) changes the batch axis")
                step = Step("reshape", op.name, shape=shape)
            elif op.name in _BINARY_OPS:
                step = cls._binary_step(model, op, current, shape)
            else:
                raise _Unsupported(f"op {op.index} ({op.name}) is not supported")
            if step.activation not in _ACTIVATIONS and step.kind != "activation":
                raise _Unsupported(f"op {op.index} ({op.name}) has fused activation {step.activation}")
            steps.append(step)
            current = out.index
            consumers = model.consumers(current)
            if current in model.outputs:
                if consumers:
                    raise _Unsupported(f"model output {current} also feeds op {consumers[0].index}")
                break
            if len(consumers) != 1:
                raise _Unsupported(f"tensor {current} feeds {len(consumers)} ops: the tail branches")
            op = consumers[0]
        return cls(first.input, input_shape, current, steps, weights, biases)

    @staticmethod
    def _fc_step(model, op, name, current, shape, weights, biases) -> Step:
        layer = model.layer(name)
        if op.options.get("weights_format", 0) != 0:
            raise _Unsupported(f"{name} uses a shuffled weight format")
        # float16 weights behind a DEQUANTIZE op: the tail reads them dequantized, as the op does
        w = model.weight(layer) if layer.compressible else model.constant(layer.weight)
        if w is None or layer.dtype != "FLOAT32" or w.ndim != 2:
            raise _Unsupported(f"{name} has no float32 constant weights ({layer.skip_reason or layer.dtype})")
        in_values = int(np.prod(model.tensors[current].shape[1:]))
        if in_values != w.shape[1] or int(np.prod(shape)) != w.shape[0]:
            raise _Unsupported(f"{name} maps {in_values} values per sample through a {w.shape} matrix")
        bias = np.zeros(w.shape[0], np.float32)
        if layer.bias is not None:
            b = model.constant(layer.bias)
            if b is None or b.dtype != np.float32 or b.size != w.shape[0]:
                raise _Unsupported(f"{name} has no float32 constant bias of {w.shape[0]} values")
            bias = np.array(b, np.float32).reshape(-1)
        weights[name] = np.asarray(w, np.float32)
        biases[name] = bias
        return Step("fc", op.name, name=name, activation=layer.activation, shape=shape)

    @staticmethod
    def _binary_step(model, op, current, shape) -> Step:
        if len(op.inputs) != 2 or current not in op.inputs or op.inputs[0] == op.inputs[1]:
            raise _Unsupported(f"op {op.index} ({op.name}) does not combine the chain with a constant")
        other = op.inputs[1] if op.inputs[0] == current else op.inputs[0]
        constant = model.constant(other)
        if constant is None or constant.dtype != np.float32:
            raise _Unsupported(f"op {op.index} ({op.name}) reads tensor {other}, which is not a float32 constant")
        batch_shape = (1,) + tuple(model.tensors[current].shape[1:])
        try:
            broadcast = np.broadcast_shapes(batch_shape, constant.shape)
        except ValueError:
            broadcast = None
        if broadcast != batch_shape:
            raise _Unsupported(f"op {op.index} ({op.name}) broadcasts the chain to a new shape")
        return Step("binary", op.name, activation=op.options.get("activation", "NONE"), shape=shape,
                    constant=np.array(constant, np.float32), constant_first=op.inputs[0] == other)

    def forward(self, h, weights: Optional[Mapping[str, np.ndarray]] = None,
                chunk: Optional[int] = None) -> np.ndarray:
        """The model output for activations h ([N, *input_shape] or [N, values]), float32.

        weights overrides some layers' matrices by name (e.g. a decompressed one; a CSR for a layer in
        `sparse`, as CSR.from_stream decodes it, spares the dense matrix); chunk bounds
        how many samples go through at once (default: as many as keep each activation <= 256 MiB).
        """
        return self._forward(h, weights, chunk, stop=None)

    def forward_from(self, layer: str, v, weights: Optional[Mapping[str, np.ndarray]] = None,
                     chunk: Optional[int] = None) -> np.ndarray:
        """The model output from v, the activations that reach FC layer `layer` (input_of's), through
        that layer and the rest: what forward gives when only `layer` and later ones change,
        without recomputing the layers before (the same chunks, so the same numbers)."""
        if layer not in self.weights:
            raise InputError(f"no layer {layer!r} in the tail (layers: {', '.join(self.layers)})")
        return self._forward(v, weights, chunk, stop=None, start=layer)

    def input_of(self, h, layer: str, weights: Optional[Mapping[str, np.ndarray]] = None,
                 chunk: Optional[int] = None) -> np.ndarray:
        """The activations that reach FC layer `layer` of the tail, for h.

        With Tail.from_model(model, layer) this lets a caller that varies only later layers
        compute the earlier ones once.
        """
        if layer not in self.weights:
            raise InputError(f"no layer {layer!r} in the tail (layers: {', '.join(self.layers)})")
        return self._forward(h, weights, chunk, stop=layer)

    def _forward(self, h, weights, chunk, stop, start=None) -> np.ndarray:
        h = np.asarray(h)
        want = int(np.prod(self.input_shape))
        shape = self.input_shape if start is None else h.shape[1:]
        takes = want if start is None else self.weights[start].shape[1]
        if h.ndim < 1 or int(np.prod(h.shape[1:])) != takes:
            raise InputError(f"h has samples of shape {h.shape[1:]} but the tail takes {shape if start is None else takes}")
        if chunk is None:
            widest = max([want] + [int(np.prod(step.shape)) for step in self.steps])
            chunk = max(1, CHUNK_VALUES // widest)
        if chunk < 1:
            raise InputError(f"chunk must be >= 1, got {chunk}")
        matrices = dict(self.weights)
        for name, w in (weights or {}).items():
            if name not in self.weights:
                raise InputError(f"no layer {name!r} in the tail (layers: {', '.join(self.layers)})")
            if isinstance(w, CSR) and name not in self.sparse:
                raise InputError(f"weights for {name}: a CSR matrix, but the tail multiplies {name} densely")
            w = w if isinstance(w, CSR) else np.asarray(w, np.float32)
            if tuple(w.shape) != self.weights[name].shape:
                raise InputError(f"weights for {name}: shape {tuple(w.shape)} instead of {self.weights[name].shape}")
            matrices[name] = w
        # a candidate's CSR is built once per call, before the chunks
        for name in self.sparse:
            if name in (weights or {}):
                if not isinstance(matrices[name], CSR):
                    matrices[name] = CSR.from_dense(matrices[name])
            else:
                if name not in self._csr:
                    self._csr[name] = CSR.from_dense(self.weights[name])
                matrices[name] = self._csr[name]
        parts = [self._run(np.asarray(h[i:i + chunk], np.float32).reshape((-1,) + shape), matrices, stop, start)
                 for i in range(0, h.shape[0], chunk)]
        if not parts:
            parts = [self._run(np.zeros((0,) + shape, np.float32), matrices, stop, start)]
        return np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]

    def _run(self, v: np.ndarray, matrices: dict, stop: Optional[str], start: Optional[str] = None) -> np.ndarray:
        n = v.shape[0]
        steps = self.steps if start is None else self.steps[next(i for i, s in enumerate(self.steps) if s.name == start):]
        for step in steps:
            if step.kind == "fc":
                if step.name == stop:
                    return np.array(v, np.float32)  # a copy: never a view of the caller's h
                w = matrices[step.name]
                if isinstance(w, CSR):
                    v = matmul(v.reshape(n, -1), w, self.biases[step.name])
                else:
                    v = v.reshape(n, -1) @ w.T
                    v += self.biases[step.name]
            elif step.kind == "activation":
                v = self._activation(step, v)
                continue
            elif step.kind == "softmax":
                v = _softmax(v, step.beta, step.op == "LOG_SOFTMAX")
            elif step.kind == "binary":
                v = self._binary(step, v)
            v = v.reshape((n,) + step.shape)
            fused = _ACTIVATIONS[step.activation]
            if fused is not None:
                v = fused(v)
        return v

    @staticmethod
    def _activation(step: Step, v: np.ndarray) -> np.ndarray:
        v = np.array(v, np.float32)  # a copy: the caller's h must not change
        if step.op == "LOGISTIC":
            return _sigmoid(v)
        if step.op == "LEAKY_RELU":
            return np.where(v >= 0, v, v * np.float32(step.alpha))
        return _OP_ACTIVATIONS[step.op](v)

    @staticmethod
    def _binary(step: Step, v: np.ndarray) -> np.ndarray:
        c = step.constant
        a, b = (c, v) if step.constant_first else (v, c)
        return {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "DIV": np.divide}[step.op](a, b)

    def accuracy(self, h, y, weights: Optional[Mapping[str, np.ndarray]] = None,
                 chunk: Optional[int] = None) -> float:
        """Top-1 accuracy of the tail's output on (h, y)."""
        y = np.asarray(y)
        if y.ndim != 1 or y.shape[0] != np.shape(h)[0]:
            raise InputError(f"y must be a vector of {np.shape(h)[0]} labels (one per row of h), got shape {y.shape}")
        return top1(self.forward(h, weights, chunk=chunk), y)

    def __repr__(self) -> str:
        return f"Tail(tensor {self.input_tensor} {self.input_shape} -> {' -> '.join(s.name or s.op for s in self.steps)})"
