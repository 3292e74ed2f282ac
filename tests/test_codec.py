"""The array codec: round trips, the error bound, bad arguments, untrusted input, frozen streams."""
import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pydsz.errors import DszError, FormatError
from pydsz.format import codec

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
RNG = np.random.default_rng(1234)


def within(x, y, eb):
    """Finite values within eb (checked in double), non-finite values bit-identical."""
    with np.errstate(invalid="ignore"):  # signaling NaNs
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
    fin = np.isfinite(x)
    assert np.all(np.abs(x64[fin] - y64[fin]) <= eb)
    assert np.array_equal(x[~fin].view(np.uint32), y[~fin].view(np.uint32))


def pruned_laplace(n, keep=0.1, scale=0.05, seed=0):
    x = np.random.default_rng(seed).laplace(0, scale, int(n / keep)).astype(np.float32)
    return x[np.abs(x) > np.quantile(np.abs(x), 1 - keep)][:n]


@pytest.mark.parametrize("dist", ["laplace", "uniform", "constant", "pruned", "zeros"])
@pytest.mark.parametrize("eb", [1e-4, 1e-2, 0.5])
def test_round_trip_distributions(dist, eb):
    x = {
        "laplace": RNG.laplace(0, 0.05, 5000),
        "uniform": RNG.uniform(-3, 3, 5000),
        "constant": np.full(5000, 0.37),
        "pruned": pruned_laplace(5000),
        "zeros": np.zeros(5000),
    }[dist].astype(np.float32)
    y = codec.decompress_array(codec.compress_array(x, eb))
    assert y.dtype == np.float32 and y.shape == x.shape
    within(x, y, eb)


@pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (3, 0, 2), (5, 6), (2, 3, 4), (1,) * 8])
def test_round_trip_shapes(shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    y = codec.decompress_array(codec.compress_array(x, 1e-3))
    assert y.shape == x.shape
    within(x, y, 1e-3)


@pytest.mark.parametrize("layout", ["fortran", "negative", "strided", "transposed"])
def test_layouts(layout):
    base = RNG.standard_normal((40, 30)).astype(np.float32)
    x = {"fortran": np.asfortranarray(base), "negative": base[::-1, ::-2], "strided": base[::3, 1::4],
         "transposed": base.T}[layout]
    y = codec.decompress_array(codec.compress_array(x, 1e-3))
    assert y.shape == x.shape
    within(np.ascontiguousarray(x), y, 1e-3)


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview, "numpy"])
def test_any_buffer_decodes(kind):
    x = RNG.standard_normal(100).astype(np.float32)
    b = codec.compress_array(x, 1e-2)
    buf = np.frombuffer(b, dtype=np.uint8) if kind == "numpy" else kind(b)
    np.testing.assert_array_equal(codec.decompress_array(buf), codec.decompress_array(b))


@pytest.mark.parametrize("predictor", ["none", "lorenzo"])
def test_forced_predictor(predictor):
    x = np.cumsum(RNG.standard_normal(2000)).astype(np.float32)
    b = codec.compress_array(x, 1e-2, predictor=predictor)
    within(x, codec.decompress_array(b), 1e-2)


def test_auto_predictor_picks_lorenzo_on_smooth_data_and_none_on_weights():
    smooth = np.cumsum(RNG.standard_normal(20000) * 0.01).astype(np.float32)
    weights = pruned_laplace(20000)
    auto = codec.compress_array(smooth, 1e-3)
    assert len(auto) <= len(codec.compress_array(smooth, 1e-3, predictor="none"))
    assert len(codec.compress_array(weights, 1e-3)) == len(codec.compress_array(weights, 1e-3, predictor="none"))


def test_relative_mode_uses_value_range():
    x = RNG.uniform(-2, 6, 3000).astype(np.float32)
    y = codec.decompress_array(codec.compress_array(x, 1e-3, mode="rel"))
    within(x, y, 1e-3 * (float(x.max()) - float(x.min())))


def test_size_near_entropy_on_pruned_weights():
    x = pruned_laplace(200_000)
    for eb in (1e-3, 5e-3, 1e-2):
        q = np.round(x.astype(np.float64) / (2 * eb))
        _, counts = np.unique(q, return_counts=True)
        p = counts / counts.sum()
        bound = x.size * float(-(p * np.log2(p)).sum()) / 8
        assert len(codec.compress_array(x, eb)) <= 1.03 * bound


