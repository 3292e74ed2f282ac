"""TFLite model I/O: find the weight tensors of a .tflite file and rewrite their bytes in place.

Read-only flatbuffer parsing through the `tflite` package. Only subgraph 0 (the main graph) is
searched for layers; buffers are checked against every subgraph, so that a constant another graph
also reads is never altered behind its back. Nothing here writes flatbuffers: `replace` returns a
copy of the file with some tensors' bytes overwritten, which is all the .dsz container needs.
"""

from __future__ import annotations

import struct
from typing import Mapping, Optional, Sequence, Union

import numpy as np

from pydsz.errors import DszError, FormatError, InputError
from pydsz.model.tensors import (
    BIAS_INPUT,
    DATA_INPUT,
    DTYPES,
    INTEGER_TYPES,
    KINDS,
    STORED_TYPES,
    Layer,
    Op,
    Tensor,
    WeightBuffer,
    computed_by,
    enum_names,
    parse_options,
)

try:
    import tflite
except ImportError:  # the framework's extra; decoding a .dsz never needs it
    tflite = None

__all__ = ["TFLiteModel"]

_IDENTIFIER = b"TFL3"
_SCHEMA_VERSION = 3

















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

        op_names = enum_names(tflite.BuiltinOperator)
        types = enum_names(tflite.TensorType)
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
                sparse=tensor.Sparsity() is not None,
                scale=tuple(float(v) for v in quant.ScaleAsNumpy()) if quant is not None and quant.ScaleLength() else (),
                zero_point=(tuple(int(v) for v in quant.ZeroPointAsNumpy())
                            if quant is not None and quant.ZeroPointLength() else ()),
                axis=quant.QuantizedDimension() if quant is not None else 0))

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
                               options=parse_options(op, name)))
        self.inputs = indices(graph.InputsAsNumpy(), "graph input", -1)
        self.outputs = indices(graph.OutputsAsNumpy(), "graph output", -1)
        self._keys = self._io_keys(model)

    def _io_keys(self, model) -> dict:
        """Each graph input's and output's name for users (--model-output, .npz arrays, metrics):
        the serving signature's (Keras' input and output names) where it names them all, else the
        tensor's; input<i> / output<i> where a name is missing or repeats."""
        signature = {}
        for s in range(model.SignatureDefsLength()):
            sig = model.SignatureDefs(s)
            if sig.SubgraphIndex() == 0:
                for get, count in ((sig.Inputs, sig.InputsLength()), (sig.Outputs, sig.OutputsLength())):
                    for j in range(count):
                        signature[get(j).TensorIndex()] = (get(j).Name() or b"").decode("utf-8", "replace")
                break
        keys = {}
        for indices, prefix in ((self.inputs, "input"), (self.outputs, "output")):
            names = [signature.get(i, "") for i in indices]
            if not all(names) or len(set(names)) != len(names):
                names = [self.tensors[i].name for i in indices]
            keys.update({i: n if n and names.count(n) == 1 else f"{prefix}{k}"
                         for k, (i, n) in enumerate(zip(indices, names))})
        return keys

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

    def _stored_tensor(self, w: Tensor) -> Optional[Tensor]:
        """The constant that holds a weight's values: w itself, or the float16 constant a DEQUANTIZE
        op turns into w (weights stored as float16); None when w is computed otherwise."""
        if self._has_data(w):
            return w
        producer = next((op for op in self.ops if w.index in op.outputs), None)
        if producer is None or producer.name != "DEQUANTIZE" or not producer.inputs or producer.inputs[0] < 0:
            return None
        source = self.tensors[producer.inputs[0]]
        return source if self._has_data(source) and source.type == "FLOAT16" else None

    def _has_data(self, t: Tensor) -> bool:
        # converters may give a computed tensor an empty buffer of its own rather than buffer 0
        return t.buffer != 0 and self._buffers[t.buffer][0] >= 0 and self._buffers[t.buffer][1] > 0

    def _find_layers(self) -> list:
        counters = {"fc": 0, "conv": 0}
        layers = []
        weight_tensors = set()  # the weight inputs of the layer ops and the constants that hold them
        for op in self.ops:
            kind = KINDS.get(op.name)
            if kind is None:
                continue
            if len(op.inputs) < 2 or op.inputs[1] < 0:
                raise FormatError(f"op {op.index} ({op.name}) has no weight input")
            counters[kind] += 1
            w = self.tensors[op.inputs[1]]
            stored = self._stored_tensor(w)
            layers.append((f"{kind}{counters[kind]}", kind, op, w, stored))
            weight_tensors.add(w.index)
            if stored is not None:
                weight_tensors.add(stored.index)

        by_buffer: dict = {}
        for name, _, _, _, stored in layers:
            if stored is not None:
                by_buffer.setdefault(stored.buffer, []).append(name)

        result = []
        for name, kind, op, w, stored in layers:
            offset, nbytes = self._buffers[stored.buffer] if stored is not None else (-1, 0)
            if offset < 0:
                offset, nbytes = -1, 0
            reason = self._skip_reason(w, stored, nbytes, weight_tensors)
            b = BIAS_INPUT.get(op.name, 2)
            bias = op.inputs[b] if len(op.inputs) > b and op.inputs[b] >= 0 else None
            result.append(Layer(
                name=name, kind=kind, op=op.name, op_index=op.index, input=op.inputs[DATA_INPUT.get(op.name, 0)],
                output=op.outputs[0], weight=w.index, bias=bias,
                activation=op.options.get("activation", "NONE"), shape=w.shape, dtype=w.type,
                buffer=stored.buffer if stored is not None else 0, offset=offset, nbytes=nbytes,
                compressible=not reason, skip_reason=reason,
                shared_with=tuple(n for n in by_buffer.get(stored.buffer, ()) if n != name) if stored else (),
                stored=stored.index if stored is not None else -1,
                stored_dtype=stored.type if stored is not None else ""))
        return result

    def _skip_reason(self, w: Tensor, stored: Optional[Tensor], nbytes: int, weight_tensors: set) -> str:
        if stored is None or nbytes == 0:
            return f"weight tensor {w.index} ({w.name!r}) has no constant data: {computed_by(self.ops, w.index)}"
        if stored.type not in STORED_TYPES:
            return f"{stored.type} weights are kept lossless (float32, float16, int8 and uint8 weights are compressed)"
        if stored.type in INTEGER_TYPES:
            if not stored.quantized:
                return f"{stored.type} weights without quantization scales are kept lossless"
            if len(stored.scale) not in (1, stored.shape[stored.axis] if stored.axis < len(stored.shape) else -1) \
                    or len(stored.zero_point) not in (0, len(stored.scale)):
                return f"{stored.type} weights with {len(stored.scale)} scales for shape {stored.shape} are kept lossless"
        elif stored.quantized:
            return f"quantized {stored.type.lower()} weights are kept lossless"
        if stored.sparse:
            return "sparse-format weights are kept lossless"
        if stored.shape != w.shape:
            return f"the DEQUANTIZE op changes the weight's shape {stored.shape} to {w.shape}"
        expected = int(np.prod(w.shape, dtype=np.int64)) * stored.dtype.itemsize
        if expected != nbytes:
            raise FormatError(f"tensor {stored.index} ({stored.name!r}) of shape {stored.shape} needs {expected} "
                              f"bytes but buffer {stored.buffer} holds {nbytes}")
        for s, t in self._buffer_users[stored.buffer]:
            if s != 0 or t not in weight_tensors:
                return (f"buffer {stored.buffer} is also read by tensor {t} of subgraph {s}, which is not a "
                        "layer weight")
        for op in self.ops:
            reads = [i for i, t in enumerate(op.inputs) if t == w.index]
            if reads and (op.name not in KINDS or reads != [1]):
                return f"weight tensor {w.index} is also read by op {op.index} ({op.name}) as a non-weight input"
            if stored is not w and stored.index in op.inputs and (op.name != "DEQUANTIZE" or op.outputs[0] != w.index):
                return f"float16 weight tensor {stored.index} is also read by op {op.index} ({op.name})"
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
                             dtype=group[0].stored_dtype, offset=group[0].offset, nbytes=group[0].nbytes)
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
        """A layer's weights, read-only and shaped as the tensor: float32 for compressible layers
        (float16 weights dequantized, as the DEQUANTIZE op does; int8/uint8 ones as
        scale * (q - zero_point) of their channel), the stored values otherwise."""
        layer = self.layer(layer) if isinstance(layer, str) else layer
        values = self.stored(layer)
        if values.dtype == np.float16:
            values = values.astype(np.float32)
        elif layer.compressible and layer.stored_dtype in INTEGER_TYPES:
            scale, zero = self.quantization(layer)
            values = ((values.astype(np.float32) - zero) * scale).astype(np.float32)
        else:
            return values
        values.flags.writeable = False
        return values

    def quantization(self, layer: Union[str, Layer]) -> tuple:
        """(scale, zero point) of a layer's stored integer weights, float32 and int32 arrays shaped to
        broadcast against them (one value per channel along the quantized axis, or one in all)."""
        layer = self.layer(layer) if isinstance(layer, str) else layer
        t = self.tensors[layer.stored]
        if not t.scale:
            raise InputError(f"layer {layer.name}: its weights are not quantized")
        shape = [1] * len(t.shape)
        if len(t.scale) > 1:
            shape[t.axis] = len(t.scale)
        scale = np.array(t.scale, np.float32).reshape(shape or ())
        zero = np.array(t.zero_point or (0,) * len(t.scale), np.int32).reshape(shape or ())
        return scale, zero

    def stored(self, layer: Union[str, Layer]) -> np.ndarray:
        """A layer's weights as stored in the file (float16 where a DEQUANTIZE op reads them), read-only."""
        layer = self.layer(layer) if isinstance(layer, str) else layer
        values = self.constant(layer.stored) if layer.stored >= 0 else None
        if values is None:
            raise InputError(f"layer {layer.name}: {layer.skip_reason}")
        return values

    def replace(self, arrays: Mapping[Union[str, int], np.ndarray], head: Optional[tuple] = None) -> bytes:
        """A copy of the file with some weight buffers overwritten in place.

        Keys are layer names or buffer indices; a layer name writes its buffer, which every layer
        sharing it then reads. Each array must have the tensor's shape; it is stored little-endian
        in the stored dtype (only a same-kind cast, e.g. float32 -> float16 for weights the model
        stores as float16, rounding to nearest, is allowed). A float array for a layer whose
        weights are int8/uint8 holds real values: it is quantized with the layer's scales
        (round to nearest, clipped to the type's range), so weight() values come back exactly.
        head: (root offset, bytes) placed between the 8-byte header and the rest of the file, which
        moves up by their length (a sub-model's new root tables: pydsz.model.cut).
        """
        writes: dict = {}
        for key, array in arrays.items():
            if isinstance(key, str):
                layer = self.layer(key)
                if layer.offset < 0:
                    raise InputError(f"layer {key}: {layer.skip_reason}")
                target = (layer.buffer, layer.shape, layer.stored_dtype, layer.offset, layer.nbytes, f"layer {key}")
            else:
                target = self._buffer_target(int(key))
            buffer, shape, type_name, offset, nbytes, what = target
            array = np.asarray(array)
            if isinstance(key, str) and type_name in INTEGER_TYPES and array.dtype.kind == "f" and layer.compressible:
                scale, zero = self.quantization(layer)
                info = np.iinfo(np.dtype(DTYPES[type_name]))
                with np.errstate(invalid="ignore", divide="ignore"):
                    q = np.rint(array.astype(np.float64) / scale) + zero
                array = np.clip(np.nan_to_num(q), info.min, info.max).astype(DTYPES[type_name])
            if array.shape != tuple(shape):
                raise InputError(f"{what}: array of shape {array.shape} does not match the tensor's {tuple(shape)}")
            dtype = np.dtype(DTYPES[type_name])
            if not np.can_cast(array.dtype, dtype, casting="same_kind"):
                raise InputError(f"{what}: cannot store {array.dtype} values in a {type_name} tensor")
            # the values' bytes as views, written once into the new file: no copy of a large model's
            # weights (tobytes) nor of the file (a bytearray and then bytes) on the way
            raw = np.ascontiguousarray(array, dtype=dtype).reshape(-1).view(np.uint8)
            if raw.nbytes != nbytes:
                raise InputError(f"{what}: {raw.nbytes} bytes do not fit the tensor's {nbytes}")
            if buffer in writes and not np.array_equal(writes[buffer][1], raw):
                raise InputError(f"{what}: buffer {buffer} is given two different arrays ({writes[buffer][2]})")
            writes[buffer] = (offset, raw, what)
        from pydsz._core import BytesWriter

        root, body = head if head is not None else (None, b"")
        shift = len(body)
        writer = BytesWriter(len(self.data) + shift)
        out = np.frombuffer(writer, np.uint8)
        src = np.frombuffer(self.data, np.uint8)
        out[:8] = src[:8]
        out[8:8 + shift] = np.frombuffer(body, np.uint8)
        out[8 + shift:] = src[8:]
        if root is not None:
            out[:4] = np.frombuffer(struct.pack("<I", root), np.uint8)
        for offset, raw, _ in writes.values():
            out[shift + offset:shift + offset + len(raw)] = raw
        del out, src
        return writer.take()

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
        """[{index, name, key, shape, shape_signature, dtype}] of the graph inputs; key: the name users
        know it by (the serving signature's, else the tensor's)."""
        return [self._details(i) for i in self.inputs]

    def output_details(self) -> list:
        return [self._details(i) for i in self.outputs]

    def _details(self, index: int) -> dict:
        t = self.tensors[index]
        return {"index": index, "name": t.name, "key": self._keys.get(index, t.name), "shape": t.shape,
                "shape_signature": t.shape_signature, "dtype": t.dtype}

    def place(self, buffer: int) -> tuple:
        """(absolute file offset, size) of a buffer's bytes; (-1, 0) when it holds none."""
        return self._buffers[buffer] if 0 < buffer < len(self._buffers) else (-1, 0)

    def consumers(self, tensor_index: int) -> list:
        """The ops of subgraph 0 that read a tensor, in execution order."""
        return [op for op in self.ops if tensor_index in op.inputs]

    def __repr__(self) -> str:
        return (f"TFLiteModel({len(self.data)} bytes, {len(self.ops)} ops, "
                f"layers {[layer.name for layer in self._layers]})")
