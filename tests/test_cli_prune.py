"""`dsz prune --method oneshot|retrain` through the command line: exit codes, errors, no partial output."""

import json

import numpy as np
import pytest
from test_cli import assert_user_error, dsz

from pydsz.model.data import bundled, load_npz
from pydsz.model.graph import TFLiteModel
from pydsz.prune.masks import density


@pytest.mark.slow
def test_oneshot_prunes_every_layer_without_training_data(tmp_path):
    out = tmp_path / "pruned.tflite"
    result = dsz("prune", bundled("lenet5.tflite"), "--method", "oneshot", "--layers", "all",
                 "--data", bundled("fmnist_val.npz"), "--sparsity", "0.5", "-o", out)
    assert result.returncode == 0, result.stderr
    assert "method: oneshot" in result.stdout and "seconds per layer: conv1=" in result.stdout
    model = TFLiteModel.from_file(out)
    assert all(abs(1 - density(model.weight(l)) - 0.5) < 0.01 for l in ("conv1", "conv2", "fc1", "fc2"))


def test_oneshot_calibrates_on_images_without_labels(tmp_path):
    x, _ = load_npz(bundled("fmnist_val.npz"))
    data, out = tmp_path / "x.npz", tmp_path / "pruned.tflite"
    np.savez(data, x=x[:1000])
    result = dsz("prune", bundled("lenet300.tflite"), "--method", "oneshot", "--data", data, "--sparsity", "0.6",
                 "-o", out)
    assert result.returncode == 0, result.stderr
    assert "top-1 on" not in result.stdout and "peak memory" in result.stdout
    assert abs(1 - density(TFLiteModel.from_file(out).weight("fc1")) - 0.6) < 0.01
    # what pruning cost, without labels: the default metric against the unpruned model, as dsz eval measures it
    said = result.stdout.split("expected-top1 against the unpruned model on the validation data: ")[1]
    check = dsz("eval", out, "--reference", bundled("lenet300.tflite"), "--data", data, "--json")
    assert float(said.split()[0]) == pytest.approx(json.loads(check.stdout)["loss"], rel=1e-3, abs=1e-6)
    assert "(expected top-1 accuracy (0.003 = 0.3 points); 1000 samples)" in said


@pytest.mark.slow
def test_oneshot_auto_without_labels_judges_by_expected_top1(tmp_path):
    x, _ = load_npz(bundled("fmnist_val.npz"))
    data, out = tmp_path / "x.npz", tmp_path / "auto.tflite"
    np.savez(data, x=x[:2000])
    result = dsz("prune", bundled("lenet300.tflite"), "--method", "oneshot", "--data", data, "--sparsity", "auto",
                 "--auto-budget", "0.01", "-o", out)
    assert result.returncode == 0, result.stderr
    assert "auto judged by expected-top1" in result.stdout and "top-1 on" not in result.stdout
    assert 1 - density(TFLiteModel.from_file(out).weight("fc1")) >= 0.5  # the largest layer is pruned
    check = dsz("eval", out, "--reference", bundled("lenet300.tflite"), "--metric", "expected-top1", "--data", data,
                "--json")
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["loss"] <= 0.01  # the margin was kept in hand on these same samples


@pytest.mark.slow
def test_oneshot_auto_judges_by_the_metric_given(tmp_path):
    out = tmp_path / "auto.tflite"
    result = dsz("prune", bundled("lenet300.tflite"), "--method", "oneshot", "--data", bundled("fmnist_val.npz"),
                 "--sparsity", "auto", "--metric", "output-error", "--auto-budget", "0.05", "-o", out)
    assert result.returncode == 0, result.stderr
    assert "auto judged by output-error" in result.stdout
    check = dsz("eval", out, "--reference", bundled("lenet300.tflite"), "--metric", "output-error",
                "--data", bundled("fmnist_val.npz"), "--json")
    assert 0 < json.loads(check.stdout)["value"] <= 0.05


def test_oneshot_auto_by_a_metric_that_needs_labels_without_them_is_a_user_error(tmp_path):
    x, _ = load_npz(bundled("fmnist_val.npz"))
    data, out = tmp_path / "x.npz", tmp_path / "auto.tflite"
    np.savez(data, x=x[:500])
    result = dsz("prune", bundled("lenet300.tflite"), "--method", "oneshot", "--data", data, "--sparsity", "auto",
                 "--metric", "top1", "-o", out)
    assert_user_error(result, "needs labels")
    assert not out.exists()


