"""Gathered .dsz entries (format version 3): small kernels and a model's constants in one stream, each
within its own bound, everything else of the model unchanged; and their spans checked as untrusted."""
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import pydsz
from pydsz.compress.pipeline import compress
from pydsz.encode import constants, gather, pack
from pydsz.encode.pack import _serialize
from pydsz.errors import FormatError
from pydsz.format import codec, spans
from pydsz.format.container import TensorEntry
from pydsz.model import selection
from pydsz.model.data import bundled, load_npz
from pydsz.model.graph import TFLiteModel

LENET5 = bundled("lenet5.tflite").read_bytes()
LENET5_F16 = bundled("lenet5_f16.tflite").read_bytes()
LAYERS = ["conv1", "conv2", "fc1", "fc2"]


@settings(max_examples=300, deadline=None)
@given(data=st.data(), dtype=st.sampled_from([np.float32, np.float16]), bound=st.floats(1e-6, 10.0))
def test_quantized_spans_keep_every_value_within_its_bound(data, dtype, bound):
    values = data.draw(hnp.arrays(dtype, st.integers(1, 300), elements=st.floats(
        -1e4, 1e4, allow_nan=False, width=16 if dtype == np.float16 else 32)))
    found = gather.quantize(values, bound)
    if found is None:  # only where the dtype cannot hold the values that finely, or the integers would
        # be too large for it: they keep their own stream
        assert np.abs(values.astype(np.float64)).max() / bound > spans.MAX_INTEGER[np.dtype(dtype).name] / 4
        return
    q, step = found
    assert q.dtype == dtype and np.array_equal(q, np.rint(q)) and 0 < step <= 2 * bound
    err = np.abs(values.astype(np.float64) - spans.dequantize(q, step, dtype))
    assert err.max() <= bound


def _changed_bytes(model: TFLiteModel, names, buffers) -> np.ndarray:
    mask = np.zeros(len(model.data), bool)
    for name in names:
        layer = model.layer(name)
        mask[layer.offset:layer.offset + layer.nbytes] = True
    for b in buffers:
        offset, nbytes = model.place(b)
        mask[offset:offset + nbytes] = True
    return mask


@settings(max_examples=25, deadline=None)
@given(bounds=st.lists(st.sampled_from([0.0, 1e-4, 1e-3, 1e-2, 0.05]), min_size=4, max_size=4),
       rel=st.sampled_from([0.0, 2.0 ** -20, 2.0 ** -10, 0.02]), layers=st.sampled_from(["all", "fc"]),
       stored=st.sampled_from(["float32", "float16"]))
@example(bounds=[0.0] * 4, rel=0.0, layers="all", stored="float16")  # nothing compressed
def test_every_value_within_its_bound_and_the_rest_identical(bounds, rel, layers, stored):
    original = {"float32": LENET5, "float16": LENET5_F16}[stored]
    chosen = {name: b for name, b in zip(LAYERS, bounds) if layers == "all" or name.startswith("fc")}
    packed = pydsz.load(pack.pack_model(original, chosen, layers, gather_small=True, constants_rel=rel))
    decoded = packed.tflite_bytes()
    before, after = TFLiteModel(original), TFLiteModel(decoded)
    for name, bound in chosen.items():  # within the bound of the values as stored
        err = np.abs(before.stored(name).astype(np.float64) - after.stored(name))
        assert err.max() <= bound
    kinds = selection.KINDS[layers]
    held = constants.buffers(before, stored.upper(), kinds) if rel else []
    for b in held:
        t = next(t.index for t in before.tensors if t.buffer == b)
        value = before.constant(t).astype(np.float64)
        assert np.abs(value - after.constant(t)).max() <= rel * np.abs(value).max()
    if layers == "fc":  # only the chosen kind's biases may change (float16: the DEQUANTIZE's input)
        biases = {before.layer(n).bias for n in ("fc1", "fc2")}
        biases |= {op.inputs[0] for op in before.ops if op.name == "DEQUANTIZE" and op.outputs[0] in biases}
        assert set(held) <= {before.tensors[b].buffer for b in biases}
    same = ~_changed_bytes(before, chosen, held)
    assert np.array_equal(np.frombuffer(original, np.uint8)[same], np.frombuffer(decoded, np.uint8)[same])
    gathered = [e for e in packed.entries if e.representation == "gathered"]
    assert packed.version == (4 if packed.rest_codec == "lzma" else 3 if gathered else
                              1 if all(e.dtype == "float32" for e in packed.entries) else 2)
    for name, values in packed.weights().items():  # gathered layers too, in their shapes
        assert np.abs(before.stored(name).astype(np.float64) - values).max() <= chosen[name]


