"""What issue 27 changed at the command line: bad data refused before any work, layers by name, the
progress bar's rate and time left, the report's time per layer, the peak-memory bound."""

import json
import subprocess
import sys

import numpy as np
import pytest

from pydsz.compress import pipeline
from pydsz.errors import InputError
from pydsz.model.data import bundled, load_npz
from pydsz.model.graph import TFLiteModel


def _dsz(*args):
    return subprocess.run([sys.executable, "-m", "pydsz.cli", *map(str, args)], capture_output=True, text=True)


def _dsz_on_a_terminal(*args, env=None) -> subprocess.CompletedProcess:
    """dsz with its stderr on a pseudo-terminal, as a user at a terminal runs it (progress bars are
    drawn only there); stdout still piped."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal's size: tqdm draws to its width
    proc = subprocess.Popen([sys.executable, "-m", "pydsz.cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=slave, env={**os.environ, **(env or {})})
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        err += chunk
    out = proc.stdout.read()
    proc.wait()
    os.close(master)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode(errors="replace"))


@pytest.fixture(scope="module")
def val200():
    x, y = load_npz(bundled("fmnist_val.npz"))
    return x[:200].astype(np.float32), y[:200]


@pytest.mark.parametrize("bad, what", [(np.nan, "NaN"), (np.inf, "an infinity")])
@pytest.mark.parametrize("command", ["compress", "prune"])
def test_a_nan_or_an_infinity_in_the_data_is_refused_before_any_work(tmp_path, val200, bad, what, command):
    x = val200[0][:8].copy()
    x[5, 3, 4] = bad
    data = tmp_path / "calib.npz"
    np.savez(data, x=x, y=val200[1][:8])
    out = tmp_path / "out"
    extra = ["--method", "oneshot", "--sparsity", "0.5"] if command == "prune" else []
    result = _dsz(command, bundled("lenet5.tflite"), "--data", data, *extra, "-o", out)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert f"calib.npz: array 'x', sample 5 holds {what}" in lines[0]
    assert not out.exists()


def test_a_model_whose_outputs_are_not_finite_is_refused(tmp_path, val200):
    model = TFLiteModel(bundled("lenet5.tflite").read_bytes())
    w = np.array(model.weight("fc2"))
    w[0, 0] = np.inf  # every sample's first logit becomes infinite or NaN
    broken = model.replace({"fc2": w})
    with pytest.raises(InputError, match=r"the model's output .* is (NaN|an infinity) for sample 0 .* inputs are finite"):
        pipeline.compress(broken, *val200, 0.003)
    path = tmp_path / "broken.tflite"
    path.write_bytes(broken)
    data = tmp_path / "val.npz"
    np.savez(data, x=val200[0][:16], y=val200[1][:16])
    result = _dsz("prune", path, "--method", "oneshot", "--sparsity", "0.5", "--data", data, "-o", tmp_path / "p.tflite")
    assert result.returncode == 1 and "inputs are finite" in result.stderr and not (tmp_path / "p.tflite").exists()


@pytest.mark.slow
def test_compress_by_layer_name_shows_progress_and_reports_time_per_layer(tmp_path, val200):
    data = tmp_path / "val.npz"
    np.savez(data, x=val200[0], y=val200[1])
    out, report = tmp_path / "m.dsz", tmp_path / "report"
    result = _dsz_on_a_terminal("compress", bundled("lenet5.tflite"), "--data", data, "--metric", "output-error",
                                "--layers", "conv2,fc1", "--report", report, "-o", out)
    assert result.returncode == 0, result.stderr
    assert "eval/s" in result.stderr and "left" in result.stderr  # the progress bar: rate and time left
    doc = json.loads((report / "report.json").read_text())
    assert [l["name"] for l in doc["layers"]] == ["conv2", "fc1"]
    assert set(doc["assessment"]["layers"]) == {"conv2", "fc1"}
    assert all(info["seconds"] > 0 and info["evaluations"] > 0 for info in doc["assessment"]["layers"].values())
    assert "assessment:" in result.stdout and "meant to stay within" in result.stdout
    assert "one batch's tensors" in result.stdout and "data" in result.stdout


def test_an_unknown_layer_name_is_one_line(tmp_path, val200):
    data = tmp_path / "val.npz"
    np.savez(data, x=val200[0], y=val200[1])
    result = _dsz("compress", bundled("lenet5.tflite"), "--data", data, "--layers", "fc7", "-o", tmp_path / "m.dsz")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and "no layer 'fc7'" in lines[0]
