"""Interpreter loading and evaluation on the reference models and Fashion-MNIST."""

from pathlib import Path

import numpy as np
import pytest
import tflite
from test_model import build_tflite, f32

from pydsz.errors import DszError, InputError
from pydsz.format.interpreter import REPACK_LIMIT, RUNTIMES, interpreter_class, make_interpreter
from pydsz.model import activations, runtime
from pydsz.model.graph import TFLiteModel
from pydsz.prune import gptq

# these run a TFLite interpreter: CI runs them again under tflite-runtime
pytestmark = pytest.mark.runtime

DATA = Path(__file__).parents[1] / "pydsz" / "data"


@pytest.fixture(scope="module")
def held_out():
    with np.load(DATA / "fmnist_test.npz") as f:
        return f["x"][:2000], f["y"][:2000]


def test_litert_is_found(monkeypatch):
    interpreter = pytest.importorskip("ai_edge_litert.interpreter").Interpreter
    monkeypatch.delenv("DSZ_RUNTIME", raising=False)
    assert interpreter_class() is interpreter


def test_environment_variable_forces_a_runtime(monkeypatch):
    interpreter = pytest.importorskip("ai_edge_litert.interpreter").Interpreter
    monkeypatch.setenv("DSZ_RUNTIME", "litert")
    assert interpreter_class() is interpreter
    monkeypatch.setenv("DSZ_RUNTIME", "onnx")
    with pytest.raises(DszError, match="unknown TFLite runtime 'onnx'"):
        interpreter_class()


def test_missing_runtime_names_the_extra(monkeypatch):
    # a module set to None in sys.modules raises ImportError on import
    monkeypatch.setitem(__import__("sys").modules, "tflite_runtime.interpreter", None)
    monkeypatch.setitem(__import__("sys").modules, "tflite_runtime", None)
    with pytest.raises(DszError, match=r"pip install pydsz\[litert\]"):
        interpreter_class("tflite-runtime")


@pytest.mark.parametrize("name", sorted(RUNTIMES))
def test_every_installed_runtime_gives_the_same_predictions(name, lenet5, held_out):
    try:
        interpreter = make_interpreter(lenet5, runtime=name)
    except DszError as exc:
        pytest.skip(str(exc))
    x, _ = held_out
    np.testing.assert_allclose(runtime.predict(interpreter, x[:200]), runtime.predict(lenet5, x[:200]), atol=1e-5)


@pytest.mark.parametrize("name", sorted(RUNTIMES))
def test_a_model_over_the_repack_limit_runs_on_the_builtin_kernels_with_the_same_predictions(
        name, lenet5, held_out, monkeypatch):
    try:
        reference = runtime.predict(make_interpreter(lenet5, runtime=name), held_out[0][:200])
    except DszError as exc:
        pytest.skip(str(exc))
    monkeypatch.setattr("pydsz.format.interpreter.REPACK_LIMIT", len(lenet5) - 1)
    builtin = make_interpreter(lenet5, runtime=name)
    np.testing.assert_allclose(runtime.predict(builtin, held_out[0][:200]), reference, atol=1e-5)


def _rss() -> int:
    return next(int(line.split()[1]) << 10 for line in open("/proc/self/status") if line.startswith("VmRSS"))


def test_a_model_over_the_repack_limit_keeps_no_copy_of_its_weights(held_out):
    # one 4160x4096 dense layer: 68 MB of weights, over the limit; XNNPACK would add a copy of them
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.01, (4096, 4160)).astype(np.float32)
    model = build_tflite(
        [{"shape": [1, 4160]}, {"shape": [4096, 4160], "data": w.tobytes()}, {"shape": [1, 4096]}],
        [("FULLY_CONNECTED", [0, 1], [2])], inputs=[0], outputs=[2])
    assert len(model) > REPACK_LIMIT
    before = _rss()
    interpreter = make_interpreter(model)
    out = runtime.predict(interpreter, np.ones((2, 4160), np.float32))
    assert _rss() - before < w.nbytes // 4
    np.testing.assert_allclose(out, np.ones((2, 4160), np.float32) @ w.T, rtol=1e-4, atol=1e-4)


