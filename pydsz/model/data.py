"""Data sets as (x, y) arrays: .npz files, directories of images, IDX files, Fashion-MNIST, and the
files bundled in pydsz/data.

Numpy only (Pillow for images): no TensorFlow. Samples keep their stored dtype and shape (the
bundled Fashion-MNIST subsets are uint8 [N, 28, 28]); load_data fits them to a model's inputs.
Labels y are optional where a metric needs none.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import zipfile
import zlib
from pathlib import Path
from typing import Mapping, Optional, Union

import numpy as np

from pydsz.errors import InputError

PathLike = Union[str, "os.PathLike[str]"]

# An .npz's array of each sample's source (load_groups), which no model input takes
GROUPS = "groups"

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_ENV = "DSZ_FASHION_MNIST_DIR"
# The validation split is the last VALIDATION_SIZE training images (the first 55,000 train).
VALIDATION_SIZE = 5000

# The reference models and Fashion-MNIST subsets live in pydsz/data of the source tree (and the sdist),
# not in wheels: a device that installs the decoder downloads none of them. An editable install or a
# checkout finds them there; DSZ_DATA names another folder that holds them.
DATA_ENV = "DSZ_DATA"
_DATA_DIR = Path(__file__).resolve().parents[1] / "data"  # pydsz/data

# IDX type codes -> big-endian dtypes (http://yann.lecun.com/exdb/mnist/).
_IDX_DTYPES = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _read_bytes(path: PathLike) -> bytes:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or e})") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise InputError(f"{path}: corrupt gzip data ({e})") from None
    return raw


def read_idx(path: PathLike) -> np.ndarray:
    """Read an IDX file (plain or gzipped) into an array of its stored type, in native byte order."""
    raw = _read_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise InputError(f"{path}: not an IDX file (bad magic)")
    dtype = _IDX_DTYPES.get(raw[2])
    if dtype is None:
        raise InputError(f"{path}: unknown IDX type code 0x{raw[2]:02x}")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise InputError(f"{path}: truncated IDX header ({ndim} dimensions)")
    shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, 4))
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise InputError(
            f"{path}: IDX shape {shape} needs {expected} data bytes, file has {len(raw) - header}"
        )
    return np.frombuffer(raw, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def _fashion_mnist_file(directory: Path, name: str) -> Path:
    for candidate in (directory / (name + ".gz"), directory / name):
        if candidate.is_file():
            return candidate
    raise InputError(
        f"{directory / (name + '.gz')}: no such file; Fashion-MNIST comes from Debian's package "
        f"(apt-get install dataset-fashion-mnist) or a directory named by ${FASHION_MNIST_ENV}"
    )


def fashion_mnist(split: str) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST's "train" (60,000) or "test" (10,000) split: x uint8 [N, 28, 28], y uint8 [N].

    Reads the gzipped IDX files of Debian's dataset-fashion-mnist, or of the directory named by
    the environment variable DSZ_FASHION_MNIST_DIR.
    """
    prefixes = {"train": "train", "test": "t10k"}
    if split not in prefixes:
        raise InputError(f"Fashion-MNIST split {split!r}: must be 'train' or 'test'")
    directory = Path(os.environ.get(FASHION_MNIST_ENV) or FASHION_MNIST_DIR)
    images = _fashion_mnist_file(directory, f"{prefixes[split]}-images-idx3-ubyte")
    labels = _fashion_mnist_file(directory, f"{prefixes[split]}-labels-idx1-ubyte")
    x, y = read_idx(images), read_idx(labels)
    if x.dtype != np.uint8 or x.ndim != 3 or x.shape[1:] != (28, 28):
        raise InputError(f"{images}: expected uint8 images [N, 28, 28], got {x.dtype} {x.shape}")
    if y.dtype != np.uint8 or y.shape != (len(x),):
        raise InputError(f"{labels}: expected {len(x)} uint8 labels, got {y.dtype} {y.shape}")
    return x, y