def test_gathering_makes_a_model_of_small_layers_smaller():
    bounds = {"conv1": 0.01, "conv2": 0.01, "fc1": 0.01, "fc2": 0.01}
    plain = pack.pack_model(LENET5, bounds, "all")
    gathered = pack.pack_model(LENET5, bounds, "all", gather_small=True, constants_rel=2.0 ** -10)
    assert len(gathered) < len(plain)
    names = [n for e in pydsz.load(gathered).entries if e.representation == "gathered" for n in e.name.split(",")]
    assert "conv1:20x5x5x1" in names and "" in names  # a small kernel and the constants are gathered
    assert not any(n.startswith("fc1") for n in names)  # 400,000 weights pay for their own code table
    assert pydsz.load(gathered).info()["tensors"][-1]["name"].startswith("gathered: ")


def _file(spans, n=4, dtype="float32", model_bytes=64, stream=None, extra=()):
    values = np.arange(n, dtype=dtype)
    stream = stream if stream is not None else codec.compress_array(values, 0.5)
    entry = TensorEntry(name=",".join([""] * len(spans)), buffer_index=0, offset=spans[0][0] if spans else 0,
                        nbytes=values.nbytes, shape=(n,), representation="gathered", error_bound=0.5,
                        stream=stream, dtype=dtype, spans=tuple(spans))
    return _serialize(bytes(model_bytes), [entry, *extra])


def test_a_well_formed_gathered_file_scatters_each_span():
    out = pydsz.load(_file([(8, 1, 0.5), (32, 3, 2.0)])).tflite_bytes()
    assert np.frombuffer(out[8:12], "<f4")[0] == 0.0
    np.testing.assert_array_equal(np.frombuffer(out[32:44], "<f4"), [2.0, 4.0, 6.0])
    assert out[:8] == bytes(8) and out[44:] == bytes(20)


@pytest.mark.parametrize("spans, match", [
    ([(8, 2, 1.0), (16, 1, 1.0)], "do not hold its 4 values"),  # counts add up to 3
    ([(8, 0, 1.0), (16, 4, 1.0)], "do not hold"),  # an empty span
    ([(8, 2, 1.0), (60, 2, 1.0)], "do not fit a model of 64 bytes"),  # past the end
    ([(8, 2, 1.0), (12, 2, 1.0)], "overlap"),  # overlapping spans
    ([(8, 2, -1.0), (16, 2, 1.0)], "step"),
    ([(8, 2, float("nan")), (16, 2, 1.0)], "step"),
    ([(8, 2, 0.0), (16, 2, 1.0)], "step"),
])
def test_bad_spans_are_refused(spans, match):
    with pytest.raises(FormatError, match=match):
        pydsz.load(_file(spans)).tflite_bytes()


def test_a_span_may_not_overlap_another_entry():
    w = np.ones(4, np.float32)
    other = TensorEntry("fc1", 1, 20, w.nbytes, (4,), "dense", 1e-3, codec.compress_array(w, 1e-3))
    with pytest.raises(FormatError, match="overlap"):
        pydsz.load(_file([(8, 2, 1.0), (16, 2, 1.0)], extra=[other]))


def test_float16_spans_are_written_in_float16_and_a_step_of_0_is_refused():
    values = np.array([1, -2, 3, 2047], np.float16)
    out = pydsz.load(_file([(8, 4, 0.25)], dtype="float16", stream=codec.compress_array(values, 0.5)))
    np.testing.assert_array_equal(np.frombuffer(out.tflite_bytes()[8:16], "<f2"), values.astype(np.float64) * 0.25)
    with pytest.raises(FormatError, match="step"):
        pydsz.load(_file([(8, 4, 0.0)], dtype="float16", stream=codec.compress_array(values, 0.5)))


def test_a_stream_of_the_wrong_size_is_refused():
    with pytest.raises(FormatError, match="decodes to"):
        pydsz.load(_file([(8, 4, 1.0)], stream=codec.compress_array(np.zeros(5, np.float32), 0.5))).tflite_bytes()


@pytest.mark.runtime
@pytest.mark.slow
def test_compress_gathers_the_constants_within_the_budget():
    x, y = load_npz(bundled("fmnist_val.npz"))
    result = compress(LENET5, x[:2000], y[:2000], 0.01, layers="all")
    assert result.loss <= result.allowed_loss
    assert result.constants_rel > 0
    packed = pydsz.load(result.dsz)
    entry = next(e for e in packed.entries if e.representation == "gathered")
    assert "" in entry.name.split(",")
    before, after = TFLiteModel(LENET5), TFLiteModel(packed.tflite_bytes())
    for b in constants.buffers(before, "FLOAT32"):
        t = next(t.index for t in before.tensors if t.buffer == b)
        value = before.constant(t).astype(np.float64)
        assert np.abs(value - after.constant(t)).max() <= result.constants_rel * np.abs(value).max()


def test_every_byte_of_a_gathered_table_mutated_raises_only_dszerror():
    from fuzz_load import exercise, with_fixed_crcs

    data = _file([(8, 1, 0.5), (32, 3, 2.0)])
    table_end = 40 + int.from_bytes(data[12:16], "little")
    for at in range(40, table_end):
        for value in (0x00, 0x01, 0x7F, 0x80, 0xFF):
            mutated = bytearray(data)
            mutated[at] = value
            exercise(with_fixed_crcs(bytes(mutated)))  # anything but a DszError fails the test
