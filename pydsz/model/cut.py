"""Sub-models from a cut: the ops of the main graph from one op on, as a .tflite of their own whose
inputs are the tensors that cross the cut.

A candidate that changes one layer's weights changes nothing computed before that layer's op: the
tensors that cross the cut there (the activations the later ops read) are the same for every
candidate, so they are computed once (pydsz.model.chain) and only what lies after the cut runs again.

A segment is a set of ops of subgraph 0 in execution order, the tensors fed to it and the tensors
read out of it. Ops whose outputs do not hold one row per sample (SHAPE -> STRIDED_SLICE -> PACK
computing a RESHAPE's target from the batch size) and ops computed from constants alone (the
DEQUANTIZE of a float16 weight) are pulled into the segment rather than fed across the cut: their
values are not activations to cache.

The .tflite of a segment is the original file with a new head: a new root Model table and a new
SubGraph table for subgraph 0 (inputs, outputs and operators vectors of its own), placed between the
8-byte header and the rest, which moves up by a multiple of 64 bytes and keeps its alignment. Every
other table, vector and buffer is the original one, reached by the same relative offsets; the
serving signatures are left out (they name the original inputs). Nothing is parsed again or copied
but the file itself, once per candidate, with the candidate's weights written where they live.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterable, Optional

import numpy as np

from pydsz.errors import InputError
from pydsz.model.graph import TFLiteModel

try:
    import tflite
except ImportError:  # the framework's extra
    tflite = None

# The head grows the file by a multiple of this: buffers keep the alignment the converter gave them.
ALIGN = 64
# Ops whose state or control flow lives outside the main graph's tensors: a model holding one is
# evaluated whole.
_UNCUTTABLE = {"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE", "WHILE", "IF", "CALL",
               "STABLEHLO_WHILE", "STABLEHLO_CASE", "STABLEHLO_COMPOSITE"}
# vtable slots (field number * 2 + 4) of the schema's Model and SubGraph tables
_MODEL_SCALARS = {4: "version"}
_MODEL_OFFSETS = (6, 10, 12, 14, 16)  # operator_codes, description, buffers, metadata_buffer, metadata
_MODEL_SUBGRAPHS = 8
_GRAPH_OFFSETS = (4, 12)  # tensors, name


@dataclass(frozen=True)
class Segment:
    """Ops of subgraph 0 to run (indices, in execution order), the tensors fed to them and read out."""

    ops: tuple
    inputs: tuple
    outputs: tuple


# A cut's baseline may differ from the whole model's outputs by float rounding only (kernels fused
# differently): beyond this relative L2 difference the cut is not trusted and the whole model runs.
CUT_TOLERANCE = 1e-3


class Graph:
    """What cutting a model needs to know about its main graph: who produces and who reads each
    tensor, which are constants or computed from constants alone, which hold one row per sample
    (`rows`, as runtime.probe finds them; without it, a dynamic batch's -1 in the shape signature
    says so, and for a model of a fixed batch of 1 a first axis of 1)."""

    def __init__(self, model: TFLiteModel, rows: Optional[set] = None):
        self.model, self.rows = model, rows
        self.reason = _uncuttable(model)
        self.producer = {t: op.index for op in model.ops for t in op.outputs if t >= 0}
        # a tensor no op writes that is no graph input is a constant, even without bytes (an empty shape)
        self.constant = {t.index for t in model.tensors
                         if model.constant(t.index) is not None or (t.index not in self.producer
                                                                    and t.index not in model.inputs)}
        self.static: set = set()  # computed from constants alone
        for op in model.ops:
            reads = [t for t in op.inputs if t >= 0]
            if reads and all(t in self.constant or t in self.static for t in reads):
                self.static.update(t for t in op.outputs if t >= 0)
        signatures = [model.tensors[i].shape_signature for i in model.inputs]
        self.dynamic = any(len(s) and s[0] == -1 for s in signatures)

    def per_sample(self, t: int) -> bool:
        """Whether tensor t holds one row per sample (its values can be cached and fed by batches)."""
        tensor = self.model.tensors[t]
        if t in self.model.inputs:
            return True
        if self.rows is not None:
            return t in self.rows
        if self.dynamic:
            return len(tensor.shape_signature) >= 1 and tensor.shape_signature[0] == -1
        return len(tensor.shape) >= 2 and tensor.shape[0] == 1

    def segment(self, ops: Iterable[int], available: set, outputs: Iterable[int]) -> Segment:
        """The ops `ops` plus those they need that cannot be fed from `available` (tensors whose
        values are at hand, one row per sample), fed from `available`, read out at `outputs`."""
        outputs = tuple(outputs)
        chosen = set(ops)
        pending = [self.producer[t] for t in outputs if t in self.producer and t not in available]
        pending += list(chosen)
        chosen.update(pending)
        fed: set = set()
        while pending:
            op = self.model.ops[pending.pop()]
            for t in op.inputs:
                if t < 0 or t in self.constant or self.producer.get(t) in chosen:
                    continue
                if t in available and t not in self.static and self.per_sample(t):
                    fed.add(t)
                elif t in self.producer:
                    chosen.add(self.producer[t])
                    pending.append(self.producer[t])
                else:
                    raise InputError(f"tensor {t} is needed after the cut but neither produced nor available")
        for t in outputs:
            if t not in available and self.producer.get(t) not in chosen:
                raise InputError(f"tensor {t} cannot be read out of the segment")
        # a tensor both produced in the segment and available is produced, never fed
        fed = {t for t in fed if self.producer.get(t) not in chosen}
        return Segment(tuple(sorted(chosen)), tuple(sorted(fed)), outputs)

    def tail(self, start: int) -> Segment:
        """The ops from op `start` to the model outputs, fed with what crosses the cut before it;
        the outputs computed before the cut are left out (no weight after it changes them)."""
        before = set(self.model.inputs) | {t for t, op in self.producer.items() if op < start}
        ops = range(start, len(self.model.ops))
        produced = {t for op in ops for t in self.model.ops[op].outputs}
        outputs = [t for t in self.model.outputs if t in produced or (t in self.producer and t in self.static)]
        return self.segment(ops, before, outputs)


def _uncuttable(model: TFLiteModel) -> Optional[str]:
    """Why the model cannot be cut (evaluated whole), or None."""
    if tflite is None:
        return "the tflite package is missing"
    root = tflite.Model.GetRootAsModel(model.data, 0)
    if root.SubgraphsLength() != 1:
        return f"it has {root.SubgraphsLength()} subgraphs"
    for i in range(root.BuffersLength()):
        if root.Buffers(i).Offset() > 1:
            return "its buffers are stored out of line"
    graph = root.Subgraphs(0)
    for t in range(graph.TensorsLength()):
        if graph.Tensors(t).IsVariable():
            return f"tensor {t} is a variable"
    stateful = sorted({op.name for op in model.ops} & _UNCUTTABLE)
    if stateful:
        return f"it holds {', '.join(stateful)} ops"
    return None


class _Head:
    """Bytes at absolute file offsets from `base` on, written as flatbuffer tables and vectors."""

    def __init__(self, base: int, shift: int):
        self.base, self.shift, self.buf = base, shift, bytearray()

    def alloc(self, size: int, align: int) -> int:
        self.buf += bytes(-(self.base + len(self.buf)) % align)
        pos = self.base + len(self.buf)
        self.buf += bytes(size)
        return pos

    def u32(self, pos: int, value: int) -> None:
        struct.pack_into("<I", self.buf, pos - self.base, value)

    def table(self, fields: dict) -> tuple[int, dict]:
        """A table of 4-byte fields {slot: None}: (its position, {slot: field position})."""
        slots = sorted(fields)
        count = (max(slots) - 4) // 2 + 1 if slots else 0
        vtable = self.alloc(4 + 2 * count, 2)
        table = self.alloc(4 + 4 * len(slots), 4)
        struct.pack_into("<HH", self.buf, vtable - self.base, 4 + 2 * count, 4 + 4 * len(slots))
        where = {}
        for k, slot in enumerate(slots):
            where[slot] = table + 4 + 4 * k
            struct.pack_into("<H", self.buf, vtable - self.base + 4 + (slot - 4), 4 + 4 * k)
        struct.pack_into("<i", self.buf, table - self.base, table - vtable)
        return table, where

    def vector(self, count: int) -> int:
        pos = self.alloc(4 + 4 * count, 4)
        self.u32(pos, count)
        return pos

    def point(self, field: int, target: int) -> None:
        """An offset field at `field` to `target`, an absolute position in the new file."""
        self.u32(field, target - field)


def _field(tab, slot: int) -> Optional[int]:
    """Absolute position of a table's field, None where it is absent."""
    o = tab.Offset(slot)
    return tab.Pos + o if o else None


