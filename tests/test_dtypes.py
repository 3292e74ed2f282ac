"""float16, int8 and uint8 values through the codecs: the bound holds in the stored dtype."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pydsz.errors import FormatError
from pydsz.format import codec

# float16's edges: the largest finite values, the smallest normal and subnormal ones, signed
# zeros, infinities and NaNs with payloads (as bit patterns)
F16_EDGES = np.array([0x7BFF, 0xFBFF, 0x7BFE, 0x0400, 0x8400, 0x03FF, 0x0001, 0x8001, 0x0000, 0x8000,
                      0x7C00, 0xFC00, 0x7E01, 0xFD55, 0x3C00, 0x3C01], np.uint16).view(np.float16)


def within16(x, y, eb):
    """Every finite float16 value within eb of the original, the others bit for bit."""
    assert y.dtype == np.float16 and y.shape == x.shape
    fin = np.isfinite(x)
    assert np.all(np.abs(x[fin].astype(np.float64) - y[fin].astype(np.float64)) <= eb)
    assert np.array_equal(x[~fin].view(np.uint16), y[~fin].view(np.uint16))


def sparse_matrix(x):
    return x.reshape(1, -1) if x.ndim != 2 else x


f16_values = hnp.arrays(np.float16, hnp.array_shapes(min_dims=1, max_dims=2, max_side=40),
                        elements=st.one_of(st.floats(width=16, allow_nan=True, allow_infinity=True),
                                           st.sampled_from(list(F16_EDGES))))
f16_bounds = st.one_of(st.floats(1e-9, 1e5), st.sampled_from([5.96e-8, 6.1e-5, 0.5, 16.0, 65504.0, 1e300]))


@settings(max_examples=200, deadline=None)
@given(x=f16_values, eb=f16_bounds, predictor=st.sampled_from(["none", "lorenzo"]))
def test_float16_array_bound(x, eb, predictor):
    within16(x, codec.decompress_array(codec.compress_array(x, eb, predictor=predictor)), eb)


@settings(max_examples=200, deadline=None)
@given(x=f16_values, eb=f16_bounds, predictor=st.sampled_from(["none", "lorenzo"]))
def test_float16_sparse_bound_and_zeros(x, eb, predictor):
    w = sparse_matrix(x)
    y = codec.decode_sparse(codec.encode_sparse(w, eb, predictor=predictor))
    within16(w, y, eb)
    assert np.array_equal(w == 0, y == 0)  # a non-zero never decodes to zero, nor a zero to anything else


def test_float16_edges_at_every_bound():
    for eb in (1e-8, 6e-8, 1e-4, 1.0, 32.0, 65504.0, 7e4, 1e30):
        x = np.tile(F16_EDGES, 3)
        within16(x, codec.decompress_array(codec.compress_array(x, eb, predictor="lorenzo")), eb)
        within16(x, codec.decompress_array(codec.compress_array(x, eb, predictor="none")), eb)


def test_float16_smaller_than_its_bytes():
    x = np.random.default_rng(0).laplace(0, 0.05, 20000).astype(np.float16)
    assert len(codec.compress_array(x, 1e-3)) < x.nbytes / 2


int_values = st.sampled_from([np.int8, np.uint8]).flatmap(
    lambda t: hnp.arrays(t, hnp.array_shapes(min_dims=1, max_dims=2, max_side=40)))


@settings(max_examples=200, deadline=None)
@given(x=int_values, k=st.integers(0, 255), predictor=st.sampled_from(["none", "lorenzo"]),
       sparse=st.booleans())
def test_integer_bound_in_steps(x, k, predictor, sparse):
    if sparse:
        x = sparse_matrix(x)
        y = codec.decode_sparse(codec.encode_sparse(x, k, predictor=predictor))
        assert np.array_equal(x == 0, y == 0)
    else:
        y = codec.decompress_array(codec.compress_array(x, k, predictor=predictor))
    assert y.dtype == x.dtype and y.shape == x.shape
    assert np.all(np.abs(x.astype(np.int64) - y.astype(np.int64)) <= k)


def test_integer_lossless():
    x = np.random.default_rng(1).integers(-128, 128, (64, 50)).astype(np.int8)
    assert np.array_equal(codec.decompress_array(codec.compress_array(x, 0)), x)


@pytest.mark.parametrize("bad", [0.5, -1, 256, float("nan")])
def test_integer_bound_must_be_whole_steps(bad):
    with pytest.raises(ValueError, match="whole number of quantization steps"):
        codec.compress_array(np.zeros(4, np.int8), bad)


def test_integer_relative_mode_refused():
    with pytest.raises(ValueError, match="mode 'abs'"):
        codec.encode_sparse(np.ones((2, 2), np.uint8), 1, mode="rel")


def test_sparse_info_reports_dtype_and_steps():
    info = codec.sparse_info(codec.encode_sparse(np.eye(4, dtype=np.int8), 2))
    assert info["dtype"] == "int8" and info["error_bound"] == 2 and info["format_version"] == 2


def test_float32_streams_stay_version_1():
    assert codec.sparse_info(codec.encode_sparse(np.eye(4, dtype=np.float32), 1e-3))["format_version"] == 1


def test_out_must_have_the_stream_dtype():
    stream = codec.compress_array(np.ones(4, np.float16), 1e-3)
    with pytest.raises(ValueError, match="float16"):
        codec.decompress_array(stream, out=np.empty(4, np.float32))


@pytest.mark.parametrize("dtype", [np.float16, np.int8])
def test_truncated_and_flipped_streams_are_refused_or_bounded(dtype):
    """Every truncation is a FormatError; a flipped bit is refused or decodes to what the (changed)
    header declares: the frame has no checksum (the container's CRC catches the flip), but never
    reads or writes out of bounds."""
    x = np.random.default_rng(2).laplace(0, 8, (20, 30)).clip(-100, 100).astype(dtype)
    x[np.abs(x) < 4] = 0
    for stream in (codec.compress_array(x, 1), codec.encode_sparse(x, 1)):
        decode = codec.decode_sparse if stream[:4] == b"DSZS" else codec.decompress_array
        for cut in range(0, len(stream), max(1, len(stream) // 40)):
            with pytest.raises(FormatError):
                decode(stream[:cut])
        for bit in range(0, 8 * len(stream), 13):
            flipped = bytearray(stream)
            flipped[bit // 8] ^= 1 << (bit % 8)
            try:
                y = decode(bytes(flipped))
            except FormatError:
                continue
            assert y.dtype in (np.float32, np.float16, np.int8, np.uint8)


# ---- float16 models in the container ----

def _float16_fc(rows=32, cols=64, seed=0, prune=0.0):
    """x -> DEQUANTIZE(float16 [rows, cols]) -> FULLY_CONNECTED, as the converter's float16 option writes it."""
    import tflite
    from test_model import build_tflite

    w = np.random.default_rng(seed).laplace(0, 0.05, (rows, cols))
    w[np.abs(w) < np.quantile(np.abs(w), prune)] = 0
    return build_tflite(
        tensors=[{"shape": [1, cols]},
                 {"shape": [rows, cols], "type": tflite.TensorType.FLOAT16, "data": w.astype(np.float16).tobytes()},
                 {"shape": [rows, cols]}, {"shape": [1, rows]}],
        ops=[("DEQUANTIZE", [1], [2]), ("FULLY_CONNECTED", [0, 2, -1], [3])], inputs=[0], outputs=[3])


@pytest.mark.parametrize("prune", [0.0, 0.9])
def test_float16_model_decodes_within_bound_in_float16(prune):
    import pydsz
    from pydsz.model.graph import TFLiteModel

    original = _float16_fc(prune=prune)
    packed = pydsz.load(pydsz.pack_model(original, 1e-3))
    (entry,) = packed.entries
    assert entry.dtype == "float16" and entry.nbytes == 32 * 64 * 2 and packed.version >= 2
    before, after = TFLiteModel(original), TFLiteModel(packed.tflite_bytes())
    x, y = before.stored("fc1"), after.stored("fc1")
    assert y.dtype == np.float16
    assert np.abs(x.astype(np.float64) - y.astype(np.float64)).max() <= 1e-3
    assert not y[x == 0].any()  # pruned weights stay exact zeros
    changed = np.zeros(len(original), bool)
    changed[entry.offset:entry.offset + entry.nbytes] = True
    a, b = np.frombuffer(original, np.uint8), np.frombuffer(packed.tflite_bytes(), np.uint8)
    assert np.array_equal(a[~changed], b[~changed])


def test_float16_model_runs_in_litert():
    import pydsz
    from pydsz.format.interpreter import make_interpreter

    original = _float16_fc()
    decoded = pydsz.load(pydsz.pack_model(original, 1e-3)).tflite_bytes()
    x = np.random.default_rng(3).standard_normal((1, 64)).astype(np.float32)
    outputs = []
    for model in (original, decoded):
        interp = make_interpreter(model)
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        outputs.append(interp.get_tensor(interp.get_output_details()[0]["index"]).copy())
    # each of 64 weights moved by at most 1e-3: the output by at most 1e-3 * sum |x|
    assert np.abs(outputs[0] - outputs[1]).max() <= 1e-3 * np.abs(x).sum() + 1e-4


def test_float16_info_reports_dtype_and_float16_bytes():
    import pydsz

    (row,) = pydsz.load(pydsz.pack_model(_float16_fc(), 1e-3)).info()["tensors"]
    assert row["dtype"] == "float16" and row["original_bytes"] == 32 * 64 * 2 and row["bound_unit"] == "absolute"


def test_float32_only_files_stay_version_1(monkeypatch):
    import pydsz
    from pydsz.encode import pack
    from pydsz.model.data import bundled

    original = bundled("lenet300.tflite").read_bytes()
    assert pydsz.load(pydsz.pack_model(original, 0.01)).version == 4  # its rest and table are LZMA2, which came with 4
    # where LZMA2 gains nothing, readers from before stored dtypes read it
    monkeypatch.setattr(pack, "lzma_tables", lambda raw: raw + bytes(64))
    assert pydsz.load(pydsz.pack_model(original, 0.01)).version == 1


def test_version_1_file_with_a_float16_tensor_is_refused(monkeypatch):
    """A reader meeting a float16 tensor in a version-1 table refuses it instead of misreading it."""
    import struct
    import zlib

    import pydsz
    from pydsz.encode import pack
    from pydsz.format import container

    monkeypatch.setattr(pack, "lzma_tables", lambda raw: raw + bytes(64))  # a version 2 file: no flags
    buf = bytearray(pydsz.pack_model(_float16_fc(), 1e-3))
    struct.pack_into("<H", buf, 4, 1)
    head_end = container.HEADER.size + struct.unpack_from("<I", buf, 12)[0]
    struct.pack_into("<I", buf, head_end, zlib.crc32(buf[:head_end]))
    struct.pack_into("<I", buf, len(buf) - 4, zlib.crc32(buf[:-4]))
    with pytest.raises(FormatError, match="dtype"):
        pydsz.load(bytes(buf))


def test_float16_container_truncation_and_bit_flips_are_refused():
    import pydsz

    packed = pydsz.pack_model(_float16_fc(prune=0.5), 1e-3)
    for cut in range(0, len(packed), max(1, len(packed) // 60)):
        with pytest.raises(FormatError):
            pydsz.load(packed[:cut])
    for bit in range(0, 8 * len(packed), 97):
        flipped = bytearray(packed)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(FormatError):
            pydsz.load(bytes(flipped)).tflite_bytes()


# ---- the reference models converted with the float16 option (bench/builders/make_reference_models.py --dtypes) ----

@pytest.mark.runtime
@pytest.mark.parametrize("name", ["lenet300_f16.tflite", "lenet5_f16.tflite"])
def test_float16_reference_model_packs_every_layer_and_keeps_accuracy(name):
    import pydsz
    from pydsz.model.data import bundled, load_npz
    from pydsz.model.graph import TFLiteModel
    from pydsz.model.runtime import accuracy

    original = bundled(name).read_bytes()
    packed = pydsz.load(pydsz.pack_model(original, 2e-3, layers="all"))
    layers = TFLiteModel(original).layers(kinds=("fc", "conv"))
    assert sorted(n for e in packed.entries for n in e.name.split(",")) == sorted(l.name for l in layers)
    assert {e.dtype for e in packed.entries} == {"float16"}
    decoded = packed.tflite_bytes()
    for layer in layers:
        x, y = TFLiteModel(original).stored(layer), TFLiteModel(decoded).stored(layer)
        assert np.abs(x.astype(np.float64) - y.astype(np.float64)).max() <= 2e-3
    x, y = load_npz(bundled("fmnist_test.npz"))
    assert abs(accuracy(original, x, y) - accuracy(decoded, x, y)) <= 0.003


# ---- int8 models: the reference models converted with full-integer quantization ----

@pytest.mark.parametrize("name", ["lenet300_int8.tflite", "lenet5_int8.tflite"])
def test_int8_per_channel_weights_dequantize_with_their_channel_scale(name):
    from pydsz.model.data import bundled
    from pydsz.model.graph import TFLiteModel

    model = TFLiteModel(bundled(name).read_bytes())
    for layer in model.layers(kinds=("fc", "conv")):
        scale, zero = model.quantization(layer)
        q = model.stored(layer)
        assert np.allclose(model.weight(layer), (q.astype(np.float32) - zero) * scale)


@pytest.mark.parametrize("bound", ["1q", "2q"])
def test_int8_model_decodes_within_steps(bound):
    import pydsz
    from pydsz.model.data import bundled
    from pydsz.model.graph import TFLiteModel

    original = bundled("lenet5_int8.tflite").read_bytes()
    packed = pydsz.load(pydsz.pack_model(original, bound, layers="all"))
    assert {e.dtype for e in packed.entries} == {"int8"} and len(packed.entries) == 4
    before, after = TFLiteModel(original), TFLiteModel(packed.tflite_bytes())
    k = int(bound[:-1])
    for layer in before.layers(kinds=("fc", "conv")):
        diff = np.abs(before.stored(layer).astype(int) - after.stored(layer).astype(int))
        assert diff.max() <= k
        scale, _ = before.quantization(layer)
        # k steps of the channel, up to the float32 rounding of the two dequantized values
        assert np.all(np.abs(before.weight(layer) - after.weight(layer)) <= k * scale + 1e-7)


def test_int8_lossless_decodes_byte_identical():
    import pydsz
    from pydsz.model.data import bundled

    original = bundled("lenet300_int8.tflite").read_bytes()
    packed = pydsz.load(pydsz.pack_model(original, 0, layers="all"))
    assert packed.entries and packed.tflite_bytes() == original


@pytest.mark.runtime
def test_int8_model_runs_in_litert_and_keeps_accuracy():
    import pydsz
    from pydsz.model.data import bundled, load_npz
    from pydsz.model.runtime import accuracy

    original = bundled("lenet5_int8.tflite").read_bytes()
    decoded = pydsz.load(pydsz.pack_model(original, "1q", layers="all")).tflite_bytes()
    x, y = load_npz(bundled("fmnist_test.npz"))
    assert abs(accuracy(original, x, y) - accuracy(decoded, x, y)) <= 0.01


def test_int8_layer_refuses_an_absolute_bound():
    import pydsz
    from pydsz.errors import InputError
    from pydsz.model.data import bundled

    with pytest.raises(InputError, match="fc1 stores int8 weights: give its bound in quantization steps"):
        pydsz.pack_model(bundled("lenet300_int8.tflite").read_bytes(), {"fc1": 0.01})


def test_int8_info_shows_steps():
    import pydsz
    from pydsz.model.data import bundled

    rows = pydsz.load(pydsz.pack_model(bundled("lenet300_int8.tflite").read_bytes(), {"fc2": "2q"})).info()["tensors"]
    fc2 = next(r for r in rows if r["name"] == "fc2")
    assert fc2["dtype"] == "int8" and fc2["error_bound"] == 2 and fc2["bound_unit"] == "steps"


@pytest.mark.runtime
def test_int8_model_compresses_under_an_accuracy_budget_in_steps():
    """Assessment measures int8 layers at whole steps (0, 1, 2, ...) and the pipeline packs them as such."""
    import pydsz
    from pydsz.compress.pipeline import compress
    from pydsz.model.data import bundled, load_npz

    x, y = load_npz(bundled("fmnist_val.npz"))
    result = compress(bundled("lenet300_int8.tflite").read_bytes(), x[:1000], y[:1000], 0.01)
    assert all(p.bound == int(p.bound) for points in result.curves.values() for p in points)
    assert [p.bound for p in result.curves["fc1"]][:4] == [0, 1, 2, 3]
    assert result.metric.name == "top1" and result.before - result.after <= 0.01 + 1e-9
    entries = {e.name: e for e in pydsz.load(result.dsz).entries}
    assert entries and all(e.dtype == "int8" and e.error_bound == int(e.error_bound) for e in entries.values())
    # the report says steps, as `dsz pack -e 2q` takes them
    from pydsz.compress.report import layer_table, to_dict
    assert all(l.bound_unit == "steps" for l in result.layers) and any(l.bound for l in result.layers)
    rows = {line.split()[0]: line.split()[3] for line in layer_table(result).splitlines()[2:]}
    assert all(rows[l.name] == (f"{l.bound:g}q" if l.bound else "lossless") for l in result.layers)
    assert {l["bound_unit"] for l in to_dict(result)["layers"]} == {"steps"}


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_tensor_at_an_unaligned_offset_decodes_through_a_copy(dtype):
    """No TFLite writer puts weights at an odd offset, but a .dsz may say so: the value is still right."""
    import pydsz
    from pydsz.encode import pack
    from pydsz.format import container

    w = np.linspace(-1, 1, 24).astype(dtype).reshape(4, 6)
    model = bytes(range(7)) + bytes(w.nbytes) + bytes(5)
    entry = container.TensorEntry("fc1", 1, 7, w.nbytes, (4, 6), "dense", 1e-3, codec.compress_array(w, 1e-3),
                                  np.dtype(dtype).name)
    decoded = pydsz.load(pack._serialize(model, [entry])).tflite_bytes()
    assert decoded[:7] == bytes(range(7)) and decoded[-5:] == bytes(5)
    y = np.frombuffer(decoded[7:7 + w.nbytes], dtype).reshape(4, 6)
    assert np.abs(y.astype(np.float64) - w.astype(np.float64)).max() <= 1e-3


def test_pruned_uint8_layer_with_a_zero_point_is_coded_dense():
    """Pruning leaves uint8 weights at their zero point (128), not at 0, the sparse codec's implicit value:
    sparse coding would store every pruned value as a non-zero, so the smaller dense stream is chosen."""
    import tflite
    from test_model import build_tflite

    import pydsz
    from pydsz.model.graph import TFLiteModel

    rng = np.random.default_rng(5)
    w = np.where(rng.random((32, 64)) < 0.9, 128, rng.integers(0, 256, (32, 64))).astype(np.uint8)
    original = build_tflite(
        tensors=[{"shape": [1, 64]},
                 {"shape": [32, 64], "type": tflite.TensorType.UINT8, "scale": 0.01, "zero_point": 128,
                  "data": w.tobytes()},
                 {"shape": [1, 32]}],
        ops=[("FULLY_CONNECTED", [0, 1, -1], [2])], inputs=[0], outputs=[2])
    packed = pydsz.load(pydsz.pack_model(original, "1q"))
    (entry,) = packed.entries
    assert entry.dtype == "uint8" and entry.representation == "dense"
    assert len(entry.stream) < len(codec.encode_sparse(w, 1))  # what sparse coding would have stored
    decoded = TFLiteModel(packed.tflite_bytes()).stored("fc1")
    assert np.abs(decoded.astype(int) - w.astype(int)).max() <= 1
