"""What the container does to a weight tensor at an error bound: its stream, its sizes, the values it
decodes to. The assessment measures exactly these (tests check them against pack_model's)."""

from __future__ import annotations

from typing import Optional

import numpy as np

from pydsz.encode import pack
from pydsz.format import codec, delta

# A float layer's `bound 0` option is its bytes in the container's zstd section, sized in parts of
# this many bytes, each its own task: compressing them is the slowest single step of a large layer's
# assessment (AlexNet's fc6, 151 MB: ~45 s), which a cluster then shares out. Their sizes add up to
# the whole's to within ~0.1% (pack.lossless_size).
LOSSLESS_PART = 16 << 20


def matrix(w: np.ndarray) -> np.ndarray:
    """A weight tensor as the sparse codec stores it: [first axis, the rest]."""
    return codec.stored_array(w).reshape(w.shape[0] if w.ndim else 1, -1)


def encode_weight(w: np.ndarray, bound: float,
                  pattern: Optional[codec.SparseIndex] = None) -> tuple[np.ndarray, int, int, int]:
    """What the container does to a weight tensor: (decoded values, stream bytes, data, index bytes).

    The bound is absolute for float weights and in quantization steps for int8/uint8 ones (which
    are decoded to their integers). Bound 0 keeps it lossless (zstd, as the container stores it;
    integers: their entropy coding where smaller). A tensor that is mostly non-zero
    may go to the dense codec when that is smaller, as the container decides. pattern: the
    tensor's codec.sparse_index, when it is encoded at many bounds (the same answers, faster).
    """
    w = codec.stored_array(w)  # float16 and int8 weights are encoded as the model stores them
    if bound == 0 and w.dtype.kind == "f":
        size = sum(pack.lossless_size(part) for part in lossless_parts(w))
        return as_weight(w, w.shape), size, size, 0
    stream, dense, sizes = encode(w, bound, pattern)
    if bound == 0 and (size := pack.lossless_size(w)) <= sizes[0]:
        sizes = (size, size, 0)  # integers: the container keeps the smaller of the two
    return as_weight(decode(stream, dense), w.shape), *sizes


def encode(w: np.ndarray, bound: float, pattern: Optional[codec.SparseIndex]) -> tuple[bytes, bool, tuple]:
    """encode_weight's stream of stored weights w: (its bytes, whether the dense codec's rather than
    the sparse one's, (stream, data, index bytes))."""
    stream = codec.encode_sparse(matrix(w), bound, index=pattern)
    dense = codec.compress_array(w, bound) if np.count_nonzero(w) > w.size // 2 else None
    if dense is not None and len(dense) < len(stream):
        return dense, True, (len(dense), len(dense), 0)
    info = codec.sparse_info(stream)
    return stream, False, (len(stream), int(info["data_bytes"]), int(info["index_bytes"]))


# the codec of a stream coded as its difference from values a device holds (a model update)
DELTA = "delta"


def encode_update(w: np.ndarray, held: Optional[np.ndarray], bound: float,
                  pattern: Optional[codec.SparseIndex] = None) -> tuple[bytes, object, tuple]:
    """A changed layer of a model update at `bound`: its difference from the `held` float32 values
    (pydsz.format.delta; codec DELTA) where that is smaller than its values afresh (encode's), which
    it is unless the layer moved about as far as its own scale or the held values are far from it.
    held None: afresh."""
    stream, dense, sizes = encode(codec.stored_array(w), bound, pattern)
    difference = delta.encode(w, held, bound) if held is not None else None
    if difference is not None and len(difference) < len(stream):
        return difference, DELTA, (len(difference), len(difference), 0)
    return stream, dense, sizes


def decode(stream: bytes, dense: bool) -> np.ndarray:
    return codec.decompress_array(stream) if dense else codec.decode_sparse(stream)


def lossless_parts(w: np.ndarray) -> list:
    """The tensor's bytes in LOSSLESS_PART pieces (views, no copy), at least one."""
    data = memoryview(np.ascontiguousarray(w)).cast("B")
    return [data[i:i + LOSSLESS_PART] for i in range(0, max(len(data), 1), LOSSLESS_PART)]


def as_weight(decoded: np.ndarray, shape: tuple) -> np.ndarray:
    """Decoded values as the evaluator takes them: float32 (float16 widened exactly), or the stored
    integers, which TFLiteModel.replace() writes as they are."""
    decoded = decoded.reshape(shape)
    return decoded.astype(np.float32, copy=False) if decoded.dtype.kind == "f" else decoded


