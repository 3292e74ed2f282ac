"""TFLite model I/O: find the weight tensors of a .tflite file and rewrite their bytes in place.

Read-only flatbuffer parsing through the `tflite` package. Only subgraph 0 (the main graph) is
searched for layers; buffers are checked against every subgraph, so that a constant another graph
also reads is never altered behind its back. Nothing here writes flatbuffers: `replace` returns a
copy of the file with some tensors' bytes overwritten, which is all the .dsz container needs.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Union

import numpy as np

from .errors import DszError, FormatError, InputError

try:
    import tflite
except ImportError:  # the framework's extra; decoding a .dsz never needs it
    tflite = None

__all__ = ["Layer", "Op", "Tensor", "TFLiteModel", "WeightBuffer"]

_IDENTIFIER = b"TFL3"
_SCHEMA_VERSION = 3

KINDS = {"FULLY_CONNECTED": "fc", "CONV_2D": "conv", "DEPTHWISE_CONV_2D": "conv"}

_DTYPES = {
    "FLOAT32": "<f4", "FLOAT16": "<f2", "FLOAT64": "<f8", "INT8": "i1", "UINT8": "u1",
    "INT16": "<i2", "UINT16": "<u2", "INT32": "<i4", "UINT32": "<u4", "INT64": "<i8",
    "UINT64": "<u8", "BOOL": "?",
}

# Options tables this package reads, by op name; other ops keep an empty options dict.
_OPTION_CLASSES = {
    "FULLY_CONNECTED": "FullyConnectedOptions", "CONV_2D": "Conv2DOptions",
    "DEPTHWISE_CONV_2D": "DepthwiseConv2DOptions", "SOFTMAX": "SoftmaxOptions",
    "ADD": "AddOptions", "SUB": "SubOptions", "MUL": "MulOptions", "DIV": "DivOptions",
    "LEAKY_RELU": "LeakyReluOptions",
}
_OPTION_FIELDS = {
    "FusedActivationFunction": "activation", "KeepNumDims": "keep_num_dims",
    "WeightsFormat": "weights_format", "Beta": "beta", "Alpha": "alpha",
    # convolution geometry (pydsz.oneshot's im2col); padding stays the schema's enum: 0 SAME, 1 VALID
    "Padding": "padding", "StrideH": "stride_h", "StrideW": "stride_w",
    "DilationHFactor": "dilation_h", "DilationWFactor": "dilation_w", "DepthMultiplier": "depth_multiplier",
}


def _enum_names(enum_class) -> dict:
    return {v: k for k, v in vars(enum_class).items() if not k.startswith("_")}


@dataclass(frozen=True)
class Tensor:
    index: int
    name: str
    shape: tuple
    shape_signature: tuple  # -1 marks a dynamic dimension (the batch); equals shape when absent
    type: str  # TFLite type name: "FLOAT32", "INT8", ...
    buffer: int  # 0: no constant data
    quantized: bool
    sparse: bool

    @property
    def dtype(self) -> Optional[np.dtype]:
        code = _DTYPES.get(self.type)
        return None if code is None else np.dtype(code)


@dataclass(frozen=True)
class Op:
    index: int
    name: str  # builtin operator name ("FULLY_CONNECTED", "RELU", ...) or "CUSTOM:<code>"
    inputs: tuple  # tensor indices; -1 marks an absent optional input
    outputs: tuple
    options: dict  # activation (name), keep_num_dims, beta, alpha, ... for the ops in _OPTION_CLASSES


@dataclass(frozen=True)
class Layer:
    """One FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D op of subgraph 0 and where its weights live."""

    name: str  # fc1, fc2, ... / conv1, conv2, ... in execution order
    kind: str  # "fc" or "conv"
    op: str  # the builtin operator name
    op_index: int
    input: int  # tensor indices
    output: int
    weight: int
    bias: Optional[int]  # None when the op has no bias input
    activation: str  # fused activation: "NONE", "RELU", "RELU6", ...
    shape: tuple  # weight shape: FC [out, in], conv OHWI, depthwise [1, H, W, C*M]
    dtype: str  # TFLite type name of the weight tensor
    buffer: int  # 0 when the weight has no constant buffer
    offset: int  # absolute file offset of the weight bytes (-1 when there are none)
    nbytes: int
    compressible: bool  # float32 constant weights that only layer weights read
    skip_reason: str  # why not compressible ("" when it is)
    shared_with: tuple = ()  # names of the other layers whose weight is the same buffer

    @property
    def buffer_index(self) -> int:
        """The same as `buffer` (the name the container's table uses)."""
        return self.buffer


@dataclass(frozen=True)
class WeightBuffer:
    """A compressible buffer, listed once however many layers read it."""

    buffer: int
    layers: tuple  # names of the layers that read it, in execution order
    shape: tuple
    dtype: str
    offset: int
    nbytes: int


def _parse_options(op, name: str) -> dict:
    class_name = _OPTION_CLASSES.get(name)
    table = op.BuiltinOptions()
    if class_name is None or table is None:
        return {}
    options = getattr(tflite, class_name)()
    options.Init(table.Bytes, table.Pos)
    activations = _enum_names(tflite.ActivationFunctionType)
    parsed = {}
    for method, key in _OPTION_FIELDS.items():
        if hasattr(options, method):
            value = getattr(options, method)()
            parsed[key] = activations.get(value, str(value)) if key == "activation" else value
    return parsed


class TFLiteModel:
    """A parsed .tflite file: its tensors, ops and the layers whose weights pydsz compresses."""

    def __init__(self, data: Union[bytes, bytearray, memoryview]):
        if tflite is None:
            raise DszError("reading TFLite models needs the 'tflite' package: pip install pydsz[server]")
        self.data = bytes(data)
        if len(self.data) < 8 or self.data[4:8] != _IDENTIFIER:
            raise FormatError("not a TFLite model: missing 'TFL3' identifier")
        try:
            self._parse()
            self._layers = self._find_layers()
        except FormatError:
            raise
        except (IndexError, struct.error, ValueError, TypeError, OverflowError) as exc:
            raise FormatError(f"corrupt or truncated TFLite model ({len(self.data)} bytes): {exc}") from exc

    @classmethod
    def from_file(cls, path) -> "TFLiteModel":
        with open(path, "rb") as f:
            return cls(f.read())

    def _parse(self) -> None:
        model = tflite.Model.GetRootAsModel(self.data, 0)
        if model.Version() != _SCHEMA_VERSION:
            raise FormatError(f"unsupported TFLite schema version {model.Version()} (expected 3)")
        if model.SubgraphsLength() < 1:
            raise FormatError("TFLite model has no subgraphs")
        self._buffers = [self._buffer_extent(model.Buffers(i), i) for i in range(model.BuffersLength())]

        op_names = _enum_names(tflite.BuiltinOperator)
        types = _enum_names(tflite.TensorType)
        codes = []
        for i in range(model.OperatorCodesLength()):
            code = model.OperatorCodes(i)
            builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
            name = op_names.get(builtin, f"BUILTIN_{builtin}")
            if name == "CUSTOM":
                name = "CUSTOM:" + (code.CustomCode() or b"").decode("utf-8", "replace")
            codes.append(name)

        # every tensor of every subgraph that reads each buffer: (subgraph, tensor)
        self._buffer_users: dict = {}
        for s in range(model.SubgraphsLength()):
            graph = model.Subgraphs(s)
            for t in range(graph.TensorsLength()):
                b = graph.Tensors(t).Buffer()
                if b >= len(self._buffers):
                    raise FormatError(f"tensor {t} of subgraph {s} refers to buffer {b} of {len(self._buffers)}")
                if b:
                    self._buffer_users.setdefault(b, []).append((s, t))

        graph = model.Subgraphs(0)
        self.tensors = []
        for t in range(graph.TensorsLength()):
            tensor = graph.Tensors(t)
            shape = tuple(int(d) for d in tensor.ShapeAsNumpy()) if tensor.ShapeLength() else ()
            signature = (tuple(int(d) for d in tensor.ShapeSignatureAsNumpy())
                         if tensor.ShapeSignatureLength() else shape)
            quant = tensor.Quantization()
            self.tensors.append(Tensor(
                index=t, name=(tensor.Name() or b"").decode("utf-8", "replace"), shape=shape,
                shape_signature=signature, type=types.get(tensor.Type(), f"TYPE_{tensor.Type()}"),
                buffer=tensor.Buffer(),
                quantized=quant is not None and quant.ScaleLength() > 0,
                sparse=tensor.Sparsity() is not None))

        n_tensors = len(self.tensors)

        def indices(array, what: str, op_index: int) -> tuple:
            values = tuple(int(v) for v in array) if not isinstance(array, int) else ()
            for v in values:
                if v < -1 or v >= n_tensors:
                    raise FormatError(f"op {op_index}: {what} tensor {v} of {n_tensors}")
            return values

        self.ops = []
        for i in range(graph.OperatorsLength()):
            op = graph.Operators(i)
            if op.OpcodeIndex() >= len(codes):
                raise FormatError(f"op {i} uses operator code {op.OpcodeIndex()} of {len(codes)}")
            name = codes[op.OpcodeIndex()]
            self.ops.append(Op(index=i, name=name,
                               inputs=indices(op.InputsAsNumpy(), "input", i),
                               outputs=indices(op.OutputsAsNumpy(), "output", i),
                               options=_parse_options(op, name)))
        self.inputs = indices(graph.InputsAsNumpy(), "graph input", -1)
        self.outputs = indices(graph.OutputsAsNumpy(), "graph output", -1)

    def _buffer_extent(self, buf, index: int) -> tuple:
        """(absolute offset, size) of a buffer's bytes in the file, checked against its length."""
        if buf.Offset() > 1:  # out-of-line data (large models); 0 and 1 mean "not used"
            start, size = buf.Offset(), buf.Size()
        else:
            o = buf._tab.Offset(4)
            if o == 0:
                return (-1, 0)
            start, size = buf._tab.Vector(o), buf._tab.VectorLen(o)
        if start + size > len(self.data):
            raise FormatError(f"truncated TFLite model: buffer {index} needs bytes {start}..{start + size} "
                              f"of a {len(self.data)}-byte file")
        return (start, size)

    def _find_layers(self) -> list:
        counters = {"fc": 0, "conv": 0}
        layers = []
        weight_tensors = set()
        for op in self.ops:
            kind = KINDS.get(op.name)
            if kind is None:
                continue
            if len(op.inputs) < 2 or op.inputs[1] < 0:
                raise FormatError(f"op {op.index} ({op.name}) has no weight input")
            counters[kind] += 1
            layers.append((f"{kind}{counters[kind]}", kind, op))
            weight_tensors.add(op.inputs[1])

        by_buffer: dict = {}
        for name, _, op in layers:
            b = self.tensors[op.inputs[1]].buffer
            if b:
                by_buffer.setdefault(b, []).append(name)

        result = []
        for name, kind, op in layers:
            w = self.tensors[op.inputs[1]]
            offset, nbytes = self._buffers[w.buffer] if w.buffer else (-1, 0)
            if offset < 0:
                offset, nbytes = -1, 0
            reason = self._skip_reason(w, nbytes, weight_tensors)
            bias = op.inputs[2] if len(op.inputs) > 2 and op.inputs[2] >= 0 else None
            result.append(Layer(
                name=name, kind=kind, op=op.name, op_index=op.index, input=op.inputs[0],
                output=op.outputs[0], weight=w.index, bias=bias,
                activation=op.options.get("activation", "NONE"), shape=w.shape, dtype=w.type,
                buffer=w.buffer, offset=offset, nbytes=nbytes, compressible=not reason,
                skip_reason=reason,
                shared_with=tuple(n for n in by_buffer.get(w.buffer, ()) if n != name)))
        return result

    def _skip_reason(self, w: Tensor, nbytes: int, weight_tensors: set) -> str:
        if w.buffer == 0 or nbytes == 0:
            producer = next((op.name for op in self.ops if w.index in op.outputs), None)
            source = f"computed by a {producer} op" if producer else "not a constant"
            return f"weight tensor {w.index} ({w.name!r}) has no constant data: {source}"
        if w.type != "FLOAT32":
            return f"{w.type} weights are kept lossless (only float32 weights are compressed)"
        if w.quantized:
            return "quantized float32 weights are kept lossless"
        if w.sparse:
            return "sparse-format weights are kept lossless"
        expected = int(np.prod(w.shape, dtype=np.int64)) * 4
        if expected != nbytes:
            raise FormatError(f"tensor {w.index} ({w.name!r}) of shape {w.shape} needs {expected} bytes "
                              f"but buffer {w.buffer} holds {nbytes}")
        for s, t in self._buffer_users[w.buffer]:
            if s != 0 or t not in weight_tensors:
                return f"buffer {w.buffer} is also read by tensor {t} of subgraph {s}, which is not a layer weight"
        for op in self.ops:
            reads = [i for i, t in enumerate(op.inputs) if t == w.index]
            if reads and (op.name not in KINDS or reads != [1]):
                return f"weight tensor {w.index} is also read by op {op.index} ({op.name}) as a non-weight input"
        return ""

    def layers(self, kinds: Sequence[str] = ("fc",)) -> list:
        """The layers of the given kinds ("fc", "conv") in execution order, compressible or not."""
        unknown = set(kinds) - {"fc", "conv"}
        if unknown:
            raise InputError(f"unknown layer kind(s) {sorted(unknown)}: use 'fc' and/or 'conv'")
        return [layer for layer in self._layers if layer.kind in kinds]

    def layer(self, name: str) -> Layer:
        for layer in self._layers:
            if layer.name == name:
                return layer
        names = ", ".join(layer.name for layer in self._layers) or "none"
        raise InputError(f"model has no layer {name!r} (layers: {names})")

    def weight_buffers(self, kinds: Sequence[str] = ("fc",)) -> list:
        """The compressible weight buffers of the given layer kinds, each once (shared buffers too)."""
        groups: dict = {}
        for layer in self.layers(kinds):
            if layer.compressible:
                groups.setdefault(layer.buffer, []).append(layer)
        return [WeightBuffer(buffer=b, layers=tuple(layer.name for layer in group), shape=group[0].shape,
                             dtype=group[0].dtype, offset=group[0].offset, nbytes=group[0].nbytes)
                for b, group in groups.items()]

    def constant(self, tensor_index: int) -> Optional[np.ndarray]:
        """A constant tensor's values (read-only, shaped as the tensor), or None if it has no data."""
        t = self.tensors[tensor_index]
        offset, nbytes = self._buffers[t.buffer] if t.buffer else (-1, 0)
        if offset < 0 or nbytes == 0 or t.dtype is None:
            return None
        count = int(np.prod(t.shape, dtype=np.int64))
        if count * t.dtype.itemsize != nbytes:
            raise FormatError(f"tensor {t.index} ({t.name!r}) of shape {t.shape} and type {t.type} "
                              f"does not fit buffer {t.buffer} ({nbytes} bytes)")
        return np.frombuffer(self.data, dtype=t.dtype, count=count, offset=offset).reshape(t.shape)

    def weight(self, layer: Union[str, Layer]) -> np.ndarray:
        """A layer's weights as a read-only view, shaped as the tensor (float32 for compressible layers)."""
        layer = self.layer(layer) if isinstance(layer, str) else layer
        values = self.constant(layer.weight)
        if values is None:
            raise InputError(f"layer {layer.name}: {layer.skip_reason}")
        return values

    def replace(self, arrays: Mapping[Union[str, int], np.ndarray]) -> bytes:
        """A copy of the file with some weight buffers overwritten in place.

        Keys are layer names or buffer indices; a layer name writes its buffer, which every layer
        sharing it then reads. Each array must have the tensor's shape; it is stored little-endian
        in the tensor's dtype (only a same-kind cast, e.g. float64 -> float32, is allowed).
        """
        writes: dict = {}
        for key, array in arrays.items():
            if isinstance(key, str):
                layer = self.layer(key)
                if layer.offset < 0:
                    raise InputError(f"layer {key}: {layer.skip_reason}")
                target = (layer.buffer, layer.shape, layer.dtype, layer.offset, layer.nbytes, f"layer {key}")
            else:
                target = self._buffer_target(int(key))
            buffer, shape, type_name, offset, nbytes, what = target
            array = np.asarray(array)
            if array.shape != tuple(shape):
                raise InputError(f"{what}: array of shape {array.shape} does not match the tensor's {tuple(shape)}")
            dtype = np.dtype(_DTYPES[type_name])
            if not np.can_cast(array.dtype, dtype, casting="same_kind"):
                raise InputError(f"{what}: cannot store {array.dtype} values in a {type_name} tensor")
            raw = np.ascontiguousarray(array, dtype=dtype).tobytes()
            if len(raw) != nbytes:
                raise InputError(f"{what}: {len(raw)} bytes do not fit the tensor's {nbytes}")
            if buffer in writes and writes[buffer][1] != raw:
                raise InputError(f"{what}: buffer {buffer} is given two different arrays ({writes[buffer][2]})")
            writes[buffer] = (offset, raw, what)
        out = bytearray(self.data)
        for offset, raw, _ in writes.values():
            out[offset:offset + len(raw)] = raw
        return bytes(out)

    def _buffer_target(self, buffer: int) -> tuple:
        users = [t for s, t in self._buffer_users.get(buffer, []) if s == 0]
        offset, nbytes = self._buffers[buffer] if 0 < buffer < len(self._buffers) else (-1, 0)
        if not users or offset < 0:
            raise InputError(f"buffer {buffer} holds no constant tensor of the main graph")
        t = self.tensors[users[0]]
        if t.dtype is None:
            raise InputError(f"buffer {buffer}: tensor {t.index} has unsupported type {t.type}")
        return buffer, t.shape, t.type, offset, nbytes, f"buffer {buffer}"

    def input_details(self) -> list:
        """[{index, name, shape, shape_signature, dtype}] of the graph inputs."""
        return [self._details(i) for i in self.inputs]

    def output_details(self) -> list:
        return [self._details(i) for i in self.outputs]

    def _details(self, index: int) -> dict:
        t = self.tensors[index]
        return {"index": index, "name": t.name, "shape": t.shape, "shape_signature": t.shape_signature,
                "dtype": t.dtype}

    def consumers(self, tensor_index: int) -> list:
        """The ops of subgraph 0 that read a tensor, in execution order."""
        return [op for op in self.ops if tensor_index in op.inputs]

    def __repr__(self) -> str:
        return (f"TFLiteModel({len(self.data)} bytes, {len(self.ops)} ops, "
                f"layers {[layer.name for layer in self._layers]})")