def _target(data: bytes, field: int) -> int:
    return field + struct.unpack_from("<I", data, field)[0]


def head(model: TFLiteModel, segment: Segment) -> tuple[int, bytes]:
    """(the new root offset, the bytes that, placed between model.data's 8-byte header and its rest,
    make the segment's .tflite: see the module's docstring); their length is a multiple of ALIGN."""
    size = len(_build(model, segment, 1 << 30)[1])  # any shift larger than the head: the layout is the same
    shift = -(-size // ALIGN) * ALIGN
    root, body = _build(model, segment, shift)
    return root, body + bytes(shift - len(body))


def _build(model: TFLiteModel, segment: Segment, shift: int) -> tuple[int, bytes]:
    data = model.data
    root = tflite.Model.GetRootAsModel(data, 0)
    graph = root.Subgraphs(0)
    h = _Head(8, shift)
    model_fields = {s: _field(root._tab, s) for s in (*_MODEL_SCALARS, *_MODEL_OFFSETS)}
    model_fields = {s: f for s, f in model_fields.items() if f is not None}
    model_table, model_where = h.table({**model_fields, _MODEL_SUBGRAPHS: None})
    graph_fields = {s: f for s in _GRAPH_OFFSETS if (f := _field(graph._tab, s)) is not None}
    subgraphs = h.vector(1)
    graph_table, graph_where = h.table({**graph_fields, 6: None, 8: None, 10: None})
    vectors = {}
    for slot, values in ((6, segment.inputs), (8, segment.outputs)):
        vectors[slot] = h.vector(len(values))
        for k, v in enumerate(values):
            h.u32(vectors[slot] + 4 + 4 * k, v)
    operators = h.vector(len(segment.ops))
    for k, op in enumerate(segment.ops):
        h.point(operators + 4 + 4 * k, graph.Operators(op)._tab.Pos + shift)
    for slot, field in model_fields.items():
        if slot in _MODEL_SCALARS:
            h.u32(model_where[slot], struct.unpack_from("<I", data, field)[0])
        else:
            h.point(model_where[slot], _target(data, field) + shift)
    h.point(model_where[_MODEL_SUBGRAPHS], subgraphs)
    h.point(subgraphs + 4, graph_table)
    for slot, field in graph_fields.items():
        h.point(graph_where[slot], _target(data, field) + shift)
    for slot, vector in ((*vectors.items(), (10, operators))):
        h.point(graph_where[slot], vector)
    return model_table, bytes(h.buf)


def model_bytes(model: TFLiteModel, segment: Segment, weights: Optional[dict] = None) -> bytes:
    """The segment's .tflite, with `weights` ({layer name or buffer index: array}, as
    TFLiteModel.replace takes them) written in place."""
    return model.replace(weights or {}, head=head(model, segment))


def differs(outputs: dict, reference: dict) -> Optional[str]:
    """Why a cut's baseline outputs are not the whole model's up to float rounding, or None."""
    for key, ref in reference.items():
        a, b = np.asarray(outputs[key], np.float64), np.asarray(ref, np.float64)
        scale = float(np.linalg.norm(b))
        diff = float(np.linalg.norm(a - b))
        if not diff <= CUT_TOLERANCE * max(scale, 1e-30):
            return f"output {key} differs from the whole model's by {diff / max(scale, 1e-30):.2g} (relative L2)"
    return None
