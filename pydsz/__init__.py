"""pydsz: DeepSZ, error-bounded lossy compression of neural network weights.

The decoder needs numpy and zstandard only; encoding models also needs the `tflite` package
(pip install pydsz[tools]).
"""
from .codec import compress_array, decode_sparse, decompress_array, encode_sparse, sparse_info
from .container import DszModel, load, pack_model, write_model
from .errors import DszError, FormatError, InputError

__version__ = "0.1.0"

__all__ = [
    "compress_array", "decompress_array", "encode_sparse", "decode_sparse", "sparse_info",
    "pack_model", "write_model", "load", "DszModel",
    "DszError", "FormatError", "InputError",
]
