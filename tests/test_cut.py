"""Sub-models from a cut and the chain of cut activations: the same outputs as the whole model, on
real models (the bundled LeNets and multitask model; MediaPipe's when the cache is there)."""

import numpy as np
import pytest

from pydsz.assess.evaluator import Evaluator
from pydsz.model import activations, cut, runtime
from pydsz.model.chain import Chain
from pydsz.model.data import bundled, load_npz
from pydsz.model.graph import TFLiteModel
from pydsz.model.selection import compressible_layers


@pytest.fixture(scope="module")
def val300():
    x, y = load_npz(bundled("fmnist_val.npz"))
    return x[:300], y[:300]


def _whole(model, x):
    keys = [d["key"] for d in model.output_details()]
    return dict(zip(model.outputs, (runtime.outputs(model.data, x, keys)[k] for k in keys)))


@pytest.mark.parametrize("name", ["lenet5.tflite", "lenet300.tflite", "lenet5_f16.tflite"])
def test_every_layers_tail_gives_the_whole_models_outputs(name, val300):
    model = TFLiteModel(bundled(name).read_bytes())
    x = runtime.fit_inputs(model.input_details(), val300[0])
    graph = cut.Graph(model, runtime.probe(model, x).rows)
    whole = _whole(model, x)
    starts = [layer.op_index for layer in model.layers(("fc", "conv"))]
    chain = Chain(model, graph, x, starts)
    for start in starts:
        tail = graph.tail(start)
        assert start in tail.ops and max(tail.ops) == len(model.ops) - 1
        keys = [str(t) for t in tail.outputs]
        out = runtime.outputs(cut.model_bytes(model, tail), chain.feeds(start), keys)
        for t in tail.outputs:
            assert np.array_equal(out[str(t)], whole[t]), (name, start)


def test_a_float16_layers_dequantize_moves_into_its_cut():
    """The DEQUANTIZE ops of float16 weights come first in the graph: the cut pulls them in rather
    than starting at them (which would run the whole model)."""
    model = TFLiteModel(bundled("lenet5_f16.tflite").read_bytes())
    graph = cut.Graph(model)
    last = model.layers(("fc",))[-1]
    tail = graph.tail(last.op_index)
    assert all(model.ops[o].name == "DEQUANTIZE" for o in tail.ops if o < last.op_index)
    assert len(tail.inputs) == 1 and tail.inputs[0] == last.input


def test_the_chain_gives_each_cut_the_same_values_whatever_was_asked_before(val300):
    model = TFLiteModel(bundled("lenet5.tflite").read_bytes())
    x = runtime.fit_inputs(model.input_details(), val300[0])
    graph = cut.Graph(model)
    starts = [layer.op_index for layer in model.layers(("fc", "conv"))]
    forward, backward = Chain(model, graph, x, starts), Chain(model, graph, x, starts)
    first = {s: [a.copy() for a in forward.feeds(s)] for s in starts}
    for s in reversed(starts):  # each step back starts again from the inputs
        assert all(np.array_equal(a, b) for a, b in zip(backward.feeds(s), first[s]))
    assert forward.steps <= len(starts)


def test_capture_runs_only_what_the_tensor_needs_and_gives_the_preserved_values(val300):
    model = TFLiteModel(bundled("lenet5.tflite").read_bytes())
    layer = model.layer("fc1")
    x = val300[0][:50]
    cut_values = activations.capture(model.data, x, layer.input)
    preserved = activations._capture_preserved(model.data, x, layer.input, None, None)
    assert np.array_equal(cut_values, preserved)


def test_a_model_of_several_inputs_and_outputs_cuts_and_keeps_the_outputs_before_the_cut():
    data = bundled("multitask.tflite").read_bytes()
    model = TFLiteModel(data)
    rng = np.random.default_rng(0)
    x = [rng.random((20, *d["shape"][1:]), dtype=np.float32) for d in model.input_details()]
    names = [layer.name for layer in compressible_layers(model, "all")]
    evaluator = Evaluator(data, x, None, names, metric="output-error")
    slow = Evaluator(data, x, None, names, metric="output-error", paths=())
    for name in names:
        w = np.asarray(model.weight(name))
        noisy = {name: (w + np.float32(0.01) * np.sign(w)).astype(np.float32)}
        assert evaluator.path([name]) not in ("whole",), name
        a, b = evaluator.measure(noisy), slow.measure(noisy)
        assert a.loss == pytest.approx(b.loss, rel=1e-5, abs=1e-9), name
    assert evaluator.cut_reason is None


def test_a_cut_whose_baseline_strays_from_the_whole_model_is_not_trusted(val300, monkeypatch):
    import pydsz.assess.evaluator as ev

    data = bundled("lenet5.tflite").read_bytes()
    model = TFLiteModel(data)
    evaluator = Evaluator(data, *val300, ["conv2"], paths=("cut",))
    real = ev.Evaluator._from_cut
    monkeypatch.setattr(ev.Evaluator, "_from_cut",
                        lambda self, start, w, samples=None: {k: v * 1.1 for k, v in real(self, start, w, samples).items()})
    w = np.asarray(model.weight("conv2"))
    m = evaluator.measure({"conv2": w * np.float32(1.05)})
    assert evaluator.path(["conv2"]) == "whole" and "differs from the whole model's" in evaluator.cut_reason
    monkeypatch.undo()
    assert m == Evaluator(data, *val300, ["conv2"], paths=()).measure({"conv2": w * np.float32(1.05)})