def test_make_interpreter_takes_bytearray_and_model(lenet300):
    for content in (bytearray(lenet300), memoryview(lenet300), TFLiteModel(lenet300)):
        interpreter = make_interpreter(content, num_threads=1)
        assert interpreter.get_input_details()[0]["shape_signature"].tolist() == [-1, 784]


def test_make_interpreter_rejects_garbage():
    with pytest.raises(DszError):
        make_interpreter(b"not a model at all, not at all")


@pytest.mark.parametrize("name", ["lenet300", "lenet5"])
def test_predict_reshapes_uint8_images(name, request, held_out):
    x, _ = held_out
    out = runtime.predict(request.getfixturevalue(name), x[:300], batch_size=128)
    assert out.shape == (300, 10) and out.dtype == np.float32
    np.testing.assert_allclose(out.sum(axis=1), 1, atol=1e-5)  # softmax


def test_predict_does_not_depend_on_the_batch_size(lenet5, held_out):
    x, _ = held_out
    a = runtime.predict(lenet5, x[:200], batch_size=200)
    b = runtime.predict(lenet5, x[:200], batch_size=7)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_predict_accepts_flat_samples_for_an_image_model(lenet5, held_out):
    x, _ = held_out
    np.testing.assert_array_equal(runtime.predict(lenet5, x[:50]), runtime.predict(lenet5, x[:50].reshape(50, 784)))


def test_predict_reuses_an_interpreter(lenet300, held_out):
    x, _ = held_out
    interpreter = make_interpreter(lenet300)
    first = runtime.predict(interpreter, x[:100], batch_size=64)
    np.testing.assert_array_equal(runtime.predict(interpreter, x[:100], batch_size=64), first)
    np.testing.assert_allclose(runtime.predict(lenet300, x[:100]), first, atol=1e-6)


def test_predict_falls_back_to_one_sample_for_a_fixed_batch():
    # RESHAPE to a constant [1, 4] only works one sample at a time
    w = f32((3, 4))
    data = build_tflite(
        tensors=[{"shape": [1, 2, 2]}, {"shape": [2], "data": np.array([1, 4], np.int32).tobytes(), "type": tflite.TensorType.INT32},
                 {"shape": [1, 4]}, {"shape": [3, 4], "data": w.tobytes()}, {"shape": [1, 3]}],
        ops=[("RESHAPE", [0, 1], [2]), ("FULLY_CONNECTED", [2, 3, -1], [4])], inputs=[0], outputs=[4])
    x = f32((10, 2, 2), 1)
    np.testing.assert_allclose(runtime.predict(data, x, batch_size=4), x.reshape(10, 4) @ w.T, rtol=1e-5, atol=1e-6)


def test_an_output_without_a_row_per_sample_falls_back_to_one_sample():
    # a STRIDED_SLICE ending at row 1 hard-codes a batch of 1 without failing: a batch of 4 gives one row
    i32 = {"type": tflite.TensorType.INT32}
    data = build_tflite(
        tensors=[{"shape": [1, 4]}, {"shape": [2], "data": np.array([0, 0], np.int32).tobytes(), **i32},
                 {"shape": [2], "data": np.array([1, 4], np.int32).tobytes(), **i32},
                 {"shape": [2], "data": np.array([1, 1], np.int32).tobytes(), **i32}, {"shape": [1, 4]}],
        ops=[("STRIDED_SLICE", [0, 1, 2, 3], [4])], inputs=[0], outputs=[4])
    x = f32((10, 4), 2)
    np.testing.assert_array_equal(runtime.predict(data, x, batch_size=4), x)
    keys = [d["key"] for d in TFLiteModel(data).output_details()]
    np.testing.assert_array_equal(runtime.outputs(data, x, keys, batch_size=4)[keys[0]], x)


