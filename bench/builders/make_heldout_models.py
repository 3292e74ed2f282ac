"""Models "trained elsewhere", as a new user brings them: Keras MLPs and small CNNs on Fashion-MNIST (needs
TensorFlow, in a separate venv; never a dependency of pydsz).

Issue 23's case is an MLP trained by someone else and handed to `dsz prune` / `dsz compress` with only
500 validation and 500 test images. These models are trained here by TensorFlow, not by pydsz's trainer,
with choices pydsz's own models do not make (dropout, a 1/255 scaling the converter folds into the first
layer's weights, other widths and depths), so that the auto sparsity is checked on models it was not
tuned on:

  mlp-a   784 -> 300 relu -> 100 relu -> 10 softmax, dropout 0.2, inputs scaled to [0, 1] in the .npz
  mlp-b   784 -> 512 relu -> 512 relu -> 10 softmax, raw pixels 0..255 and a Rescaling(1/255) the
          converter folds into fc1's weights (stored 255 times smaller than the others)
  mlp-c   784 -> 1000 relu -> 500 relu -> 250 relu -> 10 softmax, no dropout, L2 1e-5
  mlp-d   784 -> 512 relu -> 256 relu -> 10 softmax, dropout 0.2, trained on 4,000 images only (issue 40's
          case: a user's small training set, which is all `--train` then has)
  cnn-a   28x28x1 [0, 1] -> conv 16 5x5 relu -> pool 2 -> conv 32 5x5 relu -> pool 2 -> 512 -> 256 relu -> 10
  cnn-b   28x28x1 raw, Rescaling folded -> conv 32 3x3 relu -> pool 2 -> conv 64 3x3 relu -> pool 2
          -> 1600 -> 128 relu -> 10

Each is trained on Fashion-MNIST's first 55,000 training images (mlp-d: the first 4,000; Adam, cosine
decay, batch 128) and written to DIR/NAME.tflite with the data the commands get, as a user would have it:
  DIR/NAME-train.npz  the training images (x, y)
  DIR/NAME-val.npz    500 validation images from the last 5,000 training images
  DIR/NAME-test.npz   500 test images (the first 500 of t10k); DIR/NAME-test10k.npz all 10,000, to
                      tell a real loss from the noise of 500 images

    python -m venv ~/tfenv && ~/tfenv/bin/pip install tensorflow-cpu
    ~/tfenv/bin/python bench/builders/make_heldout_models.py [--models mlp-a,cnn-a] [--dir DIR]

DIR defaults to $DSZ_HELDOUT_CACHE or ~/.cache/pydsz/heldout. About 2 minutes per MLP and 5 per CNN on
2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parents[2]
# pydsz.model.data from this checkout without pydsz/__init__.py (the TF venv need not have the codec built)
_pkg = types.ModuleType("pydsz")
_pkg.__path__ = [str(REPO / "pydsz")]
sys.modules.setdefault("pydsz", _pkg)

import tensorflow as tf  # noqa: E402

from pydsz.model.data import fashion_mnist, split_validation  # noqa: E402

CACHE = Path(os.environ.get("DSZ_HELDOUT_CACHE", Path.home() / ".cache" / "pydsz" / "heldout"))
SEED = 23
VAL, TEST = 500, 500
TRAIN = {"mlp-d": 4000}  # training images, where not all 55,000


def _dense(h, sizes, dropout=0.0, l2=0.0):
    reg = tf.keras.regularizers.l2(l2) if l2 else None
    for units in sizes:
        h = tf.keras.layers.Dense(units, activation="relu", kernel_regularizer=reg)(h)
        if dropout:
            h = tf.keras.layers.Dropout(dropout)(h)
    return tf.keras.layers.Dense(10, activation="softmax", kernel_regularizer=reg)(h)


def build(name: str):
    """(Keras model, whether its input is raw pixels 0..255, epochs)."""
    tf.keras.utils.set_random_seed(SEED)
    if name.startswith("mlp"):
        inp = tf.keras.Input(shape=(784,))
        raw = name == "mlp-b"
        h = tf.keras.layers.Rescaling(1 / 255)(inp) if raw else inp
        sizes, dropout, l2 = {"mlp-a": ((300, 100), 0.2, 0), "mlp-b": ((512, 512), 0.2, 0),
                              "mlp-c": ((1000, 500, 250), 0.0, 1e-5), "mlp-d": ((512, 256), 0.2, 0)}[name]
        return tf.keras.Model(inp, _dense(h, sizes, dropout, l2)), raw, 40 if name in TRAIN else 15
    inp = tf.keras.Input(shape=(28, 28, 1))
    raw = name == "cnn-b"
    h = tf.keras.layers.Rescaling(1 / 255)(inp) if raw else inp
    filters, kernel, hidden = {"cnn-a": ((16, 32), 5, 256), "cnn-b": ((32, 64), 3, 128)}[name]
    for f in filters:
        h = tf.keras.layers.Conv2D(f, kernel, activation="relu")(h)
        h = tf.keras.layers.MaxPooling2D(2)(h)
    h = tf.keras.layers.Flatten()(h)
    h = tf.keras.layers.Dense(hidden, activation="relu")(h)
    return tf.keras.Model(inp, tf.keras.layers.Dense(10, activation="softmax")(h)), raw, 8


def make(name: str, out: Path) -> dict:
    (x, y), (x_val, y_val) = split_validation(*fashion_mnist("train"))
    x, y = x[:TRAIN.get(name, len(x))], y[:TRAIN.get(name, len(y))]
    x_test, y_test = fashion_mnist("test")
    model, raw, epochs = build(name)
    shape = (-1, 784) if name.startswith("mlp") else (-1, 28, 28, 1)

    def inputs(a):
        a = a.reshape(shape).astype(np.float32)
        return a if raw else a / 255.0

    start = time.time()
    steps = epochs * -(-len(x) // 128)
    model.compile(optimizer=tf.keras.optimizers.Adam(tf.keras.optimizers.schedules.CosineDecay(1e-3, steps)),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(inputs(x), y, batch_size=128, epochs=epochs, verbose=2, shuffle=True)
    seconds = time.time() - start
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    (out / f"{name}.tflite").write_bytes(bytes(converter.convert()))
    rng = np.random.default_rng(SEED)
    pick = rng.choice(len(x_val), VAL, replace=False)
    np.savez(out / f"{name}-train.npz", x=inputs(x), y=y)
    np.savez(out / f"{name}-val.npz", x=inputs(x_val[pick]), y=y_val[pick])
    np.savez(out / f"{name}-test.npz", x=inputs(x_test[:TEST]), y=y_test[:TEST])
    np.savez(out / f"{name}-test10k.npz", x=inputs(x_test), y=y_test)
    test = float(np.mean(np.argmax(model.predict(inputs(x_test), verbose=0), axis=1) == y_test))
    info = {"name": name, "tensorflow": tf.__version__, "epochs": epochs, "seconds": round(seconds),
            "raw_pixels": raw, "keras_top1_test10k": test, "params": int(model.count_params())}
    (out / f"{name}.json").write_text(json.dumps(info, indent=1))
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp-a,mlp-b,mlp-c,cnn-a,cnn-b")
    parser.add_argument("--dir", type=Path, default=CACHE)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        print(make(name, args.dir), flush=True)


if __name__ == "__main__":
    main()
