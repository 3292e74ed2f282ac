"""Writing output as a user expects of a command line (issue 37): an output that would overwrite an
input is refused before any work, every OS error on output is one line naming the path and the cause
(exit 1, nothing partial left, an existing file untouched), SIGTERM cleans up as SIGINT does, progress
bars follow tqdm's conventions, and the conventions of a CLI and a library hold (--version, exit
codes in --help, broken pipes, thread counts, warnings where a bound cannot do what was meant)."""

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pydsz
from pydsz import cli
from pydsz.format import files
from pydsz.model.data import bundled

LENET300 = bundled("lenet300.tflite")


def dsz(*args, cwd=None, env=None, preexec_fn=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pydsz.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, **(env or {})}, preexec_fn=preexec_fn)


def one_line_error(result, *words):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1, result.stderr
    assert len(lines) == 1 and lines[0].startswith("dsz: error: "), result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], lines[0]


def leftovers(folder: Path) -> list:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp"))


@pytest.fixture(scope="module")
def val_npz(tmp_path_factory, val):
    path = tmp_path_factory.mktemp("data") / "val.npz"
    np.savez(path, x=val[0][:500], y=val[1][:500])
    return path


# ---- an output that is an input ----

def test_pack_onto_its_input_is_refused_and_the_input_kept(tmp_path):
    model = tmp_path / "m.tflite"
    model.write_bytes(LENET300.read_bytes())
    one_line_error(dsz("pack", model, "-e", "0.005", "-o", model), "would overwrite the input")
    assert model.read_bytes() == LENET300.read_bytes()


def test_the_same_file_under_another_name_is_refused(tmp_path):
    model, link = tmp_path / "m.tflite", tmp_path / "link.tflite"
    model.write_bytes(LENET300.read_bytes())
    link.symlink_to(model)
    one_line_error(dsz("pack", model, "-e", "0.005", "-o", link), "would overwrite the input")
    assert model.read_bytes() == LENET300.read_bytes()


def test_decompress_onto_its_input_is_refused(tmp_path):
    packed = tmp_path / "m.dsz"
    pydsz.write_model(LENET300, packed, 0.01)
    before = packed.read_bytes()
    one_line_error(dsz("decompress", packed, "-o", packed), "would overwrite the input")
    assert packed.read_bytes() == before


def test_compress_onto_its_data_or_model_is_refused_before_any_work(tmp_path, val_npz):
    model = tmp_path / "m.tflite"
    model.write_bytes(LENET300.read_bytes())
    for target in (model, val_npz):
        result = dsz("compress", model, "--data", val_npz, "-o", target)
        one_line_error(result, "would overwrite the input")
        assert result.stdout == ""  # nothing assessed, nothing printed
    assert model.read_bytes() == LENET300.read_bytes()


# ---- outputs that cannot be written ----

@pytest.mark.parametrize("command", ["pack", "decompress"])
def test_an_output_that_is_a_directory_or_empty_is_one_line(tmp_path, command):
    source = LENET300
    if command == "decompress":
        source = tmp_path / "m.dsz"
        pydsz.write_model(LENET300, source, 0.01)
    extra = ["-e", "0.005"] if command == "pack" else []
    one_line_error(dsz(command, source, *extra, "-o", tmp_path), "is a directory")
    one_line_error(dsz(command, source, *extra, "-o", ""), "path is empty")
    one_line_error(dsz(command, source, *extra, "-o", tmp_path / "no" / "such" / "m.out"), "does not exist")


def _file_size_limit(limit: int):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.mark.parametrize("command", ["pack", "decompress"])
def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path, command):
    """A full disk as RLIMIT_FSIZE makes one (EFBIG where ENOSPC would be: the same OSError path)."""
    source = LENET300
    if command == "decompress":
        source = tmp_path / "m.dsz"
        pydsz.write_model(LENET300, source, 0.01)
    out = tmp_path / "out.bin"
    out.write_bytes(b"the old file")
    extra = ["-e", "0.005"] if command == "pack" else []
    result = dsz(command, source, *extra, "-o", out, preexec_fn=_file_size_limit(4096))
    one_line_error(result, str(out), "cannot write", "too large")
    assert out.read_bytes() == b"the old file" and leftovers(tmp_path) == []


