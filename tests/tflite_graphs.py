"""Models of several subgraphs for the tests: a minimal .tflite writer (the converter makes IF and WHILE
only from TensorFlow control flow), and two models built with it whose layers' weights live in a
branch of an IF and in the body of a WHILE."""

import flatbuffers
import numpy as np
import tflite

T = tflite.TensorType


def build(graphs: list) -> bytes:
    """A .tflite of several subgraphs. graphs: dicts of tensors, ops, inputs, outputs. A tensor: shape,
    type (default FLOAT32), data (bytes of a constant), signature (default: shape with a fixed batch).
    An op: (name, inputs, outputs[, options name, {setter: value}])."""
    b = flatbuffers.Builder(1024)

    def vector(start, values, prepend):
        start(b, len(values))
        for v in reversed(values):
            prepend(v)
        return b.EndVector()

    ints = lambda start, values: vector(start, list(values), b.PrependInt32)  # noqa: E731
    tables = lambda start, values: vector(start, list(values), b.PrependUOffsetTRelative)  # noqa: E731

    tflite.BufferStart(b)
    buffers = [tflite.BufferEnd(b)]
    buffer_of = {}
    for g, graph in enumerate(graphs):
        for t, tensor in enumerate(graph["tensors"]):
            if "data" in tensor:
                data = bytes(tensor["data"])
                b.StartVector(1, len(data), 16)
                b.head -= len(data)
                b.Bytes[b.head:b.head + len(data)] = data
                vec = b.EndVector()
                tflite.BufferStart(b)
                tflite.BufferAddData(b, vec)
                buffer_of[g, t] = len(buffers)
                buffers.append(tflite.BufferEnd(b))
    names = sorted({op[0] for graph in graphs for op in graph["ops"]})
    codes = []
    for name in names:
        code = getattr(tflite.BuiltinOperator, name)
        tflite.OperatorCodeStart(b)
        tflite.OperatorCodeAddDeprecatedBuiltinCode(b, min(code, 127))
        tflite.OperatorCodeAddBuiltinCode(b, code)
        tflite.OperatorCodeAddVersion(b, 1)
        codes.append(tflite.OperatorCodeEnd(b))
    subgraphs = []
    for g, graph in enumerate(graphs):
        tensors = []
        for t, tensor in enumerate(graph["tensors"]):
            name = b.CreateString(f"g{g}t{t}")
            shape = ints(tflite.TensorStartShapeVector, tensor["shape"])
            signature = ints(tflite.TensorStartShapeSignatureVector, tensor.get("signature", tensor["shape"]))
            quantization = None
            if "quantization" in tensor:  # (scale, zero point), per tensor
                scale, zero = tensor["quantization"]
                tflite.QuantizationParametersStartScaleVector(b, 1)
                b.PrependFloat32(scale)
                scales = b.EndVector()
                tflite.QuantizationParametersStartZeroPointVector(b, 1)
                b.PrependInt64(zero)
                zeros = b.EndVector()
                tflite.QuantizationParametersStart(b)
                tflite.QuantizationParametersAddScale(b, scales)
                tflite.QuantizationParametersAddZeroPoint(b, zeros)
                quantization = tflite.QuantizationParametersEnd(b)
            tflite.TensorStart(b)
            tflite.TensorAddShape(b, shape)
            tflite.TensorAddShapeSignature(b, signature)
            tflite.TensorAddType(b, tensor.get("type", T.FLOAT32))
            tflite.TensorAddName(b, name)
            tflite.TensorAddBuffer(b, buffer_of.get((g, t), 0))
            if quantization is not None:
                tflite.TensorAddQuantization(b, quantization)
            tensors.append(tflite.TensorEnd(b))
        ops = []
        for name, inputs, outputs, *extra in graph["ops"]:
            options = None
            if extra:
                kind, values = extra
                getattr(tflite, f"{kind}Start")(b)
                for setter, value in values.items():
                    getattr(tflite, f"{kind}Add{setter}")(b, value)
                options = getattr(tflite, f"{kind}End")(b)
            in_vec, out_vec = ints(tflite.OperatorStartInputsVector, inputs), ints(tflite.OperatorStartOutputsVector, outputs)
            tflite.OperatorStart(b)
            tflite.OperatorAddOpcodeIndex(b, names.index(name))
            tflite.OperatorAddInputs(b, in_vec)
            tflite.OperatorAddOutputs(b, out_vec)
            if options is not None:
                tflite.OperatorAddBuiltinOptionsType(b, getattr(tflite.BuiltinOptions, extra[0]))
                tflite.OperatorAddBuiltinOptions(b, options)
            ops.append(tflite.OperatorEnd(b))
        tensor_vec, op_vec = tables(tflite.SubGraphStartTensorsVector, tensors), tables(tflite.SubGraphStartOperatorsVector, ops)
        in_vec = ints(tflite.SubGraphStartInputsVector, graph["inputs"])
        out_vec = ints(tflite.SubGraphStartOutputsVector, graph["outputs"])
        tflite.SubGraphStart(b)
        tflite.SubGraphAddTensors(b, tensor_vec)
        tflite.SubGraphAddOperators(b, op_vec)
        tflite.SubGraphAddInputs(b, in_vec)
        tflite.SubGraphAddOutputs(b, out_vec)
        subgraphs.append(tflite.SubGraphEnd(b))
    graphs_vec = tables(tflite.ModelStartSubgraphsVector, subgraphs)
    codes_vec = tables(tflite.ModelStartOperatorCodesVector, codes)
    buffers_vec = tables(tflite.ModelStartBuffersVector, buffers)
    tflite.ModelStart(b)
    tflite.ModelAddVersion(b, 3)
    tflite.ModelAddOperatorCodes(b, codes_vec)
    tflite.ModelAddSubgraphs(b, graphs_vec)
    tflite.ModelAddBuffers(b, buffers_vec)
    b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def quantized_output_model(n: int = 16, classes: int = 10, scale: float = 1 / 256, zero: int = -128,
                           quantize: bool = True, gain: float = 1.0) -> bytes:
    """SOFTMAX(FC(x, W)) quantized to int8 (scale, zero point), as a fully integer classifier hands out its
    probabilities: p = scale * (q - zero); quantize=False: the float probabilities. x: [1, n]. gain
    scales W (the logits' spread)."""
    w = (_w((classes, n), 3) * np.float32(gain)).astype("<f4")
    main = {"tensors": [{"shape": [1, n]}, {"shape": [classes, n], "data": w.tobytes()},
                        {"shape": [1, classes]}, {"shape": [1, classes]},
                        {"shape": [1, classes], "type": T.INT8, "quantization": (scale, zero)}],
            "ops": [("FULLY_CONNECTED", [0, 1, -1], [2]), ("SOFTMAX", [2], [3], "SoftmaxOptions", {"Beta": 1.0}),
                    ("QUANTIZE", [3], [4])],
            "inputs": [0], "outputs": [4]}
    if not quantize:
        main["tensors"], main["ops"], main["outputs"] = main["tensors"][:4], main["ops"][:2], [3]
    return build([main])


