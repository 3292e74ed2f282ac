"""Sparse streams decoded straight into CSR: the same arrays as the dense decode's CSR, untrusted input refused."""

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydsz import _core
from pydsz.errors import FormatError, InputError
from pydsz.format import codec
from pydsz.model.sparse import CSR

# a bound per dtype: float bounds, whole steps of the integer types
BOUNDS = {np.float32: st.sampled_from([1e-4, 1e-2, 0.5, 10.0]), np.float16: st.sampled_from([1e-3, 1e-2, 0.5]),
          np.int8: st.integers(0, 5), np.uint8: st.integers(0, 5)}


def matrix(rows, cols, density, seed, dtype, special=False):
    """A pruned matrix of the dtype; `special` puts infinities and NaN among a float32 one's non-zeros."""
    rng = np.random.default_rng(seed)
    w = rng.laplace(0, 0.05 if dtype in (np.float32, np.float16) else 40, (rows, cols))
    w[rng.random((rows, cols)) >= density] = 0
    if rows > 2:
        w[1] = 0  # an empty row
    if dtype in (np.int8, np.uint8):
        info = np.iinfo(dtype)
        w = np.clip(np.where(w > 0, np.ceil(w), np.floor(w)), info.min, info.max)  # a non-zero stays one
    w = w.astype(dtype)
    if special and w.size:
        flat = w.reshape(-1)
        for k, v in zip(rng.integers(0, flat.size, 3), (np.inf, -np.inf, np.nan)):
            flat[k] = v
    return w


def assert_same_csr(a: CSR, b: CSR):
    assert a.shape == b.shape
    assert a.row_ptr.dtype == np.int64 and a.col_index.dtype == np.int32 and a.values.dtype == np.float32
    assert np.array_equal(a.row_ptr, b.row_ptr)
    assert np.array_equal(a.col_index, b.col_index)
    assert a.values.tobytes() == b.values.tobytes()  # bit for bit, NaN payloads included


@settings(max_examples=150, deadline=None)
@given(data=st.data(), rows=st.integers(0, 30), cols=st.integers(0, 700), density=st.floats(0, 1),
       seed=st.integers(0, 2**16), dtype=st.sampled_from([np.float32, np.float16, np.int8, np.uint8]),
       index_codec=st.sampled_from(["gap8", "huffgap", "bitmap"]), predictor=st.sampled_from(["none", "lorenzo"]))
def test_property_from_stream_equals_from_dense_of_the_decode(data, rows, cols, density, seed, dtype, index_codec,
                                                              predictor):
    w = matrix(rows, cols, density, seed, dtype, special=dtype == np.float32 and seed % 4 == 0)
    bound = data.draw(BOUNDS[dtype])
    s = codec.encode_sparse(w, bound, index_codec=index_codec, predictor=predictor)
    got = CSR.from_stream(s)
    assert_same_csr(got, CSR.from_dense(codec.decode_sparse(s)))
    assert len(got.values) == np.count_nonzero(w)  # every stored non-zero is an entry


@pytest.mark.parametrize("index_codec", ["gap8", "huffgap", "bitmap"])
def test_a_large_layer_takes_the_fused_decoders_path_and_still_agrees(index_codec):
    # long enough for the dense decoder's fast path (huffgap, predictor none) and many batches
    w = matrix(300, 2000, 0.09, 7, np.float32)
    s = codec.encode_sparse(w, 1e-3, index_codec=index_codec, predictor="none")
    assert_same_csr(CSR.from_stream(s), CSR.from_dense(codec.decode_sparse(s)))


def test_decode_sparse_csr_gives_the_three_arrays():
    w = matrix(4, 6, 0.5, 1, np.float32)
    row_ptr, col_index, values = codec.decode_sparse_csr(codec.encode_sparse(w, 1e-6))
    rows, cols = np.nonzero(w)
    assert np.array_equal(row_ptr, np.searchsorted(rows, np.arange(5)))
    assert np.array_equal(col_index, cols)
    assert np.allclose(values, w[rows, cols], atol=1e-6, rtol=0)


@pytest.mark.parametrize("index_codec", ["gap8", "huffgap", "bitmap"])
def test_truncation_at_every_offset_raises(index_codec):
    s = codec.encode_sparse(matrix(10, 40, 0.3, 2, np.float32), 1e-2, index_codec=index_codec)
    for k in range(len(s)):
        with pytest.raises(FormatError):
            CSR.from_stream(s[:k])


@pytest.mark.parametrize("index_codec", ["gap8", "huffgap", "bitmap"])
def test_bit_flips_fail_as_the_dense_decode_does_or_agree_with_it(index_codec):
    rng = np.random.default_rng(3)
    s = codec.encode_sparse(matrix(20, 30, 0.2, 4, np.float32), 1e-2, index_codec=index_codec)
    outcomes = set()
    for _ in range(1500):
        m = bytearray(s)
        m[int(rng.integers(len(m)))] ^= 1 << int(rng.integers(8))
        try:
            info = codec.sparse_info(bytes(m))
            if info["rows"] * info["cols"] > 10**6 or info["rows"] > 10**6:
                continue  # a flipped header's matrix: decodable, but too large to compare here
            dense = codec.decode_sparse(bytes(m))
        except FormatError:
            with pytest.raises(FormatError):
                codec.decode_sparse_csr(bytes(m))
            outcomes.add("failed")
            continue
        row_ptr, col_index, values = codec.decode_sparse_csr(bytes(m))
        # a forged stream may decode a non-zero to 0, which from_dense would drop: compare the matrices
        back = np.zeros(dense.shape, np.float32)
        back[np.repeat(np.arange(dense.shape[0]), np.diff(row_ptr)), col_index] = values
        assert back.tobytes() == dense.tobytes()
        outcomes.add("decoded")
    assert outcomes == {"failed", "decoded"}


def test_an_array_stream_is_refused():
    with pytest.raises(FormatError, match="array"):
        codec.decode_sparse_csr(codec.compress_array(np.eye(3, dtype=np.float32), 1e-3))


def test_more_than_2_31_columns_is_an_input_error():
    s = codec.encode_sparse(np.zeros((0, 2**31 + 1), np.float32), 1e-3)
    with pytest.raises(InputError, match="2\\^31"):
        CSR.from_stream(s)



def test_a_matrix_without_columns_has_a_zero_pointer_per_row():
    row_ptr, col_index, values = codec.decode_sparse_csr(codec.encode_sparse(np.zeros((5, 0), np.float32), 1e-3))
    assert row_ptr.tolist() == [0] * 6 and col_index.size == values.size == 0


def test_a_corrupt_stream_of_2_40_rows_without_columns_fails_before_allocating_their_pointers():
    s = _core.encode_sparse(np.zeros((5, 0), np.float32), 1e-3, 1e-3, 0, 0, 32768, 0)  # sections raw
    info = _core.frame_info(s)
    body = bytearray(s[info["header_size"]:])
    body[0] = 1  # one outlier declared among no values
    info.update(shape=(1 << 40, 0))
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match="corruption"):
            codec.decode_sparse_csr(_core.write_header(info) + bytes(body))
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()
