"""The `dsz` command line: exit codes, one-line errors, no partial outputs."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from pydsz.model.data import bundled

COMMANDS = ["pack", "decompress", "info", "eval"]


def dsz(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "pydsz.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


def assert_user_error(result, *words):
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dsz: error: "), result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "lenet300.dsz"
    result = dsz("pack", bundled("lenet300.tflite"), "--error-bound", "0.01", "-o", out)
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.parametrize("command", COMMANDS)
def test_help_on_every_command(command):
    result = dsz(command, "--help")
    assert result.returncode == 0 and "usage: dsz " + command in result.stdout


def test_pack_prints_the_table(packed):
    result = dsz("info", packed)
    assert result.returncode == 0
    assert "fc1" in result.stdout and "ratio" in result.stdout


def test_info_json(packed):
    info = json.loads(dsz("info", packed, "--json").stdout)
    assert [t["name"] for t in info["tensors"]] == ["fc1", "fc2", "fc3"]


def test_decompress_and_eval(packed, tmp_path):
    out = tmp_path / "m.tflite"
    assert dsz("decompress", packed, "-o", out).returncode == 0
    data = bundled("fmnist_val.npz")
    from_dsz = json.loads(dsz("eval", packed, "--data", data, "--json").stdout)
    from_tflite = json.loads(dsz("eval", out, "--data", data, "--json").stdout)
    assert from_dsz["top1"] == from_tflite["top1"] > 0.8
    assert from_dsz["samples"] == 5000


def test_per_layer_bounds(tmp_path):
    out = tmp_path / "m.dsz"
    result = dsz("pack", bundled("lenet300.tflite"), "-e", "fc1=0.02,fc2=0.01", "-o", out, "-q")
    assert result.returncode == 0 and result.stdout == ""
    info = json.loads(dsz("info", out, "--json").stdout)
    assert [(t["name"], t["error_bound"]) for t in info["tensors"]] == [("fc1", 0.02), ("fc2", 0.01)]


def test_a_default_bound_with_per_layer_overrides(tmp_path):
    out = tmp_path / "m.dsz"
    result = dsz("pack", bundled("lenet300.tflite"), "-e", "0.002,fc3=0.01", "-o", out, "-q")
    assert result.returncode == 0, result.stderr
    info = json.loads(dsz("info", out, "--json").stdout)
    assert [(t["name"], t["error_bound"]) for t in info["tensors"]] == [("fc1", 0.002), ("fc2", 0.002), ("fc3", 0.01)]
    twice = dsz("pack", bundled("lenet300.tflite"), "-e", "0.002,0.003,fc3=0.01", "-o", tmp_path / "n.dsz")
    assert twice.returncode == 2 and "given twice" not in twice.stdout and "invalid error bound" in twice.stderr
    assert not (tmp_path / "n.dsz").exists()


def test_usage_errors_exit_2(tmp_path):
    assert dsz().returncode == 2
    assert dsz("pack", bundled("lenet300.tflite"), "-o", tmp_path / "x.dsz").returncode == 2
    assert dsz("pack", bundled("lenet300.tflite"), "-e", "fc1=abc", "-o", tmp_path / "x.dsz").returncode == 2
    assert not any(tmp_path.iterdir())


def test_missing_input_is_one_line(tmp_path):
    out = tmp_path / "x.dsz"
    assert_user_error(dsz("pack", tmp_path / "nope.tflite", "-e", "0.01", "-o", out), "nope.tflite", "no such file")
    assert not out.exists()


def test_unknown_layer_is_one_line(tmp_path):
    out = tmp_path / "x.dsz"
    assert_user_error(dsz("pack", bundled("lenet300.tflite"), "-e", "fc7=0.01", "-o", out), "fc7")
    assert not any(tmp_path.iterdir())


def test_corrupt_file_leaves_no_output(packed, tmp_path):
    bad = tmp_path / "bad.dsz"
    data = bytearray(packed.read_bytes())
    data[len(data) // 2] ^= 0x10
    bad.write_bytes(bytes(data))
    out = tmp_path / "out.tflite"
    assert_user_error(dsz("decompress", bad, "-o", out), "checksum")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.dsz"]
    assert_user_error(dsz("info", tmp_path / "bad.dsz"), "checksum")


def test_truncated_file(packed, tmp_path):
    bad = tmp_path / "cut.dsz"
    bad.write_bytes(packed.read_bytes()[:100])
    assert_user_error(dsz("decompress", bad, "-o", tmp_path / "o.tflite"), "truncated")


def test_existing_output_survives_a_failure(packed, tmp_path):
    out = tmp_path / "keep.tflite"
    out.write_bytes(b"old")
    bad = tmp_path / "bad.dsz"
    bad.write_bytes(b"DSZM" + bytes(60))
    assert dsz("decompress", bad, "-o", out).returncode == 1
    assert out.read_bytes() == b"old"


def test_eval_bad_data(packed, tmp_path):
    npz = tmp_path / "noy.npz"
    np.savez(npz, x=np.zeros((3, 784), np.uint8))
    assert_user_error(dsz("eval", packed, "--data", npz), "noy.npz", "'y'")
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, x=np.zeros((3, 10), np.uint8), y=np.zeros(3, np.uint8))
    assert_user_error(dsz("eval", packed, "--data", wrong))
    labels = tmp_path / "labels.npz"
    np.savez(labels, x=np.zeros((3, 784), np.uint8), y=np.array([0, 1, 10]))
    assert_user_error(dsz("eval", packed, "--data", labels), "label")


def _int16_and_float_model(path):
    import tflite
    from test_model import build_tflite

    rng = np.random.default_rng(0)
    path.write_bytes(build_tflite(
        tensors=[{"shape": [1, 8]},
                 {"shape": [4, 8], "type": tflite.TensorType.INT16, "scale": 0.1,
                  "data": np.arange(32, dtype=np.int16).tobytes()},
                 {"shape": [1, 4]},
                 {"shape": [3, 4], "data": rng.standard_normal((3, 4)).astype(np.float32).tobytes()},
                 {"shape": [1, 3]}],
        ops=[("FULLY_CONNECTED", [0, 1, -1], [2]), ("FULLY_CONNECTED", [2, 3, -1], [4])],
        inputs=[0], outputs=[4]))
    return path


def test_pack_says_which_layers_stay_lossless(tmp_path):
    model = _int16_and_float_model(tmp_path / "q.tflite")
    result = dsz("pack", model, "-e", "0.01", "-o", tmp_path / "q.dsz")
    assert result.returncode == 0, result.stderr
    assert "kept lossless: fc1:" in result.stdout and "INT16" in result.stdout
    info = json.loads(dsz("info", tmp_path / "q.dsz", "--json").stdout)
    assert [t["name"] for t in info["tensors"]] == ["fc2"]
    assert_user_error(dsz("pack", model, "-e", "fc1=0.01", "-o", tmp_path / "r.dsz"), "fc1", "cannot be compressed")


def test_pack_takes_int8_bounds_in_steps_and_info_shows_them(tmp_path):
    from pydsz.model.data import bundled

    result = dsz("pack", bundled("lenet5_int8.tflite"), "-e", "conv2=2q,fc1=1q", "--layers", "all",
                 "-o", tmp_path / "q.dsz")
    assert result.returncode == 0, result.stderr
    info = dsz("info", tmp_path / "q.dsz").stdout
    assert "dtype" in info and "stored B" in info
    fc1 = next(line for line in info.splitlines() if line.startswith("fc1"))
    assert "int8" in fc1.split() and "1q" in fc1.split()
    assert not (tmp_path / "r.dsz").exists()


def test_num_threads_defaults_to_the_cores_here_and_to_the_runtime_in_dask_workers():
    from pydsz.cli import build_parser
    from pydsz.cli.options import default_threads

    parser = build_parser()
    common = ["compress", "m.tflite", "--data", "d.npz", "-o", "out.dsz"]
    cases = {(): len(os.sched_getaffinity(0)), ("--num-threads", "3"): 3, ("--workers", "2"): None,
             ("--cluster", "tcp://127.0.0.1:8786"): None}
    for extra, expected in cases.items():
        args = parser.parse_args(common + list(extra))
        default_threads(args)
        assert args.num_threads == expected, extra
    args = parser.parse_args(["info", "m.dsz"])  # a command without the option is left as it is
    default_threads(args)
    assert not hasattr(args, "num_threads")
