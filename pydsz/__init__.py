"""pydsz: DeepSZ, error-bounded lossy compression of neural network weights.

`pip install pydsz` is the decoder: numpy, zstandard and the compiled extension, enough to turn a
.dsz back into .tflite bytes; decoding imports nothing more (pydsz.format). Encoding models needs the
encoder side (pip install pydsz[server]), whose entry points here load on first use; running them a
TFLite runtime (pydsz[litert] or pydsz[tflite]).
"""
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

__version__ = "0.1.0"

# the encoder's entry points, imported when first asked for: a device that only decodes never loads them
_ENCODER = {"pack_model": "pydsz.encode.pack", "write_model": "pydsz.encode.pack"}

__all__ = [
    "compress_array", "decompress_array", "encode_sparse", "decode_sparse", "decode_sparse_csr", "sparse_info",
    "pack_model", "write_model", "load", "DszModel",
    "DszError", "FormatError", "InputError",
]


def __getattr__(name: str):
    if name in _ENCODER:
        import importlib

        return getattr(importlib.import_module(_ENCODER[name]), name)
    raise AttributeError(f"module 'pydsz' has no attribute {name!r}")
