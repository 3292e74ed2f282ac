"""The vocabulary of a TFLite graph as pydsz reads it: tensors, ops, the layers whose weights it
compresses, and the tables that say where an op's inputs are (pydsz.model.graph parses a file into them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

try:
    import tflite
except ImportError:  # the framework's extra; decoding a .dsz never needs it
    tflite = None

KINDS = {"FULLY_CONNECTED": "fc", "CONV_2D": "conv", "DEPTHWISE_CONV_2D": "conv", "TRANSPOSE_CONV": "conv"}


# where an op's data input and bias are (the weight is input 1 of all of them): TRANSPOSE_CONV reads
# (output shape, weights, input[, bias])
DATA_INPUT = {"TRANSPOSE_CONV": 2}


BIAS_INPUT = {"TRANSPOSE_CONV": 3}


# stored dtypes of compressible weights (float16: behind a DEQUANTIZE op; int8/uint8: quantized)
STORED_TYPES = ("FLOAT32", "FLOAT16", "INT8", "UINT8")


INTEGER_TYPES = ("INT8", "UINT8")


DTYPES = {
    "FLOAT32": "<f4", "FLOAT16": "<f2", "FLOAT64": "<f8", "INT8": "i1", "UINT8": "u1",
    "INT16": "<i2", "UINT16": "<u2", "INT32": "<i4", "UINT32": "<u4", "INT64": "<i8",
    "UINT64": "<u8", "BOOL": "?",
}


# Options tables this package reads, by op name; other ops keep an empty options dict.
OPTION_CLASSES = {
    "FULLY_CONNECTED": "FullyConnectedOptions", "CONV_2D": "Conv2DOptions",
    "DEPTHWISE_CONV_2D": "DepthwiseConv2DOptions", "SOFTMAX": "SoftmaxOptions",
    "ADD": "AddOptions", "SUB": "SubOptions", "MUL": "MulOptions", "DIV": "DivOptions",
    "LEAKY_RELU": "LeakyReluOptions",
    # the ops that run other subgraphs, and which
    "IF": "IfOptions", "WHILE": "WhileOptions", "CALL_ONCE": "CallOnceOptions",
}


OPTION_FIELDS = {
    "FusedActivationFunction": "activation", "KeepNumDims": "keep_num_dims",
    "WeightsFormat": "weights_format", "Beta": "beta", "Alpha": "alpha",
    # convolution geometry (pydsz.prune.oneshot's im2col); padding stays the schema's enum: 0 SAME, 1 VALID
    "Padding": "padding", "StrideH": "stride_h", "StrideW": "stride_w",
    "DilationHFactor": "dilation_h", "DilationWFactor": "dilation_w", "DepthMultiplier": "depth_multiplier",
    "ThenSubgraphIndex": "then", "ElseSubgraphIndex": "else", "CondSubgraphIndex": "cond",
    "BodySubgraphIndex": "body", "InitSubgraphIndex": "init",
}


def enum_names(enum_class) -> dict:
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
    # affine quantization (real = scale * (q - zero_point)), per tensor or per channel along `axis`
    scale: tuple = ()
    zero_point: tuple = ()
    axis: int = 0

    @property
    def dtype(self) -> Optional[np.dtype]:
        code = DTYPES.get(self.type)
        return None if code is None else np.dtype(code)


@dataclass(frozen=True)
class Op:
    index: int
    name: str  # builtin operator name ("FULLY_CONNECTED", "RELU", ...) or "CUSTOM:<code>"
    inputs: tuple  # tensor indices; -1 marks an absent optional input
    outputs: tuple
    options: dict  # activation (name), keep_num_dims, beta, alpha, ... for the ops in OPTION_CLASSES


@dataclass(frozen=True)
class Graph:
    """One subgraph: the main graph (0) or one that IF, WHILE or CALL_ONCE runs."""

    index: int
    name: str
    tensors: list
    ops: list
    inputs: tuple
    outputs: tuple


@dataclass(frozen=True)
class Layer:
    """One FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D / TRANSPOSE_CONV op and where its weights live.
    Its tensor and op indices are those of its subgraph; the stored constant's are of `stored_subgraph`
    (a branch's weights may be a constant of the graph that passes them to the IF or WHILE running it)."""

    name: str  # fc1, fc2, ... / conv1, conv2, ... in execution order; sg<k>.fc1, ... in subgraph k
    kind: str  # "fc" or "conv"
    op: str  # the builtin operator name
    op_index: int
    input: int  # tensor indices
    output: int
    weight: int
    bias: Optional[int]  # None when the op has no bias input
    activation: str  # fused activation: "NONE", "RELU", "RELU6", ...
    shape: tuple  # weight shape: FC [out, in], conv OHWI, depthwise [1, H, W, C*M]
    dtype: str  # TFLite type name of the weight tensor the op reads
    buffer: int  # the stored constant's buffer; 0 when there is none
    offset: int  # absolute file offset of the stored bytes (-1 when there are none)
    nbytes: int
    compressible: bool  # float32 or float16 constant weights that only layer weights read
    skip_reason: str  # why not compressible ("" when it is)
    shared_with: tuple = ()  # names of the other layers whose weight is the same buffer
    # the constant whose bytes hold the weights: the weight tensor itself, or the float16 input of
    # the DEQUANTIZE op that computes it (the converter's float16 option); -1 when there is none
    stored: int = -1
    stored_dtype: str = ""  # TFLite type name of the stored constant: "FLOAT32", "FLOAT16", ...
    subgraph: int = 0  # the subgraph whose op this is
    stored_subgraph: int = 0  # the subgraph of the `stored` tensor

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
    dtype: str  # the stored dtype (TFLite type name)
    offset: int
    nbytes: int


def parse_options(op, name: str) -> dict:
    class_name = OPTION_CLASSES.get(name)
    table = op.BuiltinOptions()
    if class_name is None or table is None:
        return {}
    options = getattr(tflite, class_name)()
    options.Init(table.Bytes, table.Pos)
    activations = enum_names(tflite.ActivationFunctionType)
    parsed = {}
    for method, key in OPTION_FIELDS.items():
        if hasattr(options, method):
            value = getattr(options, method)()
            parsed[key] = activations.get(value, str(value)) if key == "activation" else value
    return parsed


# the ops that run subgraphs: (option naming a subgraph, the first of the op's inputs that is the
# subgraph's first input). IF's input 0 is its condition; WHILE hands all its inputs to cond and body.
CALLS = {"IF": (("then", 1), ("else", 1)), "WHILE": (("cond", 0), ("body", 0)), "CALL_ONCE": (("init", 0),)}


def computed_by(ops: list, tensor: int) -> str:
    """How a weight without constant data is computed, followed back to its sources: the op
    nearest the weight alone says too little (DEQUANTIZE of a DENSIFY'd sparse constant)."""
    producers = {t: op for op in ops for t in op.outputs}
    chain = []
    while tensor in producers and len(chain) < 8 and producers[tensor].inputs:
        chain.append(producers[tensor].name)
        tensor = producers[tensor].inputs[0]
    if not chain:
        return "not a constant"
    text = "computed by a " + " op from a ".join(chain) + " op"
    if "DENSIFY" in chain:
        text += " (sparse-format weights are kept lossless)"
    return text
