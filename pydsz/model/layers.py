"""Which ops of a model are layers, in every subgraph, and which constant holds each one's weights.

A layer is a FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D / TRANSPOSE_CONV op of any subgraph: the
main graph's are named fc1, fc2, ... and conv1, ... in execution order, those of subgraph k (a branch
of IF, a body of WHILE, CALL_ONCE's init) sg<k>.fc1, sg<k>.conv1, ... Its weights are held by a
constant: the weight tensor itself, the float16 constant a DEQUANTIZE op widens into it, or, for a
weight that is an input of its subgraph, the operand that every op running the subgraph passes for
it (openWakeWord's wake-word models hand a second FC network's weights from the main graph to the
branch of an IF). A layer is compressible when that constant is float32, float16, int8 or uint8 and
nothing but layer weights reads it, in any subgraph (a constant also read as data would change that
data).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from pydsz.errors import FormatError
from pydsz.model.tensors import BIAS_INPUT, CALLS, DATA_INPUT, INTEGER_TYPES, KINDS, STORED_TYPES, Layer, computed_by

# how many subgraph boundaries a weight is followed across to its constant
MAX_DEPTH = 8


def find(model) -> list[Layer]:
    """Every layer of `model` (a pydsz.model.graph.TFLiteModel being parsed: its graphs and buffers)."""
    found = []
    refs = set()  # (subgraph, tensor) of every weight, its constant, and the tensors between them
    for graph in model.graphs:
        counters = {"fc": 0, "conv": 0}
        prefix = f"sg{graph.index}." if graph.index else ""
        for op in graph.ops:
            kind = KINDS.get(op.name)
            if kind is None:
                continue
            if len(op.inputs) < 2 or op.inputs[1] < 0:
                raise FormatError(f"op {op.index} ({op.name}) of subgraph {graph.index} has no weight input")
            counters[kind] += 1
            path = [(graph.index, op.inputs[1])]
            stored = _constant(model, graph.index, op.inputs[1], path)
            found.append((f"{prefix}{kind}{counters[kind]}", kind, graph, op, stored, path))
            refs.update(path)

    by_buffer: dict = {}
    for name, _, _, _, stored, _ in found:
        if stored is not None:
            by_buffer.setdefault(_tensor(model, stored).buffer, []).append(name)

    result = []
    for name, kind, graph, op, stored, path in found:
        w = graph.tensors[op.inputs[1]]
        st = _tensor(model, stored) if stored is not None else None
        offset, nbytes = model.place(st.buffer) if st is not None else (-1, 0)
        reason = _skip_reason(model, graph.index, w, st, nbytes, path, refs)
        b = BIAS_INPUT.get(op.name, 2)
        bias = op.inputs[b] if len(op.inputs) > b and op.inputs[b] >= 0 else None
        result.append(Layer(
            name=name, kind=kind, op=op.name, op_index=op.index, input=op.inputs[DATA_INPUT.get(op.name, 0)],
            output=op.outputs[0], weight=w.index, bias=bias,
            activation=op.options.get("activation", "NONE"), shape=w.shape, dtype=w.type,
            buffer=st.buffer if st is not None else 0, offset=offset, nbytes=nbytes,
            compressible=not reason, skip_reason=reason,
            shared_with=tuple(n for n in by_buffer.get(st.buffer, ()) if n != name) if st is not None else (),
            stored=st.index if st is not None else -1, stored_dtype=st.type if st is not None else "",
            subgraph=graph.index, stored_subgraph=stored[0] if stored is not None else graph.index))
    return result


def _tensor(model, ref: tuple):
    return model.graphs[ref[0]].tensors[ref[1]]


def _constant(model, s: int, t: int, path: list, depth: int = 0) -> Optional[tuple[int, int]]:
    """(subgraph, tensor) of the constant whose values tensor t of subgraph s holds, or None where it is
    computed; every tensor followed on the way is appended to `path`."""
    graph = model.graphs[s]
    tensor = graph.tensors[t]
    if model.has_data(tensor):
        return s, t
    producer = next((op for op in graph.ops if t in op.outputs), None)
    if producer is not None:
        if producer.name != "DEQUANTIZE" or not producer.inputs or producer.inputs[0] < 0:
            return None
        source = graph.tensors[producer.inputs[0]]
        path.append((s, source.index))
        return (s, source.index) if model.has_data(source) and source.type == "FLOAT16" else None
    if t not in graph.inputs or depth >= MAX_DEPTH:
        return None
    position = graph.inputs.index(t)
    found = set()
    for caller, op, first in callers(model, s):
        if first + position >= len(op.inputs) or op.inputs[first + position] < 0:
            return None
        if op.name == "WHILE" and _changed_by_body(model, op, position):
            return None  # a loop variable the body changes: the weights would not stay constant
        path.append((caller, op.inputs[first + position]))
        found.add(_constant(model, caller, op.inputs[first + position], path, depth + 1))
    return found.pop() if len(found) == 1 else None


def callers(model, s: int) -> list:
    """(subgraph, op, first input passed to s's first input) of every op that runs subgraph s."""
    out = []
    for graph in model.graphs:
        for op in graph.ops:
            for option, first in CALLS.get(op.name, ()):
                if op.options.get(option) == s:
                    out.append((graph.index, op, first))
    return out


def _changed_by_body(model, op, position: int) -> bool:
    body = op.options.get("body")
    if body is None or not 0 <= body < len(model.graphs):
        return True
    graph = model.graphs[body]
    return (position >= len(graph.inputs) or position >= len(graph.outputs)
            or graph.inputs[position] != graph.outputs[position])


def _skip_reason(model, s: int, w, stored, nbytes: int, path: list, refs: set) -> str:
    if stored is None or nbytes == 0:
        where = f" of subgraph {s}" if s else ""
        return f"weight tensor {w.index}{where} ({w.name!r}) has no constant data: {computed_by(model.graphs[s].ops, w.index)}"
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
        return f"the weight's constant has the shape {stored.shape}, the layer reads {w.shape}"
    expected = int(np.prod(w.shape, dtype=np.int64)) * stored.dtype.itemsize
    if expected != nbytes:
        raise FormatError(f"tensor {stored.index} ({stored.name!r}) of shape {stored.shape} needs {expected} "
                          f"bytes but buffer {stored.buffer} holds {nbytes}")
    for user in model.buffer_users(stored.buffer):
        if user not in refs:
            return (f"buffer {stored.buffer} is also read by tensor {user[1]} of subgraph {user[0]}, which is not a "
                    "layer weight")
    for graph_index, t in path:
        for op in model.graphs[graph_index].ops:
            for i, tensor in enumerate(op.inputs):
                if tensor == t and not _reads_as_weight(model, graph_index, op, i, refs):
                    return (f"tensor {t} of subgraph {graph_index} is also read by op {op.index} ({op.name}) as a "
                            "non-weight input")
    return ""


def _reads_as_weight(model, s: int, op, i: int, refs: set) -> bool:
    """Whether op (of subgraph s) reading its input i reads a layer's weights: a layer's input 1, a
    DEQUANTIZE into a weight, or an operand that each subgraph it runs receives as a weight or not at all."""
    if op.name in KINDS:
        return i == 1
    if op.name == "DEQUANTIZE":
        return any((s, out) in refs for out in op.outputs)
    for option, first in CALLS.get(op.name, ()):
        callee = op.options.get(option)
        if callee is None or not 0 <= callee < len(model.graphs) or i < first:
            return False
        graph = model.graphs[callee]
        if i - first >= len(graph.inputs):
            return False
        received = graph.inputs[i - first]
        # the other branch of an IF gets the operand too, and may leave it alone
        unused = received not in graph.outputs and not any(received in o.inputs for o in graph.ops)
        if (callee, received) not in refs and not unused:
            return False
    return op.name in CALLS