def test_predict_shape_mismatch_message(lenet300):
    with pytest.raises(InputError, match=r"x has samples of shape \(32, 32, 3\) \(3072 values\) "
                                         r"but the model takes \(784,\)"):
        runtime.predict(lenet300, np.zeros((4, 32, 32, 3), np.uint8))


def test_predict_needs_a_sample(lenet300):
    with pytest.raises(InputError, match="at least one sample"):
        runtime.predict(lenet300, np.zeros((0, 784), np.float32))


def test_accuracy_of_the_reference_models(lenet300, lenet5, held_out):
    x, y = held_out
    assert runtime.accuracy(lenet300, x, y) > 0.8
    assert runtime.accuracy(lenet5, x, y) > 0.8


def test_accuracy_rejects_labels_out_of_range(lenet300, held_out):
    x, y = held_out
    with pytest.raises(InputError, match=r"labels range over 0\.\.10 but the model has 10 outputs"):
        runtime.accuracy(lenet300, x[:3], np.array([0, 10, 2]))


def test_accuracy_rejects_label_count_mismatch(lenet300, held_out):
    x, y = held_out
    with pytest.raises(InputError, match="vector of 10 labels"):
        runtime.accuracy(lenet300, x[:10], y[:9])


def test_capture_the_input_of_the_first_fc_layer(lenet5, held_out):
    x, _ = held_out
    fc1 = TFLiteModel(lenet5).layer("fc1")
    h = activations.capture(lenet5, x[:100], fc1.input, batch_size=32)
    assert h.shape == (100, 800) and h.dtype == np.float32
    assert (h >= 0).any() and np.isfinite(h).all()
    # the same rows whatever the batch
    np.testing.assert_allclose(activations.capture(lenet5, x[:100], fc1.input, batch_size=100), h, rtol=1e-5, atol=1e-6)


def test_capture_batches_hold_the_preserved_tensors_within_their_bytes(lenet5, held_out, monkeypatch):
    """The default batch keeps every preserved tensor of a batch within CAPTURE_BYTES (LeNet-5 keeps
    about 85 KB a sample: 200 KB allows 2 samples), and the values are those of a batch of 256, bit for bit."""
    x, _ = held_out
    fc1 = TFLiteModel(lenet5).layer("fc1")
    whole = activations.capture(lenet5, x[:50], fc1.input, batch_size=256)
    batches = []
    run = runtime.run_batches
    monkeypatch.setattr(runtime, "run_batches", lambda it, x, batch_size, read: batches.append(batch_size) or
                        run(it, x, batch_size, read))
    monkeypatch.setattr(runtime, "CAPTURE_BYTES", 200_000)
    small = activations.capture(lenet5, x[:50], fc1.input)
    assert batches == [2]
    assert np.array_equal(small.view(np.uint32), whole.view(np.uint32))


def test_outputs_batches_hold_the_tensors_within_their_bytes(lenet5, held_out, monkeypatch):
    """outputs() sizes its default batch by BATCH_BYTES (LeNet-5: about 85 KB a sample, 200 KB allow 2),
    to the same outputs as a batch of 256 up to float rounding (tflite-runtime 2.14's kernels round a
    sample differently in another batch; LiteRT's do not)."""
    x, _ = held_out
    keys = [d["key"] for d in TFLiteModel(lenet5).output_details()]
    whole = runtime.outputs(lenet5, x[:50], keys, batch_size=256)
    batches = []
    run = runtime.run_batches
    monkeypatch.setattr(runtime, "run_batches", lambda it, x, batch_size, read: batches.append(batch_size) or
                        run(it, x, batch_size, read))
    assert runtime.BATCH_BYTES // 90_000 >= runtime.DEFAULT_BATCH  # small models keep the default
    monkeypatch.setattr(runtime, "BATCH_BYTES", 200_000)
    small = runtime.outputs(lenet5, x[:50], keys)
    assert batches == [2]
    for k in keys:
        np.testing.assert_allclose(small[k], whole[k], rtol=1e-5, atol=1e-6)
        assert np.array_equal(small[k].argmax(axis=-1), whole[k].argmax(axis=-1))


