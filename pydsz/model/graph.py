"""TFLite model I/O: find the weight tensors of a .tflite file and rewrite their bytes in place.

Read-only flatbuffer parsing through the `tflite` package, of every subgraph (pydsz.model.layers
finds the layers in each, and where their weights are held; `tensors`, `ops`, `inputs` and `outputs`
are the main graph's, which the interpreter's entry point runs). Nothing here writes flatbuffers: `replace` returns a
copy of the file with some tensors' bytes overwritten, which is all the .dsz container needs.
"""

from __future__ import annotations

import struct
from typing import Mapping, Optional, Sequence, Union

import numpy as np

from pydsz.errors import DszError, FormatError, InputError
from pydsz.model.layers import find as find_layers
from pydsz.model.tensors import DTYPES, INTEGER_TYPES, Graph, Layer, Op, Tensor, WeightBuffer, enum_names, parse_options

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
            self._layers = find_layers(self)
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

        self.graphs = [self._parse_graph(model.Subgraphs(k), k, codes, types) for k in range(model.SubgraphsLength())]
        main = self.graphs[0]
        self.tensors, self.ops, self.inputs, self.outputs = main.tensors, main.ops, main.inputs, main.outputs
        self._keys = self._io_keys(model)

    def _parse_graph(self, graph, k: int, codes: list, types: dict) -> Graph:
        tensors = []
        for t in range(graph.TensorsLength()):
            tensor = graph.Tensors(t)
            shape = tuple(int(d) for d in tensor.ShapeAsNumpy()) if tensor.ShapeLength() else ()
            signature = (tuple(int(d) for d in tensor.ShapeSignatureAsNumpy())
                         if tensor.ShapeSignatureLength() else shape)
            quant = tensor.Quantization()
            tensors.append(Tensor(
                index=t, name=(tensor.Name() or b"").decode("utf-8", "replace"), shape=shape,
                shape_signature=signature, type=types.get(tensor.Type(), f"TYPE_{tensor.Type()}"),
                buffer=tensor.Buffer(),
                quantized=quant is not None and quant.ScaleLength() > 0,
                sparse=tensor.Sparsity() is not None,
                scale=tuple(float(v) for v in quant.ScaleAsNumpy()) if quant is not None and quant.ScaleLength() else (),
                zero_point=(tuple(int(v) for v in quant.ZeroPointAsNumpy())
                            if quant is not None and quant.ZeroPointLength() else ()),
                axis=quant.QuantizedDimension() if quant is not None else 0))
        where = f" of subgraph {k}" if k else ""

        def indices(array, what: str, op_index: int) -> tuple:
            values = tuple(int(v) for v in array) if not isinstance(array, int) else ()
            for v in values:
                if v < -1 or v >= len(tensors):
                    raise FormatError(f"op {op_index}{where}: {what} tensor {v} of {len(tensors)}")
            return values

        ops = []
        for i in range(graph.OperatorsLength()):
            op = graph.Operators(i)
            if op.OpcodeIndex() >= len(codes):
                raise FormatError(f"op {i}{where} uses operator code {op.OpcodeIndex()} of {len(codes)}")
            name = codes[op.OpcodeIndex()]
            ops.append(Op(index=i, name=name, inputs=indices(op.InputsAsNumpy(), "input", i),
                          outputs=indices(op.OutputsAsNumpy(), "output", i), options=parse_options(op, name)))
        return Graph(index=k, name=(graph.Name() or b"").decode("utf-8", "replace"), tensors=tensors, ops=ops,
                     inputs=indices(graph.InputsAsNumpy(), "graph input", -1),
                     outputs=indices(graph.OutputsAsNumpy(), "graph output", -1))

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

    def has_data(self, t: Tensor) -> bool:
        """Whether a tensor is a constant: a buffer with bytes (converters may give a computed tensor an
        empty buffer of its own rather than buffer 0)."""
        return t.buffer != 0 and self._buffers[t.buffer][0] >= 0 and self._buffers[t.buffer][1] > 0

    def buffer_users(self, buffer: int) -> list:
        """(subgraph, tensor) of every tensor that reads a buffer."""
        return self._buffer_users.get(buffer, [])

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

    def constant(self, tensor_index: int, subgraph: int = 0) -> Optional[np.ndarray]:
        """A constant tensor's values (read-only, shaped as the tensor), or None if it has no data."""
        t = self.graphs[subgraph].tensors[tensor_index]
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
        t = self.graphs[layer.stored_subgraph].tensors[layer.stored]
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
        values = self.constant(layer.stored, layer.stored_subgraph) if layer.stored >= 0 else None
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
        users = self._buffer_users.get(buffer, [])
        offset, nbytes = self._buffers[buffer] if 0 < buffer < len(self._buffers) else (-1, 0)
        if not users or offset < 0:
            raise InputError(f"buffer {buffer} holds no constant tensor")
        t = self.graphs[users[0][0]].tensors[users[0][1]]
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
                "shape_signature": t.shape_signature, "dtype": t.dtype, "scale": t.scale}

    def place(self, buffer: int) -> tuple:
        """(absolute file offset, size) of a buffer's bytes; (-1, 0) when it holds none."""
        return self._buffers[buffer] if 0 < buffer < len(self._buffers) else (-1, 0)

    def consumers(self, tensor_index: int) -> list:
        """The ops of subgraph 0 that read a tensor, in execution order."""
        return [op for op in self.ops if tensor_index in op.inputs]

    def __repr__(self) -> str:
        return (f"TFLiteModel({len(self.data)} bytes, {len(self.ops)} ops, "
                f"layers {[layer.name for layer in self._layers]})")
