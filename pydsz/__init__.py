"""pydsz: DeepSZ, error-bounded lossy compression of neural network weights.

`pip install pydsz` is the decoder: numpy, zstandard and the compiled extension, enough to turn a
.dsz back into .tflite bytes; decoding imports nothing more. Encoding models needs the encoder side
(pip install pydsz[server]); running them a TFLite runtime (pydsz[litert] or pydsz[tflite]).
"""
from .codec import compress_array, decode_sparse, decode_sparse_csr, decompress_array, encode_sparse, sparse_info
from .container import DszModel, load, pack_model, write_model
from .errors import DszError, FormatError, InputError

__version__ = "0.1.0"

__all__ = [
    "compress_array", "decompress_array", "encode_sparse", "decode_sparse", "decode_sparse_csr", "sparse_info",
    "pack_model", "write_model", "load", "DszModel",
    "DszError", "FormatError", "InputError",
]
