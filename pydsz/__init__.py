"""pydsz: DeepSZ, error-bounded lossy compression of neural network weights.

`pip install pydsz` is the decoder: numpy, zstandard and the compiled extension, enough to turn a
.dsz back into .tflite bytes; decoding imports nothing more (pydsz.format). Encoding models needs the
encoder side (pip install pydsz[server]), whose entry points here load on first use; running them a
TFLite runtime (pydsz[litert] or pydsz[tflite]).

    pydsz.load(path).tflite_bytes()                      decode a .dsz
    pydsz.compress_model(tflite, x, y, pydsz.Budget("top1", 0.003))  the main job: the smallest .dsz
                                                         within a loss budget (its Result's .dsz)
    pydsz.prune_model(tflite, (x, y), (x_val, y_val), 0.9)            magnitude pruning + retraining
    pydsz.prune_oneshot(tflite, x_calib, (x_val, y_val), 0.5)         SparseGPT from calibration inputs
    pydsz.pack_model(tflite, 0.005)                      compress with bounds given
    pydsz.diff_model(held, new, x, y, 0.003).update      the update from the model a device holds to a new one
    pydsz.patch(held, update)                            apply it on the device: the new .tflite bytes

Bad input raises pydsz.InputError, a corrupt file pydsz.FormatError: both are pydsz.DszError.
"""
from pathlib import Path

try:
    from pydsz import _core  # noqa: F401  (the compiled extension: everything below needs it)
except ImportError as exc:  # a source folder without its build shadows the installed package
    raise ImportError(
        f"pydsz's compiled extension (pydsz._core) is not in {Path(__file__).parent}: this is a source folder "
        "that was not built in place, imported instead of the installed pydsz (run from another folder, or "
        "install the checkout with pip install -e .)") from exc

from pydsz.context import Run
from pydsz.errors import DszError, FormatError, InputError
from pydsz.format.codec import (
    compress_array,
    decode_sparse,
    decode_sparse_csr,
    decompress_array,
    encode_sparse,
    sparse_info,
)
from pydsz.format.container import DszModel, load
from pydsz.format.update import patch

__version__ = "0.1.0"

# the encoder's entry points, imported when first asked for: a device that only decodes never loads them
_ENCODER = {
    "pack_model": ("pydsz.encode.pack", "pack_model"),
    "write_model": ("pydsz.encode.pack", "write_model"),
    "compress_model": ("pydsz.compress.pipeline", "compress"),
    "prune_model": ("pydsz.prune.retraining", "prune_model"),
    "prune_oneshot": ("pydsz.prune.oneshot", "prune_model"),
    "diff_model": ("pydsz.compress.diff", "diff"),
    "Budget": ("pydsz.budget.rule", "Budget"),
    "Retraining": ("pydsz.prune.train", "Retraining"),
    "Compensation": ("pydsz.compress.compensation", "Compensation"),
}

__all__ = [
    "compress_array", "decompress_array", "encode_sparse", "decode_sparse", "decode_sparse_csr", "sparse_info",
    "load", "DszModel", "patch", "Run", "DszError", "FormatError", "InputError", *_ENCODER,
]


def __getattr__(name: str):
    if name in _ENCODER:
        import importlib

        module, attribute = _ENCODER[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'pydsz' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_ENCODER))
