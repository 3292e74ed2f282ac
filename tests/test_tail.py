"""The numpy FC tail agrees with the interpreter, with the model's weights and with others plugged in."""

from pathlib import Path

import numpy as np
import pytest
import tflite
from test_model import build_tflite, f32

from pydsz.errors import InputError
from pydsz.model import activations, runtime
from pydsz.model.graph import TFLiteModel
from pydsz.model.tail import Tail

# these run a TFLite interpreter: CI runs them again under tflite-runtime
pytestmark = pytest.mark.runtime

DATA = Path(__file__).parents[1] / "pydsz" / "data"
ACT = tflite.ActivationFunctionType
INT32 = tflite.TensorType.INT32


_captured = {}


def captured(model_bytes, x, tensor):
    """runtime.capture, cached: capturing LeNet-5 on the whole test set takes seconds."""
    key = (hash(model_bytes), x.shape, tensor)
    if key not in _captured:
        _captured[key] = activations.capture(model_bytes, x, tensor)
    return _captured[key]


def assert_agrees(tail, model_bytes, x):
    """The tail on captured activations vs the interpreter on the whole model."""
    out = tail.forward(captured(model_bytes, x, tail.input_tensor))
    expected = runtime.predict(model_bytes, x)
    assert out.shape == expected.shape and out.dtype == np.float32
    np.testing.assert_allclose(out, expected, atol=1e-5)
    assert np.mean(out.argmax(1) == expected.argmax(1)) >= 0.999


@pytest.mark.parametrize("model_name, start, layers", [
    ("lenet300", "fc1", ("fc1", "fc2", "fc3")),
    ("lenet300", "fc2", ("fc2", "fc3")),
    ("lenet5", "fc1", ("fc1", "fc2")),
])
def test_tail_agrees_with_the_interpreter(model_name, start, layers, request, test_set):
    model = request.getfixturevalue(model_name + "_model")
    tail = Tail.from_model(model, start)
    assert tail is not None and tail.layers == layers
    assert tail.input_tensor == model.layer(start).input
    assert_agrees(tail, model.data, test_set[0])


def test_tail_accuracy_equals_the_interpreter(lenet5_model, test_set):
    x, y = test_set
    tail = Tail.from_model(lenet5_model, "fc1")
    h = captured(lenet5_model.data, x, tail.input_tensor)
    assert abs(tail.accuracy(h, y) - runtime.accuracy(lenet5_model.data, x, y)) <= 1 / len(y)


@pytest.mark.parametrize("model_name, start, layer", [("lenet300", "fc1", "fc2"), ("lenet5", "fc1", "fc1")])
def test_plugged_in_weights_match_a_replaced_model(model_name, start, layer, request, test_set):
    model = request.getfixturevalue(model_name + "_model")
    x = test_set[0][:2000]
    tail = Tail.from_model(model, start)
    w = np.array(model.weight(layer))
    w[np.abs(w) < np.quantile(np.abs(w), 0.9)] = 0  # pruned, as DeepSZ does
    w += np.random.default_rng(1).uniform(-0.01, 0.01, w.shape).astype(np.float32) * (w != 0)
    h = activations.capture(model.data, x, tail.input_tensor)
    replaced = runtime.predict(model.replace({layer: w}), x)
    np.testing.assert_allclose(tail.forward(h, weights={layer: w}), replaced, atol=1e-5)
    assert not np.allclose(tail.forward(h), replaced, atol=1e-3)  # the change is visible


def test_forward_batches_in_chunks(lenet300_model, test_set):
    tail = Tail.from_model(lenet300_model, "fc2")
    h = activations.capture(lenet300_model.data, test_set[0][:1000], tail.input_tensor)
    np.testing.assert_allclose(tail.forward(h, chunk=77), tail.forward(h), atol=1e-5)


def test_input_of_a_later_layer_feeds_its_own_tail(lenet300_model, test_set):
    full = Tail.from_model(lenet300_model, "fc1")
    later = Tail.from_model(lenet300_model, "fc3")
    h = activations.capture(lenet300_model.data, test_set[0][:500], full.input_tensor)
    h3 = full.input_of(h, "fc3")
    assert h3.shape == (500, 100)
    np.testing.assert_allclose(h3, activations.capture(lenet300_model.data, test_set[0][:500], later.input_tensor), atol=1e-5)
    w = np.zeros((10, 100), np.float32)
    np.testing.assert_allclose(later.forward(h3, weights={"fc3": w}), full.forward(h, weights={"fc3": w}), atol=1e-6)


