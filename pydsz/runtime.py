"""TFLite interpreters: load one, run a model over a data set in batches, read intermediate tensors.

Three runtimes are supported, tried in this order: ai-edge-litert (LiteRT, works with numpy 2),
tflite-runtime (the last release needs numpy < 2) and tensorflow.lite. The environment variable
DSZ_RUNTIME=litert|tflite-runtime|tensorflow forces one.
"""

from __future__ import annotations

import importlib
import os
import warnings
from typing import Optional, Union

import numpy as np

from .errors import DszError, InputError

__all__ = ["RUNTIMES", "interpreter_class", "make_interpreter", "predict", "accuracy", "capture"]

RUNTIMES = {
    "litert": ("ai_edge_litert.interpreter", "Interpreter"),
    "tflite-runtime": ("tflite_runtime.interpreter", "Interpreter"),
    "tensorflow": ("tensorflow", "lite.Interpreter"),  # the public tf.lite, not the tensorflow.lite package
}
_INSTALL_HINT = ("install one: pip install pydsz[litert] (ai-edge-litert), "
                 "pip install pydsz[tflite] (tflite-runtime with numpy < 2; 32-bit ARM too) or pip install tensorflow")

DEFAULT_BATCH = 256


def _load(module: str, path: str):
    found = importlib.import_module(module)
    for name in path.split("."):
        found = getattr(found, name)
    return found


def interpreter_class(runtime: Optional[str] = None):
    """The Interpreter class of `runtime` (default: $DSZ_RUNTIME, else the first one installed)."""
    runtime = runtime or os.environ.get("DSZ_RUNTIME") or None
    if runtime is not None:
        if runtime not in RUNTIMES:
            raise DszError(f"unknown TFLite runtime {runtime!r} (DSZ_RUNTIME): choose one of {', '.join(RUNTIMES)}")
        try:
            return _load(*RUNTIMES[runtime])
        except (ImportError, AttributeError) as exc:
            raise DszError(f"TFLite runtime {runtime!r} is not usable ({exc}); {_INSTALL_HINT}") from exc
    for module, path in RUNTIMES.values():
        try:
            return _load(module, path)
        except (ImportError, AttributeError):
            continue
    raise DszError(f"no TFLite interpreter found; {_INSTALL_HINT}")


def make_interpreter(model, num_threads: Optional[int] = None, preserve_all_tensors: bool = False,
                     runtime: Optional[str] = None):
    """An interpreter for a model given as bytes (or bytearray, memoryview, TFLiteModel).

    preserve_all_tensors keeps intermediate tensors readable after invoke(); without it the
    runtime may reuse their memory.
    """
    content = bytes(getattr(model, "data", model))  # the Interpreter refuses bytearray
    cls = interpreter_class(runtime)
    kwargs = {"model_content": content, "num_threads": num_threads}
    if preserve_all_tensors:
        kwargs["experimental_preserve_all_tensors"] = True
    try:
        with warnings.catch_warnings():
            # LiteRT warns that preserving tensors costs memory; capture() asks for it knowingly
            warnings.filterwarnings("ignore", message=".*preserve_all_tensors", category=UserWarning)
            return cls(**kwargs)
    except ValueError as exc:
        raise InputError(f"the TFLite runtime cannot load this model: {exc}") from exc


def _interpreter(model, num_threads):
    return model if hasattr(model, "invoke") else make_interpreter(model, num_threads=num_threads)


