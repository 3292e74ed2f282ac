"""A model's small float constants (layer biases, PReLU slopes, the constant operands of ADD, SUB and
MUL), error-bounded in gathered .dsz entries (pydsz.encode.gather, doc/format.md).

Once the weights are compressed they are a large share of what is left of a small conv model
(hand_recrop: 46 tensors, 1,132 values, 4.5 KB against a file of ~24 KB), and each alone is too
small for a stream of its own, whose header and code table would cost more than it saves. Gathered,
one header and one code table serve many, and the rest of the model holds zeros in their place.

Each is kept within a fraction of its own largest magnitude (a bias of 2 and a slope of 0.1 are
parameters of different scales, as SZ's relative mode has it). That fraction is not assessed layer by
layer: the weights' bounds come first, and the constants take what the budget leaves
(pipeline.compress measures a few fractions on the decoded model, coarse to fine, and keeps the
coarsest that stays within it, or none).
"""

from __future__ import annotations

import numpy as np

# ops whose constant operands are gathered, besides the layers' biases
OPERAND_OPS = {"ADD", "SUB", "MUL", "PRELU"}
# a scalar operand (a MUL by 0.5, an epsilon) is a number the graph's author chose, not a parameter
# learned per channel, and gathering it would save a few bytes at most
MIN_VALUES = 2
# the relative bounds tried, coarse to fine: 2**-8 of a constant's largest magnitude moved hand_recrop's
# outputs by ~0.2% of its 1% budget, 2**-10 by nothing measurable
FRACTIONS = (2.0 ** -8, 2.0 ** -10, 2.0 ** -12)


def buffers(model, dtype: str, kinds: tuple = ("fc", "conv")) -> list[int]:
    """The buffers of constants that may be gathered, stored as `dtype` ("FLOAT32" or "FLOAT16"), in
    file order: each read only where a learned parameter is, directly or through the DEQUANTIZE that
    turns float16 into float32, and no layer's weights. Where every kind of layer is compressed
    (`kinds` fc and conv: --layers all), those places are the layers' biases and the operands of
    OPERAND_OPS; otherwise the biases of the layers of `kinds` only, and nothing else of the model
    changes."""
    layers = [l for l in model.layers(("fc", "conv")) if not l.subgraph]  # the main graph's constants only
    weights = {l.stored for l in layers} | {l.weight for l in layers}
    biases = {(l.op_index, l.bias) for l in layers if l.bias is not None and l.kind in kinds}
    operand_ops = OPERAND_OPS if set(kinds) >= {"fc", "conv"} else set()
    dequantized = {op.outputs[0]: op.inputs[0] for op in model.ops if op.name == "DEQUANTIZE" and op.inputs}

    def role_ok(tensor: int) -> bool:
        readers = model.consumers(tensor)
        return bool(readers) and all(
            (op.index, tensor) in biases or (op.name in operand_ops and op.inputs.index(tensor) > 0)
            for op in readers)

    found = {}
    users: dict[int, list[int]] = {}
    for t in model.tensors:
        if t.buffer:
            users.setdefault(t.buffer, []).append(t.index)
    for buffer, tensors in users.items():
        first = model.tensors[tensors[0]]
        if first.type != dtype or first.quantized or any(t in weights for t in tensors):
            continue
        values = model.constant(first.index)
        if values is None or values.size < MIN_VALUES:
            continue
        # a float16 constant reaches its readers through DEQUANTIZE ops; a float32 one directly
        readers = [out for out, source in dequantized.items() if source in tensors] if dtype == "FLOAT16" \
            else tensors
        if readers and all(role_ok(t) for t in readers):
            found[buffer] = model.place(buffer)[0]
    return sorted(found, key=found.get)


def candidates(bounds: dict, float_layers: set) -> list[float]:
    """The relative bounds to try for the gathered constants, coarse to fine; none when every float
    layer is kept lossless (the model is then kept as it is)."""
    return list(FRACTIONS) if any(b > 0 and name in float_layers for name, b in bounds.items()) else []


def bounds(arrays: list, rel: float) -> list[float]:
    """Each constant's absolute bound: `rel` times its largest magnitude (a tensor of zeros keeps them)."""
    return [rel * max(float(np.max(np.abs(a))), float(np.finfo(np.float32).tiny)) for a in arrays]


def arrays(model, buffer_list: list[int]) -> list[np.ndarray]:
    """The values of each buffer, flat."""
    first = {}
    for t in model.tensors:
        first.setdefault(t.buffer, t.index)
    return [np.asarray(model.constant(first[b])).reshape(-1) for b in buffer_list]