def _w(shape, seed):
    return (np.random.default_rng(seed).standard_normal(shape) * 0.3).astype("<f4")


def if_model(n: int = 32) -> bytes:
    """y = FC(x, W_then) where max(x) > 0, else FC(x, W_else): W_then is a constant of the main graph
    that the IF hands to its `then` branch (as openWakeWord's wake-word models do), W_else a constant of
    the `else` branch itself. x: [1, n]."""
    main = {"tensors": [{"shape": [1, n]}, {"shape": [2], "type": T.INT32, "data": np.array([0, 1], "<i4").tobytes()},
                        {"shape": []}, {"shape": [], "data": np.zeros((), "<f4").tobytes()},
                        {"shape": [], "type": T.BOOL}, {"shape": [n, n], "data": _w((n, n), 1).tobytes()},
                        {"shape": [1, n]}],
            "ops": [("REDUCE_MAX", [0, 1], [2], "ReducerOptions", {"KeepDims": False}), ("GREATER", [2, 3], [4]),
                    ("IF", [4, 0, 5], [6], "IfOptions", {"ThenSubgraphIndex": 1, "ElseSubgraphIndex": 2})],
            "inputs": [0], "outputs": [6]}
    then = {"tensors": [{"shape": [1, n]}, {"shape": [n, n]}, {"shape": [1, n]}],
            "ops": [("FULLY_CONNECTED", [0, 1, -1], [2])], "inputs": [0, 1], "outputs": [2]}
    other = {"tensors": [{"shape": [1, n]}, {"shape": [n, n]}, {"shape": [n, n], "data": _w((n, n), 2).tobytes()},
                         {"shape": [1, n]}],
             "ops": [("FULLY_CONNECTED", [0, 2, -1], [3])], "inputs": [0, 1], "outputs": [3]}
    return build([main, then, other])