ADVERSARIAL = np.array(
    [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1.17e-38, 3.4028235e38, -3.4028235e38,
     1.0, -1.0, 123456.7, 1e-30], dtype=np.float32)


@pytest.mark.parametrize("eb", [1e-45, 1e-320, 1e-30, 1e-6, 1.0, 1e30, 1e38, 1e300, 1.7e308])
@pytest.mark.parametrize("predictor", ["none", "lorenzo", "auto"])
def test_adversarial_values(eb, predictor):
    x = np.concatenate([ADVERSARIAL, np.frombuffer(np.array([0x7FC01234, 0xFF800001], np.uint32).tobytes(),
                                                   np.float32)])
    y = codec.decompress_array(codec.compress_array(x, eb, predictor=predictor))
    within(x, y, eb)


@settings(max_examples=150, deadline=None)
@given(x=hnp.arrays(np.float32, hnp.array_shapes(min_dims=0, max_dims=3, max_side=20),
                    elements=st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)),
       eb=st.floats(min_value=1e-300, max_value=1e300, allow_nan=False, allow_infinity=False),
       predictor=st.sampled_from(["none", "lorenzo", "auto"]))
def test_property_bound_holds(x, eb, predictor):
    y = codec.decompress_array(codec.compress_array(x, eb, predictor=predictor))
    assert y.shape == x.shape
    within(x, y, eb)


@pytest.mark.parametrize("bad", [0, -1e-3, float("nan"), float("inf"), "x", None])
def test_bad_bound(bad):
    with pytest.raises(ValueError, match="error_bound"):
        codec.compress_array(np.zeros(3, np.float32), bad)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, ">f4", bool])
def test_bad_dtype(dtype):
    with pytest.raises(ValueError, match="float16, int8 or uint8 values are supported.*astype"):
        codec.compress_array(np.zeros(3, dtype), 1e-3)


def test_bad_mode():
    with pytest.raises(ValueError, match="mode"):
        codec.compress_array(np.zeros(3, np.float32), 1e-3, mode="pw_rel")


def test_lossless_wrapper_used_when_smaller():
    x = np.zeros(100_000, np.float32)
    b = codec.compress_array(x, 1e-3)
    assert len(b) < 1000
    np.testing.assert_array_equal(codec.decompress_array(b), x)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300_000), st.floats(0.01, 1.0), st.integers(0, 2**32 - 1))
