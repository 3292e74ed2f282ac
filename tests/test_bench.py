"""`dsz bench`: every method on the same pruned model, measured the same way; the comparisons."""

import json
import subprocess
import sys

import numpy as np
import pytest

from pydsz.bench import anchors, summary
from pydsz.errors import InputError
from pydsz.model import runtime
from pydsz.model.data import bundled, load_npz
from pydsz.model.graph import TFLiteModel
from pydsz.prune.masks import magnitude_mask

pytestmark = pytest.mark.runtime

SAMPLES = 500


@pytest.fixture(scope="module")
def pruned():
    """LeNet-300-100 magnitude-pruned without retraining: a pruned model, quickly."""
    model = TFLiteModel(bundled("lenet300.tflite").read_bytes())
    sparsity = {"fc1": 0.9, "fc2": 0.9, "fc3": 0.5}
    return model.replace({n: np.where(magnitude_mask(model.weight(n), s), model.weight(n), 0)
                          for n, s in sparsity.items()})


@pytest.fixture(scope="module")
def splits():
    (x, y), (xt, yt) = load_npz(bundled("fmnist_val.npz")), load_npz(bundled("fmnist_test.npz"))
    return (x[:SAMPLES], y[:SAMPLES]), (xt[:SAMPLES], yt[:SAMPLES])


@pytest.fixture(scope="module")
def info(pruned, splits):
    pytest.importorskip("hdf5plugin")  # SZ3, for the DeepSZ baseline: the `bench` extra
    return anchors.benchmark(pruned, *splits, 0.01, sweep=anchors.Sweep(budgets=[0.01], clusters=[8, 32], bits=[8]))


@pytest.mark.slow
def test_every_method_has_its_points(info):
    methods = [p["method"] for p in info["points"]]
    assert methods == [anchors.OURS, anchors.DEEPSZ, anchors.DC, anchors.DC, anchors.INT, anchors.FLOAT16, anchors.LOSSLESS]
    assert [info["points"][i]["method"] for i in info["main"]] == list(dict.fromkeys(methods))


def test_sizes_and_ratios_add_up(info):
    for p in info["points"]:
        assert p["fc_bytes"] == sum(p["layer_bytes"].values())
        if p["method"] != anchors.OURS:  # pydsz's file is the .dsz itself
            assert p["file_bytes"] == info["rest_bytes"] + p["fc_bytes"]
        assert p["ratio"] == pytest.approx(info["fc_original_bytes"] / p["fc_bytes"])
    assert info["fc_original_bytes"] == 4 * (784 * 300 + 300 * 100 + 100 * 10)


def test_each_method_decodes_within_its_own_error(info):
    by = {(p["method"], p["setting"]): p for p in info["points"]}
    assert by[anchors.LOSSLESS, None]["max_error"] == 0
    assert by[anchors.FLOAT16, "float16"]["max_error"] < 1e-3
    deepsz = by[anchors.DEEPSZ, 0.01]
    assert deepsz["max_error"] <= max(deepsz["detail"]["bounds"].values())
    # pydsz compensates by default: its bounds hold on the compensated weights it stores (tests/test_oneshot.py),
    # which move from the original's by design
    assert by[anchors.OURS, 0.01]["detail"]["compensated"]


def test_accuracy_is_the_interpreters_on_the_decoded_model(info, pruned, splits):
    val, test = splits
    lossless = next(p for p in info["points"] if p["method"] == anchors.LOSSLESS)
    assert lossless["val_value"] == pytest.approx(runtime.accuracy(pruned, *val), abs=1e-12)
    assert lossless["val_value"] == info["pruned"]["val_value"]
    assert lossless["test_value"] == pytest.approx(runtime.accuracy(pruned, *test), abs=1e-12)
    assert lossless["test_loss"] == pytest.approx(info["original"]["test_value"] - lossless["test_value"])


def test_ours_beats_lossless_and_deepsz_respects_its_grid(info):
    by = {p["method"]: p for p in info["points"]}
    assert by[anchors.OURS]["ratio"] > by[anchors.LOSSLESS]["ratio"]
    assert set(by[anchors.DEEPSZ]["detail"]["bounds"].values()) <= set(anchors.deepsz.GRID)


def point(method, setting, ratio, loss):
    return {"method": method, "setting": setting, "ratio": ratio, "test_loss": loss}


def test_comparison_takes_our_best_point_losing_no_more():
    ours = [point(anchors.OURS, 0.003, 50.0, 0.004), point(anchors.OURS, 0.006, 60.0, 0.006)]
    deepsz, dc = point(anchors.DEEPSZ, 0.003, 35.0, 0.005), point(anchors.DC, 32, 40.0, 0.0065)
    result = anchors.compare(ours + [deepsz, dc], [deepsz, dc])
    rows = {r["method"]: r for r in result["points"]}
    assert rows[anchors.DEEPSZ]["advantage"] == pytest.approx(50 / 35)
    assert rows[anchors.DC]["advantage"] == pytest.approx(60 / 40)
    targets = {t["target"]: t["met"] for t in result["targets"]}
    assert list(targets.values()) == [True, True, True]


