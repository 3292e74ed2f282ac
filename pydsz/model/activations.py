"""A model's intermediate tensors over a data set: every output of a sub-model (tensors), one tensor
kept for every sample (capture: the input of a layer, of the FC tail), or streamed past a visitor
(stream: a layer's inputs summed into its Hessian without keeping them). Each batch runs only the ops
a tensor needs, where the model can be cut (pydsz.model.cut), in the interpreter's usual memory.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from pydsz.errors import InputError
from pydsz.format.interpreter import make_interpreter
from pydsz.model import runtime


def tensors(model, x, batch_size: Optional[int] = None, num_threads: Optional[int] = None) -> list:
    """Every output of the model (bytes) for every sample of x, in the graph's output order, each
    written batch by batch into one array from pydsz.model.cache (memory-mapped where the user's limit says
    so): how activations to keep are computed. batch_size: as outputs() chooses it."""
    from pydsz.model import cache

    if batch_size is None:
        batch_size = runtime.batch_within(model, runtime.BATCH_BYTES, x)
    interpreter = make_interpreter(model, num_threads=num_threads)
    details = interpreter.get_output_details()
    n = len(runtime.fit_inputs(interpreter.get_input_details(), x, finite=False)[0])
    out: list = []
    filled = 0

    def read(it):
        nonlocal filled
        values = [it.get_tensor(d["index"]) for d in details]
        rows = it.get_input_details()[0]["shape"][0]
        if any(v.ndim == 0 or v.shape[0] != rows for v in values):
            return values  # runtime.run_batches retries one sample at a time, then says what is wrong
        if not out:
            out.extend(cache.empty((n, *v.shape[1:]), v.dtype) for v in values)
        for array, v in zip(out, values):
            array[filled:filled + rows] = v
        filled += rows
        return []

    runtime.run_batches(interpreter, x, batch_size, read)
    del interpreter
    runtime.trim()
    return out


def capture(model, x, tensor_index: int, batch_size: Optional[int] = None,
            num_threads: Optional[int] = None) -> np.ndarray:
    """The values of tensor `tensor_index` for every sample of x (e.g. the input of the first FC layer).

    model: bytes or TFLiteModel. The model is cut after the op that computes the tensor
    (pydsz.model.cut), which then is its output: only the ops it needs run, in the interpreter's usual
    memory. A model that cannot be cut runs whole with all tensors preserved (intermediates are
    otherwise unreliable), its batches then within runtime.CAPTURE_BYTES of preserved tensors. The result is
    written batch by batch into one array from pydsz.model.cache (memory-mapped where the user's limit
    says so), never held twice; a sample's values do not depend on the batch it runs in.
    """
    from pydsz.model import cut
    from pydsz.model.graph import TFLiteModel

    if hasattr(model, "invoke"):
        raise InputError("capture needs the model's bytes, not an interpreter: it must preserve all tensors")
    parsed = model if isinstance(model, TFLiteModel) else TFLiteModel(bytes(model))
    if not 0 <= tensor_index < len(parsed.tensors):
        raise InputError(f"tensor {tensor_index} out of range: the model has {len(parsed.tensors)} tensors")
    graph = cut.Graph(parsed)
    if graph.reason is None and tensor_index in graph.producer and graph.per_sample(tensor_index):
        sub, fed = _prefix(parsed, graph, x, tensor_index)
        return tensors(sub, fed, batch_size or runtime.batch_within(sub, runtime.CAPTURE_BYTES, fed), num_threads)[0]
    return _capture_preserved(parsed.data, x, tensor_index, batch_size, num_threads)


def stream(model, x, tensor_index: Optional[int], visit, batch_size: Optional[int] = None,
           num_threads: Optional[int] = None) -> None:
    """Call visit(values) with tensor `tensor_index`'s values (None: the model's first output) for
    each batch of x, in order, whatever their shape: for what needs all of a tensor's rows but not
    which sample each came from (a Hessian), in one batch's memory. Unlike capture, the tensor need
    not hold one row per sample (BirdNET's front-end FC reads [frames x batch, 1025] rows).
    model: bytes or TFLiteModel."""
    from pydsz.model import cut
    from pydsz.model.graph import TFLiteModel

    parsed = model if isinstance(model, TFLiteModel) else TFLiteModel(bytes(model))
    if tensor_index is None:
        tensor_index = parsed.outputs[0]
    if not 0 <= tensor_index < len(parsed.tensors):
        raise InputError(f"tensor {tensor_index} out of range: the model has {len(parsed.tensors)} tensors")
    graph = cut.Graph(parsed)
    if graph.reason is None and tensor_index in graph.producer:
        sub, fed = _prefix(parsed, graph, x, tensor_index)
        interpreter = make_interpreter(sub, num_threads=num_threads)
        read = interpreter.get_output_details()[0]["index"]
        batch_size = batch_size or runtime.batch_within(sub, runtime.CAPTURE_BYTES, fed)
    else:
        fed = x
        interpreter = make_interpreter(parsed.data, num_threads=num_threads, preserve_all_tensors=True)
        read = tensor_index
        batch_size = batch_size or runtime.batch_within(parsed.data, runtime.CAPTURE_BYTES, x)
    # a batch whose invoke fails is retried sample by sample (runtime.run_batches); one visited is never re-run
    runtime.run_batches(interpreter, fed, batch_size, lambda it: visit(it.get_tensor(read)) or [])
    del interpreter
    runtime.trim()


def _prefix(parsed, graph, x, tensor_index: int) -> tuple:
    """The model cut after the op that computes the tensor, which is its output, and the model
    inputs it reads, in its own order."""
    from pydsz.model import cut

    segment = graph.segment(range(graph.producer[tensor_index] + 1), set(parsed.inputs), [tensor_index])
    by_tensor = dict(zip(parsed.inputs, runtime.fit_inputs(parsed.input_details(), x, finite=False)))
    return cut.model_bytes(parsed, segment), [by_tensor[t] for t in segment.inputs]


def _capture_preserved(model: bytes, x, tensor_index: int, batch_size: Optional[int],
                       num_threads: Optional[int]) -> np.ndarray:
    from pydsz.model import cache

    if batch_size is None:
        batch_size = runtime.batch_within(model, runtime.CAPTURE_BYTES, x)
    interpreter = make_interpreter(model, num_threads=num_threads, preserve_all_tensors=True)
    n = len(runtime.fit_inputs(interpreter.get_input_details(), x, finite=False)[0])
    out, filled = None, 0

    def read(it):
        nonlocal out, filled
        values = it.get_tensor(tensor_index)
        rows = it.get_input_details()[0]["shape"][0]
        if values.ndim == 0 or values.shape[0] != rows:
            raise InputError(f"tensor {tensor_index} of shape {values.shape} has no batch axis to capture")
        if out is None:
            out = cache.empty((n, *values.shape[1:]), values.dtype)
        out[filled:filled + rows] = values
        filled += rows
        return []  # the values are in out, their batch axis checked above

    runtime.run_batches(interpreter, x, batch_size, read)
    del interpreter
    runtime.trim()
    return out
