"""The baselines of `dsz bench`: each decodes to the weights it claims, within its own error."""

import numpy as np
import pytest

from pydsz.assess.ladder import Point
from pydsz.bench.baselines import deep_compression, huffman, lossless, positions_of, quantized, relative_index
from pydsz.errors import FormatError


def pruned(shape=(60, 90), keep=0.08, seed=0, scale=0.05):
    rng = np.random.default_rng(seed)
    w = rng.laplace(0, scale, shape).astype(np.float32)
    w[rng.random(shape) > keep] = 0
    return w


def test_relative_index_inserts_fillers_and_decodes_to_the_positions():
    w = np.zeros(200, np.float32)
    w[[0, 5, 70, 199]] = 1
    symbols, positions = relative_index(w, 5)
    # gaps of at most 32: fillers at 37 and 69 before 70, at 102, 134, 166 and 198 before 199
    assert list(positions) == [0, 5, 37, 69, 70, 102, 134, 166, 198, 199]
    assert symbols.max() < 32
    assert np.array_equal(positions_of(symbols, w.size, "t"), positions)


def test_relative_index_past_the_end_is_a_format_error():
    with pytest.raises(FormatError):
        positions_of(np.array([10, 10]), 15, "t")


FIBONACCI = [1, 1]
while len(FIBONACCI) < 22:
    FIBONACCI.append(FIBONACCI[-1] + FIBONACCI[-2])


# Fibonacci counts make the deepest Huffman tree: 21 bits unless limited
@pytest.mark.parametrize("counts", [[5], [1, 1], [100, 1, 1, 3, 0, 7], FIBONACCI])
def test_huffman_round_trip(counts):
    rng = np.random.default_rng(1)
    symbols = rng.permutation(np.repeat(np.arange(len(counts)), counts))
    buf = huffman.encode(symbols, len(counts))
    decoded, end = huffman.decode(buf + b"tail")
    assert np.array_equal(decoded, symbols) and end == len(buf)
    assert huffman.code_lengths(counts).max() <= huffman.MAX_BITS


def test_huffman_payload_is_near_the_entropy():
    rng = np.random.default_rng(2)
    symbols = rng.geometric(0.3, 20000) - 1
    counts = np.bincount(symbols)
    entropy_bytes = -(counts[counts > 0] * np.log2(counts[counts > 0] / counts.sum())).sum() / 8
    assert len(huffman.encode(symbols, counts.size)) < 1.03 * entropy_bytes + 64


def test_huffman_truncated_stream_is_a_format_error():
    buf = huffman.encode(np.arange(50) % 7, 7)
    with pytest.raises(FormatError):
        huffman.decode(buf[:-3])


@pytest.mark.parametrize("clusters", [4, 32])
def test_deep_compression_decodes_every_weight_to_its_nearest_centroid(clusters):
    w = pruned()
    buf = deep_compression.encode(w, clusters)
    d = deep_compression.decode(buf)
    assert np.array_equal(d == 0, w == 0)  # positions exact, fillers decode to zero
    codebook = np.unique(d[d != 0])
    assert len(codebook) <= clusters
    nonzero = w[w != 0]
    nearest = codebook[np.abs(nonzero[:, None] - codebook[None, :]).argmin(axis=1)]
    assert np.array_equal(d[w != 0], nearest)


def test_deep_compression_kmeans_starts_linear_and_converges():
    values = np.concatenate([np.full(50, -1.0), np.full(50, 2.0)])
    codebook, labels = deep_compression.kmeans(values, 2)
    assert list(codebook) == [-1.0, 2.0] and list(np.bincount(labels)) == [50, 50]


def test_deep_compression_corrupt_stream_is_a_format_error():
    buf = deep_compression.encode(pruned(), 8)
    with pytest.raises(FormatError):
        deep_compression.decode(buf[:-1])


def test_int8_per_channel_error_within_half_a_step():
    w = pruned(keep=0.5)
    d = quantized.decode(quantized.encode(w, 8))
    steps = quantized.scales(w, 8)
    assert np.all(np.abs(d - w) <= steps[:, None] / 2 * (1 + 1e-6))
    assert np.all(d[w == 0] == 0)


def test_float16_is_the_half_precision_values():
    w = pruned(keep=0.5)
    d = quantized.decode(quantized.encode(w, quantized.FLOAT16))
    assert np.array_equal(d, w.astype(np.float16).astype(np.float32))


def test_quantized_rejects_a_bad_width():
    with pytest.raises(ValueError):
        quantized.encode(pruned(), 9)


def test_lossless_is_exact():
    w = pruned()
    assert np.array_equal(lossless.decode(lossless.encode(w)), w)
    raw = bytes(range(256)) * 20
    assert lossless.unfit(lossless.best_fit(raw)) == raw


@pytest.mark.parametrize("bound", [1e-3, 9e-3])
def test_deepsz_decodes_within_its_bound(bound):
    pytest.importorskip("hdf5plugin")
    from pydsz.bench.baselines import deepsz

    w = pruned(shape=(40, 700), keep=0.03)  # gaps beyond 256: fillers in the data array
    d = deepsz.decode(deepsz.encode(w, bound))
    assert np.abs(d - w).max() <= bound
    _, fillers = relative_index(w, 8)
    untouched = np.ones(w.size, bool)
    untouched[fillers] = False
    assert np.all(d.reshape(-1)[untouched & (w.reshape(-1) == 0)] == 0)


def test_deepsz_index_is_eight_bit_gaps():
    pytest.importorskip("hdf5plugin")
    from pydsz.bench.baselines import deepsz

    w = pruned(shape=(40, 700), keep=0.03)
    _, _, index = deepsz.sections(deepsz.encode(w, 5e-3))
    symbols, _ = relative_index(w, 8)
    assert lossless.unfit(index) == symbols.astype(np.uint8).tobytes()


def test_deepsz_optimizer_adds_the_losses():
    from pydsz.bench.baselines import deepsz

    def pts(name, sizes, drops):
        return [Point(name, b, s, s, 0, d) for b, s, d in zip((1e-3, 2e-3, 3e-3), sizes, drops)]

    table = {"fc1": pts("fc1", [300, 200, 100], [0, 2, 5]), "fc2": pts("fc2", [90, 60, 30], [0, 1, 4])}
    assert deepsz.choose(table, 6, 1000) == {"fc1": 3e-3, "fc2": 2e-3}  # 5 + 1 samples, 160 bytes
    assert deepsz.choose(table, 9, 1000) == {"fc1": 3e-3, "fc2": 3e-3}
    assert deepsz.choose(table, 0, 1000) == {"fc1": 1e-3, "fc2": 1e-3}
    costly = {"fc1": pts("fc1", [300, 200, 100], [3, 4, 5])}
    assert deepsz.choose(costly, 2, 1000) == {"fc1": 1e-3}  # nothing fits: the grid's tightest bound
