"""What large models need, on small real models: out-of-line buffers through compress and decompress,
and cached activations memory-mapped from disk (--max-cache-memory) with results unchanged."""

import gc
import sys
from pathlib import Path

import numpy as np
import pytest
from test_cli import dsz

from pydsz.errors import InputError
from pydsz.model import activations, cache, runtime
from pydsz.model.data import bundled, load_npz
from pydsz.model.graph import TFLiteModel


@pytest.fixture(autouse=True)
def no_earlier_caches():
    """The caches' accounting is the process's: caches an earlier test still holds count against this
    test's limits. pytest keeps the last failed test's frames (sys.last_traceback, and sys.last_exc from
    Python 3.12, for post-mortem debugging), and with them what that test cached; let them go."""
    sys.last_type = sys.last_value = sys.last_traceback = sys.last_exc = None
    gc.collect()


@pytest.fixture
def no_limit(monkeypatch):
    monkeypatch.delenv(cache.ENV, raising=False)


def test_sizes_parse_with_binary_units():
    assert cache.parse_size("2G") == 2 * 2**30
    assert cache.parse_size("500m") == 500 * 2**20
    assert cache.parse_size("64KiB") == 64 * 2**10
    assert cache.parse_size("1048576") == 2**20
    with pytest.raises(InputError, match="size 'lots'"):
        cache.parse_size("lots")


def test_caches_beyond_the_limit_are_memory_mapped(monkeypatch):
    monkeypatch.setenv(cache.ENV, "1M")
    small = cache.empty((100, 100))  # 40 KB: held in memory
    large = cache.empty((1000, 1000))  # 4 MB: beyond the limit
    assert not isinstance(small, np.memmap) and isinstance(large, np.memmap)
    large[...] = 1.5
    assert float(large.sum()) == 1.5e6
    kept = cache.keep(np.arange(300_000, dtype=np.float32))  # 1.2 MB with small's 40 KB: over
    assert isinstance(kept, np.memmap) and np.array_equal(kept, np.arange(300_000, dtype=np.float32))


def test_without_a_limit_nothing_is_mapped(no_limit):
    assert not isinstance(cache.empty((3000, 1000)), np.memmap)


def test_freed_caches_return_their_share_of_the_limit(monkeypatch):
    monkeypatch.setenv(cache.ENV, "1M")
    for _ in range(5):  # each 800 KB array fits once the one before it is gone
        assert not isinstance(cache.empty((200, 1000)), np.memmap)


def test_the_caches_peak_counts_held_and_mapped_ones_together(monkeypatch):
    """cache.peak() is what the CLI adds to 3x the model for the memory a command should stay within."""
    monkeypatch.setenv(cache.ENV, "1M")
    before = cache.peak()
    held, mapped = cache.empty((100, 1000)), cache.empty((1000, 1000))  # 400 KB in memory, 4 MB mapped
    assert isinstance(mapped, np.memmap) and not isinstance(held, np.memmap)
    high = cache.peak()
    assert high >= before and high >= cache._now >= 4_400_000
    del held, mapped
    assert cache.peak() == high and cache._now <= high - 4_400_000


def test_capture_is_the_same_mapped_or_not(monkeypatch):
    model = bundled("lenet5.tflite").read_bytes()
    x, _ = load_npz(bundled("fmnist_val.npz"))
    fc1 = TFLiteModel(model).layer("fc1")
    tensor = TFLiteModel(model).ops[fc1.op_index].inputs[0]
    monkeypatch.delenv(cache.ENV, raising=False)
    in_memory = activations.capture(model, x[:700], tensor, batch_size=256)
    monkeypatch.setenv(cache.ENV, "0")
    mapped = activations.capture(model, x[:700], tensor, batch_size=256)
    assert isinstance(mapped, np.memmap) and not isinstance(in_memory, np.memmap)
    assert np.array_equal(in_memory, mapped)


@pytest.fixture
def val_npz(tmp_path, val) -> Path:
    """1,000 validation samples: at a 1-point budget they allow 10 changed predictions, as the whole
    5,000 allowed 15 at 0.3 points, in a fifth of the time (the caches are mapped at any size with limit 0)."""
    path = tmp_path / "val.npz"
    np.savez(path, x=val[0], y=val[1])
    return path


@pytest.mark.slow
def test_compress_is_byte_identical_with_mapped_caches(tmp_path, val_npz):
    outputs = []
    for limit in ([], ["--max-cache-memory", "0"]):
        out = tmp_path / f"m{len(limit)}.dsz"
        result = dsz("compress", bundled("lenet5.tflite"), "--data", val_npz, "--max-loss", "0.01",
                     "-q", "-o", out, *limit)
        assert result.returncode == 0, result.stderr
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]


def test_prune_is_byte_identical_with_mapped_caches(tmp_path):
    x, y = load_npz(bundled("fmnist_val.npz"))
    train, val = tmp_path / "train.npz", tmp_path / "val.npz"
    np.savez(train, x=x[:3000], y=y[:3000])
    np.savez(val, x=x[3000:], y=y[3000:])
    outputs = []
    for limit in ([], ["--max-cache-memory", "0"]):
        out = tmp_path / f"p{len(limit)}.tflite"
        result = dsz("prune", bundled("lenet300.tflite"), "--train", train, "--data", val, "--sparsity", "0.9",
                     "--epochs", "1", "--device", "cpu", "-q", "-o", out, *limit)
        assert result.returncode == 0, result.stderr
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]


def test_a_bad_cache_size_is_a_usage_error(tmp_path):
    result = dsz("compress", bundled("lenet5.tflite"), "--data", bundled("fmnist_val.npz"),
                 "--max-cache-memory", "lots", "-o", tmp_path / "m.dsz")
    assert result.returncode == 2 and "size 'lots'" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "m.dsz").exists()


@pytest.mark.slow
def test_out_of_line_model_compresses_and_decodes_like_the_inline_one(tmp_path, val_npz):
    """lenet300_ool holds lenet300's weights out of line (Buffer.offset/size): the same bounds are
    chosen, and the decoded files keep their own layout yet compute the same outputs in LiteRT."""
    data = val_npz
    decoded = {}
    for name in ("lenet300", "lenet300_ool"):
        packed, out = tmp_path / f"{name}.dsz", tmp_path / f"{name}.tflite"
        result = dsz("compress", bundled(f"{name}.tflite"), "--data", data, "--max-loss", "0.01", "-o", packed)
        assert result.returncode == 0, result.stderr
        assert dsz("decompress", packed, "-o", out).returncode == 0
        decoded[name] = out.read_bytes()
    inline, ool = (TFLiteModel(decoded[n]) for n in ("lenet300", "lenet300_ool"))
    assert len(decoded["lenet300_ool"]) == bundled("lenet300_ool.tflite").stat().st_size
    for layer in ("fc1", "fc2", "fc3"):
        assert ool.layer(layer).offset != inline.layer(layer).offset
        assert np.array_equal(ool.weight(layer), inline.weight(layer))
    x, _ = load_npz(data)
    assert np.array_equal(runtime.predict(decoded["lenet300"], x[:500]), runtime.predict(decoded["lenet300_ool"], x[:500]))

