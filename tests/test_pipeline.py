"""The main job end to end: assess -> optimize -> verify -> encode, and the report."""

import json

import numpy as np
import pytest

from pydsz.assess.ladder import Point
from pydsz.budget.rule import Budget
from pydsz.compress import demo, pipeline
from pydsz.compress.report import layer_table, totals_line, write_report
from pydsz.errors import InputError
from pydsz.format import container
from pydsz.gpu import device
from pydsz.model import runtime
from pydsz.model.data import bundled


@pytest.fixture(scope="module")
def result(lenet300, val):
    return pipeline.compress(lenet300, *val, budget=0.003)


@pytest.mark.slow
def test_compress_stays_within_the_budget_measured_on_the_decoded_model(result, lenet300, val):
    decoded = container.load(result.dsz).tflite_bytes()
    measured = runtime.accuracy(decoded, *val)
    assert measured == pytest.approx(result.after, abs=1e-12)
    assert result.before - measured <= 0.003 + 1e-12
    assert result.before == pytest.approx(runtime.accuracy(lenet300, *val), abs=1e-12)
    assert result.loss == pytest.approx(result.before - measured, abs=1e-12)
    assert {l.name for l in result.layers} == {"fc1", "fc2", "fc3"}
    assert result.ratio > 4  # dense float32 weights at the largest bounds the budget allows
    assert result.attempts[-1]["measured_loss"] <= result.allowed


def test_chosen_bounds_are_what_the_file_holds(result):
    bounds, steps = {}, {}
    for e in container.load(result.dsz).entries:
        if e.representation == "gathered":  # a gathered layer's step: twice its bound, a hair less
            steps.update({name.split(":")[0]: step for name, (_, _, step) in zip(e.name.split(","), e.spans) if name})
        else:
            bounds[e.name] = e.error_bound
    for layer in result.layers:
        if layer.name in steps:
            assert 2 * layer.bound * (1 - 1e-3) <= steps[layer.name] <= 2 * layer.bound
        elif layer.bound > 0:
            assert bounds[layer.name] == layer.bound
        else:
            assert layer.name not in bounds


@pytest.mark.slow
def test_verification_tightens_when_losses_do_not_add_up(lenet300, val, monkeypatch):
    real_assess = pipeline.plan.assess

    def optimistic(*args, **kwargs):
        # Claim every bound is free: the optimizer then picks the largest ones and only the
        # verification (which measures) can bring the loss back within budget.
        assessment = real_assess(*args, **kwargs)
        assessment.table = {name: [Point(p.layer, p.bound, p.size, p.data_bytes, p.index_bytes, 0)
                                   for p in points] for name, points in assessment.table.items()}
        return assessment

    monkeypatch.setattr(pipeline.plan, "assess", optimistic)
    result = pipeline.compress(lenet300, *val, budget=0.002)
    assert len(result.attempts) > 1
    assert result.attempts[0]["loss"] > result.allowed
    assert result.before - result.after <= 0.002 + 1e-12
    assert result.attempts[-1]["measured_loss"] <= result.allowed


@pytest.mark.slow
def test_target_ratio_gives_the_best_accuracy_at_that_size(lenet300, val):
    result = pipeline.compress(lenet300, *val, target_ratio=8)
    streams = sum(l.stream_bytes for l in result.layers)
    assert streams <= sum(l.original_bytes for l in result.layers) / 8
    assert result.after == pytest.approx(runtime.accuracy(container.load(result.dsz).tflite_bytes(), *val), abs=1e-12)


@pytest.mark.slow
def test_reference_accuracy_shares_the_budget(lenet300, val):
    # an earlier step spent 0.3 points: no budget is left, nothing may be lost
    result = pipeline.compress(lenet300, *val, Budget(None, 0.003, spent=0.003))
    assert result.allowed == 0
    assert result.after >= result.before


@pytest.mark.parametrize("max_loss", [-0.1, 1.0, 2.0, float("nan")])
def test_max_loss_outside_0_1_is_an_input_error(lenet300, val, max_loss):
    with pytest.raises(InputError, match="max-loss"):
        pipeline.compress(lenet300, *val, budget=max_loss)


def test_labels_out_of_range_are_an_input_error(lenet300, val):
    with pytest.raises(InputError, match="labels"):
        pipeline.compress(lenet300, val[0], val[1].astype(np.int64) + 10)


def test_inputs_that_do_not_fit_the_model_are_an_input_error(lenet300, val):
    with pytest.raises(InputError):
        pipeline.compress(lenet300, val[0][:, :20, :20], val[1])


def test_no_compressible_layer_is_an_input_error(lenet300, val):
    with pytest.raises(InputError, match="no compressible conv layer"):
        pipeline.compress(lenet300, *val, layers="conv")


def test_report_writes_json_and_png(result, tmp_path):
    paths = write_report(result, tmp_path / "r", extra={"note": "test"})
    report = json.loads(paths[0].read_text())
    assert report["note"] == "test"
    assert report["totals"]["measured_loss"] == pytest.approx(result.loss)
    assert [l["name"] for l in report["layers"]] == ["fc1", "fc2", "fc3"]
    assert paths[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report["metric"]["name"] == "top1" and report["metric"]["unit"].startswith("top-1")
    assert "fc1" in layer_table(result) and "top1" in totals_line(result)


def test_expected_losses_are_monotone_and_keep_a_noise_margin():
    points = [Point("fc1", b, 100, 90, 10, drop, np.sqrt(lost + gained), lost, gained) for b, drop, lost, gained in
              [(0.0, 0, 0, 0), (0.01, 2, 3, 1), (0.02, -1, 4, 5), (0.04, 6, 8, 2)]]
    at_face_value = pipeline.expected_losses(points, margin=0)
    assert at_face_value == [0.0, 0.5, 0.5, 6.0]  # the dip at 0.02 is pooled with its neighbour
    careful = pipeline.expected_losses(points, margin=1)
    assert all(a <= b for a, b in zip(careful, careful[1:]))
    assert careful[-1] == pytest.approx(6 + np.sqrt(10))


# The command line: `dsz compress` and `dsz prune`, one-line errors and no partial output.

def _dsz(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "pydsz.cli", *map(str, args)], capture_output=True, text=True)


