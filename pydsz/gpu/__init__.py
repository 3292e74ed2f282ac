"""The GPU path (optional extra `pip install pydsz[gpu]`): PyCUDA kernels for the heavy parts.

- device: `available()`, `resolve("cpu" | "gpu" | "auto")`, `name()`; what `--device` chooses
- quantize: libdsz's quantizer on the GPU (codes, histograms for many bounds, reconstructions)
- sweep: the assessment sweep (one layer quantized at many bounds, the FC tail, top-1 counts)
- train: masked Adam steps and gradients for retraining the FC tail
- reference: the numpy side of all of it, the answers the GPU must give

Only `device` is imported here; the rest imports pycuda when first used.
"""

from pydsz.gpu.device import available, name, resolve

__all__ = ["available", "name", "resolve"]