@pytest.mark.parametrize("layer", ["fc1", "fc2", "fc3"])
def test_forward_from_a_layer_gives_forwards_numbers_exactly(lenet300_model, test_set, layer):
    tail = Tail.from_model(lenet300_model, "fc1")
    h = activations.capture(lenet300_model.data, test_set[0][:700], tail.input_tensor)
    later = {name: tail.weights[name] * np.float32(0.9) for name in tail.layers[tail.layers.index(layer):]}
    for chunk in (None, 256):
        np.testing.assert_array_equal(tail.forward_from(layer, tail.input_of(h, layer, chunk=chunk), later, chunk=chunk),
                                      tail.forward(h, later, chunk=chunk))
    with pytest.raises(InputError, match="but the tail takes"):
        tail.forward_from("fc2", h)


def test_input_of_the_first_layer_is_a_copy_of_h(lenet300_model):
    tail = Tail.from_model(lenet300_model, "fc2")
    h = np.ones((3, 300), np.float32)
    out = tail.input_of(h, "fc2")
    np.testing.assert_array_equal(out, h)
    assert not np.shares_memory(out, h)


def test_forward_leaves_h_alone(lenet300_model, test_set):
    tail = Tail.from_model(lenet300_model, "fc2")
    h = activations.capture(lenet300_model.data, test_set[0][:100], tail.input_tensor)
    before = h.copy()
    tail.forward(h)
    np.testing.assert_array_equal(h, before)


def test_weights_are_the_models_own_read_only(lenet300_model):
    """The tail's weights are views of the model's float32 bytes (no copy of a large model's tail),
    which nothing can write through."""
    tail = Tail.from_model(lenet300_model, "fc1")
    data = np.frombuffer(lenet300_model.data, np.uint8)
    for name in tail.layers:
        np.testing.assert_array_equal(tail.weights[name], lenet300_model.weight(name))
        assert tail.weights[name].dtype == np.float32 and np.shares_memory(tail.weights[name], data)
        assert not tail.weights[name].flags.writeable
        assert tail.biases[name].shape == (lenet300_model.layer(name).shape[0],)


def test_unknown_layer_override_is_an_error(lenet300_model):
    tail = Tail.from_model(lenet300_model, "fc2")
    with pytest.raises(InputError, match="no layer 'fc1' in the tail"):
        tail.forward(np.zeros((2, 300), np.float32), weights={"fc1": np.zeros((300, 784))})


def test_override_of_the_wrong_shape_is_an_error(lenet300_model):
    tail = Tail.from_model(lenet300_model, "fc2")
    with pytest.raises(InputError, match=r"weights for fc2: shape \(300, 100\) instead of \(100, 300\)"):
        tail.forward(np.zeros((2, 300), np.float32), weights={"fc2": np.zeros((300, 100))})


def test_h_of_the_wrong_shape_is_an_error(lenet300_model):
    with pytest.raises(InputError, match=r"h has samples of shape \(784,\) but the tail takes \(300,\)"):
        Tail.from_model(lenet300_model, "fc2").forward(np.zeros((2, 784), np.float32))


def test_labels_are_checked(lenet300_model):
    tail = Tail.from_model(lenet300_model, "fc3")
    with pytest.raises(InputError, match="labels range"):
        tail.accuracy(np.zeros((2, 100), np.float32), np.array([3, 12]))


def test_a_conv_layer_is_not_a_tail_start(lenet5_model):
    assert Tail.from_model(lenet5_model, "conv2") is None
    with pytest.raises(InputError, match="conv2 is a CONV_2D layer"):
        Tail.from_model(lenet5_model, "conv2", strict=True)


def test_unknown_start_is_an_input_error(lenet5_model):
    with pytest.raises(InputError, match="no layer 'fc7'"):
        Tail.from_model(lenet5_model, "fc7")


# ---- ops beyond the reference models, on small hand-built graphs ----

