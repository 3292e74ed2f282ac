"""Data sets as (x, y) arrays: .npz files, IDX files, Fashion-MNIST, and the files bundled in pydsz/data.

Numpy only: no TensorFlow. Samples keep their stored dtype and shape (the bundled Fashion-MNIST
subsets are uint8 [N, 28, 28]); fitting them to a model's input is the evaluator's business.
"""

from __future__ import annotations

import gzip
import os
import zipfile
import zlib
from pathlib import Path
from typing import Union

import numpy as np

from pydsz.errors import InputError

PathLike = Union[str, "os.PathLike[str]"]

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_ENV = "DSZ_FASHION_MNIST_DIR"
# The validation split is the last VALIDATION_SIZE training images (the first 55,000 train).
VALIDATION_SIZE = 5000

_DATA_DIR = Path(__file__).resolve().parent / "data"

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


def load_npz(path: PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Load a data set stored as arrays `x` (samples) and `y` (integer labels) in an .npz file."""
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    try:
        npz = np.load(path, allow_pickle=False)
        if not isinstance(npz, np.lib.npyio.NpzFile):
            raise InputError(f"{path}: not an .npz archive (a single .npy array)")
        with npz:
            arrays = {}
            for name in ("x", "y"):
                if name not in npz.files:
                    raise InputError(f"{path}: no array '{name}'")
                arrays[name] = npz[name]
    except InputError:
        raise
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or e})") from None
    except (ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        # np.load raises ValueError for non-npz bytes and for object (pickled) arrays.
        raise InputError(f"{path}: not a valid .npz archive ({e})") from None
    x, y = arrays["x"], arrays["y"]
    if x.ndim == 0 or x.dtype.kind not in "biuf":
        raise InputError(f"{path}: array 'x' must be numeric with a sample axis, got {x.dtype} {x.shape}")
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise InputError(f"{path}: array 'y' must be 1-D integer labels, got {y.dtype} {y.shape}")
    if len(x) != len(y):
        raise InputError(f"{path}: 'x' has {len(x)} samples, 'y' has {len(y)} labels")
    if len(x) == 0:
        raise InputError(f"{path}: no samples")
    return x, y


def bundled(name: str) -> Path:
    """Path of a file bundled in pydsz/data (a reference model or data set), e.g. "lenet5.tflite"."""
    path = _DATA_DIR / name
    if Path(name).name != name or not path.is_file():
        available = sorted(p.name for p in _DATA_DIR.glob("*") if p.is_file())
        raise InputError(f"{name}: no such bundled file (have: {', '.join(available) or 'none'})")
    return path
