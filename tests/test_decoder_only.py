"""The decoder on its own: `pip install pydsz` (numpy, zstandard, the extension) decodes, and never
imports what only encoding needs.

These tests need no encoder-side package, so CI runs them in a fresh environment holding only the
base install (DSZ_DECODER_ONLY=1 makes them check that it really is bare), then again there with
tflite-runtime added for the interpreter test. DSZ_EDGE_MODEL names a .dsz to use where the
`tflite` parser is not there to pack one.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pydsz
from pydsz.model.data import bundled

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
DECODER_ONLY = os.environ.get("DSZ_DECODER_ONLY") == "1"
# packages and modules of the encoder side: model I/O, pruning, assessment, reports, GPU, benchmarks
SERVER_ONLY = ("tflite", "flatbuffers", "tqdm", "matplotlib", "pycuda", "tensorflow", "h5py", "hdf5plugin",
               "pydsz.encode", "pydsz.budget.rule", "pydsz.budget.knapsack", "pydsz.assess", "pydsz.prune", "pydsz.compress", "pydsz.bench",
               "pydsz.model.graph", "pydsz.model.tail", "pydsz.gpu")


@pytest.fixture(scope="module")
def lenet_dsz(tmp_path_factory) -> Path:
    """LeNet-300-100 as a .dsz: DSZ_EDGE_MODEL's, or packed here at bound 0.01 when the parser is installed."""
    given = os.environ.get("DSZ_EDGE_MODEL")
    if given:
        return Path(given)
    if importlib.util.find_spec("tflite") is None:
        if DECODER_ONLY:
            pytest.fail("DSZ_EDGE_MODEL must name a .dsz where the tflite parser is not installed")
        pytest.skip("no .dsz to decode: set DSZ_EDGE_MODEL or install the tflite parser")
    path = tmp_path_factory.mktemp("edge") / "lenet300.dsz"
    pydsz.write_model(bundled("lenet300.tflite"), path, 0.01)
    return path


@pytest.fixture(scope="module")
def device_dir(tmp_path_factory) -> Path:
    """A directory holding a copy of edge_demo/, as on a device, and not the checkout."""
    path = tmp_path_factory.mktemp("device")
    shutil.copytree(ROOT / "edge_demo", path / "edge_demo", ignore=shutil.ignore_patterns("__pycache__"))
    return path


def run_python(code: str, *args, cwd: Path) -> subprocess.CompletedProcess:
    """python -c code in a fresh process that imports the pydsz this test imports (installed or not)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(cwd), str(Path(pydsz.__file__).parents[1])]))
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


_DECODE_AND_LIST = """
import hashlib, json, sys
import pydsz
from edge_demo.__main__ import main
from pydsz.cli import main as dsz

fixture, model, out, update, base = sys.argv[1:6]
m = pydsz.load(model)
m.weights(), m.info()
rcs = [main([model]), dsz(["info", model]), dsz(["decompress", model, "-o", out]),
       main([update, "--base", base]), dsz(["patch", base, update, "-o", out + ".patched"])]
print(json.dumps({"rcs": rcs, "fixture_sha256": hashlib.sha256(pydsz.load(fixture).tflite_bytes()).hexdigest(),
                  "patched_sha256": hashlib.sha256(pydsz.patch(base, update)).hexdigest(),
                  "modules": sorted(sys.modules)}))
"""


def test_decoding_imports_no_server_module(lenet_dsz, device_dir):
    # the library, edge_demo, and the dsz commands a device uses, model updates included
    edge = device_dir / "edge_demo"
    r = run_python(_DECODE_AND_LIST, FIXTURES / "shared-v1.dsz", lenet_dsz, device_dir / "out.tflite",
                   edge / "lenet5-update.dszu", edge / "lenet5.dsz", cwd=device_dir)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.splitlines()[-1])
    assert result["rcs"] == [0, 0, 0, 0, 0]
    assert result["patched_sha256"] == (edge / "lenet5-update.sha256").read_text().split()[0]
    assert (device_dir / "out.tflite.patched").read_bytes() == pydsz.patch(edge / "lenet5.dsz",
                                                                          edge / "lenet5-update.dszu")
    assert (device_dir / "out.tflite").read_bytes() == pydsz.load(lenet_dsz).tflite_bytes()
    assert result["fixture_sha256"] == (FIXTURES / "shared-v1.tflite.sha256").read_text().split()[0]
    imported = [m for m in result["modules"] if any(m == s or m.startswith(s + ".") for s in SERVER_ONLY)]
    assert imported == []


def test_base_install_requires_numpy_and_zstandard_only():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert sorted(r.split(">")[0].split("<")[0].split("=")[0] for r in project["dependencies"]) == \
        ["numpy", "zstandard"]
    extras = {name: " ".join(reqs) for name, reqs in project["optional-dependencies"].items()}
    for name, needs in {"server": ("tflite>", "tqdm", "matplotlib", "ai-edge-litert"), "gpu": ("pycuda",),
                        "litert": ("ai-edge-litert",), "tflite": ("tflite-runtime", "numpy<2")}.items():
        assert all(n in extras[name] for n in needs), (name, extras[name])


@pytest.mark.skipif(not DECODER_ONLY, reason="checks CI's decoder-only environment (DSZ_DECODER_ONLY=1)")
def test_environment_holds_no_server_package():
    assert [p for p in ("tflite", "tqdm", "matplotlib", "pycuda", "h5py") if importlib.util.find_spec(p)] == []


@pytest.mark.skipif(any(importlib.util.find_spec(m) for m in ("ai_edge_litert", "tflite_runtime", "tensorflow")),
                    reason="a TFLite runtime is installed")
def test_interpreter_without_a_runtime_says_what_to_install():
    m = pydsz.load(FIXTURES / "shared-v1.dsz")
    with pytest.raises(pydsz.DszError, match="pip install"):
        m.interpreter()


@pytest.mark.runtime
def test_edge_demo_decodes_and_classifies(lenet_dsz, device_dir):
    if not any(importlib.util.find_spec(m) for m in ("ai_edge_litert", "tflite_runtime", "tensorflow")):
        pytest.skip("no TFLite runtime installed")
    data = bundled("fmnist_test.npz")
    r = run_python("import sys; from edge_demo.__main__ import main; sys.exit(main(sys.argv[1:]))",
                   lenet_dsz, "--data", data, "--write-tflite", device_dir / "lenet300.tflite", cwd=device_dir)
    assert r.returncode == 0, r.stderr
    for stage in ("lossless decompression", "value decoding", "sparse reconstruction", "interpreter load",
                  "peak memory"):
        assert stage in r.stdout
    accuracy = float(r.stdout.split("top-1 accuracy ")[1].split("%")[0])
    assert accuracy > 85.0  # LeNet-300-100 scores 89.9% uncompressed; bound 0.01 costs well under a point
    assert (device_dir / "lenet300.tflite").read_bytes() == pydsz.load(lenet_dsz).tflite_bytes()
