"""Which device runs the heavy parts: `available()`, `resolve("cpu" | "gpu" | "auto")`, `name()`.

pycuda is an optional extra (`pip install pydsz[gpu]`) and is imported only here and in
pydsz/gpu/_cuda.py, lazily, so that pydsz works without it.
"""

from __future__ import annotations

import functools
from typing import Optional

from pydsz.errors import InputError

DEVICES = ("cpu", "gpu", "auto")


@functools.lru_cache(maxsize=None)
def missing() -> Optional[str]:
    """Why the GPU path cannot run here, or None when it can. Never raises."""
    try:
        import pycuda.driver as cuda
    except ImportError:
        return "pycuda is not installed (pip install pydsz[gpu])"
    except Exception as exc:  # pycuda present but its driver library cannot load
        return f"pycuda cannot load the CUDA driver ({type(exc).__name__}: {exc})"
    try:
        cuda.init()
        if cuda.Device.count() == 0:
            return "no CUDA device is present"
    except Exception as exc:
        return f"no CUDA device is usable ({type(exc).__name__}: {exc})"
    return None


def available() -> bool:
    """True when pycuda imports and a CUDA device is present. Never raises."""
    return missing() is None


def resolve(device: str = "auto") -> str:
    """The device to use, "cpu" or "gpu", for a request "cpu", "gpu" or "auto".

    "auto" takes the GPU when one is available. InputError when "gpu" is asked for and
    there is none (the message says what is missing) or the request is none of the three.
    """
    if device not in DEVICES:
        raise InputError(f"device must be one of {', '.join(DEVICES)}, not {device!r}")
    if device == "cpu":
        return "cpu"
    why = missing()
    if why is None:
        return "gpu"
    if device == "gpu":
        raise InputError(f"--device gpu: {why}")
    return "cpu"


def name() -> str:
    """The name of the CUDA device the GPU path runs on (device 0), e.g. "NVIDIA H100 80GB HBM3"."""
    why = missing()
    if why is not None:
        raise InputError(f"no GPU: {why}")
    import pycuda.driver as cuda

    return cuda.Device(0).name()