def test_oneshot_calibrates_on_a_directory_of_images(tmp_path):
    from PIL import Image

    x, _ = load_npz(bundled("fmnist_val.npz"))
    folder = tmp_path / "photos"
    folder.mkdir()
    for i, image in enumerate(x[:64]):
        Image.fromarray(image).save(folder / f"{i:02d}.png")
    out = tmp_path / "pruned.tflite"
    result = dsz("prune", bundled("lenet5.tflite"), "--method", "oneshot", "--layers", "conv", "--data", folder,
                 "--normalize=0,255", "--sparsity", "0.5", "-o", out)
    assert result.returncode == 0, result.stderr
    assert abs(1 - density(TFLiteModel.from_file(out).weight("conv2")) - 0.5) < 0.01


def test_retrain_takes_no_metric_or_images(tmp_path):
    out = tmp_path / "pruned.tflite"
    result = dsz("prune", bundled("lenet300.tflite"), "--train", bundled("fmnist_val.npz"),
                 "--data", bundled("fmnist_val.npz"), "--sparsity", "0.5", "--metric", "output-error", "-o", out)
    assert_user_error(result, "--method oneshot")
    assert not out.exists()


def test_oneshot_takes_an_n_m_pattern(tmp_path):
    out = tmp_path / "pruned.tflite"
    result = dsz("prune", bundled("lenet300.tflite"), "--method", "oneshot", "--data", bundled("fmnist_val.npz"),
                 "--sparsity", "2:4", "-q", "-o", out)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    w = TFLiteModel.from_file(out).weight("fc2")
    assert (w == 0).reshape(w.shape[0], -1, 4).sum(axis=2).min() >= 2


def test_retrain_without_training_data_is_a_user_error(tmp_path):
    out = tmp_path / "pruned.tflite"
    result = dsz("prune", bundled("lenet300.tflite"), "--data", bundled("fmnist_val.npz"), "--sparsity", "0.5",
                 "-o", out)
    assert_user_error(result, "--train")
    assert not out.exists()


def test_retrain_of_conv_layers_is_a_user_error(tmp_path):
    out = tmp_path / "pruned.tflite"
    result = dsz("prune", bundled("lenet5.tflite"), "--train", bundled("fmnist_val.npz"),
                 "--data", bundled("fmnist_val.npz"), "--sparsity", "0.5", "--layers", "all", "-o", out)
    assert_user_error(result, "--method oneshot")
    assert not out.exists()


def test_a_bad_n_m_pattern_is_a_user_error(tmp_path):
    out = tmp_path / "pruned.tflite"
    result = dsz("prune", bundled("lenet300.tflite"), "--method", "oneshot", "--data", bundled("fmnist_val.npz"),
                 "--sparsity", "4:4", "-o", out)
    assert_user_error(result, "4:4")
    assert not out.exists()


def test_auto_on_too_small_a_validation_set_is_a_user_error(tmp_path):
    x, y = load_npz(bundled("fmnist_val.npz"))
    small = tmp_path / "small.npz"
    np.savez(small, x=x[:200], y=y[:200])
    out = tmp_path / "pruned.tflite"
    result = dsz("prune", bundled("lenet300.tflite"), "--method", "oneshot", "--train", bundled("fmnist_val.npz"),
                 "--data", small, "--sparsity", "auto", "--auto-budget", "0.002", "-q", "-o", out)
    assert_user_error(result, "200 samples are too few", "use at least")  # as dsz compress says it
    assert not out.exists()


def test_auto_names_the_option_that_sets_its_budget(tmp_path):
    """dsz prune sets auto's budget with --auto-budget and has no --max-loss or --margin: its errors say so."""
    x, y = load_npz(bundled("fmnist_val.npz"))
    small = tmp_path / "small.npz"
    np.savez(small, x=x[:200], y=y[:200])
    result = dsz("prune", bundled("lenet300.tflite"), "--method", "oneshot", "--train", bundled("fmnist_val.npz"),
                 "--data", small, "--sparsity", "auto", "--auto-budget", "0.002", "-q", "-o", tmp_path / "p.tflite")
    assert_user_error(result, "--auto-budget")
    assert "--max-loss" not in result.stderr and "--margin" not in result.stderr
