"""A TFLite interpreter for decoded model bytes: what a device needs to run a .dsz after decoding it.

Three runtimes are supported, tried in this order: ai-edge-litert (LiteRT, works with numpy 2),
tflite-runtime (the last release needs numpy < 2) and tensorflow.lite. The environment variable
DSZ_RUNTIME=litert|tflite-runtime|tensorflow forces one.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from typing import Optional

from pydsz.errors import DszError, InputError

RUNTIMES = {
    "litert": ("ai_edge_litert.interpreter", "Interpreter"),
    "tflite-runtime": ("tflite_runtime.interpreter", "Interpreter"),
    "tensorflow": ("tensorflow", "lite.Interpreter"),  # the public tf.lite, not the tensorflow.lite package
}


_INSTALL_HINT = ("install one: pip install pydsz[litert] (ai-edge-litert), "
                 "pip install pydsz[tflite] (tflite-runtime with numpy < 2; 32-bit ARM too) or pip install tensorflow")


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


# XNNPACK, the runtimes' default delegate, repacks a model's float weights into a copy of its own
# (VGG-16's FC layers: +470 MiB); a model larger than this runs on the builtin kernels, which read
# the weights where they are (+12 MiB). A model and its decoded .dsz have the same size, so both
# run on the same kernels and their outputs compare.
REPACK_LIMIT = 64 << 20


def make_interpreter(model, num_threads: Optional[int] = None, preserve_all_tensors: bool = False,
                     runtime: Optional[str] = None):
    """An interpreter for a model given as bytes (or bytearray, memoryview, TFLiteModel).

    preserve_all_tensors keeps intermediate tensors readable after invoke(); without it the
    runtime may reuse their memory.
    """
    content = bytes(getattr(model, "data", model))  # the Interpreter refuses bytearray
    cls = interpreter_class(runtime)
    kwargs = {"model_content": content, "num_threads": num_threads}
    if len(content) > REPACK_LIMIT:
        kwargs["experimental_op_resolver_type"] = \
            sys.modules[cls.__module__].OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    if preserve_all_tensors:
        kwargs["experimental_preserve_all_tensors"] = True
    try:
        with warnings.catch_warnings():
            # LiteRT warns that preserving tensors costs memory; capture() asks for it knowingly
            warnings.filterwarnings("ignore", message=".*preserve_all_tensors", category=UserWarning)
            return cls(**kwargs)
    except ValueError as exc:
        raise InputError(f"the TFLite runtime cannot load this model: {exc}") from exc
