"""Deep Compression (Han, Mao, Dally, ICLR 2016) as a baseline: prune, share weights, Huffman-code.

Per FC layer of the pruned model: the non-zeros are clustered by 1-D k-means (32 clusters for FC
layers, centroids initialized linearly over the weights' range, as the paper recommends); each
entry stores its cluster's index and its distance from the previous entry in 5 bits (FC layers),
with a filler entry wherever a distance exceeds 32. Both index streams are Huffman-coded. The
codebook (float32 centroids) and the Huffman tables are stored too. Fillers take a symbol of
their own in the cluster alphabet and decode to an exact zero. The paper fine-tunes the centroids
by retraining; that is not done here (no gradient path to the shared weights through the cached
activations that would be honest to call the same), so this is Deep Compression without the
centroid fine-tuning.
"""

from __future__ import annotations

import struct

import numpy as np

from pydsz.bench.baselines import huffman, pack_shape, positions_of, relative_index, unpack_shape
from pydsz.errors import FormatError, InputError

CLUSTERS = 32
INDEX_BITS = 5
ITERATIONS = 100
_CLUSTERS = struct.Struct("<H")


def _assign(values: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Each value's nearest centroid (centroids sorted ascending)."""
    return np.searchsorted((centroids[1:] + centroids[:-1]) / 2, values)


def kmeans(values: np.ndarray, clusters: int) -> tuple[np.ndarray, np.ndarray]:
    """(float32 centroids ascending, each value's nearest one) by Lloyd's iterations from a linear
    initialization over [min, max]. In 1-D the centroids stay sorted; an empty cluster keeps its place."""
    values = np.asarray(values, np.float64)
    if values.size == 0:
        return np.zeros(clusters, np.float32), np.zeros(0, np.int64)
    centroids = np.linspace(values.min(), values.max(), clusters)
    for _ in range(ITERATIONS):
        labels = _assign(values, centroids)
        counts = np.bincount(labels, minlength=clusters)
        sums = np.bincount(labels, values, minlength=clusters)
        updated = np.where(counts > 0, sums / np.maximum(counts, 1), centroids)
        if np.array_equal(updated, centroids):
            break
        centroids = updated
    codebook = centroids.astype(np.float32)
    return codebook, _assign(values, codebook.astype(np.float64))


def encode(w: np.ndarray, clusters: int = CLUSTERS) -> bytes:
    """Shape, the codebook, the Huffman-coded cluster indices, the Huffman-coded relative index."""
    if not 1 <= int(clusters) <= 1 << 15:
        raise InputError(f"clusters {clusters}: must be in 1..32768")
    clusters = int(clusters)
    w = np.ascontiguousarray(w, np.float32)
    index, positions = relative_index(w, INDEX_BITS)
    values = w.reshape(-1)[positions]
    filler = values == 0
    codebook, labels = kmeans(values[~filler], clusters)
    symbols = np.full(values.size, clusters, np.int64)  # the filler symbol
    symbols[~filler] = labels
    return (pack_shape(w.shape) + _CLUSTERS.pack(clusters) + codebook.tobytes()
            + huffman.encode(symbols, clusters + 1) + huffman.encode(index, 1 << INDEX_BITS))


def decode(buf: bytes) -> np.ndarray:
    """The dense float32 tensor: each entry's centroid at its position, fillers and the rest zero."""
    shape, pos = unpack_shape(buf, "Deep Compression stream")
    if len(buf) < pos + _CLUSTERS.size:
        raise FormatError("Deep Compression stream: truncated")
    (clusters,) = _CLUSTERS.unpack_from(buf, pos)
    pos += _CLUSTERS.size
    if len(buf) < pos + 4 * clusters:
        raise FormatError("Deep Compression stream: truncated codebook")
    values = np.append(np.frombuffer(buf, "<f4", clusters, pos), np.float32(0))  # filler: zero
    symbols, pos = huffman.decode(buf, pos + 4 * clusters)
    index, pos = huffman.decode(buf, pos)
    if pos != len(buf) or symbols.size != index.size or (symbols.size and symbols.max() > clusters):
        raise FormatError("Deep Compression stream: cluster and position indices do not match")
    size = int(np.prod(shape))
    out = np.zeros(size, np.float32)
    out[positions_of(index, size, "Deep Compression stream")] = values[symbols]
    return out.reshape(shape)
