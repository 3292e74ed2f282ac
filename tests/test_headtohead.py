"""`dsz bench --layers all` (pydsz.bench.headtohead): the model as given against what users pick instead."""

import json

import numpy as np
import pytest

from pydsz.bench import headtohead
from pydsz.bench.baselines import litert, quantized
from pydsz.budget.rule import Budget
from pydsz.errors import InputError
from pydsz.model import runtime
from pydsz.model.data import bundled, load_npz
from pydsz.model.graph import TFLiteModel

SAMPLES = 200


def test_per_channel_follows_the_axis_tflite_quantizes():
    rng = np.random.default_rng(0)
    # a depthwise kernel [1, H, W, C] whose channels span three orders of magnitude
    w = (rng.normal(size=(1, 3, 3, 6)) * np.logspace(-3, 0, 6)).astype(np.float32)
    axis = quantized.channel_axis("DEPTHWISE_CONV_2D", w.ndim)
    codes, scales, decoded = quantized.per_channel(w, 8, axis)
    assert axis == 3 and scales.shape == (6,) and codes.dtype == np.int8
    assert np.all(np.abs(decoded - w) <= scales / 2 * (1 + 1e-6))
    # per channel, each channel's largest value takes the largest code: the small channels keep their precision
    assert np.all(np.abs(codes).reshape(-1, 6).max(axis=0) == 127)
    assert quantized.channel_axis("CONV_2D", 4) == 0 and quantized.channel_axis("FULLY_CONNECTED", 2) == 0


def test_wider_codes_are_int16_and_tighter():
    w = np.random.default_rng(1).normal(size=(4, 40)).astype(np.float32)
    codes, scales, decoded = quantized.per_channel(w, 12, 0)
    assert codes.dtype == np.int16 and np.abs(codes).max() == 2047
    assert np.max(np.abs(decoded - w)) < np.max(np.abs(quantized.per_channel(w, 8, 0)[2] - w))
    with pytest.raises(InputError, match="2..16"):
        quantized.per_channel(w, 17, 0)


def test_blockwise_int4_packs_two_codes_a_byte_with_a_scale_per_block():
    w = np.random.default_rng(2).normal(size=(3, 64)).astype(np.float32)
    packed, scales, decoded = quantized.blockwise(w, 4, 32)
    assert packed.size == w.size // 2 and scales.size == w.size // 32
    low = (packed & 0xF).astype(np.int8)
    low = np.where(low > 7, low - 16, low)
    assert np.allclose(decoded.reshape(-1, 32)[:, 0::2].reshape(-1), low * np.repeat(scales, 16))
    assert np.all(np.abs(decoded - w).reshape(-1, 32) <= scales[:, None] / 2 * (1 + 1e-6))
    with pytest.raises(InputError, match="not a multiple of the block"):
        quantized.blockwise(w[:, :40], 4, 32)


def point(method, setting, size, loss):
    return {"method": method, "setting": setting, "file_bytes": size, "test_loss": loss, "val_loss": loss}


def test_size_at_reads_the_lower_envelope_geometrically():
    curve = [point(headtohead.INTB, 8, 400, 0.01), point(headtohead.INTB, 7, 100, 0.03),
             point(headtohead.INTB, 9, 500, 0.02)]  # int9 loses more than int8 here: not on the envelope
    assert headtohead.size_at(curve, 0.02) == pytest.approx(200)  # halfway, geometric: sqrt(400 * 100)
    assert headtohead.size_at(curve, 0.05) == 100  # beyond its largest loss: its smallest size
    assert headtohead.size_at(curve, 0.005) is None  # the curve never loses that little


def test_comparison_at_equal_test_loss():
    points = [point(headtohead.LOSSLESS, "-", 1000, 0.0), point(headtohead.INTB, 8, 400, 0.01),
              point(headtohead.INTB, 7, 100, 0.03), point(headtohead.OURS, 0.01, 100, 0.02),
              {"method": headtohead.COMPENSATED, "setting": 0.01, "skipped": "why"}]
    (row,) = headtohead.compare(points)
    assert row["advantage"][headtohead.INTB] == pytest.approx(2.0)
    assert row["best_baseline"] == headtohead.INTB and row["vs_zstd19"] == 10


@pytest.fixture(scope="module")
def splits():
    (x, _), (xt, _) = load_npz(bundled("fmnist_val.npz")), load_npz(bundled("fmnist_test.npz"))
    return (x[:SAMPLES], None), (xt[:SAMPLES], None)