def while_model(n: int = 32, steps: int = 3) -> bytes:
    """x through `steps` rounds of TANH(FC(x, W)) in a WHILE loop whose body holds W. x: [1, n]."""
    def i32(v):
        return np.array(v, "<i4").tobytes()

    main = {"tensors": [{"shape": [1, n]}, {"shape": [], "type": T.INT32, "data": i32(0)},
                        {"shape": [], "type": T.INT32}, {"shape": [1, n]}],
            "ops": [("WHILE", [1, 0], [2, 3], "WhileOptions", {"CondSubgraphIndex": 1, "BodySubgraphIndex": 2})],
            "inputs": [0], "outputs": [3]}
    cond = {"tensors": [{"shape": [], "type": T.INT32}, {"shape": [1, n]},
                        {"shape": [], "type": T.INT32, "data": i32(steps)}, {"shape": [], "type": T.BOOL}],
            "ops": [("LESS", [0, 2], [3])], "inputs": [0, 1], "outputs": [3]}
    body = {"tensors": [{"shape": [], "type": T.INT32}, {"shape": [1, n]}, {"shape": [], "type": T.INT32, "data": i32(1)},
                        {"shape": [], "type": T.INT32}, {"shape": [n, n], "data": (_w((n, n), 3) * 0.5).tobytes()},
                        {"shape": [1, n]}, {"shape": [1, n]}],
            "ops": [("ADD", [0, 2], [3]), ("FULLY_CONNECTED", [1, 4, -1], [5]), ("TANH", [5], [6])],
            "inputs": [0, 1], "outputs": [3, 6]}
    return build([main, cond, body])


def long_conv_model(length: int = 20000, channels: int = 16) -> bytes:
    """A 1-D convolutional model of a long input, as audio models are (basic-pitch: 43,844 samples):
    x [N, length, 1, 1] -> CONV 9x1 to `channels` (ReLU) -> CONV 9x1 to `channels` (ReLU) -> CONV 1x1
    to 1; the second conv's im2col temporary is 9 x channels values per input sample."""
    conv = {"Padding": tflite.Padding.SAME, "StrideW": 1, "StrideH": 1, "FusedActivationFunction": 1}
    c = channels
    tensors = [{"shape": [1, length, 1, 1], "signature": [-1, length, 1, 1]},
               {"shape": [c, 9, 1, 1], "data": _w((c, 9, 1, 1), 4).tobytes()},
               {"shape": [c], "data": np.zeros(c, "<f4").tobytes()}, {"shape": [1, length, 1, c]},
               {"shape": [c, 9, 1, c], "data": (_w((c, 9, 1, c), 5) / 3).tobytes()},
               {"shape": [c], "data": np.zeros(c, "<f4").tobytes() + b""}, {"shape": [1, length, 1, c]},
               {"shape": [1, 1, 1, c], "data": _w((1, 1, 1, c), 6).tobytes()},
               {"shape": [1], "data": np.zeros(1, "<f4").tobytes()}, {"shape": [1, length, 1, 1]}]
    for t in (3, 6, 9):
        tensors[t]["signature"] = [-1, *tensors[t]["shape"][1:]]
    ops = [("CONV_2D", [0, 1, 2], [3], "Conv2DOptions", conv), ("CONV_2D", [3, 4, 5], [6], "Conv2DOptions", conv),
           ("CONV_2D", [6, 7, 8], [9], "Conv2DOptions", {**conv, "FusedActivationFunction": 0})]
    return build([{"tensors": tensors, "ops": ops, "inputs": [0], "outputs": [9]}])


def wide_fc_model(inputs: int = 3000, hidden: int = 64, outputs: int = 8) -> bytes:
    """x [N, inputs] -> FC to `hidden` (ReLU) -> FC to `outputs`: the first layer's Hessian is inputs^2
    float64 (openWakeWord's timer model: 3264 inputs, 81 MiB)."""
    tensors = [{"shape": [1, inputs], "signature": [-1, inputs]},
               {"shape": [hidden, inputs], "data": (_w((hidden, inputs), 7) / np.float32(np.sqrt(inputs))).astype("<f4").tobytes()},
               {"shape": [hidden], "data": np.zeros(hidden, "<f4").tobytes()},
               {"shape": [1, hidden], "signature": [-1, hidden]},
               {"shape": [outputs, hidden], "data": _w((outputs, hidden), 8).tobytes()},
               {"shape": [outputs], "data": np.zeros(outputs, "<f4").tobytes()},
               {"shape": [1, outputs], "signature": [-1, outputs]}]
    ops = [("FULLY_CONNECTED", [0, 1, 2], [3], "FullyConnectedOptions", {"FusedActivationFunction": 1}),
           ("FULLY_CONNECTED", [3, 4, 5], [6])]
    return build([{"tensors": tensors, "ops": ops, "inputs": [0], "outputs": [6]}])