def test_a_report_that_fails_leaves_no_folder_and_one_line(tmp_path, val_npz, monkeypatch, capsys):
    real = files.write_atomic

    def full_disk(path, data):
        if Path(path).name == "curves.png":
            raise pydsz.InputError(f"{path}: cannot write: No space left on device")
        real(path, data)

    monkeypatch.setattr(files, "write_atomic", full_disk)
    out, report = tmp_path / "m.dsz", tmp_path / "report"
    code = cli.main(["compress", str(LENET300), "--data", str(val_npz), "--max-loss", "0.01", "-o", str(out),
                     "--report", str(report), "--no-compensate", "-q"])  # the report is the point, not the plan
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "curves.png: cannot write: No space left" in err[0]
    assert not report.exists()  # the folder this call made is gone with what it held
    assert out.exists()  # the .dsz itself was complete when the report failed


def test_compress_refuses_an_unwritable_output_and_report_before_the_work(tmp_path, val_npz):
    missing = tmp_path / "missing" / "m.dsz"
    result = dsz("compress", LENET300, "--data", val_npz, "-o", missing)
    one_line_error(result, "does not exist")
    assert result.stdout == ""
    a_file = tmp_path / "taken"
    a_file.write_text("")
    result = dsz("compress", LENET300, "--data", val_npz, "-o", tmp_path / "m.dsz", "--report", a_file)
    one_line_error(result, "is a file")
    assert result.stdout == "" and not (tmp_path / "m.dsz").exists()


def test_prune_and_demo_check_their_output_first(tmp_path, val_npz):
    result = dsz("prune", LENET300, "--method", "oneshot", "--data", val_npz, "--sparsity", "0.5",
                 "-o", tmp_path / "missing" / "p.tflite")
    one_line_error(result, "does not exist")
    result = dsz("demo", "-o", tmp_path / "missing" / "d.dsz")
    one_line_error(result, "does not exist")
    assert result.stdout == ""  # not a line of the minutes-long job


