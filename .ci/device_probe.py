"""What .ci/device compares between x86-64 and an emulated device, run on both by the same interpreter
that has pydsz installed from a wheel:

    python device_probe.py MODEL.dsz OUT.json

Decodes MODEL.dsz (python -m edge_demo, as a device user runs it, and pydsz.load), classifies the
first SAMPLES images of the bundled Fashion-MNIST test split with whichever TFLite runtime is
installed (all 10,000 take minutes under emulation), and feeds edge_demo
a truncated and a bit-flipped copy of the file; applies edge_demo/lenet5-update.dszu to
edge_demo/lenet5.dsz (python -m edge_demo --base) and to a wrong base; OUT.json gets the decoded and
the patched .tflite's sha256, the predictions and how each damaged file and the wrong base were
refused.
"""
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

# the test split staged beside this script: the wheel under test carries no data
os.environ.setdefault("DSZ_DATA", str(Path(__file__).resolve().parent / "data"))

import pydsz  # noqa: E402
from pydsz.format.interpreter import make_interpreter  # noqa: E402
from pydsz.model.data import bundled, load_npz  # noqa: E402
from pydsz.model.runtime import predict  # noqa: E402

SAMPLES = 1000
HERE = Path(__file__).resolve().parent
UPDATE, UPDATE_BASE = HERE / "edge_demo" / "lenet5-update.dszu", HERE / "edge_demo" / "lenet5.dsz"


def edge_demo(*args: str) -> subprocess.CompletedProcess:
    """python -m edge_demo ARGS, from the folder that holds edge_demo/ (this script's)."""
    return subprocess.run([sys.executable, "-m", "edge_demo", *args], cwd=Path(__file__).parent,
                          capture_output=True, text=True, timeout=1800)


def refusal(data: bytes, tmp: Path, name: str) -> dict:
    path = tmp / name
    path.write_bytes(data)
    r = edge_demo(str(path))
    return {"returncode": r.returncode, "stderr": r.stderr.strip().replace(str(path), name)}


def updated(tmp: Path) -> dict:
    """The update applied as a device user applies it, and to a wrong base (the patched model itself)."""
    patched = tmp / "patched.tflite"
    r = edge_demo(str(UPDATE), "--base", str(UPDATE_BASE), "--write-tflite", str(patched))
    if r.returncode != 0:
        sys.exit(f"edge_demo --base failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    print(r.stdout, end="")
    data = patched.read_bytes()
    if data != pydsz.patch(UPDATE_BASE, UPDATE):
        sys.exit("edge_demo --base's --write-tflite differs from pydsz.patch(...)")
    wrong = edge_demo(str(UPDATE), "--base", str(patched))
    return {"sha256": hashlib.sha256(data).hexdigest(), "wrong_base": {"returncode": wrong.returncode,
                                                                       "stderr": wrong.stderr.strip()}}


def main(model: str, out: str) -> int:
    x, y = (a[:SAMPLES] for a in load_npz(bundled("fmnist_test.npz")))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data_path = tmp / "fmnist_test.npz"
        np.savez(data_path, x=x, y=y)
        decoded = tmp / "decoded.tflite"
        r = edge_demo(model, "--data", str(data_path), "--write-tflite", str(decoded))
        if r.returncode != 0:
            sys.exit(f"edge_demo failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        print(r.stdout, end="")
        tflite = decoded.read_bytes()
        if tflite != pydsz.load(model).tflite_bytes():
            sys.exit("edge_demo's --write-tflite differs from pydsz.load(...).tflite_bytes()")

        raw = Path(model).read_bytes()
        flipped = bytearray(raw)
        flipped[len(raw) // 2] ^= 0x10  # one bit, in the middle of the compressed streams
        refused = {"truncated": refusal(raw[: len(raw) - 100], tmp, "truncated.dsz"),
                   "bit-flipped": refusal(bytes(flipped), tmp, "flipped.dsz")}
        update = updated(tmp)

    scores = predict(make_interpreter(tflite), x)
    classes = scores.argmax(axis=1)
    runtime = next(m for m in ("ai_edge_litert", "tflite_runtime", "tensorflow") if importlib.util.find_spec(m))
    result = {"machine": os.uname().machine, "python": sys.version.split()[0], "runtime": runtime,
              "numpy": np.__version__, "tflite_sha256": hashlib.sha256(tflite).hexdigest(),
              "top1": float((classes == y).mean()), "classes": classes.tolist(),
              "scores": np.round(scores.astype(np.float64), 6).tolist(), "refused": refused, "update": update,
              "edge_demo": r.stdout}
    Path(out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
