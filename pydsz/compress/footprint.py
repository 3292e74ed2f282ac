"""What a command holds at its peak, part by part: the bound `dsz compress` and `dsz prune` print beside
the peak they measured.

The parts are sized from what the command knows once its data is loaded: the process itself (Python
and its libraries, read when the command starts), the data, copies of the model (the original, a
candidate, the decoded .dsz, and the weights the interpreter's XNNPACK delegate packs into a copy of
its own), the interpreter's tensors for one batch (their real sizes on one sample: runtime.probe,
not the shapes the model declares, which for dynamic shapes count one along the free axes), the
model's outputs a comparison holds, the cached activations (pydsz.model.cache), and for one-shot pruning
and compensation the Hessians and a piece of the layer inputs streamed into them (float32 and the
float64 copy they are summed in), with compensation also its calibration inputs and the factors it
keeps per layer.
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

MIB = 1 << 20
# the codec's working memory is measured on a section of CODEC_SAMPLE bytes; a section of 1 MiB, the
# largest that tries every coder, takes up to CODEC_GROWTH more (zstd -22 and lzma -9 with a 1 MiB
# dictionary: 16.4 MiB measured, on random, constant and gap-like bytes)
CODEC_SAMPLE = 1 << 16
CODEC_GROWTH = 20 * MIB


def process() -> dict:
    """What the process holds before it loads anything of the user's: Python and the libraries a
    command imports with the interpreter's kernels (they load with the first interpreter: one of a
    two-op model built here), and apart from it the codec's working memory, which comes on
    top of whatever else is held while a stream is encoded (lzma -9 and zstd -22 try every index
    section of up to 1 MiB: 1 MiB for a 4 KiB section, 3 for 64 KiB, 19 for 1 MiB; measured here on
    64 KiB, a twentieth of a second, with CODEC_GROWTH for the larger sections). Zeros where memory cannot
    be read."""
    from pydsz.compress import pipeline  # noqa: F401  (what compress imports)
    from pydsz.format import wrapping
    from pydsz.format.interpreter import make_interpreter
    from pydsz.model import runtime  # noqa: F401  (what compress and prune import)

    model = _smallest_model()
    interpreter = make_interpreter(model)
    x = [np.zeros((2, *d["shape"][1:]), d["dtype"]) for d in interpreter.get_input_details()]
    runtime.probe(model, x)  # the builtin kernels too
    np.dot(np.ones((64, 64), np.float32), np.ones((64, 64), np.float32))  # BLAS's buffers, per thread
    held = resident() or 0
    section = np.resize(np.frombuffer(model, np.uint8), CODEC_SAMPLE).tobytes()
    wrapping.wrap(section, wrapping.gap8_wrappers(len(section)))  # every lossless coder an index section may take
    return {"the process": held, "the codec at work": max(0, (peak() or 0) - held) + CODEC_GROWTH}


def cuda() -> dict:
    """For a command on the GPU: the host memory the CUDA driver and pycuda take with the context and
    the loaded kernels, as the growth of the resident set while they come (on an H200 such commands
    peaked about 95 MiB above the bound that left this out)."""
    from pydsz.gpu import _cuda

    before = resident() or 0
    _cuda.module()
    return {"the CUDA context": max(0, (resident() or 0) - before)}


def resident() -> Optional[int]:
    """This process's resident bytes now (Linux), None where it cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def peak() -> Optional[int]:
    """This process's peak resident bytes so far, None where the platform does not say."""
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def line(parts: dict) -> str:
    """The peak measured beside the bound: "612 MiB (meant to stay within 700 MiB: the process 150 + ...)"."""
    total = sum(parts.values())
    text = " + ".join(f"{name} {value / MIB:.0f}" for name, value in parts.items() if round(value / MIB))
    measured = peak()
    bound = f"within {total / MIB:.0f} MiB: {text}"
    return f"unknown (meant to stay {bound})" if measured is None else f"{measured / MIB:.0f} MiB (meant to stay {bound})"