def split_validation(
    x: np.ndarray, y: np.ndarray, size: int = VALIDATION_SIZE
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Split off the last `size` samples: ((x_train, y_train), (x_val, y_val))."""
    if not 0 < size < len(x):
        raise InputError(f"validation size {size}: must be in 1..{len(x) - 1}")
    return (x[:-size], y[:-size]), (x[-size:], y[-size:])


def load_npz(path: PathLike, need_labels: bool = True) -> tuple:
    """A data set stored in an .npz file: (x, y).

    x: the array `x`, or, for a model of several inputs, the arrays `x0`, `x1`, ... or ones named
    after the inputs (every array but `y` and `groups`), as a dict. y: the integer labels `y`; None when the
    file has none and need_labels is False.
    """
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    try:
        npz = np.load(path, allow_pickle=False)
        if not isinstance(npz, np.lib.npyio.NpzFile):
            raise InputError(f"{path}: not an .npz archive (a single .npy array)")
        with npz:
            arrays = {name: npz[name] for name in npz.files}
    except InputError:
        raise
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or e})") from None
    except (ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        # np.load raises ValueError for non-npz bytes and for object (pickled) arrays.
        raise InputError(f"{path}: not a valid .npz archive ({e})") from None
    y = arrays.pop("y", None)
    arrays.pop(GROUPS, None)  # the samples' sources (load_groups), no input
    if y is None and need_labels:
        raise InputError(f"{path}: no array 'y'")
    if "x" in arrays:
        x = arrays["x"]
    elif arrays and not need_labels:
        x = arrays
    else:
        raise InputError(f"{path}: no array 'x'" + ("" if need_labels else " (nor x0, x1, ... for several inputs)"))
    for name, a in ({"x": x} if "x" in arrays else x).items():
        if a.ndim == 0 or a.dtype.kind not in "biuf":
            raise InputError(f"{path}: array '{name}' must be numeric with a sample axis, got {a.dtype} {a.shape}")
        if len(a) == 0:
            raise InputError(f"{path}: no samples")
    n = len(x) if "x" in arrays else len(next(iter(x.values())))
    if y is not None:
        if y.ndim != 1 or y.dtype.kind not in "iu":
            raise InputError(f"{path}: array 'y' must be 1-D integer labels, got {y.dtype} {y.shape}")
        if n != len(y):
            raise InputError(f"{path}: 'x' has {n} samples, 'y' has {len(y)} labels")
    return x, y


def load_groups(path: PathLike, n: int) -> Optional[np.ndarray]:
    """The samples' sources that an .npz of n samples gives in its array `groups` (integers or strings, one
    per sample: the photo a crop was cut from, the recording a clip came from, the speaker), which
    cross-fitting keeps apart (two_halves); None for a directory of images or an .npz without one."""
    if os.path.isdir(path):
        return None
    with np.load(path, allow_pickle=False) as npz:
        if GROUPS not in npz.files:
            return None
        try:
            groups = npz[GROUPS]
        except ValueError as e:  # an object array
            raise InputError(f"{path}: array '{GROUPS}' must hold integers or strings ({e})") from None
    if groups.ndim != 1 or groups.dtype.kind not in "iuSU":
        raise InputError(f"{path}: array '{GROUPS}' must be 1-D integers or strings (each sample's source), "
                         f"got {groups.dtype} {groups.shape}")
    if len(groups) != n:
        raise InputError(f"{path}: array '{GROUPS}' has {len(groups)} values for {n} samples; give one per sample")
    if len(np.unique(groups)) < 2:
        raise InputError(f"{path}: array '{GROUPS}' puts all {n} samples in one group; cross-fitting keeps groups "
                         "apart, so it needs two or more (leave it out where the samples share no source)")
    return groups


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
# --normalize: uint8 pixel values 0..255 mapped linearly onto these ranges for float inputs
NORMALIZATIONS = {"0,1": (0.0, 1.0), "-1,1": (-1.0, 1.0), "0,255": (0.0, 255.0)}


def load_images(directory: PathLike, input_shape, input_dtype, normalize: Optional[str] = None) -> np.ndarray:
    """The PNG and JPEG images of a directory (sorted by name) as model input [N, H, W, C].

    Each image is resized to the input's height and width (bilinear, aspect ratio not kept). An
    input of 3 channels takes colour images (an alpha channel is dropped, palettes expanded), one
    of 1 channel grayscale ones; any other mix is an InputError. For a float input `normalize`
    ("0,1", "-1,1" or "0,255") maps the pixel values; a uint8 input takes them as they are.
    """
    from PIL import Image, UnidentifiedImageError

    directory = Path(directory)
    shape = tuple(int(d) for d in input_shape)
    if len(shape) != 4 or shape[3] not in (1, 3):
        raise InputError(f"{directory}: a directory of images needs a model input of shape [batch, height, width, "
                         f"1 or 3], not {list(shape)}")
    dtype = np.dtype(input_dtype)
    if dtype.kind == "f":
        if normalize not in NORMALIZATIONS:
            raise InputError(f"{directory}: the model takes {dtype} input: give --normalize "
                             f"{' or '.join(NORMALIZATIONS)} to map the pixels' 0..255 onto its range")
    elif dtype != np.uint8:
        raise InputError(f"{directory}: images can feed float or uint8 inputs, not {dtype}: give an .npz")
    elif normalize is not None:
        raise InputError(f"{directory}: the model takes uint8 pixels as they are: leave out --normalize")
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise InputError(f"{directory}: no PNG or JPEG images ({', '.join(IMAGE_SUFFIXES)})")
    height, width, channels = shape[1:]
    out = np.empty((len(files), height, width, channels), np.uint8)
    for i, path in enumerate(files):
        try:
            with Image.open(path) as image:
                image.load()
                colour = image.mode not in ("1", "L", "LA", "I", "I;16", "F")
                if colour != (channels == 3):
                    raise InputError(f"{path}: a {'colour' if colour else 'grayscale'} image ({image.mode}), "
                                     f"but the model takes {channels} channel(s)")
                image = image.convert("RGB" if colour else "L").resize((width, height), Image.BILINEAR)
        except (OSError, UnidentifiedImageError, ValueError) as e:
            raise InputError(f"{path}: not a readable image ({e})") from None
        out[i] = np.asarray(image, np.uint8).reshape(height, width, channels)
    if dtype.kind != "f":
        return out
    low, high = NORMALIZATIONS[normalize]
    return (out.astype(np.float32) * np.float32((high - low) / 255.0) + np.float32(low)).astype(dtype)


def load_data(path: PathLike, model, normalize: Optional[str] = None, need_labels: bool = False) -> tuple:
    """A data set for a model (a TFLiteModel): (x, y) from an .npz or a directory of images, checked
    against the model's inputs. x is one array, or a list of arrays for a model of several inputs;
    y is None when there are no labels (images never have)."""
    from pydsz.model.runtime import fit_inputs

    input_details = model.input_details()
    if os.path.isdir(path):
        if need_labels:
            raise InputError(f"{path}: a directory of images has no labels; this needs an .npz with 'y'")
        if len(input_details) != 1:
            raise InputError(f"{path}: images feed a model of one input; this one has {len(input_details)}")
        detail = input_details[0]
        x, y = load_images(path, detail["shape"], detail["dtype"], normalize), None
    else:
        if normalize is not None:
            raise InputError(f"{path}: --normalize applies to a directory of images, not to an .npz")
        x, y = load_npz(path, need_labels=need_labels)
    arrays = fit_inputs(input_details, x, source=str(path))
    return (arrays[0] if len(arrays) == 1 else arrays), y


def data_dir() -> Path:
    """Where the reference models and data sets are: $DSZ_DATA, else pydsz/data of the source tree."""
    given = os.environ.get(DATA_ENV)
    return Path(given) if given else _DATA_DIR


def bundled(name: str) -> Path:
    """Path of a reference model or data set of pydsz/data (data_dir()), e.g. "lenet5.tflite"."""
    folder = data_dir()
    path = folder / name
    if Path(name).name != name:
        raise InputError(f"{name}: not a file name")
    if not path.is_file():
        available = sorted(p.name for p in folder.glob("*") if p.is_file()) if folder.is_dir() else []
        if not available:
            raise InputError(f"{name}: the reference models and data are not installed (wheels carry none): "
                             f"run from a source checkout (pip install -e .), or set {DATA_ENV} to a folder that "
                             "holds pydsz/data's files")
        raise InputError(f"{name}: no such file in {folder} (have: {', '.join(available)})")
    return path


def check_outputs(outputs: dict) -> None:
    """InputError when the model's outputs on finite inputs hold a NaN or an infinity: nothing can be
    measured against them. outputs: {name: array [n, ...]}."""
    for name, values in outputs.items():
        values = np.asarray(values)
        if values.dtype.kind != "f" or values.size == 0:
            continue
        bad = ~np.isfinite(values.reshape(len(values), -1)).all(axis=1)
        if bad.any():
            first = int(np.argmax(bad))
            what = "NaN" if np.isnan(values[first]).any() else "an infinity"
            raise InputError(f"the model's output {name} is {what} for sample {first} ({int(bad.sum())} of "
                             f"{len(values)} samples), although the inputs are finite: nothing can be measured "
                             "against it; check the model and what --normalize feeds it")


# Below this spread of an output from sample to sample (relative to its size) the data never moves it.
STILL_SPREAD = 0.01


def unexercised(outputs: dict, steps: Optional[Mapping[str, float]] = None) -> Optional[str]:
    """A note naming the outputs the samples barely move, or None. A detector fed only inputs on which
    it stays silent (a wake-word model on speech without its phrase: every sample gives the same
    near-zero scores) shows no change under compression until an input that fires it comes, so the
    decisions made on such data are blind to what matters (openWakeWord's timer model: 0.015% measured
    on 64 such clips, 1.2% on clips where it fires). Integer outputs, and those `steps` names ({output:
    its quantization's step}, dequantized): at most two adjacent values, one step of their
    quantization; float outputs: a spread below STILL_SPREAD of their RMS size."""
    still = []
    for name, values in outputs.items():
        values = np.asarray(values).reshape(len(values), -1)
        if len(values) < 2:
            continue
        if values.dtype.kind in "iu":
            low, high = int(values.min()), int(values.max())
            if high - low <= 1:
                still.append(f"{name} (only the {values.dtype} values {low}..{high})")
            continue
        step = (steps or {}).get(name)
        if step:
            low, high = float(values.min()), float(values.max())
            if high - low <= 1.001 * step:
                still.append(f"{name} (only the values {low:.4g}..{high:.4g}, one step of its quantization apart)")
            continue
        values = values.astype(np.float64)
        size = math.sqrt(np.mean(np.sum(values ** 2, axis=1)))
        spread = math.sqrt(np.sum(values.var(axis=0)))
        if spread < STILL_SPREAD * size:
            still.append(f"{name} (its values vary by {spread / size:.2%} of their size)")
    if not still:
        return None
    return (f"the samples barely move the model's output {', '.join(still)}: the data never exercises what "
            "it responds to, so the decisions cannot see how compression changes it on inputs that do; add "
            "such inputs to the data (a detector's positives)")


def sample_count(x) -> int:
    """How many samples fitted inputs hold (an array, or a list of one per model input)."""
    return len(x[0]) if isinstance(x, (list, tuple)) else len(x)


def take_samples(x, samples: np.ndarray):
    """Those samples of fitted inputs (an array, or a list of one per model input)."""
    return [a[samples] for a in x] if isinstance(x, (list, tuple)) else x[samples]


def sample_digests(x) -> list[bytes]:
    """One digest per sample of inputs (an array, or a list of one per model input)."""
    arrays = [np.ascontiguousarray(a) for a in (x if isinstance(x, (list, tuple)) else [x])]
    digests = []
    for i in range(len(arrays[0])):
        h = hashlib.blake2b(digest_size=16)
        for a in arrays:
            h.update(a[i].tobytes())
        digests.append(h.digest())
    return digests


# Cross-fitting splits the data in two; below this many samples each half's Hessians say too little
# for compensation to pay, and it stays off unless asked for (then fitted on the data, with the warning)
CROSSFIT_SAMPLES = 16


def two_halves(n: int, groups: Optional[np.ndarray] = None) -> list[np.ndarray]:
    """n samples' indices in two halves drawn at random, seeded (the same data, the same split): cross-fitting's
    folds, each fitted on one half and measured on the other.

    groups: each sample's source (load_groups): a source's samples all go to one half, the largest sources
    first, each to the half with fewer samples, so that a half is measured on sources its fit never saw.
    Crops of five photos split at random put every photo in both halves, and a compensation that moved
    unseen photos' outputs half as much again as measured went unseen (hand_landmark_full, bench/zoo.py:
    1.42% on the test photos for 0.93% held out; by photo, 0.95%)."""
    rng = np.random.default_rng(0)
    if groups is None:
        order = rng.permutation(n)
        return [np.sort(order[: n // 2]), np.sort(order[n // 2:])]
    groups = np.asarray(groups)
    if groups.shape != (n,):
        raise InputError(f"groups: {len(groups)} values for {n} samples; give one per sample")
    _, which, sizes = np.unique(groups, return_inverse=True, return_counts=True)
    if len(sizes) < 2:
        raise InputError(f"groups: all {n} samples are of one group; cross-fitting needs two or more")
    halves: list[list[int]] = [[], []]
    counts = [0, 0]
    for g in sorted(rng.permutation(len(sizes)), key=lambda g: -sizes[g]):  # ties in a seeded order
        k = int(counts[1] < counts[0])
        halves[k].append(g)
        counts[k] += sizes[g]
    return [np.flatnonzero(np.isin(which, h)) for h in halves]
