"""AlexNet- and VGG-16-shaped .tflite models on Fashion-MNIST, built without TensorFlow.

DeepSZ's headline results are on AlexNet's and VGG-16's FC layers; these models have exactly
those shapes (the classes aside: Fashion-MNIST has 10, ImageNet 1000):

  alexnet  input 28x28x1 (raw 0..255) -> conv 3x3 64 SAME relu -> max pool 2 -> conv 3x3 256 VALID
           relu -> max pool 2 -> 6x6x256 = 9216 (AlexNet's pool5) -> fc6 4096x9216 relu ->
           fc7 4096x4096 relu -> fc8 10x4096 -> softmax
  vgg16    input 28x28x1 -> conv 3x3 64 SAME relu -> max pool 2 -> conv 3x3 512 SAME relu ->
           max pool 2 -> 7x7x512 = 25088 (VGG-16's pool5) -> fc6 4096x25088 relu -> fc7 4096x4096
           relu -> fc8 10x4096 -> softmax

The convolutions are a fixed feature extractor (seeded random filters, not trained: training
them would need TensorFlow or a second trainer). pydsz names the FC layers fc1, fc2, fc3 (AlexNet's
and VGG's fc6, fc7, fc8). The FC tail is trained with pydsz's own numpy
training (pydsz.prune.train.retrain, no mask) on the trunk's features of the first TRAIN_SAMPLES
training images, so the accuracy is real; it is measured on the 10,000 test images.
The files store every buffer out of line (Buffer.offset/size, absolute file offsets), as
converters store models over 2 GB. They are cached in ~/.cache/pydsz/large/ with a JSON of how
they were made; model_path(name) builds one when it is missing.

    python bench/builders/make_large_models.py alexnet vgg16   # build what is missing, print the accuracies
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import flatbuffers
import numpy as np
import tflite

from pydsz.context import Run
from pydsz.prune.train import Retraining

CACHE = Path(os.environ.get("DSZ_LARGE_CACHE", Path.home() / ".cache" / "pydsz" / "large"))
SEED = 0
ALIGN = 16  # TFLite aligns constants to 16 bytes


@dataclass(frozen=True)
class Spec:
    name: str
    conv2: int  # filters of the second convolution
    conv2_padding: str  # SAME or VALID: 14x14 -> 14x14 or 12x12, pooled to 7x7 or 6x6
    train_samples: int  # training images the tail is trained on (features of 4 bytes x in_features each)
    epochs: float
    batch_size: int = 256  # large batches: Adam's pass over 55-110M weights dominates a small step

    @property
    def side(self) -> int:
        return 7 if self.conv2_padding == "SAME" else 6

    @property
    def features(self) -> int:
        return self.side * self.side * self.conv2


SPECS = {
    "alexnet": Spec("alexnet", 256, "VALID", train_samples=10000, epochs=2),
    "vgg16": Spec("vgg16", 512, "SAME", train_samples=8000, epochs=1),
}
FC = (4096, 4096, 10)  # fc6, fc7, fc8 outputs


def model_path(name: str, progress: bool = True, num_threads: int = 2) -> Path:
    """The cached .tflite of `name` ("alexnet" or "vgg16"), built first when it is missing."""
    path = CACHE / f"{name}.tflite"
    if not path.exists():
        build(SPECS[name], progress=progress, num_threads=num_threads)
    return path


def info(name: str) -> dict:
    """How the cached model was made and its test top-1 (builds it when missing)."""
    model_path(name)
    return json.loads((CACHE / f"{name}.json").read_text())


def trunk(spec: Spec) -> dict:
    """The fixed convolutions, seeded: zero-mean 3x3 filters (edge and texture detectors) over
    pixels scaled to 0..1, then He-scaled random filters."""
    rng = np.random.default_rng(SEED)
    w1 = rng.standard_normal((64, 3, 3, 1)).astype(np.float32)
    w1 -= w1.mean(axis=(1, 2, 3), keepdims=True)
    w1 /= 255 * np.sqrt(np.sum(w1 * w1, axis=(1, 2, 3), keepdims=True))
    b1 = np.full(64, 0.02, np.float32)
    w2 = (rng.standard_normal((spec.conv2, 3, 3, 64)) * np.sqrt(2 / (9 * 64))).astype(np.float32)
    b2 = np.zeros(spec.conv2, np.float32)
    return {"w1": w1, "b1": b1, "w2": w2, "b2": b2}


def initial_tail(spec: Spec) -> list:
    """He-initialised FC layers (pydsz.prune.train.Dense), seeded."""
    from pydsz.prune.train import Dense

    rng = np.random.default_rng(SEED + 1)
    layers, fan_in = [], spec.features
    for i, out in enumerate(FC):
        w = (rng.standard_normal((out, fan_in)) * np.sqrt(2 / fan_in)).astype(np.float32)
        layers.append(Dense(f"fc{1 + i}", w, np.zeros(out, np.float32), "RELU" if i < 2 else "NONE"))
        fan_in = out
    return layers


def write_tflite(path: Path, spec: Spec, conv: dict, tail: list) -> None:
    """Write the model with every constant out of line: the flatbuffer, then each buffer's bytes at
    a 16-aligned absolute offset. Written to a temporary file, then renamed."""
    side = spec.side
    f = spec.features
    constants = [conv["w1"], conv["b1"], conv["w2"], conv["b2"], np.array([-1, f], np.int32)]
    for layer in tail:
        constants += [layer.weight, layer.bias]
    # tensors: (shape, type, constant index or None)
    F, I = tflite.TensorType.FLOAT32, tflite.TensorType.INT32
    pad2 = 14 if spec.conv2_padding == "SAME" else 12
    tensors = [
        ((1, 28, 28, 1), F, None),  # 0 input
        (conv["w1"].shape, F, 0), (conv["b1"].shape, F, 1),  # 1, 2
        ((1, 28, 28, 64), F, None),  # 3 conv1
        ((1, 14, 14, 64), F, None),  # 4 pool1
        (conv["w2"].shape, F, 2), (conv["b2"].shape, F, 3),  # 5, 6
        ((1, pad2, pad2, spec.conv2), F, None),  # 7 conv2
        ((1, side, side, spec.conv2), F, None),  # 8 pool2
        ((2,), I, 4),  # 9 shape
        ((1, f), F, None),  # 10 flat
    ]
    ops = [
        ("CONV_2D", [0, 1, 2], [3], "Conv2DOptions", {"Padding": tflite.Padding.SAME, "StrideW": 1, "StrideH": 1,
                                                      "FusedActivationFunction": tflite.ActivationFunctionType.RELU}),
        ("MAX_POOL_2D", [3], [4], "Pool2DOptions", {"Padding": tflite.Padding.VALID, "StrideW": 2, "StrideH": 2,
                                                     "FilterWidth": 2, "FilterHeight": 2}),
        ("CONV_2D", [4, 5, 6], [7], "Conv2DOptions", {"Padding": getattr(tflite.Padding, spec.conv2_padding),
                                                      "StrideW": 1, "StrideH": 1,
                                                      "FusedActivationFunction": tflite.ActivationFunctionType.RELU}),
        ("MAX_POOL_2D", [7], [8], "Pool2DOptions", {"Padding": tflite.Padding.VALID, "StrideW": 2, "StrideH": 2,
                                                     "FilterWidth": 2, "FilterHeight": 2}),
        ("RESHAPE", [8, 9], [10]),
    ]
    current = 10
    for i, layer in enumerate(tail):
        w, b = len(tensors), len(tensors) + 1
        tensors += [(layer.weight.shape, F, 5 + 2 * i), (layer.bias.shape, F, 6 + 2 * i),
                    ((1, layer.weight.shape[0]), F, None)]
        act = getattr(tflite.ActivationFunctionType, layer.activation)
        ops.append(("FULLY_CONNECTED", [current, w, b], [b + 1], "FullyConnectedOptions",
                    {"FusedActivationFunction": act}))
        current = b + 1
    tensors.append(((1, FC[-1]), F, None))
    ops.append(("SOFTMAX", [current], [len(tensors) - 1], "SoftmaxOptions", {"Beta": 1.0}))
    raws = [np.ascontiguousarray(c).tobytes() for c in constants]

    def header(base: int) -> tuple[bytes, list[int]]:
        offsets, at = [], base
        for raw in raws:
            offsets.append(at)
            at += -(-len(raw) // ALIGN) * ALIGN
        return _flatbuffer(tensors, ops, offsets, [len(r) for r in raws]), offsets

    # Offsets are 8-byte scalars: the header's size does not depend on their values.
    size = len(header(1 << 40)[0])
    base = -(-size // ALIGN) * ALIGN
    head, offsets = header(base)
    assert len(head) == size
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as out:
        out.write(head)
        for offset, raw in zip(offsets, raws):
            out.write(bytes(offset - out.tell()))
            out.write(raw)
    tmp.replace(path)


def _flatbuffer(tensors, ops, offsets, sizes) -> bytes:
    b = flatbuffers.Builder(4096)

    def vector(start, values, prepend):
        start(b, len(values))
        for v in reversed(values):
            prepend(v)
        return b.EndVector()

    ints = lambda start, values: vector(start, [int(v) for v in values], b.PrependInt32)  # noqa: E731
    tables = lambda start, values: vector(start, list(values), b.PrependUOffsetTRelative)  # noqa: E731

    buffers = [tflite.BufferStart(b) or tflite.BufferEnd(b)]
    for offset, size in zip(offsets, sizes):
        tflite.BufferStart(b)
        tflite.BufferAddOffset(b, offset)
        tflite.BufferAddSize(b, size)
        buffers.append(tflite.BufferEnd(b))
    tensor_tables = []
    for i, (shape, dtype, constant) in enumerate(tensors):
        name = b.CreateString(f"t{i}")
        shape_vec = ints(tflite.TensorStartShapeVector, shape)
        signature = ints(tflite.TensorStartShapeSignatureVector, shape if constant is not None else [-1, *shape[1:]])
        tflite.TensorStart(b)
        tflite.TensorAddShape(b, shape_vec)
        tflite.TensorAddShapeSignature(b, signature)
        tflite.TensorAddType(b, dtype)
        tflite.TensorAddName(b, name)
        if constant is not None:
            tflite.TensorAddBuffer(b, constant + 1)
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
    in_vec = ints(tflite.SubGraphStartInputsVector, [0])
    out_vec = ints(tflite.SubGraphStartOutputsVector, [len(tensors) - 1])
    tflite.SubGraphStart(b)
    tflite.SubGraphAddTensors(b, tensors_vec)
    tflite.SubGraphAddOperators(b, ops_vec)
    tflite.SubGraphAddInputs(b, in_vec)
    tflite.SubGraphAddOutputs(b, out_vec)
    graph = tflite.SubGraphEnd(b)
    graphs_vec = tables(tflite.ModelStartSubgraphsVector, [graph])
    codes_vec = tables(tflite.ModelStartOperatorCodesVector, codes)
    buffers_vec = tables(tflite.ModelStartBuffersVector, buffers)
    description = b.CreateString("pydsz bench/make_large_models.py")
    tflite.ModelStart(b)
    tflite.ModelAddVersion(b, 3)
    tflite.ModelAddOperatorCodes(b, codes_vec)
    tflite.ModelAddSubgraphs(b, graphs_vec)
    tflite.ModelAddBuffers(b, buffers_vec)
    tflite.ModelAddDescription(b, description)
    b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def build(spec: Spec, progress: bool = True, num_threads: int = 2) -> Path:
    """Build, train and cache one model; returns its path (num_threads: the interpreter's)."""
    from pydsz.model import activations, runtime
    from pydsz.model.data import fashion_mnist, split_validation
    from pydsz.model.graph import TFLiteModel
    from pydsz.model.tail import Tail
    from pydsz.prune.train import retrain

    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"{spec.name}.tflite"
    start = time.time()
    (x, y), (x_val, y_val) = split_validation(*fashion_mnist("train"))
    x, y = x[:spec.train_samples], y[:spec.train_samples].astype(np.int64)
    x_test, y_test = fashion_mnist("test")
    conv, layers = trunk(spec), initial_tail(spec)
    # the untrained model only serves to capture the trunk's features; the cache holds trained ones only
    untrained = CACHE / f"{spec.name}.untrained.tflite"
    write_tflite(untrained, spec, conv, layers)
    model = TFLiteModel(untrained.read_bytes())
    untrained.unlink()
    features = Tail.from_model(model, "fc1", strict=True).input_tensor
    h = activations.capture(model.data, x[..., None].astype(np.float32), features, num_threads=num_threads)
    del model
    captured = time.time() - start
    layers = retrain(layers, {}, h, y, Retraining(epochs=spec.epochs, batch_size=spec.batch_size, seed=SEED),
                     run=Run(progress=progress))
    del h
    trained = time.time() - start - captured
    trained_path = CACHE / f"{spec.name}.trained.tflite"
    write_tflite(trained_path, spec, conv, layers)
    data = trained_path.read_bytes()
    top1_val = runtime.accuracy(data, x_val[..., None].astype(np.float32), y_val, num_threads=num_threads)
    top1 = runtime.accuracy(data, x_test[..., None].astype(np.float32), y_test, num_threads=num_threads)
    record = {"model": spec.name, "file_bytes": len(data), "features": spec.features,
              "fc_shapes": [list(l.weight.shape) for l in layers],
              "fc_float32_bytes": int(sum(l.weight.nbytes + l.bias.nbytes for l in layers)),
              "train_samples": spec.train_samples, "epochs": spec.epochs, "batch_size": spec.batch_size, "seed": SEED,
              "top1_validation": top1_val, "top1_test": top1, "test_samples": len(y_test),
              "seconds_capture": round(captured, 1), "seconds_train": round(trained, 1),
              "seconds_total": round(time.time() - start, 1)}
    (CACHE / f"{spec.name}.json").write_text(json.dumps(record, indent=1))
    trained_path.replace(path)  # last: a cached .tflite always has its .json
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", default=list(SPECS), choices=list(SPECS))
    parser.add_argument("--rebuild", action="store_true", help="build even when cached")
    args = parser.parse_args()
    for name in args.models:
        if args.rebuild:
            (CACHE / f"{name}.tflite").unlink(missing_ok=True)
        path = model_path(name)
        r = info(name)
        print(f"{path}: {r['file_bytes'] / 1e6:.0f} MB, FC {r['fc_shapes']}, trained on {r['train_samples']} "
              f"images x {r['epochs']} epochs in {r['seconds_train']:.0f} s; top-1 {r['top1_test']:.4f} on the "
              f"{r['test_samples']} test images ({r['top1_validation']:.4f} on validation)")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    main()
