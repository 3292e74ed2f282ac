"""The zoo's classifiers: Fashion-MNIST models trained here by Keras across training-set sizes and shapes,
each with the little labelled data a user has to decide on, a large split of its own for the oracle and
a large test split, for bench/zoo.py (needs TensorFlow, in a separate venv; never a dependency of pydsz).

Issue 40's zoo asks for classifiers "trained by a builder script across data sizes (2,000 to 50,000
training samples), shapes (MLP, CNN, depthwise)", beside the models others ship (zoo_data.py). These are
trained by TensorFlow, not by pydsz's trainer, with choices pydsz's own models do not make (dropout,
batch normalization folded by the converter, ReLU6, global pooling):

  fmnist_mlp_2k    784 -> 256 relu -> 128 relu -> 10 softmax, dropout 0.2; 2,000 training images, 400 labels
  fmnist_cnn_10k   conv 32 3x3 relu -> pool 2 -> conv 64 3x3 relu -> pool 2 -> 128 relu -> 10; 10,000, 500
  fmnist_dw_20k    MobileNet-style: conv 32 3x3 /2, then depthwise 3x3 + pointwise 1x1 blocks (64, 128 /2,
                   128, 256 /2), batch norm and ReLU6 after each, global average pool, dropout 0.2 -> 10;
                   20,000, 500
  fmnist_mlp_50k   784 -> 1024 relu -> 512 relu -> 10 softmax, dropout 0.2; 50,000 training images, 1,000

Every model trains on the first N of Fashion-MNIST's 60,000 training images (Adam, cosine decay, batch 128)
and never sees the last 10,000, which are shuffled once (the same draw for every model) and split into
DIR/NAME/decision.npz (the labels a user holds: the first 400-1,000) and DIR/NAME/oracle.npz (the rest:
the large split of its own the oracle decides on, like the decision data and disjoint from the test's);
DIR/NAME/test.npz is Fashion-MNIST's 10,000 test images. Inputs are pixels / 255, float32.

    python -m venv ~/tfenv && ~/tfenv/bin/pip install tensorflow-cpu
    ~/tfenv/bin/python bench/builders/zoo_classifiers.py [--models fmnist_mlp_2k,...] [--dir DIR]

DIR defaults to $DSZ_ZOO_CACHE or ~/.cache/pydsz/zoo, as zoo_data.py's. About 1-4 minutes per model on
2 cores. This module's table (CLASSIFIERS) imports without TensorFlow, for bench/zoo.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("DSZ_ZOO_CACHE", Path.home() / ".cache" / "pydsz" / "zoo"))
SEED = 40
POOL = 10_000  # the last training images, seen by no model: decision + oracle
BUILD = "~/tfenv/bin/python bench/builders/zoo_classifiers.py"


@dataclass(frozen=True)
class Classifier:
    name: str
    shape: str  # mlp, cnn or dw
    train: int  # training images
    decision: int  # labelled images the user decides on
    epochs: int


CLASSIFIERS = [
    Classifier("fmnist_mlp_2k", "mlp", 2_000, 400, 40),
    Classifier("fmnist_cnn_10k", "cnn", 10_000, 500, 12),
    Classifier("fmnist_dw_20k", "dw", 20_000, 500, 12),
    Classifier("fmnist_mlp_50k", "mlp", 50_000, 1_000, 10),
]
BY_NAME = {c.name: c for c in CLASSIFIERS}
SPLITS = ("decision", "oracle", "test")


def paths(name: str, cache: Path = CACHE) -> dict:
    """model, decision, oracle and test of a built classifier; SystemExit saying how to build it otherwise."""
    folder = cache / name
    got = {"model": folder / "model.tflite", **{s: folder / f"{s}.npz" for s in SPLITS}}
    missing = [p.name for p in got.values() if not p.exists()]
    if missing:
        raise SystemExit(f"{name}: {', '.join(missing)} missing in {folder}; build it with TensorFlow: "
                         f"{BUILD} --models {name} --dir {cache}")
    return got


def _keras(spec: Classifier):
    import tensorflow as tf

    tf.keras.utils.set_random_seed(SEED)
    layers = tf.keras.layers
    if spec.shape == "mlp":
        inp = tf.keras.Input(shape=(784,))
        h = inp
        for units in {2_000: (256, 128), 50_000: (1024, 512)}[spec.train]:
            h = layers.Dropout(0.2)(layers.Dense(units, activation="relu")(h))
        return tf.keras.Model(inp, layers.Dense(10, activation="softmax")(h))
    inp = tf.keras.Input(shape=(28, 28, 1))
    if spec.shape == "cnn":
        h = inp
        for filters in (32, 64):
            h = layers.MaxPooling2D(2)(layers.Conv2D(filters, 3, activation="relu")(h))
        h = layers.Dense(128, activation="relu")(layers.Flatten()(h))
        return tf.keras.Model(inp, layers.Dense(10, activation="softmax")(h))

    def norm(h):
        return layers.ReLU(6.0)(layers.BatchNormalization()(h))

    h = norm(layers.Conv2D(32, 3, strides=2, padding="same", use_bias=False)(inp))
    for filters, stride in ((64, 1), (128, 2), (128, 1), (256, 2)):
        h = norm(layers.DepthwiseConv2D(3, strides=stride, padding="same", use_bias=False)(h))
        h = norm(layers.Conv2D(filters, 1, use_bias=False)(h))
    h = layers.Dropout(0.2)(layers.GlobalAveragePooling2D()(h))
    return tf.keras.Model(inp, layers.Dense(10, activation="softmax")(h))


def _save(path: Path, **arrays) -> None:
    tmp = path.with_suffix(".part.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)


def make(spec: Classifier, cache: Path) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    # pydsz.model.data from this checkout without pydsz/__init__.py (the TF venv need not have the codec built)
    package = types.ModuleType("pydsz")
    package.__path__ = [str(REPO / "pydsz")]
    sys.modules.setdefault("pydsz", package)
    from pydsz.model.data import fashion_mnist

    x, y = fashion_mnist("train")
    x_test, y_test = fashion_mnist("test")
    shape = (-1, 784) if spec.shape == "mlp" else (-1, 28, 28, 1)

    def inputs(a):
        return (a.reshape(shape) / 255.0).astype(np.float32)

    pool = np.random.default_rng(SEED).permutation(np.arange(len(x) - POOL, len(x)))
    decision, oracle = pool[:spec.decision], pool[spec.decision:]
    model = _keras(spec)
    steps = spec.epochs * -(-spec.train // 128)
    model.compile(optimizer=tf.keras.optimizers.Adam(tf.keras.optimizers.schedules.CosineDecay(1e-3, steps)),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    start = time.time()
    model.fit(inputs(x[:spec.train]), y[:spec.train], batch_size=128, epochs=spec.epochs, verbose=2, shuffle=True)
    seconds = time.time() - start
    folder = cache / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    _save(folder / "decision.npz", x=inputs(x[decision]), y=y[decision])
    _save(folder / "oracle.npz", x=inputs(x[oracle]), y=y[oracle])
    _save(folder / "test.npz", x=inputs(x_test), y=y_test)

    def top1(a, labels):
        return float(np.mean(np.argmax(model.predict(inputs(a), verbose=0), axis=1) == labels))

    info = {"name": spec.name, "tensorflow": tf.__version__, "epochs": spec.epochs, "seconds": round(seconds),
            "params": int(model.count_params()), "train": spec.train, "decision": len(decision),
            "oracle": len(oracle), "test": len(x_test), "keras_top1_train": top1(x[:spec.train], y[:spec.train]),
            "keras_top1_pool": top1(x[pool], y[pool]), "keras_top1_test": top1(x_test, y_test)}
    (folder / "info.json").write_text(json.dumps(info, indent=1))
    tmp = folder / "model.part.tflite"  # last: a model present means its data is
    tmp.write_bytes(bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert()))
    tmp.replace(folder / "model.tflite")
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(BY_NAME))
    parser.add_argument("--dir", type=Path, default=CACHE)
    args = parser.parse_args()
    for name in args.models.split(","):
        if name not in BY_NAME:
            raise SystemExit(f"unknown classifier {name!r}: one of {', '.join(BY_NAME)}")
        print(make(BY_NAME[name], args.dir), flush=True)


if __name__ == "__main__":
    main()
