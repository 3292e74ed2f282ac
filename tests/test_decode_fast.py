"""The fused sparse decoder's fast path (Huffman-coded gaps and values, predictor none), which only
large streams reach: it must keep every promise of the batched path it stands in for, on outliers,
codes longer than the lookup table, filler gaps and corrupt bytes, in every dtype."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydsz.errors import FormatError
from pydsz.format import codec

DTYPES = [np.float32, np.float16, np.int8, np.uint8]


def matrix(dtype, seed: int, density: float, rows: int = 120, cols: int = 1500) -> np.ndarray:
    """Heavy-tailed non-zeros (many symbols, hence long codes, and outliers past a small radius), with
    bands of empty rows (gaps past 255, hence fillers)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_cauchy((rows, cols)) * 4
    w[rng.random((rows, cols)) >= density] = 0
    w[rng.integers(0, rows, rows // 8)] = 0
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        w = np.rint(w).clip(info.min, info.max)
    elif dtype == np.float16:
        w = w.clip(-6e4, 6e4)
    return w.astype(dtype)


def encode(w, bound, radius):
    return codec.encode_sparse(w, bound, index_codec="huffgap", predictor="none", radius=radius)


@settings(max_examples=30, deadline=None)
@given(dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16), density=st.floats(0.01, 0.9),
       radius=st.sampled_from([8, 64, 4096]), steps=st.integers(0, 3))
def test_bound_zeros_and_outliers_hold(dtype, seed, density, radius, steps):
    w = matrix(dtype, seed, density)
    integer = np.issubdtype(dtype, np.integer)
    bound = steps if integer else 10.0 ** -(steps + 1)
    y = codec.decode_sparse(encode(w, bound, radius))
    assert y.dtype == w.dtype and y.shape == w.shape
    assert np.array_equal(y == 0, w == 0)  # positions exact; a non-zero never decodes to zero
    assert np.all(np.abs(y.astype(np.float64) - w.astype(np.float64)) <= bound)


def test_the_fast_path_meets_outliers_long_codes_and_fillers():
    """What the property test relies on being there, checked on one stream of each dtype."""
    for dtype in DTYPES:
        w = matrix(dtype, 1, 0.2)
        flat = w.reshape(-1)
        gaps = np.diff(np.flatnonzero(flat))
        assert gaps.max() > 255  # fillers
        info = codec.sparse_info(encode(w, 0 if np.issubdtype(dtype, np.integer) else 1e-3, 8))
        assert info["nnz"] == np.count_nonzero(w)
        y = codec.decode_sparse(encode(w, 0 if np.issubdtype(dtype, np.integer) else 1e-3, 8))
        assert np.array_equal(y == 0, w == 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_corrupt_bitstreams_are_refused_or_decode_in_bounds(dtype):
    """Bytes flipped across the data and index bitstreams of a stream long enough for the fast path:
    a FormatError, or an array of the declared shape (the frame has no checksum); never a crash."""
    w = matrix(dtype, 3, 0.3)
    stream = encode(w, 0 if np.issubdtype(dtype, np.integer) else 1e-3, 64)
    rng = np.random.default_rng(4)
    refused = 0
    for at in rng.integers(100, len(stream), 60):
        flipped = bytearray(stream)
        flipped[at] ^= 1 << int(rng.integers(8))
        try:
            y = codec.decode_sparse(bytes(flipped))
        except FormatError:
            refused += 1
            continue
        assert y.shape == w.shape and y.dtype == w.dtype
    assert refused > 0
    for cut in rng.integers(100, len(stream), 20):
        with pytest.raises(FormatError):
            codec.decode_sparse(stream[:cut])


@pytest.mark.parametrize("radius", [32768, 1 << 20])
def test_more_symbols_than_a_15_bit_code_holds_are_coded_within_a_smaller_radius(radius):
    """Over 2^15 distinct quantization symbols (a large radius, a fine bound, heavy tails): no
    length-limited Huffman code holds them, so the encoder quantizes within 2^14 instead, the values
    beyond it verbatim, and the frame records that radius (it used to refuse the bound)."""
    w = matrix(np.float32, 0, 0.9)
    stream = encode(w, 1e-4, radius)
    assert codec.sparse_info(stream)["radius"] == 1 << 14
    assert np.all(np.abs(codec.decode_sparse(stream).astype(np.float64) - w) <= 1e-4)
