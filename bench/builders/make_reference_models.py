"""Make the reference models and data sets bundled in pydsz/data (developer-only; needs TensorFlow).

What it writes into pydsz/data/:
  lenet300.tflite      LeNet-300-100 on Fashion-MNIST: input float32 [N, 784] of raw pixels 0..255,
                       Rescaling(1/255), Dense 300 relu, Dense 100 relu, Dense 10 softmax.
  lenet5.tflite        LeNet-5 in its Caffe form: input float32 [N, 28, 28, 1] of raw pixels 0..255,
                       Rescaling(1/255), Conv 20 5x5, MaxPool 2, Conv 50 5x5, MaxPool 2, Flatten (800),
                       Dense 500 relu, Dense 10 softmax.
  lenet300_ool.tflite  the same LeNet-300-100 converted with out-of-line buffers (Buffer.offset/size,
                       absolute file offsets) instead of inline Buffer.data, as large models are stored.
  shared.tflite        a tiny model in which one weight buffer feeds two FULLY_CONNECTED ops.
  fmnist_val.npz       the validation split: the last 5,000 training images (x uint8 [N, 28, 28], y uint8 [N]).
  fmnist_test.npz      the 10,000 test images (t10k), same layout.

With --dtypes it instead converts the trained lenet300/lenet5 above (their weights read back from
the .tflite files, no training) with the converter's other options, as models are shipped:
  lenet300_f16.tflite, lenet5_f16.tflite    float16 weights (Optimize.DEFAULT + supported_types
                       float16): each weight a float16 constant read through a DEQUANTIZE op.
  lenet300_int8.tflite, lenet5_int8.tflite  full-integer quantization (int8 weights and activations,
                       per-channel weight scales where the converter uses them; float32 input and
                       output), calibrated on 500 validation images.

All models are float32 (no quantization) with a dynamic batch dimension (shape_signature -1), so that
an interpreter can resize the input to any batch. The 1/255 scaling stays a MUL op in the file (see
pixel_scaling), so every stored weight tensor holds the trained weights. Training uses the first 55,000
training images with a fixed seed and takes about 5 minutes on 2 cores. Test accuracy is measured on
the .tflite files through ai-edge-litert, not Keras, and printed with the file sizes.

How to run (TensorFlow is never a dependency of pydsz, its tests or CI; use a separate venv):
    python -m venv ~/tfenv && ~/tfenv/bin/pip install tensorflow-cpu tflite ai-edge-litert
    ~/tfenv/bin/python bench/builders/make_reference_models.py            # from the repository root
Fashion-MNIST comes from Debian's dataset-fashion-mnist (or $DSZ_FASHION_MNIST_DIR).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = Path(__file__).resolve().parents[2]
# Use pydsz.model.data from this checkout without running pydsz/__init__.py, which needs the compiled
# codec: the TF venv need not have pydsz built or installed.
_pkg = types.ModuleType("pydsz")
_pkg.__path__ = [str(REPO / "pydsz")]
sys.modules.setdefault("pydsz", _pkg)

import tensorflow as tf  # noqa: E402
import tflite  # noqa: E402
from ai_edge_litert.interpreter import Interpreter  # noqa: E402

from pydsz.model.data import fashion_mnist, split_validation  # noqa: E402

SEED = 20190622  # HPDC 2019


def pixel_scaling(inp):
    """Rescaling(1/255) that stays a MUL op in the .tflite file.

    A plain Rescaling is folded by the converter into the first layer's weights (stored as W/255),
    which would put that layer's weights on a scale 255 times smaller than the others. The ReLU
    (an identity on pixels) becomes MUL's fused activation and blocks the folding, so the stored
    weights are the trained ones, as in Caffe's LeNet whose data layer does the scaling.
    """
    return tf.keras.layers.ReLU()(tf.keras.layers.Rescaling(1 / 255)(inp))


def lenet300() -> tf.keras.Model:
    inp = tf.keras.Input(shape=(784,), name="pixels")
    h = pixel_scaling(inp)
    h = tf.keras.layers.Dense(300, activation="relu", name="ip1")(h)
    h = tf.keras.layers.Dense(100, activation="relu", name="ip2")(h)
    out = tf.keras.layers.Dense(10, activation="softmax", name="ip3")(h)
    return tf.keras.Model(inp, out, name="lenet300")


def lenet5() -> tf.keras.Model:
    inp = tf.keras.Input(shape=(28, 28, 1), name="pixels")
    h = pixel_scaling(inp)
    h = tf.keras.layers.Conv2D(20, 5, name="conv1")(h)
    h = tf.keras.layers.MaxPooling2D(2, 2)(h)
    h = tf.keras.layers.Conv2D(50, 5, name="conv2")(h)
    h = tf.keras.layers.MaxPooling2D(2, 2)(h)
    h = tf.keras.layers.Flatten()(h)
    h = tf.keras.layers.Dense(500, activation="relu", name="ip1")(h)
    out = tf.keras.layers.Dense(10, activation="softmax", name="ip2")(h)
    return tf.keras.Model(inp, out, name="lenet5")


def shared_fc() -> tf.keras.Model:
    """One Dense layer applied twice: its kernel is one constant feeding two FULLY_CONNECTED ops."""
    inp = tf.keras.Input(shape=(64,), name="features")
    twice = tf.keras.layers.Dense(64, activation="relu", name="shared",
                                  bias_initializer=tf.keras.initializers.RandomNormal(0, 0.1))
    out = tf.keras.layers.Dense(10, activation="softmax", name="head")(twice(twice(inp)))
    return tf.keras.Model(inp, out, name="shared")


def train(model: tf.keras.Model, x, y, xv, yv, epochs: int, lr: float) -> None:
    steps = epochs * -(-len(x) // 128)
    schedule = tf.keras.optimizers.schedules.CosineDecay(lr, steps, alpha=0.05)
    model.compile(optimizer=tf.keras.optimizers.Adam(schedule), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    model.fit(x, y, batch_size=128, epochs=epochs, validation_data=(xv, yv), verbose=2, shuffle=True)


def convert(model: tf.keras.Model, out_of_line: bool = False) -> bytes:
    """Float32 .tflite with a dynamic batch dimension (the Keras input's batch is None)."""
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = []
    # Private flag (TF >= 2.14): store buffers after the flatbuffer, addressed by Buffer.offset/size.
    converter._experimental_use_buffer_offset = out_of_line
    return bytes(converter.convert())


def litert_predict(content: bytes, x: np.ndarray) -> np.ndarray:
    interp = Interpreter(model_content=content)
    inp = interp.get_input_details()[0]
    if inp["shape_signature"][0] != -1:
        raise SystemExit(f"model input {inp['shape_signature']}: batch dimension is not dynamic")
    interp.resize_tensor_input(inp["index"], [len(x), *inp["shape"][1:]])
    interp.allocate_tensors()
    interp.set_tensor(inp["index"], x.reshape(len(x), *inp["shape"][1:]).astype(np.float32))
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


def check_out_of_line(content: bytes) -> int:
    """Every tensor buffer is out of line (offset > 1, size > 0, no inline data); returns how many.

    Metadata buffers (a few bytes such as min_runtime_version) stay inline.
    """
    model = tflite.Model.GetRootAsModel(content, 0)
    metadata = {model.Metadata(i).Buffer() for i in range(model.MetadataLength())}
    n = 0
    for i in range(model.BuffersLength()):
        buf = model.Buffers(i)
        if buf.DataLength() > 0 and i not in metadata:
            raise SystemExit(f"out-of-line model: buffer {i} has {buf.DataLength()} inline bytes")
        if buf.Size() > 0:
            if buf.Offset() <= 1 or buf.Offset() + buf.Size() > len(content):
                raise SystemExit(f"out-of-line model: buffer {i} offset {buf.Offset()} size {buf.Size()}")
            n += 1
    if n == 0:
        raise SystemExit("out-of-line model: no buffer uses offset/size")
    return n


def shared_fc_weight_buffers(content: bytes) -> list[int]:
    """The buffer index of each FULLY_CONNECTED op's weight input, in execution order."""
    model = tflite.Model.GetRootAsModel(content, 0)
    graph = model.Subgraphs(0)
    found = []
    for i in range(graph.OperatorsLength()):
        op = graph.Operators(i)
        code = model.OperatorCodes(op.OpcodeIndex())
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        if builtin == tflite.BuiltinOperator.FULLY_CONNECTED:
            found.append(graph.Tensors(op.Inputs(1)).Buffer())
    return found


def load_trained(model: tf.keras.Model, content: bytes) -> None:
    """Set a Keras model's weights from its float32 .tflite (layers in execution order)."""
    from pydsz.model.graph import TFLiteModel

    tfl = TFLiteModel(content)
    layers = tfl.layers(kinds=("fc", "conv"))
    keras_layers = [layer for layer in model.layers if layer.get_weights()]
    if len(layers) != len(keras_layers):
        raise SystemExit(f"{model.name}: {len(layers)} layers in the .tflite, {len(keras_layers)} in Keras")
    for layer, keras_layer in zip(layers, keras_layers):
        w = np.array(tfl.weight(layer))
        kernel = w.T if layer.kind == "fc" else w.transpose(1, 2, 3, 0)  # [out, in] / OHWI -> Keras
        keras_layer.set_weights([kernel, np.array(tfl.constant(layer.bias))])


def convert_dtype(model: tf.keras.Model, dtype: str, calibration: np.ndarray) -> bytes:
    """The model converted with float16 weights or full-integer int8 quantization."""
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if dtype == "f16":
        converter.target_spec.supported_types = [tf.float16]
    else:
        converter.representative_dataset = lambda: ([x[None]] for x in calibration)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    return bytes(converter.convert())


def make_dtypes(out: Path) -> None:
    (_, _), (x_val, _) = split_validation(*fashion_mnist("train"))
    x_test, y_test = fashion_mnist("test")
    print(f"{'file':<22}{'bytes':>10}{'test top-1':>12}{'float32 top-1':>15}")
    for name, build, shape in (("lenet300", lenet300, (784,)), ("lenet5", lenet5, (28, 28, 1))):
        float32 = (out / f"{name}.tflite").read_bytes()
        model = build()
        load_trained(model, float32)
        base = float(np.mean(litert_predict(float32, x_test).argmax(1) == y_test))
        calibration = x_val[:500].reshape(-1, *shape).astype(np.float32)
        for dtype in ("f16", "int8"):
            content = convert_dtype(model, dtype, calibration)
            (out / f"{name}_{dtype}.tflite").write_bytes(content)
            acc = float(np.mean(litert_predict(content, x_test).argmax(1) == y_test))
            print(f"{name + '_' + dtype + '.tflite':<22}{len(content):>10}{acc:>12.4f}{base:>15.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "pydsz" / "data", help="output directory")
    parser.add_argument("--epochs300", type=int, default=20)
    parser.add_argument("--epochs5", type=int, default=12)
    parser.add_argument("--dtypes", action="store_true",
                        help="only convert the trained models to float16 and int8 (no training)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.dtypes:
        make_dtypes(args.out)
        return
    tf.keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()

    (x_train, y_train), (x_val, y_val) = split_validation(*fashion_mnist("train"))
    x_test, y_test = fashion_mnist("test")
    np.savez_compressed(args.out / "fmnist_val.npz", x=x_val, y=y_val)
    np.savez_compressed(args.out / "fmnist_test.npz", x=x_test, y=y_test)

    def as_float(x, shape):
        return x.reshape(len(x), *shape).astype(np.float32)

    results = []
    made = {}
    for name, build, shape, epochs, lr in (
        ("lenet300", lenet300, (784,), args.epochs300, 1e-3),
        ("lenet5", lenet5, (28, 28, 1), args.epochs5, 1e-3),
    ):
        t0 = time.time()
        model = build()
        train(model, as_float(x_train, shape), y_train, as_float(x_val, shape), y_val, epochs, lr)
        content = convert(model)
        (args.out / f"{name}.tflite").write_bytes(content)
        made[name] = (model, content)
        acc = float(np.mean(litert_predict(content, x_test).argmax(1) == y_test))
        results.append((f"{name}.tflite", len(content), acc, time.time() - t0))

    model, inline = made["lenet300"]
    ool = convert(model, out_of_line=True)
    n_ool = check_out_of_line(ool)
    pred_inline, pred_ool = litert_predict(inline, x_test), litert_predict(ool, x_test)
    if not np.array_equal(pred_inline, pred_ool):
        raise SystemExit("out-of-line model: outputs differ from the inline model")
    (args.out / "lenet300_ool.tflite").write_bytes(ool)
    results.append(("lenet300_ool.tflite", len(ool), float(np.mean(pred_ool.argmax(1) == y_test)), 0.0))

    shared = convert(shared_fc())
    fc_buffers = shared_fc_weight_buffers(shared)
    if len(fc_buffers) != 3 or fc_buffers[0] != fc_buffers[1]:
        raise SystemExit(f"shared model: FC weight buffers {fc_buffers}, expected the first two equal")
    (args.out / "shared.tflite").write_bytes(shared)
    litert_predict(shared, np.random.default_rng(SEED).normal(size=(4, 64)))

    print(f"\n{'file':<22}{'bytes':>10}{'test top-1':>12}{'seconds':>9}")
    for name, size, acc, secs in results:
        print(f"{name:<22}{size:>10}{acc:>12.4f}{secs:>9.0f}")
    print(f"{'shared.tflite':<22}{len(shared):>10}{'-':>12}")
    for name in ("fmnist_val.npz", "fmnist_test.npz"):
        print(f"{name:<22}{(args.out / name).stat().st_size:>10}")
    print(f"\nlenet300_ool: {n_ool} buffers out of line, outputs identical to the inline model;"
          f" shared: FC weight buffers {fc_buffers}")


if __name__ == "__main__":
    main()