def chain_model():
    """fc(relu_n1_to_1) -> add const (relu) -> reshape -> logistic -> reshape -> fc(relu6) -> const - x ->
    mul const -> leaky relu -> tanh -> fc -> softmax(beta 0.5)."""
    fc = lambda act: ("FullyConnectedOptions", {"FusedActivationFunction": act})  # noqa: E731
    tensors = [
        {"shape": [1, 12]},                                                    # 0 input
        {"shape": [6, 12], "data": f32((6, 12), 1).tobytes()},                 # 1
        {"shape": [6], "data": f32(6, 2).tobytes()},                           # 2
        {"shape": [1, 6]},                                                     # 3
        {"shape": [6], "data": f32(6, 3).tobytes()},                           # 4
        {"shape": [1, 6]},                                                     # 5
        {"shape": [3], "data": np.array([-1, 2, 3], np.int32).tobytes(), "type": INT32}, # 6
        {"shape": [1, 2, 3]},                                                  # 7
        {"shape": [1, 2, 3]},                                                  # 8
        {"shape": [2], "data": np.array([-1, 6], np.int32).tobytes(), "type": INT32},    # 9
        {"shape": [1, 6]},                                                     # 10
        {"shape": [5, 6], "data": (4 * f32((5, 6), 4)).tobytes()},             # 11
        {"shape": [5], "data": f32(5, 5).tobytes()},                           # 12
        {"shape": [1, 5]},                                                     # 13
        {"shape": [5], "data": f32(5, 6).tobytes()},                           # 14
        {"shape": [1, 5]},                                                     # 15
        {"shape": [1, 5], "data": f32((1, 5), 7).tobytes()},                   # 16
        {"shape": [1, 5]},                                                     # 17
        {"shape": [1, 5]},                                                     # 18
        {"shape": [3, 5], "data": f32((3, 5), 8).tobytes()},                   # 19
        {"shape": [1, 3]},                                                     # 20
        {"shape": [1, 3]},                                                     # 21
        {"shape": [1, 5]},                                                     # 22
    ]
    ops = [
        ("FULLY_CONNECTED", [0, 1, 2], [3], *fc(ACT.RELU_N1_TO_1)),
        ("ADD", [3, 4], [5], "AddOptions", {"FusedActivationFunction": ACT.RELU}),
        ("RESHAPE", [5, 6], [7]),
        ("LOGISTIC", [7], [8]),
        ("RESHAPE", [8, 9], [10]),
        ("FULLY_CONNECTED", [10, 11, 12], [13], *fc(ACT.RELU6)),
        ("SUB", [14, 13], [15]),
        ("MUL", [15, 16], [17]),
        ("LEAKY_RELU", [17], [18], "LeakyReluOptions", {"Alpha": 0.2}),
        ("TANH", [18], [22]),
        ("FULLY_CONNECTED", [22, 19, -1], [20]),
        ("SOFTMAX", [20], [21], "SoftmaxOptions", {"Beta": 0.5}),
    ]
    return build_tflite(tensors, ops, inputs=[0], outputs=[21])


def test_hand_built_chain_agrees_with_the_interpreter():
    data = chain_model()
    model = TFLiteModel(data)
    tail = Tail.from_model(model, "fc1", strict=True)
    assert tail.layers == ("fc1", "fc2", "fc3")
    assert [step.op for step in tail.steps] == ["FULLY_CONNECTED", "ADD", "RESHAPE", "LOGISTIC", "RESHAPE",
                                                 "FULLY_CONNECTED", "SUB", "MUL", "LEAKY_RELU",
                                                 "TANH", "FULLY_CONNECTED", "SOFTMAX"]
    x = np.random.default_rng(0).standard_normal((500, 12)).astype(np.float32)
    out = tail.forward(x)
    np.testing.assert_allclose(out, runtime.predict(data, x), atol=1e-5)
    assert_agrees(Tail.from_model(model, "fc2"), data, x)


def test_branching_graph_has_no_tail():
    data = build_tflite(
        tensors=[{"shape": [1, 4]}, {"shape": [4, 4], "data": f32((4, 4)).tobytes()}, {"shape": [1, 4]},
                 {"shape": [1, 4]}, {"shape": [1, 4]}],
        ops=[("FULLY_CONNECTED", [0, 1, -1], [2]), ("RELU", [2], [3]), ("ADD", [2, 3], [4])],
        inputs=[0], outputs=[4])
    model = TFLiteModel(data)
    assert Tail.from_model(model, "fc1") is None
    with pytest.raises(InputError, match="tail branches"):
        Tail.from_model(model, "fc1", strict=True)


def test_fused_tanh_is_not_supported():
    fc_tanh = ("FullyConnectedOptions", {"FusedActivationFunction": ACT.TANH})
    data = build_tflite(
        tensors=[{"shape": [1, 4]}, {"shape": [4, 4], "data": f32((4, 4)).tobytes()}, {"shape": [1, 4]}],
        ops=[("FULLY_CONNECTED", [0, 1, -1], [2], *fc_tanh)], inputs=[0], outputs=[2])
    with pytest.raises(InputError, match="fused activation TANH"):
        Tail.from_model(TFLiteModel(data), "fc1", strict=True)


def test_unsupported_op_has_no_tail():
    data = build_tflite(
        tensors=[{"shape": [1, 4]}, {"shape": [4, 4], "data": f32((4, 4)).tobytes()}, {"shape": [1, 4]},
                 {"shape": [1, 4]}],
        ops=[("FULLY_CONNECTED", [0, 1, -1], [2]), ("EXP", [2], [3])], inputs=[0], outputs=[3])
    with pytest.raises(InputError, match=r"op 1 \(EXP\) is not supported"):
        Tail.from_model(TFLiteModel(data), "fc1", strict=True)


def test_int8_weights_have_no_tail():
    data = build_tflite(
        tensors=[{"shape": [1, 4]},
                 {"shape": [4, 4], "type": tflite.TensorType.INT8, "scale": 0.1, "data": bytes(16)},
                 {"shape": [1, 4]}],
        ops=[("FULLY_CONNECTED", [0, 1, -1], [2])], inputs=[0], outputs=[2])
    with pytest.raises(InputError, match="no float32 constant weights"):
        Tail.from_model(TFLiteModel(data), "fc1", strict=True)