def test_edge_demo_refuses_a_directory_for_its_tflite(tmp_path):
    packed = tmp_path / "m.dsz"
    pydsz.write_model(LENET300, packed, 0.01)
    r = subprocess.run([sys.executable, "-m", "edge_demo", str(packed), "--write-tflite", str(tmp_path)],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 1 and "Traceback" not in r.stderr and "is a directory" in r.stderr


# ---- signals ----

@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_while_writing_leaves_no_temporary_and_the_old_file(tmp_path, monkeypatch, capsys, signum, code):
    out = tmp_path / "m.dsz"
    out.write_bytes(b"the old file")

    def interrupted_fsync(fd):
        os.kill(os.getpid(), signum)  # arrives while the temporary file is open, before the rename

    monkeypatch.setattr(files.os, "fsync", interrupted_fsync)
    # Python's own SIGINT handler, which a process started in the background (SIGINT ignored) lacks
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert cli.main(["pack", str(LENET300), "-e", "0.005", "-o", str(out), "-q"]) == code
    finally:
        signal.signal(signal.SIGINT, previous)
    assert out.read_bytes() == b"the old file" and leftovers(tmp_path) == []
    assert "Traceback" not in capsys.readouterr().err


def test_the_file_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(files.os, "fsync", lambda fd: synced.append(os.fstat(fd).st_size))
    files.write_atomic(tmp_path / "x.bin", b"12345")
    assert synced == [5] and (tmp_path / "x.bin").read_bytes() == b"12345"


# ---- progress and logs ----

@pytest.mark.slow
def test_a_log_gets_the_results_and_no_progress_bars(tmp_path, val_npz):
    with open(tmp_path / "log", "w") as log:
        r = subprocess.run([sys.executable, "-m", "pydsz.cli", "compress", str(LENET300), "--data", str(val_npz),
                            "--max-loss", "0.01", "-o", str(tmp_path / "m.dsz")], stdout=log, stderr=subprocess.STDOUT)
    text = (tmp_path / "log").read_text()
    assert r.returncode == 0 and "\r" not in text and "eval/s" not in text
    assert "wrote" in text and "fc1" in text  # the table and the summary are there
    assert max(len(line) for line in text.splitlines()) < 300


def test_tqdm_disable_and_no_progress_are_honoured_on_a_terminal(tmp_path, val):
    from test_engine_cli import _dsz_on_a_terminal

    # the bars are those of any assessment: a small one (200 samples, no compensation) is 10x faster
    data = tmp_path / "small.npz"
    np.savez(data, x=val[0][:200], y=val[1][:200])
    args = ("compress", LENET300, "--data", data, "--max-loss", "0.05", "--no-compensate", "-o", tmp_path / "m.dsz")
    assert "eval/s" in _dsz_on_a_terminal(*args).stderr  # bars where a user looks at a terminal
    assert "eval/s" not in _dsz_on_a_terminal(*args, env={"TQDM_DISABLE": "1"}).stderr
    quiet_bars = _dsz_on_a_terminal(*args, "--no-progress")
    assert "eval/s" not in quiet_bars.stderr and "fc1" in quiet_bars.stdout  # the results still printed


# ---- conventions ----

def test_version_and_exit_codes_in_help():
    r = dsz("--version")
    assert r.returncode == 0 and r.stdout.startswith(f"dsz (pydsz) {pydsz.__version__}") and "format version" in r.stdout
    assert "exit status" in dsz("--help").stdout and "143" in dsz("--help").stdout


def test_a_closed_pipe_is_no_traceback(tmp_path, val_npz):
    packed = tmp_path / "m.dsz"
    pydsz.write_model(LENET300, packed, 0.01)
    p = subprocess.Popen([sys.executable, "-m", "pydsz.cli", "eval", str(packed), "--data", str(val_npz), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # as `| head -c 0` does
    err = p.stderr.read().decode()
    assert p.wait() == 1 and "Traceback" not in err


def test_zero_threads_is_a_usage_error():
    r = dsz("eval", LENET300, "--data", bundled("fmnist_val.npz"), "--num-threads", "0")
    assert r.returncode == 2 and "thread count" in r.stderr and "cannot load" not in r.stderr


def test_a_truncated_dsz_is_called_that_with_its_path(tmp_path, val_npz):
    short = tmp_path / "m.dsz"
    short.write_bytes(b"DSZ")
    one_line_error(dsz("eval", short, "--data", val_npz), str(short), "truncated .dsz")


def test_a_dsz_given_where_a_tflite_is_expected_is_said(tmp_path, val_npz):
    packed = tmp_path / "m.dsz"
    pydsz.write_model(LENET300, packed, 0.01)
    r = dsz("pack", packed, "-e", "0.005", "-o", tmp_path / "again.dsz")
    assert r.returncode == 0 and "is a .dsz" in r.stderr


@pytest.mark.parametrize("model, bound, words", [
    ("lenet300.tflite", "1e30", "every weight's magnitude in fc1, fc2, fc3"),
    ("lenet300.tflite", "2q", "quantization steps"),
    ("lenet300_int8.tflite", "0.01", "int8/uint8"),
])
def test_a_bound_that_cannot_do_what_was_meant_is_one_warning(tmp_path, model, bound, words):
    r = dsz("pack", bundled(model), "-e", bound, "-o", tmp_path / "m.dsz")
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning: ")]
    assert r.returncode == 0 and len(warnings) == 1 and words in warnings[0]
    assert not dsz("pack", bundled(model), "-e", {"0.01": "2q"}.get(bound, "0.005"),  # the bound meant
                   "-o", tmp_path / "n.dsz").stderr.strip()


def test_the_library_raises_only_its_own_errors_for_bad_input():
    for call in (lambda: pydsz.compress_array(np.array(["a"]), 0.1), lambda: pydsz.compress_array(np.ones(4), -1),
                 lambda: pydsz.decompress_array(12345), lambda: pydsz.encode_sparse(np.ones(4, np.float32), 0.1)):
        with pytest.raises(pydsz.InputError):
            call()


@pytest.mark.slow
def test_compress_and_prune_are_entry_points_of_the_package(val):
    assert {"compress_model", "prune_model", "prune_oneshot", "Budget"} <= set(dir(pydsz))
    result = pydsz.compress_model(LENET300.read_bytes(), val[0][:500], val[1][:500], pydsz.Budget("top1", 0.01))
    assert len(result.dsz) < LENET300.stat().st_size / 5 and result.loss <= 0.01
    with pytest.raises(pydsz.InputError, match="max-loss"):
        pydsz.compress_model(LENET300.read_bytes(), val[0][:500], val[1][:500], pydsz.Budget("top1", 2.0))


def test_the_package_is_typed():
    assert (Path(pydsz.__file__).parent / "py.typed").is_file()


def test_a_source_folder_without_its_build_says_so(tmp_path):
    """A checkout installed without -e and run from its root: the folder pydsz/ shadows the package
    (-S leaves out site-packages and the editable install's finder, as that case has them behind)."""
    shadow = tmp_path / "pydsz"
    shadow.mkdir()
    (shadow / "__init__.py").write_text((Path(pydsz.__file__)).read_text())
    r = subprocess.run([sys.executable, "-S", "-c", "import pydsz"], capture_output=True, text=True, cwd=tmp_path,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert r.returncode == 1 and "compiled extension" in r.stderr and "pip install -e" in r.stderr