def _run_batches(interpreter, x, batch_size: int, read):
    """Feed x to the single input in batches; collect read(interpreter) for each batch, in order."""
    inputs = interpreter.get_input_details()
    if len(inputs) != 1:
        raise InputError(f"the model has {len(inputs)} inputs; only single-input models can be run here")
    detail = inputs[0]
    sample_shape = tuple(int(d) for d in detail["shape"][1:])
    x = np.asarray(x)
    if x.ndim < 1 or x.shape[0] == 0:
        raise InputError(f"x must hold at least one sample along its first axis, got shape {x.shape}")
    have, need = int(np.prod(x.shape[1:], dtype=np.int64)), int(np.prod(sample_shape, dtype=np.int64))
    if have != need:
        raise InputError(f"x has samples of shape {x.shape[1:]} ({have} values) but the model takes {sample_shape}")
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    x = x.reshape((x.shape[0],) + sample_shape)
    dtype = detail["dtype"]
    index = detail["index"]
    results = []
    rows = None  # the batch size the interpreter is allocated for (None: not yet allocated here)
    start = 0
    while start < x.shape[0]:
        batch = np.ascontiguousarray(x[start:start + batch_size], dtype=dtype)
        try:
            if batch.shape[0] != rows:
                interpreter.resize_tensor_input(index, [batch.shape[0], *sample_shape])
                interpreter.allocate_tensors()
                rows = batch.shape[0]
            interpreter.set_tensor(index, batch)
            interpreter.invoke()
        except (RuntimeError, ValueError) as exc:
            if batch_size == 1:
                raise DszError(f"the TFLite interpreter failed on sample {start}: {exc}") from exc
            # some graphs hard-code a batch of 1 (e.g. a RESHAPE to [1, n]): go one sample at a time
            batch_size, rows = 1, None
            continue
        results.append(read(interpreter))
        start += batch.shape[0]
    return results


def predict(model, x, batch_size: int = DEFAULT_BATCH, num_threads: Optional[int] = None,
            output: int = 0) -> np.ndarray:
    """The model's output (number `output`) for every sample of x, stacked along the first axis.

    model: bytes, TFLiteModel or an interpreter. Each sample of x is reshaped to the input's
    shape when the value counts match and cast to the input's dtype as is (no quantization).
    """
    interpreter = _interpreter(model, num_threads)
    outputs = interpreter.get_output_details()
    if not 0 <= output < len(outputs):
        raise InputError(f"output {output} out of range: the model has {len(outputs)} output(s)")
    index = outputs[output]["index"]
    parts = _run_batches(interpreter, x, batch_size, lambda it: it.get_tensor(index).copy())
    return np.concatenate(parts, axis=0)


def top1(scores: np.ndarray, y) -> float:
    """Fraction of rows of scores whose largest entry is at the label y; checks the labels."""
    y = np.asarray(y)
    scores = scores.reshape(scores.shape[0], -1)
    if y.ndim != 1 or y.shape[0] != scores.shape[0]:
        raise InputError(f"y must be a vector of {scores.shape[0]} labels, got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise InputError(f"labels must be integers, got {y.dtype}")
    classes = scores.shape[1]
    if y.size and (y.min() < 0 or y.max() >= classes):
        raise InputError(f"labels range over {int(y.min())}..{int(y.max())} but the model has {classes} outputs")
    return float(np.mean(np.argmax(scores, axis=1) == y))


def accuracy(model, x, y, batch_size: int = DEFAULT_BATCH, num_threads: Optional[int] = None) -> float:
    """Top-1 accuracy of the model's first output on (x, y)."""
    y = np.asarray(y)
    if y.ndim != 1 or y.shape[0] != np.shape(x)[0]:
        raise InputError(f"y must be a vector of {np.shape(x)[0]} labels (one per sample of x), got shape {y.shape}")
    return top1(predict(model, x, batch_size=batch_size, num_threads=num_threads), y)


def capture(model, x, tensor_index: int, batch_size: int = DEFAULT_BATCH,
            num_threads: Optional[int] = None) -> np.ndarray:
    """The values of tensor `tensor_index` for every sample of x (e.g. the input of the first FC layer).

    model: bytes or TFLiteModel; the interpreter is built with all tensors preserved, since
    intermediates are otherwise unreliable.
    """
    if hasattr(model, "invoke"):
        raise InputError("capture needs the model's bytes, not an interpreter: it must preserve all tensors")
    interpreter = make_interpreter(model, num_threads=num_threads, preserve_all_tensors=True)
    n_tensors = len(interpreter.get_tensor_details())
    if not 0 <= tensor_index < n_tensors:
        raise InputError(f"tensor {tensor_index} out of range: the model has {n_tensors} tensors")

    def read(it):
        values = it.get_tensor(tensor_index)
        rows = it.get_input_details()[0]["shape"][0]
        if values.ndim == 0 or values.shape[0] != rows:
            raise InputError(f"tensor {tensor_index} of shape {values.shape} has no batch axis to capture")
        return values.copy()

    return np.concatenate(_run_batches(interpreter, x, batch_size, read), axis=0)
