"""`--max-loss input` (issue 40): the budget is the loss the model takes when its inputs move within half their
own rounding step, measured on the user's data (pydsz.budget.rounding)."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydsz.budget import metrics
from pydsz.budget.rounding import input_rounding_loss, input_step
from pydsz.errors import InputError
from pydsz.model import runtime
from pydsz.model.data import bundled, load_npz
from pydsz.model.graph import TFLiteModel

LENET5 = bundled("lenet5.tflite")


@settings(max_examples=30, deadline=None)
@given(levels=st.integers(2, 4096), scale=st.floats(1e-3, 1e3), seed=st.integers(0, 2**16))
def test_the_step_of_data_on_a_grid_is_its_spacing(levels, scale, seed):
    rng = np.random.default_rng(seed)
    k = rng.integers(0, levels, 5000)
    k[:2] = [0, 1]  # two neighbouring levels are there, as in any photo
    x = (k * (scale / levels)).astype(np.float32)
    assert input_step(x) == pytest.approx(scale / levels, rel=1e-3)


def test_integers_are_their_own_step_and_float_data_of_no_grid_is_refused():
    assert input_step(np.arange(10, dtype=np.uint8)) == 1.0
    assert input_step(np.arange(256, dtype=np.float32) / 255) == pytest.approx(1 / 255, rel=1e-4)
    with pytest.raises(InputError, match="no grid"):
        input_step(np.random.default_rng(0).normal(size=1000).astype(np.float32))
    with pytest.raises(InputError, match="the same"):
        input_step(np.ones(100, np.float32))


@pytest.mark.runtime
def test_a_coarser_step_costs_more_than_a_finer_one():
    tflite = LENET5.read_bytes()
    x = runtime.fit_inputs(TFLiteModel(tflite).input_details(), load_npz(bundled("fmnist_val.npz"))[0][:300])
    metric = metrics.get("output-error")
    own, steps = input_rounding_loss(tflite, x, None, metric)
    assert steps == [1.0] and own > 0
    assert input_rounding_loss(tflite, x, None, metric, steps=[4.0])[0] > 2 * own


@pytest.mark.runtime
def test_compress_within_the_inputs_own_rounding(tmp_path):
    x, y = load_npz(bundled("fmnist_val.npz"))
    np.savez(tmp_path / "val.npz", x=x[:300], y=y[:300])
    out = tmp_path / "m.dsz"
    r = subprocess.run([sys.executable, "-m", "pydsz.cli", "compress", str(LENET5), "--data", str(tmp_path / "val.npz"),
                        "--metric", "output-error", "--max-loss", "input", "--layers", "fc", "-o", str(out),
                        "--no-progress"], capture_output=True, text=True, env={**os.environ})
    assert r.returncode == 0, r.stderr
    said = float(re.search(r"--max-loss input: ([0-9.e-]+) \(output-error", r.stdout).group(1))
    measured = float(re.search(r"measured loss ([0-9.e-]+), allowed ([0-9.e-]+)", r.stdout).group(1))
    assert 0 < measured <= said * 1.001 and out.stat().st_size > 0


@pytest.mark.runtime
def test_input_on_data_of_unknown_precision_is_one_line_and_writes_nothing(tmp_path):
    np.savez(tmp_path / "noise.npz", x=np.random.default_rng(1).normal(size=(40, 28, 28)).astype(np.float32))
    out = tmp_path / "m.dsz"
    r = subprocess.run([sys.executable, "-m", "pydsz.cli", "compress", str(LENET5), "--data", str(tmp_path / "noise.npz"),
                        "--metric", "output-error", "--max-loss", "input", "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 1 and "no grid" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()
    r = subprocess.run([sys.executable, "-m", "pydsz.cli", "compress", str(LENET5), "--data", str(tmp_path / "noise.npz"),
                        "--max-loss", "inputs", "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 2 and "give a number (0.003) or input" in r.stderr and not out.exists()
