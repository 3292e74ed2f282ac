"""Make pydsz/data/multitask.tflite: a small model of two inputs and three non-classifier-like outputs
(developer-only; needs TensorFlow, like bench/builders/make_reference_models.py).

The metrics (pydsz.budget.metrics) must work on models that are not single-output classifiers: several
inputs, several outputs, regression and mask heads. This model is that, trained on real data
(Fashion-MNIST, from Debian's dataset-fashion-mnist), small enough to bundle:

  inputs   pixels  float32 [N, 28, 28, 1], raw 0..255
           stats   float32 [N, 3]: the image's mean and standard deviation over 255 and the share
                   of pixels above 25 (computed from the image: see image_stats)
  trunk    Rescaling(1/255) (a MUL op), Conv 8 5x5 relu, MaxPool 2, Conv 16 5x5 relu, MaxPool 2,
           Flatten (256), Concatenate with stats (259), Dense 128 relu
  outputs  class   Dense 10 softmax: the garment class
           box     Dense 32 relu, Dense 4 sigmoid: the bounding box of the pixels above 25, as
                   (top, left, bottom, right) / 28: a landmark-style regression
           mask    Dense 196 sigmoid, Reshape 14x14x1: which 2x2 blocks hold a pixel above 50 (a
                   segmentation mask at half resolution)

Outputs are reached by the names of the SavedModel signature (class, box, mask). Run from the
repository root with the TensorFlow venv of make_reference_models.py:
    ~/tfenv/bin/python bench/builders/make_multitask_model.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tensorflow as tf  # noqa: E402
from ai_edge_litert.interpreter import Interpreter  # noqa: E402
from make_reference_models import REPO, SEED, pixel_scaling  # noqa: E402  (sets up TensorFlow and pydsz.model.data)

from pydsz.model.data import fashion_mnist, split_validation  # noqa: E402

LIT = 25  # a pixel above this belongs to the garment (box); above MASK_LIT to the mask
MASK_LIT = 50


def image_stats(x: np.ndarray) -> np.ndarray:
    """[N, 3] float32: mean / 255, standard deviation / 255, share of pixels above LIT."""
    flat = x.reshape(len(x), -1).astype(np.float32)
    return np.stack([flat.mean(1) / 255, flat.std(1) / 255, (flat > LIT).mean(1)], axis=1).astype(np.float32)


def targets(x: np.ndarray, y: np.ndarray) -> dict:
    lit = x.reshape(len(x), 28, 28) > LIT
    rows, cols = lit.any(2), lit.any(1)
    box = np.zeros((len(x), 4), np.float32)
    for i in range(len(x)):
        r, c = np.flatnonzero(rows[i]), np.flatnonzero(cols[i])
        if r.size:
            box[i] = (r[0] / 28, c[0] / 28, (r[-1] + 1) / 28, (c[-1] + 1) / 28)
    mask = (x.reshape(len(x), 14, 2, 14, 2) > MASK_LIT).any(axis=(2, 4)).astype(np.float32)[..., None]
    return {"class": y, "box": box, "mask": mask}


def multitask() -> tf.keras.Model:
    pixels = tf.keras.Input(shape=(28, 28, 1), name="pixels")
    stats = tf.keras.Input(shape=(3,), name="stats")
    h = pixel_scaling(pixels)
    h = tf.keras.layers.Conv2D(8, 5, activation="relu", name="conv1")(h)
    h = tf.keras.layers.MaxPooling2D(2, 2)(h)
    h = tf.keras.layers.Conv2D(16, 5, activation="relu", name="conv2")(h)
    h = tf.keras.layers.MaxPooling2D(2, 2)(h)
    h = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(h), stats])
    h = tf.keras.layers.Dense(128, activation="relu", name="shared")(h)
    cls = tf.keras.layers.Dense(10, activation="softmax", name="class")(h)
    box = tf.keras.layers.Dense(4, activation="sigmoid", name="box")(
        tf.keras.layers.Dense(32, activation="relu", name="box_hidden")(h))
    mask = tf.keras.layers.Reshape((14, 14, 1), name="mask")(
        tf.keras.layers.Dense(196, activation="sigmoid", name="mask_logits")(h))
    return tf.keras.Model([pixels, stats], {"class": cls, "box": box, "mask": mask}, name="multitask")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "pydsz" / "data", help="output directory")
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()
    tf.keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()

    (x, y), (xv, yv) = split_validation(*fashion_mnist("train"))
    xt, yt = fashion_mnist("test")

    def inputs(images):
        return {"pixels": images.reshape(len(images), 28, 28, 1).astype(np.float32), "stats": image_stats(images)}

    start = time.time()
    model = multitask()
    steps = args.epochs * -(-len(x) // 128)
    model.compile(optimizer=tf.keras.optimizers.Adam(tf.keras.optimizers.schedules.CosineDecay(1e-3, steps, alpha=0.05)),
                  loss={"class": "sparse_categorical_crossentropy", "box": "mse", "mask": "binary_crossentropy"},
                  loss_weights={"class": 1.0, "box": 10.0, "mask": 1.0})
    model.fit(inputs(x), targets(x, y), batch_size=128, epochs=args.epochs, verbose=2,
              validation_data=(inputs(xv), targets(xv, yv)))
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    content = bytes(converter.convert())
    path = args.out / "multitask.tflite"
    path.write_bytes(content)

    runner = Interpreter(model_content=content).get_signature_runner()
    out = runner(**inputs(xt))
    truth = targets(xt, yt)
    top1 = float(np.mean(out["class"].argmax(1) == yt))
    box_error = float(np.mean(np.abs(out["box"] - truth["box"])) * 28)
    mask_agree = float(np.mean((out["mask"] > 0.5) == (truth["mask"] > 0.5)))
    print(f"{path}: {len(content)} bytes, {time.time() - start:.0f} s; on the 10,000 test images: class top-1 "
          f"{top1:.4f}, box mean abs error {box_error:.2f} pixels, mask pixels right {mask_agree:.4f}")


if __name__ == "__main__":
    main()
