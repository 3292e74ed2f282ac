"""Assessment: the fast tail evaluator against the interpreter, the adaptive range, sizes as stored."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydsz.assess.evaluator import Evaluator, Measure
from pydsz.assess.ladder import Ladder, Point
from pydsz.assess.tasks import assess_layer, measure_point
from pydsz.context import Run
from pydsz.encode import pack
from pydsz.encode.tensor import LOSSLESS_PART, encode_weight
from pydsz.errors import InputError
from pydsz.format import container
from pydsz.model.data import bundled
from pydsz.model.graph import TFLiteModel
from pydsz.model.selection import compressible_layers


def _model(name):
    data = bundled(name).read_bytes()
    return data, TFLiteModel(data)


@pytest.mark.parametrize("name", ["lenet300.tflite", "lenet5.tflite"])
def test_tail_evaluator_agrees_with_the_interpreter(name, val):
    data, model = _model(name)
    names = [l.name for l in compressible_layers(model)]
    fast = Evaluator(data, *val, names)
    slow = Evaluator(data, *val, names, paths=("cut",))
    assert fast.fast and not slow.fast
    assert fast.measure({}) == slow.measure({}) == Measure(0, 0, 0, 0)
    # coarse bounds on every layer at once: predictions change, both paths must see the same
    weights = {n: encode_weight(model.weight(n), 0.05)[0] for n in names}
    changed = fast.measure(weights)
    assert changed == slow.measure(weights)
    assert changed.lost + changed.gained > 0 and changed.noise == np.sqrt(changed.lost + changed.gained)


def test_conv_layers_fall_back_to_the_interpreter_fc_layers_keep_the_tail(val):
    data, model = _model("lenet5.tflite")
    names = [l.name for l in compressible_layers(model, "all")]
    assert names == ["conv1", "conv2", "fc1", "fc2"]
    evaluator = Evaluator(data, *val, names)
    assert evaluator.path({"fc1": None}) == "tail" and evaluator.path({"conv2": None, "fc1": None}) != "tail"
    conv = encode_weight(model.weight("conv2"), 0.05)[0]
    slow = Evaluator(data, *val, names, paths=("cut",))
    assert evaluator.measure({"conv2": conv}) == slow.measure({"conv2": conv})
    assert evaluator.measure({}) == Measure(0, 0, 0, 0)


def test_encode_weight_matches_what_the_container_stores():
    data, model = _model("lenet300.tflite")
    w = model.weight("fc2")
    decoded, size, data_bytes, index_bytes = encode_weight(w, 0.01)
    packed = container.DszModel(pack.pack_model(data, {"fc2": 0.01}))
    assert np.array_equal(packed.weights()["fc2"], decoded)
    (entry,) = packed.info()["tensors"]
    assert entry["compressed_bytes"] == size
    assert np.max(np.abs(decoded - w)) <= 0.01


def test_weights_at_decodes_what_encode_weight_decodes_and_keeps_only_streams(val):
    """The Evaluator keeps each (layer, bound)'s stream, not its decoded weights (a layer's size each):
    every call decodes anew, to the same values as encode_weight."""
    data, model = _model("lenet300.tflite")
    evaluator = Evaluator(data, *val, ["fc1", "fc2"])
    bounds = {"fc1": 0.02, "fc2": 0.01}
    first, second = evaluator.weights_at(bounds), evaluator.weights_at(bounds)
    for name, bound in bounds.items():
        expected = encode_weight(model.weight(name), bound)[0]
        assert np.array_equal(first[name].view(np.uint32), expected.view(np.uint32))
        assert np.array_equal(second[name], expected) and second[name] is not first[name]
    held = [a for entry in evaluator._encoded.values() for a in entry if isinstance(a, np.ndarray)]
    assert len(evaluator._encoded) == 2 and not held
    assert evaluator.weights_at({"fc1": 0.0, "fc2": 0.0}) == {}


def test_bound_zero_is_lossless():
    _, model = _model("lenet300.tflite")
    w = model.weight("fc3")
    decoded, size, _, index_bytes = encode_weight(w, 0.0)
    assert np.array_equal(decoded, w) and index_bytes == 0 and 0 < size <= w.nbytes


def test_adaptive_range_climbs_until_clearly_beyond_budget_then_refines(val):
    data, model = _model("lenet300.tflite")
    evaluator = Evaluator(data, *val, ["fc1"])
    budget = 3
    points = assess_layer(evaluator, "fc1", model.weight("fc1"), budget)
    bounds = [p.bound for p in points]
    assert bounds[0] == 0 and points[0].loss == 0 and bounds == sorted(bounds)
    assert points[-1].loss > max(2 * budget, budget + 10)
    coarse = [p for p in points if p.bound > 0 and np.isclose(np.log2(p.bound / 1e-4) % 1, 0, atol=1e-9)]
    fine = [p for p in points if p.bound > 0 and p not in coarse]
    assert fine, "the steps where the drop crosses into the budget are refined"
    assert all(p.loss <= max(2 * budget, budget + 10) for p in coarse[:-1])
    # larger bounds give smaller streams (up to codec noise between neighbours)
    sizes = [p.size for p in coarse]
    assert sizes[-1] < sizes[0]


def test_a_model_without_compressible_layers_of_the_kind_is_an_input_error():
    _, model = _model("lenet300.tflite")
    with pytest.raises(InputError, match="no compressible conv layer"):
        compressible_layers(model, "conv")


@pytest.mark.parametrize("name", ["lenet300.tflite", "lenet5.tflite"])
def test_gpu_evaluator_agrees_with_the_numpy_tail(name, val):
    """device="gpu" runs the tail on the GPU; without one the Evaluator stays on the CPU and says why."""
    from pydsz.gpu import device

    data, model = _model(name)
    names = [l.name for l in compressible_layers(model)]
    cpu = Evaluator(data, *val, names)
    gpu = Evaluator(data, *val, names, run=Run(device="gpu"))
    assert cpu.device == "cpu" and cpu.cpu_reason is None
    if device.available():
        assert gpu.device == "gpu" and gpu.cpu_reason is None
    else:
        assert gpu.device == "cpu" and device.missing() in gpu.cpu_reason
    weights = {n: encode_weight(model.weight(n), 0.05)[0] for n in names}
    for w in ({}, weights):
        a, b = cpu.measure(w), gpu.measure(w)
        # each path counts against its own baseline; float summation order may flip a near tie
        assert abs(a.loss - b.loss) <= 2, (a, b)
    with pytest.raises(InputError, match="cpu or gpu"):
        Evaluator(data, *val, names, run=Run(device="auto"))


def _losses(onset: float, slope: float, seed: int):
    """A loss curve: zero below `onset`, then growing with the bound, with a deterministic jitter
    that can make a point overshoot and the next fall back."""
    def loss(bound: float) -> float:
        if bound < onset:
            return 0.0
        jitter = np.random.default_rng([seed, int(np.float64(bound).view(np.int64))]).normal(0, 2)
        return max(0.0, slope * bound / onset + jitter)
    return loss


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_ladder_points_do_not_depend_on_speculation_or_the_order_results_come_in(data):
    kind = data.draw(st.sampled_from(["int8", "float32", "float32 in 3 lossless parts"]))
    weight = np.array([90, -40], np.int8) if kind == "int8" else np.array([0.3, -0.2], np.float32)
    if kind.endswith("parts"):
        weight = np.concatenate([weight, np.zeros(LOSSLESS_PART // 2, np.float32)])
    budget = data.draw(st.floats(0.5, 30))
    discrete = data.draw(st.booleans())
    loss = _losses(data.draw(st.sampled_from([1.0, 3.0, 2e-4, 3e-3, 0.05])), data.draw(st.floats(0.5, 20)),
                   data.draw(st.integers(0, 1000)))
    # a task's result: bound 0's parts are sized 10, 11, ... and add up to its point
    point = lambda bound, part: Point("w", bound, 10 + part, 10 + part, 0, loss(bound) if bound else 0.0)  # noqa: E731

    one_by_one = Ladder("w", weight, budget, discrete)
    assert one_by_one.parts == (3 if kind.endswith("parts") else 1)
    while (task := one_by_one.next()) is not None:
        one_by_one.issue(task)
        one_by_one.add(task, point(*task))
    assert one_by_one.done
    assert one_by_one.points()[0] == Point("w", 0.0, *[sum(range(10, 10 + one_by_one.parts))] * 2, 0, 0.0)

    parallel, running = Ladder("w", weight, budget, discrete), []
    slots = data.draw(st.integers(1, 8))
    while True:
        task = parallel.next() if len(running) < slots else None
        if task is not None:
            parallel.issue(task)
            running.append(task)
        elif running:  # a result comes back, any of those running
            task = running.pop(data.draw(st.integers(0, len(running) - 1)))
            parallel.add(task, point(*task))
        else:
            break
    assert parallel.done
    assert parallel.points() == one_by_one.points()
    assert set(one_by_one.measured) <= set(parallel.measured)


def test_a_large_float_layers_lossless_size_is_measured_in_parts_that_add_up_to_the_whole():
    rng = np.random.default_rng(5)
    w = np.zeros(LOSSLESS_PART // 2 + 1024, np.float32)  # two parts and a bit: three tasks
    hot = rng.choice(w.size, w.size // 1000, replace=False)  # sparse enough to compress fast
    w[hot] = rng.normal(0, 0.05, hot.size).astype(np.float32)
    _, size, _, _ = encode_weight(w, 0.0)
    whole = pack.lossless_size(w)
    assert abs(size - whole) <= 0.002 * whole
    weight = w.reshape(-1, 1024)
    ladder = Ladder("w", weight, 1.0, True)
    data, _ = _model("lenet300.tflite")
    evaluator = Evaluator(data, np.zeros((1, 28, 28), np.float32), np.zeros(1, np.int64), [])
    parts = []
    while (task := ladder.next())[0] == 0:
        ladder.issue(task)
        parts.append(task)
        ladder.add(task, measure_point(evaluator, "w", *task, weight))
    assert parts == [(0.0, 0), (0.0, 1), (0.0, 2)]
    assert ladder.measured[0.0] == Point("w", 0.0, size, size, 0, 0.0)