def _one_line_error(result, *words):
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dsz: error: "), result.stderr
    assert all(w in lines[0] for w in words), lines[0]


@pytest.fixture(scope="module")
def small_val(tmp_path_factory, val):
    path = tmp_path_factory.mktemp("data") / "val.npz"
    np.savez(path, x=val[0][:500], y=val[1][:500])
    return path


@pytest.mark.slow
def test_cli_compress_writes_the_dsz_and_the_report(small_val, tmp_path):
    out = tmp_path / "m.dsz"
    result = _dsz("compress", bundled("lenet300.tflite"), "--data", small_val, "--max-loss", "0.004",
                  "-o", out, "--report", tmp_path / "rep", "--quiet")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and out.read_bytes()[:4] == container.MAGIC
    assert (tmp_path / "rep" / "report.json").exists() and (tmp_path / "rep" / "curves.png").exists()
    totals = json.loads((tmp_path / "rep" / "report.json").read_text())["totals"]
    assert totals["device"] == ("gpu" if device.available() else "cpu")  # --device auto


@pytest.mark.parametrize("command", ["compress", "prune", "demo", "bench"])
def test_cli_device_gpu_without_a_gpu_is_one_line_and_writes_nothing(small_val, tmp_path, command):
    if device.available():
        pytest.skip("this machine has a GPU")
    out = tmp_path / "out"
    args = {"compress": [bundled("lenet300.tflite"), "--data", small_val, "-o", out],
            "prune": [bundled("lenet300.tflite"), "--train", small_val, "--data", small_val, "--sparsity", "0.9",
                      "-o", out],
            "demo": ["-o", out],
            "bench": [bundled("lenet300.tflite"), "--data", small_val, "--test", small_val, "--report", out]}[command]
    _one_line_error(_dsz(command, *args, "--device", "gpu"), "--device gpu", device.missing())
    assert not out.exists()


@pytest.mark.parametrize("arrays, words", [({"x": np.zeros((3, 28, 28), np.uint8)}, ["top1 needs labels"]),
                                           ({"x": np.zeros((3, 5, 5), np.uint8), "y": np.zeros(3, np.int64)}, []),
                                           ({"x": np.zeros((3, 28, 28), np.uint8), "y": np.full(3, 12)}, ["labels"])])
def test_cli_compress_bad_data_is_one_line_and_writes_nothing(tmp_path, arrays, words):
    data = tmp_path / "bad.npz"
    np.savez(data, **arrays)
    out = tmp_path / "m.dsz"
    _one_line_error(_dsz("compress", bundled("lenet300.tflite"), "--data", data, "--metric", "top1", "-o", out),
                    *words)
    assert not out.exists() and list(tmp_path.iterdir()) == [data]


def test_cli_compress_bad_max_loss(small_val, tmp_path):
    _one_line_error(_dsz("compress", bundled("lenet300.tflite"), "--data", small_val, "--max-loss", "1",
                         "-o", tmp_path / "m.dsz"), "max-loss")
    assert not (tmp_path / "m.dsz").exists()


def test_cli_prune_with_a_tiny_training_set(small_val, tmp_path):
    train = tmp_path / "train.npz"
    np.savez(train, x=np.zeros((10, 28, 28), np.uint8), y=np.zeros(10, np.int64))
    _one_line_error(_dsz("prune", bundled("lenet300.tflite"), "--train", train, "--data", small_val,
                         "--sparsity", "0.9", "-o", tmp_path / "p.tflite"), "too small")
    assert not (tmp_path / "p.tflite").exists()


@pytest.mark.slow
def test_demo_run_prunes_and_compresses_within_the_budget_on_validation():
    row = demo.run("lenet5", max_loss=0.003)
    s = row["summary"]
    val = s["val_top1"]
    # pruning and compression share the budget; compression alone never spends more than is left
    assert val["original"] - val["compressed"] <= max(0.003, val["original"] - val["pruned"]) + 1e-12
    assert s["sparsity"]["fc1"] == pytest.approx(0.95, abs=1e-3)
    assert s["ratio"] > 40
    assert "LeNet-5 pydsz" in demo.table([row])


def test_an_executor_that_outlives_a_job_lets_its_evaluator_go(lenet300, val):
    """The command's Run, and the executor in it, outlive each compress (--prune auto compresses once
    per pruning share): the executor must not keep a finished job's Evaluator, with its compensation's
    factors and cached activations, alive into the next (oww_timer: 245 MiB past the printed bound)."""
    import gc

    from pydsz.assess.executor import Local
    from pydsz.compress.compensation import Compensation
    from pydsz.context import Run

    run = Run(executor=Local())
    x, y = val
    pipeline.compress(lenet300, x[:400], y[:400], Budget("top1", 0.01), run=run, compensation=Compensation(False))
    gc.collect()
    assert run.executor.evaluator is None