def interpreter_path(process: dict, data: int, model: int, batch_bytes: int, outputs: int, cached: int,
                     **more: int) -> dict:
    """The parts of a command that runs candidates through the interpreter (see the module's docstring);
    process: process()'s parts; `more`: further parts by name (the compensation's)."""
    return {**process, "data": data, "4 x the model": 4 * model, "one batch's tensors": batch_bytes,
            "outputs": 3 * outputs, "cached activations": cached, **more}


def _smallest_model() -> bytes:
    """A .tflite of one FULLY_CONNECTED layer (4 -> 4, batch dynamic) and a SOFTMAX: enough for an
    interpreter to load its kernels, built here so that no data file is needed (wheels carry none)."""
    import flatbuffers
    import tflite

    b = flatbuffers.Builder(256)

    def vector(start, values, prepend):
        start(b, len(values))
        for v in reversed(values):
            prepend(v)
        return b.EndVector()

    weights = np.eye(4, dtype="<f4").tobytes()
    data = b.CreateByteVector(weights)
    tflite.BufferStart(b)
    empty = tflite.BufferEnd(b)
    tflite.BufferStart(b)
    tflite.BufferAddData(b, data)
    buffers = [empty, tflite.BufferEnd(b)]
    tensors = []
    for shape, signature, buffer in (([1, 4], [-1, 4], 0), ([4, 4], [4, 4], 1), ([1, 4], [-1, 4], 0),
                                     ([1, 4], [-1, 4], 0)):
        dims = vector(tflite.TensorStartShapeVector, shape, b.PrependInt32)
        sig = vector(tflite.TensorStartShapeSignatureVector, signature, b.PrependInt32)
        tflite.TensorStart(b)
        tflite.TensorAddShape(b, dims)
        tflite.TensorAddShapeSignature(b, sig)
        tflite.TensorAddType(b, tflite.TensorType.FLOAT32)
        tflite.TensorAddBuffer(b, buffer)
        tensors.append(tflite.TensorEnd(b))
    codes, ops = [], []
    for name in ("FULLY_CONNECTED", "SOFTMAX"):
        tflite.OperatorCodeStart(b)
        tflite.OperatorCodeAddBuiltinCode(b, getattr(tflite.BuiltinOperator, name))
        tflite.OperatorCodeAddDeprecatedBuiltinCode(b, getattr(tflite.BuiltinOperator, name))
        tflite.OperatorCodeAddVersion(b, 1)
        codes.append(tflite.OperatorCodeEnd(b))
    for index, (inputs, outputs) in enumerate((([0, 1, -1], [2]), ([2], [3]))):
        ins = vector(tflite.OperatorStartInputsVector, inputs, b.PrependInt32)
        outs = vector(tflite.OperatorStartOutputsVector, outputs, b.PrependInt32)
        tflite.OperatorStart(b)
        tflite.OperatorAddOpcodeIndex(b, index)
        tflite.OperatorAddInputs(b, ins)
        tflite.OperatorAddOutputs(b, outs)
        ops.append(tflite.OperatorEnd(b))
    tables = lambda start, values: vector(start, values, b.PrependUOffsetTRelative)  # noqa: E731
    graph_tensors = tables(tflite.SubGraphStartTensorsVector, tensors)
    graph_ops = tables(tflite.SubGraphStartOperatorsVector, ops)
    graph_in = vector(tflite.SubGraphStartInputsVector, [0], b.PrependInt32)
    graph_out = vector(tflite.SubGraphStartOutputsVector, [3], b.PrependInt32)
    tflite.SubGraphStart(b)
    tflite.SubGraphAddTensors(b, graph_tensors)
    tflite.SubGraphAddOperators(b, graph_ops)
    tflite.SubGraphAddInputs(b, graph_in)
    tflite.SubGraphAddOutputs(b, graph_out)
    graphs = tables(tflite.ModelStartSubgraphsVector, [tflite.SubGraphEnd(b)])
    code_vec = tables(tflite.ModelStartOperatorCodesVector, codes)
    buffer_vec = tables(tflite.ModelStartBuffersVector, buffers)
    tflite.ModelStart(b)
    tflite.ModelAddVersion(b, 3)
    tflite.ModelAddOperatorCodes(b, code_vec)
    tflite.ModelAddSubgraphs(b, graphs)
    tflite.ModelAddBuffers(b, buffer_vec)
    b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
    return bytes(b.Output())
