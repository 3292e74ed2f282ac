"""`dsz compress --prune auto`: DeepSZ's whole pipeline under one --max-loss, through the command line."""

import json

import numpy as np
import pytest
from test_cli import assert_user_error, dsz

from pydsz.format import container
from pydsz.model import runtime
from pydsz.model.data import bundled, load_npz
from pydsz.model.graph import TFLiteModel
from pydsz.prune.masks import density


def _data(tmp_path, n, name="val.npz"):
    x, y = load_npz(bundled("fmnist_val.npz"))
    path = tmp_path / name
    np.savez(path, x=x[:n], y=y[:n])
    return path


@pytest.mark.slow
def test_one_shot_prune_auto_splits_the_budget_and_keeps_it(tmp_path):
    data, out, report = _data(tmp_path, 2000), tmp_path / "m.dsz", tmp_path / "report"
    result = dsz("compress", bundled("lenet300.tflite"), "--prune", "auto", "--data", data, "--max-loss", "0.01",
                 "--report", report, "-o", out)
    assert result.returncode == 0, result.stderr
    assert "--prune auto (oneshot): pruning" in result.stdout and "of --max-loss 0.01" in result.stdout
    decoded = container.load(out.read_bytes()).tflite_bytes()
    assert 1 - density(TFLiteModel(decoded).weight("fc1")) >= 0.5  # pruned, not only quantized
    x, y = load_npz(data)
    original = runtime.accuracy(bundled("lenet300.tflite").read_bytes(), x, y)
    assert original - runtime.accuracy(decoded, x, y) <= 0.01 + 1e-9  # pruning and bounds together
    split = json.loads((report / "report.json").read_text())["prune"]
    assert split["method"] == "oneshot" and split["tried"]
    assert split["pruning_loss"] + split["compression_loss"] <= 0.01 + 1e-9


def test_prune_auto_on_too_few_samples_names_max_loss(tmp_path):
    """compress sets the budget with --max-loss: its error names it, never prune's --auto-budget."""
    data, out = _data(tmp_path, 200), tmp_path / "m.dsz"
    result = dsz("compress", bundled("lenet300.tflite"), "--prune", "auto", "--data", data, "--max-loss", "0.005",
                 "-o", out)
    assert_user_error(result, "--max-loss")
    assert "--auto-budget" not in result.stderr
    assert not out.exists()


@pytest.mark.slow
def test_prune_auto_that_the_labels_cannot_judge_compresses_the_model_as_it_is_and_says_why(tmp_path):
    """1,000 labels and pruning's share of --max-loss 0.003 (2 samples): half an epoch of retraining flips dozens
    of predictions, so auto's plan ends at nothing pruned and `dsz prune` would stop with the error naming the
    samples needed. Inside compress the file is still made, unpruned, within the whole budget, the reason printed."""
    from pydsz.model.data import fashion_mnist

    x, y = fashion_mnist("train")
    train, data, out, report = tmp_path / "train.npz", _data(tmp_path, 1000), tmp_path / "m.dsz", tmp_path / "report"
    np.savez(train, x=x[:3000], y=y[:3000])
    result = dsz("compress", bundled("lenet300.tflite"), "--prune", "auto", "--train", train, "--epochs", "0.5",
                 "--data", data, "--max-loss", "0.003", "--report", report, "-o", out)
    assert result.returncode == 0, result.stderr
    assert "--prune auto pruned nothing: validation set of 1000 samples too small" in result.stdout
    split = json.loads((report / "report.json").read_text())["prune"]
    assert split["sparsity"] == {} and split["pruning_loss"] == 0 and len(split["tried"]) == 1
    decoded = container.load(out.read_bytes()).tflite_bytes()
    xv, yv = load_npz(data)
    original = runtime.accuracy(bundled("lenet300.tflite").read_bytes(), xv, yv)
    assert original - runtime.accuracy(decoded, xv, yv) <= 0.003 + 1e-9


def test_train_without_prune_auto_is_a_user_error(tmp_path):
    data, out = _data(tmp_path, 500), tmp_path / "m.dsz"
    result = dsz("compress", bundled("lenet300.tflite"), "--train", data, "--data", data, "-o", out)
    assert_user_error(result, "--prune auto")
    assert not out.exists()


def test_prune_auto_with_retraining_judges_by_top1_only(tmp_path):
    data, out = _data(tmp_path, 500), tmp_path / "m.dsz"
    result = dsz("compress", bundled("lenet300.tflite"), "--prune", "auto", "--train", data, "--data", data,
                 "--metric", "output-error", "-o", out)
    assert_user_error(result, "top-1", "--train")
    assert not out.exists()