def test_capture_of_the_output_is_the_prediction(lenet300, held_out):
    x, _ = held_out
    (out,) = TFLiteModel(lenet300).output_details()
    np.testing.assert_allclose(activations.capture(lenet300, x[:64], out["index"]), runtime.predict(lenet300, x[:64]),
                               atol=1e-6)


def test_capture_rejects_a_tensor_without_batch_axis(lenet300, held_out):
    x, _ = held_out
    fc1 = TFLiteModel(lenet300).layer("fc1")
    with pytest.raises(InputError, match="no batch axis"):
        activations.capture(lenet300, x[:4], fc1.weight)


def test_capture_rejects_a_bad_tensor_index(lenet300, held_out):
    x, _ = held_out
    with pytest.raises(InputError, match="tensor 9999 out of range"):
        activations.capture(lenet300, x[:4], 9999)


def test_stream_reads_a_tensor_without_a_row_per_sample():
    # a front end as BirdNET's: each sample's frames reshaped to rows of one FC layer ([frames x batch, 4])
    w = f32((5, 4))
    i32 = {"type": tflite.TensorType.INT32}
    data = build_tflite(
        tensors=[{"shape": [1, 3, 4]}, {"shape": [2], "data": np.array([-1, 4], np.int32).tobytes(), **i32},
                 {"shape": [3, 4]}, {"shape": [5, 4], "data": w.tobytes()}, {"shape": [3, 5]},
                 {"shape": [2], "data": np.array([-1, 15], np.int32).tobytes(), **i32}, {"shape": [1, 15]}],
        ops=[("RESHAPE", [0, 1], [2]), ("FULLY_CONNECTED", [2, 3, -1], [4]), ("RESHAPE", [4, 5], [6])],
        inputs=[0], outputs=[6])
    x = f32((10, 3, 4), 3)
    seen = []
    activations.stream(data, x, 2, seen.append, batch_size=4)
    assert [len(s) for s in seen] == [12, 12, 6]  # three frames a sample, batches of 4, 4 and 2 samples
    np.testing.assert_array_equal(np.concatenate(seen), x.reshape(30, 4))
    with pytest.raises(DszError):
        activations.capture(data, x, 2)  # capture keeps one row per sample: there is none to keep

    model = TFLiteModel(data)
    rows = x.reshape(30, 4).astype(np.float64)
    np.testing.assert_allclose(gptq.hessian(model, model.layers()[0], x)[0], 2 * rows.T @ rows / 30, rtol=1e-12)


_HEAP = """
import os, sys
import numpy as np
from pydsz.model import runtime
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE') >> 20
runtime.pin_mmap_threshold()
a = np.ones(30 << 17); del a  # a 30 MiB block freed: glibc's own threshold would rise to it
before = rss()
b = np.ones(20 << 17)  # 20 MiB
c = [bytearray(1000) for _ in range(1000)]  # small blocks after it, on the heap
del b
print(rss() - before)
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists() or runtime._libc() is False, reason="glibc on Linux")
def test_a_freed_large_array_goes_back_to_the_system_whatever_came_before():
    """The peak the memory bound promises must not move with the order arrays come in: with glibc's
    own threshold the 20 MiB array comes from the heap under small blocks and stays resident when
    freed (21 MiB measured without pin_mmap_threshold)."""
    import subprocess
    import sys

    kept = subprocess.run([sys.executable, "-c", _HEAP], capture_output=True, text=True, check=True).stdout
    assert int(kept) < 8
