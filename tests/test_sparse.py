"""Sparse weight matrices: exact positions, bounded values, index codecs, untrusted input."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pydsz.errors import DszError, FormatError
from pydsz.format import codec


def pruned(rows, cols, density, seed=0, dead_cols=0):
    w = np.random.default_rng(seed).laplace(0, 0.05, (rows, cols)).astype(np.float32)
    if density < 1 and w.size:
        w[np.abs(w) < np.quantile(np.abs(w), 1 - density)] = 0
    w[:, :dead_cols] = 0
    return w


def check(w, eb, **kw):
    b = codec.encode_sparse(w, eb, **kw)
    y = codec.decode_sparse(b)
    assert y.dtype == np.float32 and y.shape == w.shape
    assert np.array_equal(y != 0, w != 0), "non-zero positions must be exact"
    assert np.all(np.abs(y.astype(np.float64) - w.astype(np.float64)) <= eb)
    return b


@pytest.mark.parametrize("shape", [(0, 0), (0, 5), (5, 0), (1, 1000), (1000, 1), (37, 53), (300, 784)])
@pytest.mark.parametrize("index_codec", ["auto", "gap8", "huffgap", "bitmap"])
def test_round_trip_shapes(shape, index_codec):
    check(pruned(*shape, 0.08), 1e-2, index_codec=index_codec)


@pytest.mark.parametrize("density", [0.0, 0.002, 0.09, 0.5, 1.0])
def test_round_trip_densities(density):
    check(pruned(200, 300, density), 5e-3)


def test_long_gaps_use_fillers_without_data_slots():
    w = np.zeros((3, 5000), np.float32)
    w[0, 0], w[1, 4999], w[2, 2000] = 1.0, -2.0, 0.5
    for ic in ("gap8", "huffgap", "bitmap"):
        b = check(w, 1e-3, index_codec=ic)
        assert codec.sparse_info(b)["nnz"] == 3


def test_nonzero_never_decodes_to_zero_with_large_bound():
    w = pruned(50, 60, 0.2)
    check(w, 10.0)  # every value is within one step of 0; still non-zero after decoding


@settings(max_examples=100, deadline=None)
@given(w=hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, max_side=30),
                    elements=st.one_of(st.just(0.0), st.floats(width=32, allow_nan=False, allow_infinity=False))),
       eb=st.floats(min_value=1e-30, max_value=1e30),
       index_codec=st.sampled_from(["auto", "gap8", "huffgap", "bitmap"]))
def test_property_positions_exact_and_bound_holds(w, eb, index_codec):
    y = codec.decode_sparse(codec.encode_sparse(w, eb, index_codec=index_codec))
    assert np.array_equal(y != 0, w != 0)
    assert np.all(np.abs(y.astype(np.float64) - w.astype(np.float64)) <= eb)


def test_nonfinite_values_kept():
    w = np.zeros((4, 4), np.float32)
    w[0, 1], w[2, 2], w[3, 0] = np.nan, np.inf, -np.inf
    y = codec.decode_sparse(codec.encode_sparse(w, 1e-3))
    assert np.isnan(y[0, 1]) and y[2, 2] == np.inf and y[3, 0] == -np.inf


def test_info():
    w = pruned(100, 80, 0.1)
    b = codec.encode_sparse(w, 1e-2)
    info = codec.sparse_info(b)
    assert (info["rows"], info["cols"], info["nnz"]) == (100, 80, int((w != 0).sum()))
    assert info["error_bound"] == 1e-2 and info["predictor"] == "none"
    assert info["index_codec"] in ("gap8", "huffgap", "bitmap")
    assert info["header_bytes"] + info["data_bytes"] + info["index_bytes"] == info["total_bytes"] == len(b)


def test_auto_picks_smallest_gap_index_on_unstructured_matrix():
    w = pruned(300, 784, 0.08)
    sizes = {ic: len(codec.encode_sparse(w, 1e-2, index_codec=ic)) for ic in ("gap8", "huffgap", "bitmap")}
    auto = codec.encode_sparse(w, 1e-2)
    assert len(auto) == min(sizes["gap8"], sizes["huffgap"])
    assert codec.sparse_info(auto)["index_codec"] in ("gap8", "huffgap")


def test_auto_picks_bitmap_when_columns_are_dead():
    # MNIST-like first layer: border pixels pruned away entirely, denser elsewhere
    w = pruned(300, 784, 0.3)
    w[:, np.random.default_rng(5).random(784) < 0.4] = 0
    sizes = {ic: codec.sparse_info(codec.encode_sparse(w, 1e-2, index_codec=ic))["index_bytes"]
             for ic in ("gap8", "huffgap", "bitmap")}
    assert sizes["bitmap"] < 0.97 * min(sizes["gap8"], sizes["huffgap"])
    assert codec.sparse_info(codec.encode_sparse(w, 1e-2))["index_codec"] == "bitmap"


def test_relative_mode():
    w = pruned(100, 100, 0.1)
    nz = w[w != 0]
    b = codec.encode_sparse(w, 1e-3, mode="rel")
    eb = codec.sparse_info(b)["error_bound"]
    assert eb == pytest.approx(1e-3 * (float(nz.max()) - float(nz.min())))
    assert np.all(np.abs(codec.decode_sparse(b) - w) <= eb)


def test_bad_arguments():
    with pytest.raises(ValueError, match="2-D"):
        codec.encode_sparse(np.zeros(5, np.float32), 1e-3)
    with pytest.raises(ValueError, match="float32"):
        codec.encode_sparse(np.zeros((2, 2)), 1e-3)
    with pytest.raises(ValueError, match="index_codec"):
        codec.encode_sparse(np.zeros((2, 2), np.float32), 1e-3, index_codec="rle")
    with pytest.raises(ValueError, match="error_bound"):
        codec.encode_sparse(np.zeros((2, 2), np.float32), 0)


def test_array_and_sparse_streams_not_confused():
    with pytest.raises(FormatError, match="sparse"):
        codec.decompress_array(codec.encode_sparse(np.eye(3, dtype=np.float32), 1e-3))
    with pytest.raises(FormatError, match="array"):
        codec.decode_sparse(codec.compress_array(np.eye(3, dtype=np.float32), 1e-3))


@pytest.mark.parametrize("index_codec", ["gap8", "huffgap", "bitmap"])
def test_truncation_at_every_offset_raises(index_codec):
    b = codec.encode_sparse(pruned(10, 12, 0.3), 1e-2, index_codec=index_codec)
    for k in range(len(b)):
        with pytest.raises(FormatError):
            codec.decode_sparse(b[:k])


@pytest.mark.parametrize("index_codec", ["gap8", "huffgap", "bitmap"])
def test_bit_flips_never_crash(index_codec):
    rng = np.random.default_rng(3)
    b = codec.encode_sparse(pruned(20, 30, 0.2), 1e-2, index_codec=index_codec)
    for _ in range(1500):
        m = bytearray(b)
        pos = int(rng.integers(len(m)))
        m[pos] ^= 1 << int(rng.integers(8))
        try:
            y = codec.decode_sparse(bytes(m))
            assert y.shape[0] * y.shape[1] <= 1 << 36
        except DszError:
            pass




def test_decode_into_a_caller_array_matches_and_clears_it():
    rng = np.random.default_rng(3)
    w = rng.laplace(0, 0.05, (40, 70)).astype(np.float32)
    w[np.abs(w) < 0.08] = 0
    buf = codec.encode_sparse(w, 1e-3)
    out = np.full((40, 70), 7.0, np.float32)  # stale values must not survive
    got = codec.decode_sparse(buf, out=out)
    assert np.shares_memory(got, out)
    assert np.array_equal(out, codec.decode_sparse(buf))


@pytest.mark.parametrize("out", [np.zeros((40, 69), np.float32), np.zeros((40, 70), np.float64),
                                 np.zeros((70, 40), np.float32).T, [0.0] * 2800])
def test_decode_into_an_unfit_array_is_refused(out):
    buf = codec.encode_sparse(np.eye(40, 70, dtype=np.float32), 1e-3)
    with pytest.raises(ValueError, match="out"):
        codec.decode_sparse(buf, out=out)


def test_decompress_array_into_a_caller_array():
    x = np.linspace(-1, 1, 600, dtype=np.float32).reshape(20, 30)
    buf = codec.compress_array(x, 1e-3)
    out = np.empty(600, np.float32)
    codec.decompress_array(buf, out=out)
    assert np.array_equal(out.reshape(20, 30), codec.decompress_array(buf))


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(0, 40), cols=st.integers(0, 300), density=st.floats(0, 1), seed=st.integers(0, 2**16),
       index_codec=st.sampled_from(["auto", "gap8", "huffgap", "bitmap"]),
       bounds=st.lists(st.floats(1e-6, 1.0), min_size=1, max_size=3))
def test_an_index_chosen_once_gives_the_same_bytes_at_every_bound(rows, cols, density, seed, index_codec, bounds):
    w = pruned(rows, cols, density, seed)
    pattern = codec.sparse_index(w, index_codec)
    for eb in bounds:
        assert codec.encode_sparse(w, eb, index_codec=index_codec, index=pattern) == \
            codec.encode_sparse(w, eb, index_codec=index_codec)


def test_an_index_of_another_pattern_is_refused():
    w = pruned(30, 40, 0.2)
    moved = w.copy()
    moved[0, np.flatnonzero(w[0] == 0)[0]] = 0.5  # one more non-zero
    with pytest.raises(ValueError, match="other non-zero positions"):
        codec.encode_sparse(moved, 1e-3, index=codec.sparse_index(w))
    # the values may change freely: only the positions matter
    assert codec.decode_sparse(codec.encode_sparse(w * 2, 1e-3, index=codec.sparse_index(w))).shape == w.shape


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), tiny=st.floats(1e-9, 1e-6), predictor=st.sampled_from(["none", "lorenzo", "auto"]))
def test_a_bound_tiny_beside_the_values_still_codes_within_it(seed, tiny, predictor):
    # more distinct quantization codes than the Huffman code holds (2^15): the encoder lowers its radius,
    # the values beyond it stored verbatim (a --max-loss as small as 1e-7 reached this on LeNet-5's fc1)
    w = np.random.default_rng(seed).normal(scale=0.05, size=(300, 400)).astype(np.float32)
    w[w < -0.06] = 0
    sparse = codec.decode_sparse(codec.encode_sparse(w, tiny, predictor=predictor))
    dense = codec.decompress_array(codec.compress_array(w, tiny, predictor=predictor))
    for decoded in (sparse, dense):
        assert np.all(np.abs(decoded.astype(np.float64) - w) <= tiny)
    assert np.array_equal(sparse == 0, w == 0)  # the sparse stream keeps every non-zero non-zero


def test_the_radius_is_lowered_only_where_the_symbols_need_it():
    w = np.random.default_rng(0).normal(scale=0.05, size=(300, 400)).astype(np.float32)
    assert codec.sparse_info(codec.encode_sparse(w, 1e-3))["radius"] == 32768
    assert codec.sparse_info(codec.encode_sparse(w, 1e-6, predictor="none"))["radius"] == 1 << 14