def test_comparison_says_where_our_curve_is_not_above():
    ours = [point(anchors.OURS, 0.003, 50.0, 0.004)]
    others = [point(anchors.DEEPSZ, 0.003, 35.0, 0.005), point(anchors.DC, 4, 70.0, 0.01), point(anchors.DC, 32, 45.0, 0.002)]
    result = anchors.compare(ours + others, [others[0], others[2]])
    curve = result["targets"][-1]
    assert not curve["met"] and curve["not_above"] == ["Deep Compression 4"]
    assert curve["loses_less_than_any_pydsz_point"] == ["Deep Compression 32"]
    assert result["targets"][1]["advantage"] is None  # no point of ours loses as little as DC 32


def test_report_writes_json_and_png(info, tmp_path):
    paths = summary.write_report(info, tmp_path, stem="b")
    assert json.loads(paths[0].read_text())["model"] == "model"
    assert paths[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = summary.main_table(info) + summary.sweep_table(info) + "\n".join(summary.summary_lines(info))
    assert "Deep Compression" in text and "clusters 32" in text


def test_pruning_needs_both_train_and_sparsity(pruned, splits):
    with pytest.raises(InputError, match="--train"):
        anchors.benchmark(pruned, *splits, 0.01, pruned=anchors.Pruned(sparsity=0.9))


@pytest.mark.slow
def test_a_model_pruned_elsewhere_is_judged_from_the_unpruned_one(pruned, splits):
    pytest.importorskip("hdf5plugin")
    original = bundled("lenet300.tflite").read_bytes()
    info = anchors.benchmark(original, *splits, 0.01, pruned=anchors.Pruned(model=pruned),
                             sweep=anchors.Sweep(budgets=[0.01], clusters=[32], bits=[8]))
    val = splits[0]
    drop = runtime.accuracy(original, *val) - runtime.accuracy(pruned, *val)
    assert info["pruned"]["val_loss"] == pytest.approx(drop)  # pruning's loss counts, as when bench prunes
    assert info["pruned"]["sparsity"]["fc1"] == pytest.approx(0.9, abs=0.01)
    with pytest.raises(InputError, match="not both"):
        anchors.benchmark(original, *splits, 0.01, pruned=anchors.Pruned(splits[0], 0.9, model=pruned))


def dsz(*args):
    return subprocess.run([sys.executable, "-m", "pydsz.cli", *map(str, args)], capture_output=True, text=True)


def test_cli_user_error_is_one_line_and_writes_nothing(tmp_path):
    val, test = bundled("fmnist_val.npz"), bundled("fmnist_test.npz")
    result = dsz("bench", bundled("lenet300.tflite"), "--data", val, "--test", test, "--sparsity", "0.9",
                 "--report", tmp_path / "r")
    assert result.returncode == 1 and result.stderr.startswith("dsz: error: ") and len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_cli_prints_the_table_and_writes_the_report(pruned, splits, tmp_path):
    pytest.importorskip("hdf5plugin")
    model = tmp_path / "pruned.tflite"
    model.write_bytes(pruned)
    for name, (x, y) in zip(("val", "test"), splits):
        np.savez(tmp_path / f"{name}.npz", x=x, y=y)
    result = dsz("bench", model, "--data", tmp_path / "val.npz", "--test", tmp_path / "test.npz", "--max-loss", "0.01",
                 "--budgets", "0.01", "--report", tmp_path / "r", "-q")
    assert result.returncode == 0, result.stderr
    assert "DeepSZ" in result.stdout and "lossless zstd-19" in result.stdout and "file bytes" in result.stdout
    assert json.loads((tmp_path / "r" / "bench.json").read_text())["budgets"] == [0.01]
    assert (tmp_path / "r" / "bench.png").stat().st_size > 0


def test_interpolation_reads_our_curve_between_points():
    ours = [point(anchors.OURS, 1, 50.0, 0.004), point(anchors.OURS, 2, 40.0, 0.005), point(anchors.OURS, 3, 60.0, 0.006)]
    assert anchors.ours_interpolated(ours, 0.003) is None
    assert anchors.ours_interpolated(ours, 0.005) == pytest.approx(55.0)  # 40x at 0.005 is under the envelope
    assert anchors.ours_interpolated(ours, 0.01) == 60.0


@pytest.mark.slow
def test_a_budget_the_validation_data_cannot_resolve_is_skipped_and_reported(pruned, splits):
    """500 samples at 0.1 points: one changed sample is more than the budget (at 0.2 points, one changed
    sample, the bounds are decided in calibrated-top1 and the labels check the file)."""
    pytest.importorskip("hdf5plugin")
    info = anchors.benchmark(pruned, *splits, 0.005, sweep=anchors.Sweep(budgets=[0.001, 0.005], clusters=[8], bits=[8]))
    assert [s["setting"] for s in info["skipped"]] == [0.001] and "too few" in info["skipped"][0]["reason"]
    assert [p["setting"] for p in info["points"] if p["method"] == anchors.OURS] == [0.005]
    assert any(line.startswith("skipped: pydsz at budget 0.001") for line in summary.summary_lines(info))