def test_lzma_wrapper_is_preset_9_with_a_section_sized_dictionary(n, p, seed):
    """lzma -9 coded with a dictionary cut to the section: exactly as many bytes as xz -9's own (the
    assessment's sizes are unchanged), and a device decodes it in about the section's size, not 64 MiB."""
    import lzma

    from pydsz.format import wrapping

    raw = np.minimum(np.random.default_rng(seed).geometric(p, n), 255).astype(np.uint8).tobytes()  # gap-like
    codec_id, packed = wrapping.wrap(raw, ((wrapping.LZMA, 9),))
    if codec_id == wrapping.NONE:
        return
    assert len(packed) == len(lzma.compress(raw, preset=9))
    limit = max(n, 4096) + (1 << 20)  # the dictionary and the decoder's own state
    assert lzma.LZMADecompressor(memlimit=limit).decompress(packed) == raw


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 200_000), st.integers(0, 3), st.integers(0, 2**32 - 1))
def test_lzma_tables_decode_with_the_dictionary_their_size_gives(n, kind, seed):
    """Raw LZMA2 for the container's table and rest: the decoder's dictionary follows from the raw size
    alone, at most TABLES_DICT_MAX; a 3 MiB section whose repeats lie 2 MiB apart decodes as well."""
    from pydsz.format import wrapping

    rng = np.random.default_rng(seed)
    if kind == 3:  # beyond the dictionary: a block repeated further back than it reaches
        block = rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
        raw = block + bytes(1 << 20) + block
    else:
        raw = [rng.integers(0, 256, n, dtype=np.uint8).tobytes(), bytes(n),
               np.arange(n // 4, dtype="<u4").tobytes()][kind]  # noise, zeros, 4-byte fields
    assert wrapping.inflate_tables(wrapping.lzma_tables(raw), len(raw), "section", "") == raw


def test_a_section_that_declares_a_huge_window_is_refused():
    """An untrusted wrapped section may not make its decoder allocate more than its raw size (or, for
    lzma, -9's 64 MiB of older files) needs: a zstd frame declaring a 128 MiB window and an .xz
    declaring a 4 GiB dictionary around 5 KB are format errors, and their honest twins decode."""
    import lzma
    import zlib

    import zstandard

    from pydsz.format import wrapping

    raw = np.random.default_rng(5).integers(0, 4, 5000, dtype=np.uint8).tobytes()
    params = zstandard.ZstdCompressionParameters.from_level(19, window_log=27)
    huge = zstandard.ZstdCompressor(compression_params=params).compressobj()
    huge = huge.compress(raw) + huge.flush()  # streamed: no content size, the window as declared
    assert zstandard.get_frame_parameters(huge).window_size == 1 << 27
    with pytest.raises(FormatError, match="zstd-wrapped section does not decompress"):
        wrapping.inflate(wrapping.ZSTD, np.frombuffer(huge, np.uint8), len(raw), "t")
    honest = zstandard.ZstdCompressor(level=19).compress(raw)
    assert wrapping.inflate(wrapping.ZSTD, np.frombuffer(honest, np.uint8), len(raw), "t").tobytes() == raw

    xz = bytearray(wrapping.wrap(raw, ((wrapping.LZMA, 9),))[1])
    assert xz[16] < 40  # the LZMA2 dictionary-size byte of the first block header (bytes 12-23)
    xz[16] = 40  # 4 GiB - 1
    xz[20:24] = zlib.crc32(bytes(xz[12:20])).to_bytes(4, "little")
    assert lzma.decompress(bytes(xz)) == raw  # a valid stream, only its declared dictionary is huge
    with pytest.raises(FormatError, match="lzma-wrapped section does not decompress"):
        wrapping.inflate(wrapping.LZMA, np.frombuffer(bytes(xz), np.uint8), len(raw), "t")
    old = lzma.compress(raw, preset=9)  # as files before Nov 2026 wrote it: a 64 MiB dictionary
    assert wrapping.inflate(wrapping.LZMA, np.frombuffer(old, np.uint8), len(raw), "t").tobytes() == raw


def small_stream():
    return codec.compress_array(np.array([0.1, -0.25, 3.0, np.nan, 0.1, 7.5], np.float32), 1e-2)


def test_truncation_at_every_offset_raises():
    b = small_stream()
    for k in range(len(b)):
        with pytest.raises(FormatError):
            codec.decompress_array(b[:k])


def test_trailing_bytes_rejected():
    with pytest.raises(FormatError, match="srcSize_wrong"):
        codec.decompress_array(small_stream() + b"\0")


def test_bit_flips_never_crash():
    streams = [small_stream(), codec.compress_array(np.zeros(5000, np.float32), 1e-3),
               codec.compress_array(RNG.standard_normal(300).astype(np.float32), 1e-3, predictor="lorenzo")]
    rng = np.random.default_rng(7)
    for b in streams:
        for _ in range(400):
            m = bytearray(b)
            pos = int(rng.integers(len(m)))
            m[pos] ^= 1 << int(rng.integers(8))
            try:
                codec.decompress_array(bytes(m))
            except DszError:
                pass


def test_bad_magic_and_version():
    b = bytearray(small_stream())
    with pytest.raises(FormatError, match="prefix_unknown"):
        codec.decompress_array(b"XXXX" + bytes(b[4:]))
    b[4] = 99
    with pytest.raises(FormatError, match="version_unsupported"):
        codec.decompress_array(bytes(b))


def test_reserved_bytes_checked():
    b = bytearray(codec.compress_array(np.ones(10, np.float32), 1e-3))
    b[10] = 1
    with pytest.raises(FormatError, match="corruption"):
        codec.decompress_array(bytes(b))


@pytest.mark.parametrize("name", sorted(p.stem for p in FIXTURES.glob("*_v*.bin")))
def test_frozen_fixtures_decode_bit_exactly(name):
    """Exact by construction: decoding is integer arithmetic and elementwise float operations in an
    order the C code fixes (no BLAS, no reduction), so the bytes of an old file decode to the same bits on every machine."""
    decode = codec.decode_sparse if name.startswith("sparse_") else codec.decompress_array
    y = decode((FIXTURES / f"{name}.bin").read_bytes())
    expected = np.load(FIXTURES / f"{name}.npy")
    assert y.shape == expected.shape
    assert np.array_equal(y.view(np.uint32), expected.view(np.uint32))
