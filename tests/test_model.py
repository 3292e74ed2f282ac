"""TFLite model I/O: layer discovery, weight offsets, shared buffers, replace(), corrupt files."""

from pathlib import Path

import flatbuffers
import numpy as np
import pytest
import tflite
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pydsz.errors import FormatError, InputError
from pydsz.model.graph import TFLiteModel

DATA = Path(__file__).parents[1] / "pydsz" / "data"


def load(name: str) -> TFLiteModel:
    return TFLiteModel((DATA / name).read_bytes())


def build_tflite(tensors, ops, inputs, outputs):
    """A minimal .tflite file for models the converter will not make (int8 weights, odd tails).

    tensors: dicts with shape, type (TensorType, default FLOAT32), data (bytes of a constant),
    same_buffer_as (index of an earlier constant whose buffer it reads, with data for its shape
    signature), scale and zero_point (quantization); the first dimension is the batch (dynamic). ops: tuples (operator name,
    inputs, outputs[, options name, {option setter: value}]).
    """
    b = flatbuffers.Builder(1024)

    def vector(start, values, prepend):
        start(b, len(values))
        for v in reversed(values):
            prepend(v)
        return b.EndVector()

    ints = lambda start, values: vector(start, list(values), b.PrependInt32)  # noqa: E731
    tables = lambda start, values: vector(start, list(values), b.PrependUOffsetTRelative)  # noqa: E731

    buffers = [tflite.BufferStart(b) or tflite.BufferEnd(b)]
    for t in tensors:
        if "data" in t and "same_buffer_as" not in t:
            data = bytes(t["data"])
            b.StartVector(1, len(data), 16)  # TFLite aligns constants to 16
            b.head -= len(data)
            b.Bytes[b.head:b.head + len(data)] = data
            vec = b.EndVector()
            tflite.BufferStart(b)
            tflite.BufferAddData(b, vec)
            buffers.append(tflite.BufferEnd(b))
    tensor_tables, next_buffer, buffer_of = [], 1, {}
    for i, t in enumerate(tensors):
        name = b.CreateString(f"t{i}")
        shape = ints(tflite.TensorStartShapeVector, t["shape"])
        signature = ints(tflite.TensorStartShapeSignatureVector,
                         t["shape"] if "data" in t else [-1, *t["shape"][1:]])
        quant = None
        if "scale" in t:
            scale = vector(tflite.QuantizationParametersStartScaleVector, [t["scale"]], b.PrependFloat32)
            zero = vector(tflite.QuantizationParametersStartZeroPointVector, [t.get("zero_point", 0)], b.PrependInt64)
            tflite.QuantizationParametersStart(b)
            tflite.QuantizationParametersAddScale(b, scale)
            tflite.QuantizationParametersAddZeroPoint(b, zero)
            quant = tflite.QuantizationParametersEnd(b)
        tflite.TensorStart(b)
        tflite.TensorAddShape(b, shape)
        tflite.TensorAddShapeSignature(b, signature)
        tflite.TensorAddType(b, t.get("type", tflite.TensorType.FLOAT32))
        tflite.TensorAddName(b, name)
        if quant is not None:
            tflite.TensorAddQuantization(b, quant)
        if "same_buffer_as" in t:
            tflite.TensorAddBuffer(b, buffer_of[t["same_buffer_as"]])
        elif "data" in t:
            buffer_of[i] = next_buffer
            tflite.TensorAddBuffer(b, next_buffer)
            next_buffer += 1
        tensor_tables.append(tflite.TensorEnd(b))

    op_names = sorted({op[0] for op in ops})
    codes = []
    for name in op_names:
        code = getattr(tflite.BuiltinOperator, name)
        tflite.OperatorCodeStart(b)
        tflite.OperatorCodeAddDeprecatedBuiltinCode(b, min(code, 127))
        tflite.OperatorCodeAddBuiltinCode(b, code)
        tflite.OperatorCodeAddVersion(b, 1)
        codes.append(tflite.OperatorCodeEnd(b))
    op_tables = []
    for name, op_inputs, op_outputs, *extra in ops:
        options = None
        if extra:
            kind, values = extra
            getattr(tflite, f"{kind}Start")(b)
            for setter, value in values.items():
                getattr(tflite, f"{kind}Add{setter}")(b, value)
            options = getattr(tflite, f"{kind}End")(b)
        in_vec = ints(tflite.OperatorStartInputsVector, op_inputs)
        out_vec = ints(tflite.OperatorStartOutputsVector, op_outputs)
        tflite.OperatorStart(b)
        tflite.OperatorAddOpcodeIndex(b, op_names.index(name))
        tflite.OperatorAddInputs(b, in_vec)
        tflite.OperatorAddOutputs(b, out_vec)
        if options is not None:
            tflite.OperatorAddBuiltinOptionsType(b, getattr(tflite.BuiltinOptions, extra[0]))
            tflite.OperatorAddBuiltinOptions(b, options)
        op_tables.append(tflite.OperatorEnd(b))

    tensors_vec = tables(tflite.SubGraphStartTensorsVector, tensor_tables)
    ops_vec = tables(tflite.SubGraphStartOperatorsVector, op_tables)
    in_vec = ints(tflite.SubGraphStartInputsVector, inputs)
    out_vec = ints(tflite.SubGraphStartOutputsVector, outputs)
    tflite.SubGraphStart(b)
    tflite.SubGraphAddTensors(b, tensors_vec)
    tflite.SubGraphAddOperators(b, ops_vec)
    tflite.SubGraphAddInputs(b, in_vec)
    tflite.SubGraphAddOutputs(b, out_vec)
    graph = tflite.SubGraphEnd(b)
    graphs_vec = tables(tflite.ModelStartSubgraphsVector, [graph])
    codes_vec = tables(tflite.ModelStartOperatorCodesVector, codes)
    buffers_vec = tables(tflite.ModelStartBuffersVector, buffers)
    tflite.ModelStart(b)
    tflite.ModelAddVersion(b, 3)
    tflite.ModelAddOperatorCodes(b, codes_vec)
    tflite.ModelAddSubgraphs(b, graphs_vec)
    tflite.ModelAddBuffers(b, buffers_vec)
    b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def f32(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


FC_RELU = ("FullyConnectedOptions", {"FusedActivationFunction": tflite.ActivationFunctionType.RELU})


# ---- layer discovery ----

def test_lenet300_fc_layers_in_order(lenet300_model):
    layers = lenet300_model.layers()
    assert [layer.name for layer in layers] == ["fc1", "fc2", "fc3"]
    assert [layer.shape for layer in layers] == [(300, 784), (100, 300), (10, 100)]
    assert [layer.activation for layer in layers] == ["RELU", "RELU", "NONE"]
    assert all(layer.op == "FULLY_CONNECTED" and layer.compressible for layer in layers)


def test_lenet300_layers_are_chained(lenet300_model):
    fc1, fc2, fc3 = lenet300_model.layers()
    assert fc2.input == fc1.output and fc3.input == fc2.output
    assert fc1.op_index < fc2.op_index < fc3.op_index


def test_lenet5_conv_and_fc_layers(lenet5_model):
    layers = lenet5_model.layers(kinds=("fc", "conv"))
    assert [layer.name for layer in layers] == ["conv1", "conv2", "fc1", "fc2"]
    assert [layer.shape for layer in layers] == [(20, 5, 5, 1), (50, 5, 5, 20), (500, 800), (10, 500)]
    assert [layer.name for layer in lenet5_model.layers(kinds=("conv",))] == ["conv1", "conv2"]


def test_unknown_kind_is_an_input_error(lenet5_model):
    with pytest.raises(InputError, match="unknown layer kind"):
        lenet5_model.layers(kinds=("lstm",))


def test_unknown_layer_name_lists_the_layers(lenet300_model):
    with pytest.raises(InputError, match="no layer 'fc9'.*fc1, fc2, fc3"):
        lenet300_model.layer("fc9")


@pytest.mark.parametrize("name", ["lenet300.tflite", "lenet5.tflite", "lenet300_ool.tflite", "shared.tflite"])
def test_bytes_at_offset_are_the_weight(name):
    model = load(name)
    for layer in model.layers(kinds=("fc", "conv")):
        w = model.weight(layer)
        assert w.dtype == np.float32 and w.shape == layer.shape
        assert layer.nbytes == w.nbytes and layer.offset % 4 == 0
        assert model.data[layer.offset:layer.offset + layer.nbytes] == w.tobytes()


def test_weight_is_read_only(lenet300_model):
    with pytest.raises(ValueError):
        lenet300_model.weight("fc1")[0, 0] = 1.0


def test_out_of_line_buffers_give_the_same_weights(lenet300_model):
    ool = load("lenet300_ool.tflite")
    assert [layer.shape for layer in ool.layers()] == [layer.shape for layer in lenet300_model.layers()]
    for a, b in zip(lenet300_model.layers(), ool.layers()):
        np.testing.assert_array_equal(lenet300_model.weight(a), ool.weight(b))


def test_shared_buffer_is_listed_once():
    model = load("shared.tflite")
    groups = model.weight_buffers()
    shared = [g for g in groups if len(g.layers) > 1]
    assert len(shared) == 1
    group = shared[0]
    assert len({g.buffer for g in groups}) == len(groups)
    for name in group.layers:
        layer = model.layer(name)
        assert layer.buffer == group.buffer and set(layer.shared_with) == set(group.layers) - {name}


def test_weight_buffers_cover_every_compressible_layer(lenet5_model):
    groups = lenet5_model.weight_buffers(kinds=("fc", "conv"))
    assert [g.layers for g in groups] == [("conv1",), ("conv2",), ("fc1",), ("fc2",)]
    assert all(g.nbytes == 4 * np.prod(g.shape) for g in groups)


def test_input_and_output_details(lenet300_model):
    (inp,) = lenet300_model.input_details()
    (out,) = lenet300_model.output_details()
    assert inp["shape_signature"] == (-1, 784) and inp["dtype"] == np.float32
    assert out["shape"][-1] == 10


# ---- replace ----

def test_replace_round_trip(lenet300_model):
    w = np.asarray(lenet300_model.weight("fc2")) * np.float32(0.5)
    data = lenet300_model.replace({"fc2": w})
    assert len(data) == len(lenet300_model.data)
    again = TFLiteModel(data)
    np.testing.assert_array_equal(again.weight("fc2"), w)
    layer = lenet300_model.layer("fc2")
    assert data[:layer.offset] == lenet300_model.data[:layer.offset]
    assert data[layer.offset + layer.nbytes:] == lenet300_model.data[layer.offset + layer.nbytes:]


def test_replace_by_buffer_index(lenet300_model):
    layer = lenet300_model.layer("fc3")
    zeros = np.zeros(layer.shape, np.float32)
    assert lenet300_model.replace({layer.buffer: zeros}) == lenet300_model.replace({"fc3": zeros})


def test_replace_out_of_line_model():
    ool = load("lenet300_ool.tflite")
    w = np.full(ool.layer("fc1").shape, 0.25, np.float32)
    np.testing.assert_array_equal(TFLiteModel(ool.replace({"fc1": w})).weight("fc1"), w)


def test_replace_casts_float64_to_float32(lenet300_model):
    w = np.asarray(lenet300_model.weight("fc3"), np.float64) + 1
    np.testing.assert_array_equal(TFLiteModel(lenet300_model.replace({"fc3": w})).weight("fc3"), w.astype(np.float32))


def test_replace_checks_the_shape(lenet300_model):
    with pytest.raises(InputError, match=r"fc2: array of shape \(300, 100\) does not match .*\(100, 300\)"):
        lenet300_model.replace({"fc2": np.zeros((300, 100), np.float32)})


def test_replace_refuses_complex_values(lenet300_model):
    with pytest.raises(InputError, match="cannot store complex"):
        lenet300_model.replace({"fc3": np.zeros((10, 100), np.complex64)})


def test_replace_shared_buffer_with_two_arrays_is_an_error():
    model = load("shared.tflite")
    group = next(g for g in model.weight_buffers() if len(g.layers) > 1)
    a, b = np.zeros(group.shape, np.float32), np.ones(group.shape, np.float32)
    with pytest.raises(InputError, match="two different arrays"):
        model.replace({group.layers[0]: a, group.layers[1]: b})
    np.testing.assert_array_equal(TFLiteModel(model.replace({group.layers[0]: b})).weight(group.layers[1]), b)


# ---- what is not compressible ----

def _int8_model():
    return build_tflite(
        tensors=[{"shape": [1, 8]},
                 {"shape": [4, 8], "type": tflite.TensorType.INT8, "scale": 0.1,
                  "data": np.arange(-16, 16, dtype=np.int8).tobytes()},
                 {"shape": [1, 4]}],
        ops=[("FULLY_CONNECTED", [0, 1, -1], [2])], inputs=[0], outputs=[2])


def test_int8_weights_are_compressible_and_read_dequantized():
    model = TFLiteModel(_int8_model())
    (layer,) = model.layers()
    assert layer.compressible and layer.stored_dtype == "INT8" and layer.bias is None
    assert model.stored(layer).dtype == np.int8
    w = model.weight(layer)
    assert w.dtype == np.float32 and np.allclose(w, np.arange(-16, 16).reshape(4, 8) * np.float32(0.1))


def test_replace_quantizes_real_values_into_int8_weights():
    model = TFLiteModel(_int8_model())
    replaced = TFLiteModel(model.replace({"fc1": model.weight("fc1") + np.float32(0.04)}))
    assert np.array_equal(replaced.stored("fc1"), model.stored("fc1"))  # 0.04 rounds back to the same step
    clipped = TFLiteModel(model.replace({"fc1": np.full((4, 8), 1e6, np.float32)}))
    assert (clipped.stored("fc1") == 127).all()


def _float16_model(values, extra_ops=()):
    """x -> DEQUANTIZE(float16 constant) -> FULLY_CONNECTED, as the converter's float16 option writes it."""
    return build_tflite(
        tensors=[{"shape": [1, 8]},
                 {"shape": [4, 8], "type": tflite.TensorType.FLOAT16, "data": values.astype(np.float16).tobytes()},
                 {"shape": [4, 8]}, {"shape": [1, 4]}, {"shape": [4, 8]}],
        ops=[("DEQUANTIZE", [1], [2]), ("FULLY_CONNECTED", [0, 2, -1], [3]), *extra_ops], inputs=[0], outputs=[3])


def test_float16_weights_behind_dequantize_are_found_through_the_op():
    values = np.arange(32, dtype=np.float32).reshape(4, 8) / 7
    model = TFLiteModel(_float16_model(values))
    (layer,) = model.layers()
    assert layer.compressible and layer.stored == 1 and layer.stored_dtype == "FLOAT16" and layer.dtype == "FLOAT32"
    assert layer.nbytes == 64 and layer.shape == (4, 8)
    assert model.data[layer.offset:layer.offset + 64] == values.astype(np.float16).tobytes()
    assert [b.dtype for b in model.weight_buffers()] == ["FLOAT16"]


def test_float16_weight_reads_as_dequantized_float32():
    values = np.arange(32, dtype=np.float32).reshape(4, 8) / 7
    model = TFLiteModel(_float16_model(values))
    w = model.weight("fc1")
    assert w.dtype == np.float32 and not w.flags.writeable
    assert np.array_equal(w, values.astype(np.float16).astype(np.float32))
    assert model.stored("fc1").dtype == np.float16


def test_replace_rounds_float32_into_a_float16_buffer():
    model = TFLiteModel(_float16_model(np.zeros((4, 8))))
    new = np.full((4, 8), 1 / 3, np.float32)
    replaced = TFLiteModel(model.replace({"fc1": new}))
    assert np.array_equal(replaced.stored("fc1"), new.astype(np.float16))


def test_float16_weight_from_densify_says_it_is_sparse():
    """sparse float16 weights: constant -> DENSIFY -> DEQUANTIZE -> FULLY_CONNECTED."""
    content = build_tflite(
        tensors=[{"shape": [1, 8]},
                 {"shape": [4, 8], "type": tflite.TensorType.FLOAT16, "data": np.ones((4, 8), np.float16).tobytes()},
                 {"shape": [4, 8], "type": tflite.TensorType.FLOAT16}, {"shape": [4, 8]}, {"shape": [1, 4]}],
        ops=[("DENSIFY", [1], [2]), ("DEQUANTIZE", [2], [3]), ("FULLY_CONNECTED", [0, 3, -1], [4])],
        inputs=[0], outputs=[4])
    (layer,) = TFLiteModel(content).layers()
    assert not layer.compressible
    assert layer.skip_reason.endswith("computed by a DEQUANTIZE op from a DENSIFY op (sparse-format weights are kept "
                                      "lossless)")


def test_float16_constant_read_by_another_op_is_not_compressible():
    model = TFLiteModel(_float16_model(np.ones((4, 8)), extra_ops=[("DEQUANTIZE", [1], [4])]))
    (layer,) = model.layers()
    assert not layer.compressible and "tensor 1 of subgraph 0 is also read by op 2 (DEQUANTIZE)" in layer.skip_reason


def test_weight_also_read_by_another_op_is_not_compressible():
    data = build_tflite(
        tensors=[{"shape": [1, 8]}, {"shape": [8, 8], "data": f32((8, 8)).tobytes()}, {"shape": [1, 8]},
                 {"shape": [1, 8]}],
        ops=[("FULLY_CONNECTED", [0, 1, -1], [2]), ("ADD", [2, 1], [3])], inputs=[0], outputs=[3])
    (layer,) = TFLiteModel(data).layers()
    assert not layer.compressible and "read by op 1 (ADD)" in layer.skip_reason


def test_buffer_also_read_by_a_non_weight_tensor_is_not_compressible():
    data = build_tflite(
        tensors=[{"shape": [1, 8]}, {"shape": [8, 8], "data": f32((8, 8)).tobytes()}, {"shape": [1, 8]},
                 {"shape": [8, 8], "data": b"", "same_buffer_as": 1}, {"shape": [1, 8]}],
        ops=[("FULLY_CONNECTED", [0, 1, -1], [2]), ("ADD", [2, 3], [4])], inputs=[0], outputs=[4])
    (layer,) = TFLiteModel(data).layers()
    assert not layer.compressible and "not a layer weight" in layer.skip_reason


def test_bias_is_found_through_the_op_inputs():
    data = build_tflite(
        tensors=[{"shape": [1, 8]}, {"shape": [4, 8], "data": f32((4, 8)).tobytes()},
                 {"shape": [4], "data": f32(4).tobytes()}, {"shape": [1, 4]}],
        ops=[("FULLY_CONNECTED", [0, 1, 2], [3], *FC_RELU)], inputs=[0], outputs=[3])
    (layer,) = TFLiteModel(data).layers()
    assert layer.bias == 2 and layer.weight == 1 and layer.activation == "RELU" and layer.compressible


# ---- corrupt input ----

def test_not_a_tflite_file():
    with pytest.raises(FormatError, match="not a TFLite model: missing 'TFL3' identifier"):
        TFLiteModel(b"PK\x03\x04 this is a zip file")


def test_empty_file():
    with pytest.raises(FormatError, match="TFL3"):
        TFLiteModel(b"")


@pytest.mark.parametrize("fraction", [0.01, 0.1, 0.5, 0.9, 0.999])
def test_truncated_file(lenet300_model, fraction):
    with pytest.raises(FormatError):
        TFLiteModel(lenet300_model.data[:max(8, int(len(lenet300_model.data) * fraction))])


def test_truncated_out_of_line_file():
    ool = load("lenet300_ool.tflite")
    end = max(layer.offset + layer.nbytes for layer in ool.layers())
    with pytest.raises(FormatError, match="truncated TFLite model: buffer"):
        TFLiteModel(ool.data[:end - 1])


def test_corrupt_root_offset(lenet300_model):
    data = b"\xff\xff\xff\x7f" + lenet300_model.data[4:]
    with pytest.raises(FormatError):
        TFLiteModel(data)


SHARED = (DATA / "shared.tflite").read_bytes()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(8, len(SHARED) - 1), st.integers(0, 255)), min_size=1, max_size=4))
def test_corrupt_bytes_give_a_format_error_or_a_model(edits):
    data = bytearray(SHARED)
    for position, value in edits:
        data[position] = value
    try:
        model = TFLiteModel(bytes(data))
    except FormatError:
        return
    for layer in model.layers(kinds=("fc", "conv")):
        if layer.compressible:
            assert model.weight(layer).nbytes == layer.nbytes


def test_transpose_conv_weights_behind_dequantize_are_a_conv_layer():
    kernel = np.arange(2 * 3 * 3 * 4, dtype=np.float32).reshape(2, 3, 3, 4) / 50
    data = build_tflite(
        tensors=[{"shape": [4], "type": tflite.TensorType.INT32, "data": np.array([1, 8, 8, 2], np.int32).tobytes()},
                 {"shape": [2, 3, 3, 4], "type": tflite.TensorType.FLOAT16, "data": kernel.astype(np.float16).tobytes()},
                 {"shape": [2, 3, 3, 4]}, {"shape": [1, 4, 4, 4]}, {"shape": [1, 8, 8, 2]}],
        ops=[("DEQUANTIZE", [1], [2]), ("TRANSPOSE_CONV", [0, 2, 3], [4])], inputs=[3], outputs=[4])
    (layer,) = TFLiteModel(data).layers(kinds=("conv",))
    assert layer.name == "conv1" and layer.op == "TRANSPOSE_CONV" and layer.compressible
    assert layer.input == 3 and layer.bias is None and layer.stored_dtype == "FLOAT16"
