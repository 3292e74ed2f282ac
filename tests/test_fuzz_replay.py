"""The committed fuzz corpus (libdsz/fuzz/corpus), replayed without a fuzzer.

Every file goes through pydsz's readers (tests/fuzz_load.py's exercise(): only DszError may
escape) in a child process with capped memory, and through the C targets' replay drivers under
ASan + UBSan (make -C libdsz/fuzz run-replay). Regression tests for what fuzzing found follow.
"""
import pathlib
import shutil
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from fuzz_load import exercise, with_fixed_crcs

import pydsz
from pydsz.encode import pack
from pydsz.format import container

ROOT = pathlib.Path(__file__).resolve().parent.parent
FUZZ = ROOT / "libdsz" / "fuzz"
CORPUS = FUZZ / "corpus"
SHARED_DSZ = CORPUS / "dsz" / "shared_e0.005.dsz"
# the child's address space: the interpreter, numpy and zstandard take a few hundred MiB
ADDRESS_SPACE = 4 << 30


def corpus_files():
    return sorted(p for p in CORPUS.rglob("*") if p.is_file())


def test_corpus_is_committed_and_small():
    files = corpus_files()
    assert {p.parent.name for p in files} >= {"dsz", "header", "array", "sparse", "index", "roundtrip"}
    assert sum(p.stat().st_size for p in files) < 4 << 20


def test_python_readers_on_the_whole_corpus_raise_only_dszerror_within_memory():
    # per input, the memory Python and numpy allocate stays within a small multiple of its size
    script = textwrap.dedent(f"""
        import pathlib, resource, sys, tracemalloc
        resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE}, {ADDRESS_SPACE}))
        sys.path.insert(0, {str(ROOT / "tests")!r})
        from fuzz_load import exercise
        tracemalloc.start()
        for path in sys.argv[1:]:
            data = pathlib.Path(path).read_bytes()
            tracemalloc.reset_peak()
            exercise(data)
            peak = tracemalloc.get_traced_memory()[1]
            assert peak <= (32 << 20) + 64 * len(data), f"{{path}}: {{peak}} bytes at peak"
        print("replayed", len(sys.argv) - 1)
    """)
    files = [str(p) for p in corpus_files()]
    r = subprocess.run([sys.executable, "-c", script, *files], capture_output=True, text=True, timeout=600,
                       cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    assert f"replayed {len(files)}" in r.stdout


def _cc_with_sanitizers() -> bool:
    if not (shutil.which("make") and shutil.which("cc")):
        return False
    probe = subprocess.run(["cc", "-fsanitize=address,undefined", "-x", "c", "-o", "/dev/null", "-"],
                           input="int main(void){return 0;}", capture_output=True, text=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _cc_with_sanitizers(), reason="no C compiler with ASan + UBSan, or no make")
@pytest.mark.slow
def test_c_targets_replay_the_whole_corpus_under_sanitizers():
    r = subprocess.run(["make", "-C", str(FUZZ), "run-replay"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    replayed = [line for line in r.stdout.splitlines() if line.startswith("replayed")]
    targets = list(FUZZ.glob("fuzz_*.c"))  # one replay per target the Makefile builds
    assert len(replayed) == len(targets) and all(line.endswith(", 0 unreadable") for line in replayed), r.stdout


def _with_model_bytes(dsz: bytes, model_bytes: int) -> bytes:
    out = bytearray(dsz)
    struct.pack_into("<Q", out, 16, model_bytes)
    return with_fixed_crcs(bytes(out))


@pytest.mark.parametrize("model_bytes", [2**64 - 1, 2**63, 2**40])
def test_declared_model_size_beyond_the_zstd_frame_is_refused_before_allocating(model_bytes):
    # found by tests/fuzz_load.py: 2^63 and up raised OverflowError where the model's buffer is made
    with pytest.raises(pydsz.FormatError, match="more than a zstd frame"):
        pydsz.load(_with_model_bytes(SHARED_DSZ.read_bytes(), model_bytes))


def test_declared_model_size_other_than_the_zstd_frame_is_refused_on_load():
    dsz = SHARED_DSZ.read_bytes()
    size = struct.unpack_from("<Q", dsz, 16)[0]
    with pytest.raises(pydsz.FormatError, match="declares"):
        pydsz.load(_with_model_bytes(dsz, size + 1))


def test_exercise_lets_other_exceptions_through():
    # the harness itself must not swallow what it is there to find
    with pytest.raises(TypeError):
        exercise(None)


HUGE = 2**62


def test_sparse_stream_with_an_extent_numpy_cannot_address_is_a_format_error():
    # found by tests/fuzz_load.py: rows 0x7200000000000005, cols 0 (no elements, so libdsz accepts it)
    # made numpy's reshape raise ValueError
    data = (CORPUS / "sparse" / "crash_numpy_unaddressable_shape").read_bytes()
    with pytest.raises(pydsz.FormatError, match="too large to address"):
        pydsz.decode_sparse(data)


def test_array_stream_with_an_extent_numpy_cannot_address_is_a_format_error():
    frame = bytearray(pydsz.compress_array(np.zeros((0, 3), np.float32), 0.1))
    struct.pack_into("<Q", frame, 48 + 8, HUGE)
    with pytest.raises(pydsz.FormatError, match="too large to address"):
        pydsz.decompress_array(bytes(frame))


def test_container_entry_with_an_extent_numpy_cannot_address_is_a_format_error():
    stream = pydsz.encode_sparse(np.zeros((0, 3), np.float32), 0.1)
    entry = container.TensorEntry(name="fc1", buffer_index=1, offset=0, nbytes=0, shape=(HUGE, 0),
                                  representation="sparse", error_bound=0.1, stream=stream)
    dsz = pack._serialize(bytes(16), [entry])
    with pytest.raises(pydsz.FormatError, match="too large to address"):
        pydsz.load(dsz)
