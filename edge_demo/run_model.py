"""Decode a .dsz model on a device and run it in TensorFlow Lite.

On a Raspberry Pi or Jetson:
    pip install pydsz ai-edge-litert        # or tflite-runtime (needs numpy < 2)
    python run_model.py lenet300.dsz --data fmnist_test.npz

It decodes the model (timing each stage), optionally writes the .tflite, and reports top-1 accuracy
on an .npz of inputs `x` and labels `y`, or the prediction for the first sample when no labels exist.
Only numpy, zstandard and pydsz's C decoder are needed to decode; the interpreter only to run.
"""
import argparse
import sys
import time

import numpy as np

import pydsz
from pydsz.container import read_file, write_atomic


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help=".dsz file")
    parser.add_argument("--data", help=".npz with x (inputs) and optionally y (labels)")
    parser.add_argument("--write-tflite", metavar="PATH", help="also write the decoded .tflite here")
    parser.add_argument("--threads", type=int, default=None, help="interpreter threads")
    args = parser.parse_args()
    try:
        raw = read_file(args.model)
        t0 = time.perf_counter()
        model = pydsz.load(raw)
        tflite = model.tflite_bytes()
        t1 = time.perf_counter()
        info = model.info()["compressed_tensors"]
        print(f"decoded {len(raw)} -> {len(tflite)} bytes in {1e3 * (t1 - t0):.1f} ms "
              f"(weights {info['original_bytes']} bytes from {info['compressed_bytes']})")
        if args.write_tflite:
            write_atomic(args.write_tflite, tflite)
        if args.data:
            from pydsz.runtime import accuracy, predict

            with np.load(args.data) as npz:
                x = npz["x"]
                y = npz["y"] if "y" in npz.files else None
            if y is None:
                print("prediction for the first sample:", int(np.argmax(predict(tflite, x[:1])[0])))
            else:
                t2 = time.perf_counter()
                acc = accuracy(tflite, x, y, num_threads=args.threads)
                print(f"top-1 accuracy {acc:.4f} on {len(y)} samples "
                      f"({1e3 * (time.perf_counter() - t2) / len(y):.3f} ms per sample)")
    except pydsz.DszError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
