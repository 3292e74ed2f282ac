"""Models as their users run them (issue 41): weights inside the subgraphs that IF and WHILE run are
layers like the main graph's, compressed, decoded and judged through the model's entry point; data
that never reaches a branch is said to, and the branch keeps bounds no coarser than the measured
layers'; a model whose outputs depend on the batch is assessed one sample at a time."""

import numpy as np
import pytest
from tflite_graphs import if_model, while_model

import pydsz
from pydsz.budget.rule import Budget
from pydsz.compress import pipeline
from pydsz.format.interpreter import make_interpreter
from pydsz.model import runtime
from pydsz.model.graph import TFLiteModel

pytestmark = pytest.mark.runtime

N = 32


def _inputs(signs, seed=0):
    """One sample per sign: |normal| times it, so that max(x) > 0 runs the IF's then-branch."""
    rng = np.random.default_rng(seed)
    return np.stack([s * np.abs(rng.standard_normal((1, N))) for s in signs]).astype(np.float32).reshape(len(signs), 1, N)


def _run(model: bytes, x) -> np.ndarray:
    it = make_interpreter(model)
    it.allocate_tensors()
    out = []
    for sample in x:
        it.set_tensor(it.get_input_details()[0]["index"], sample)
        it.invoke()
        out.append(it.get_tensor(it.get_output_details()[0]["index"]).copy())
    return np.concatenate(out)


def test_the_layers_of_an_if_and_of_a_while_are_found_and_named_by_subgraph():
    branches = TFLiteModel(if_model(N)).layers(("fc", "conv"))
    assert [(l.name, l.subgraph, l.stored_subgraph, l.compressible) for l in branches] == [
        ("sg1.fc1", 1, 0, True),  # the main graph's constant that the IF hands to the branch
        ("sg2.fc1", 2, 2, True)]  # a constant of the branch itself
    (body,) = TFLiteModel(while_model(N)).layers(("fc",))
    assert (body.name, body.subgraph, body.compressible) == ("sg2.fc1", 2, True)


@pytest.mark.parametrize("build", [if_model, while_model])
def test_subgraph_weights_round_trip_within_their_bound(build):
    model = build(N)
    packed = pydsz.pack_model(model, 0.01, layers="all")
    loaded = pydsz.load(packed)
    original = TFLiteModel(model)
    names = [l.name for l in original.layers(("fc", "conv"))]
    assert sorted(e.name for e in loaded.entries) == sorted(names)
    decoded = TFLiteModel(loaded.tflite_bytes())
    for name in names:
        assert np.abs(decoded.weight(name) - original.weight(name)).max() <= 0.01
    x = _inputs([1, -1, 1])
    assert np.abs(_run(loaded.tflite_bytes(), x) - _run(model, x)).max() < 0.2  # the decoded model runs


def test_compress_judges_branch_weights_by_the_outputs_they_move():
    model = if_model(N)
    x = _inputs([1, -1] * 16, seed=1)  # both branches run
    result = pipeline.compress(model, x, None, Budget("output-error", 0.01), layers="all")
    bounds = {l.name: l.bound for l in result.layers}
    assert bounds["sg1.fc1"] > 0 and bounds["sg2.fc1"] > 0
    assert not [w for w in result.warnings if "reaches" in w]
    assert pydsz.load(result.dsz).info()["rest_bytes"] < 0.25 * len(result.dsz)  # the branches are compressed


def test_a_branch_no_sample_takes_is_said_and_kept_no_coarser_than_the_measured_layers():
    model = if_model(N)
    x = _inputs([1] * 32, seed=2)  # the else-branch never runs
    result = pipeline.compress(model, x, None, Budget("output-error", 0.01), layers="all")
    (warning,) = [w for w in result.warnings if "reaches" in w]
    assert "sg2.fc1" in warning and "sg1.fc1" not in warning
    bounds = {l.name: l.bound for l in result.layers}
    scale = {n: float(np.sqrt(np.mean(np.square(TFLiteModel(model).weight(n))))) for n in bounds}
    assert 0 < bounds["sg2.fc1"] / scale["sg2.fc1"] <= bounds["sg1.fc1"] / scale["sg1.fc1"] * (1 + 1e-6)
    # where the branch does run, it drifts no more than the budget allows the measured one
    other = _inputs([-1] * 16, seed=3)
    decoded = pydsz.load(result.dsz).tflite_bytes()
    a, b = _run(model, other), _run(decoded, other)
    assert np.mean(np.linalg.norm(a - b, axis=1) / np.linalg.norm(a, axis=1)) < 0.02