@pytest.mark.runtime
def test_every_method_is_judged_by_the_interpreter_on_the_whole_file(splits):
    model = bundled("lenet5.tflite").read_bytes()
    sweep = headtohead.Sweep(budgets=[0.02], bits=[8, 4], recipes=(), methods=(headtohead.OURS, headtohead.COMPENSATED))
    info = headtohead.benchmark(model, *splits, 0.02, sweep=sweep)
    by = {(p["method"], p["setting"]): p for p in info["points"]}
    assert by[headtohead.LOSSLESS, "-"]["test_loss"] == 0 and by[headtohead.LOSSLESS, "-"]["file_bytes"] == \
        info["zstd19_bytes"]
    assert "skipped" in by[headtohead.COMPENSATED, 0.02]  # no calibration inputs
    ours = by[headtohead.OURS, 0.02]
    assert ours["val_loss"] <= 0.02 and ours["file_bytes"] < by[headtohead.FLOAT16, "-"]["file_bytes"]
    assert "test_loss_by_output" not in ours  # one output: its loss is the loss
    # int4 drifts more than int8 and its file is smaller; the interpreter measured both
    assert by[headtohead.INTB, 4]["test_loss"] > by[headtohead.INTB, 8]["test_loss"] > 0
    assert by[headtohead.INTB, 4]["file_bytes"] < by[headtohead.INTB, 8]["file_bytes"] < info["zstd19_bytes"]
    (row,) = info["comparisons"]
    assert row["method"] == headtohead.OURS and row["vs_zstd19"] == pytest.approx(info["zstd19_bytes"] /
                                                                                    ours["file_bytes"])
    assert "int-b per-channel" in headtohead.table(info) and "vs int-b" in headtohead.comparison_table(info)


@pytest.mark.runtime
def test_a_budget_the_data_cannot_resolve_is_skipped_not_fatal():
    (x, y), (xt, yt) = load_npz(bundled("fmnist_val.npz")), load_npz(bundled("fmnist_test.npz"))
    info = headtohead.benchmark(bundled("lenet5.tflite").read_bytes(), (x[:50], y[:50]), (xt[:50], yt[:50]),
                                Budget("top1", 0.001), sweep=headtohead.Sweep(bits=[8], recipes=(),
                                                                              methods=(headtohead.OURS,)))
    skipped = [p for p in info["points"] if "skipped" in p]
    assert [p["setting"] for p in skipped] == info["budgets"] and "too few" in skipped[0]["skipped"]
    assert info["comparisons"] == [] and any(p["method"] == headtohead.INTB for p in info["points"])


def test_unknown_variants_are_refused(splits):
    with pytest.raises(InputError, match="unknown pydsz variant"):
        headtohead.benchmark(bundled("lenet5.tflite").read_bytes(), *splits,
                             sweep=headtohead.Sweep(methods=("pydsz turbo",)))


@pytest.mark.runtime
def test_the_cli_prints_the_table_and_writes_json_and_png(tmp_path):
    from test_cli import dsz

    (x, y), (xt, yt) = load_npz(bundled("fmnist_val.npz")), load_npz(bundled("fmnist_test.npz"))
    np.savez(tmp_path / "val.npz", x=x[:50], y=y[:50])
    np.savez(tmp_path / "test.npz", x=xt[:50], y=yt[:50])
    result = dsz("bench", bundled("lenet5.tflite"), "--layers", "all", "--data", tmp_path / "val.npz", "--test",
                 tmp_path / "test.npz", "--metric", "top1", "--max-loss", "0.001", "--bits", "8,6", "--quiet",
                 "--report", tmp_path / "r")
    assert result.returncode == 0, result.stderr
    assert "int-b per-channel" in result.stdout and "skipped" in result.stdout
    info = json.loads((tmp_path / "r" / "bench.json").read_text())
    assert info["layers"] == "all" and (tmp_path / "r" / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_litert_quantizer_outcome_says_why_there_is_no_file():
    model = bundled("lenet5.tflite").read_bytes()
    outcome = litert.quantize(model, "no_such_recipe")
    assert outcome.tflite is None and outcome.note
    if litert.available() is None:
        assert "no recipe" in outcome.note
        # lenet5's FC input of 500 is not a multiple of 32: the blockwise recipe refuses it, and says so
        refused = litert.quantize(model, "dynamic_wi4b32_afp32")
        assert refused.tflite is None and refused.note.startswith("refused")
        quantized_model = litert.quantize(model, "dynamic_wi8_afp32")
        assert quantized_model.quantized == quantized_model.layers == 4
        assert len(quantized_model.tflite) < len(model) / 3
        out = runtime.outputs(quantized_model.tflite, load_npz(bundled("fmnist_val.npz"))[0][:10],
                              [d["key"] for d in TFLiteModel(quantized_model.tflite).output_details()])
        assert all(np.all(np.isfinite(v)) for v in out.values())
    else:
        assert "not installed" in outcome.note