def _batch_dependent_model(n: int = 8) -> bytes:
    """y = x - max over the whole batch: openWakeWord's mel front end clamps by the batch's loudest
    sample the same way. The batch is dynamic."""
    from tflite_graphs import T, build

    axes = np.array([0, 1], "<i4").tobytes()
    graph = {"tensors": [{"shape": [1, n], "signature": [-1, n]}, {"shape": [2], "type": T.INT32, "data": axes},
                         {"shape": []}, {"shape": [1, n], "signature": [-1, n]}],
             "ops": [("REDUCE_MAX", [0, 1], [2], "ReducerOptions", {"KeepDims": False}), ("SUB", [0, 2], [3])],
             "inputs": [0], "outputs": [3]}
    return build([graph])


def test_a_model_whose_outputs_depend_on_the_batch_is_found_and_run_one_sample_at_a_time():
    model = _batch_dependent_model()
    x = np.random.default_rng(4).standard_normal((40, 8)).astype(np.float32)
    assert runtime.probe(model, [x]).batch_dependence > runtime.BATCH_TOLERANCE
    assert runtime.batch_size(model, [x]) == 1
    alone = np.concatenate([x[i:i + 1] - x[i].max() for i in range(len(x))])
    np.testing.assert_allclose(runtime.outputs(model, [x], ["y"])["y"], alone, rtol=1e-6)
    # a model without that dependence keeps its batches
    plain = if_model(N)
    assert runtime.probe(TFLiteModel(plain), [_inputs([1, 1])]).batch_dependence < runtime.BATCH_TOLERANCE


def _clamp_model(n: int = 8, floor: float = 10.0) -> bytes:
    """y = max(x, the batch's largest value - floor): openWakeWord's mel front end's clamp, which moves a
    sample only beside one much louder."""
    from tflite_graphs import T, build

    axes = np.array([0, 1], "<i4").tobytes()
    graph = {"tensors": [{"shape": [1, n], "signature": [-1, n]}, {"shape": [2], "type": T.INT32, "data": axes},
                         {"shape": []}, {"shape": [], "data": np.float32(floor).tobytes()}, {"shape": []},
                         {"shape": [1, n], "signature": [-1, n]}],
             "ops": [("REDUCE_MAX", [0, 1], [2], "ReducerOptions", {"KeepDims": False}), ("SUB", [2, 3], [4]),
                     ("MAXIMUM", [0, 4], [5])],
             "inputs": [0], "outputs": [5]}
    return build([graph])


def test_a_batch_dependence_only_loud_samples_show_is_found():
    # the first samples are alike (a batch of them is every one's alone): the probe pairs the loudest
    # input with the quietest, as a user's recordings mix them
    x = np.random.default_rng(6).uniform(0, 1, (40, 8)).astype(np.float32)
    x[17] *= 100
    model = _clamp_model()
    assert runtime.probe(model, [x[:16]]).batch_dependence < runtime.BATCH_TOLERANCE
    assert runtime.probe(model, [x]).batch_dependence > runtime.BATCH_TOLERANCE
    assert runtime.batch_size(model, [x]) == 1
    alone = np.maximum(x, x.max(axis=1, keepdims=True) - 10)
    np.testing.assert_allclose(runtime.outputs(model, [x], ["y"])["y"], alone, rtol=1e-6)


def test_a_batch_dependence_neither_the_loudest_nor_the_quietest_shows_is_found():
    # the clamp moves only a sample with a value far below the batch's loudest: not the quietest, whose
    # values are all close to it, but one louder than that with a single quiet value (a window with a gap)
    rng = np.random.default_rng(7)
    x = rng.uniform(91.5, 99, (8, 8)).astype(np.float32)
    x[2] = 100  # the loudest: the batch's largest value
    x[5] = 91  # the quietest: within the floor of 100
    x[6] = 98
    x[6, 3] = 0  # alone clamped at 88, beside the loudest at 90
    energy = np.sum(np.square(x.astype(np.float64)), axis=1)
    assert np.argmax(energy) == 2 and np.argmin(energy) == 5
    model = _clamp_model()
    assert runtime.probe(model, [x]).batch_dependence > runtime.BATCH_TOLERANCE
    alone = np.maximum(x, x.max(axis=1, keepdims=True) - 10)
    np.testing.assert_allclose(runtime.outputs(model, [x], ["y"])["y"], alone, rtol=1e-6)


def test_the_evaluator_of_a_batch_dependent_model_says_so():
    from pydsz.assess.evaluator import Evaluator

    x = np.random.default_rng(5).standard_normal((40, 8)).astype(np.float32)
    evaluator = Evaluator(_batch_dependent_model(), [x], None, [], "output-error")
    assert evaluator.batch == 1 and "depend on the batch" in evaluator.batch_note
