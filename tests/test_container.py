"""The .dsz container on the real reference models: bounds, lossless identity, corruption refused."""
import lzma
import os
import struct
import zlib

import numpy as np
import pytest
import zstandard

import pydsz
from pydsz.encode import pack
from pydsz.errors import FormatError, InputError
from pydsz.format import container, wrapping
from pydsz.model.data import bundled, load_npz
from pydsz.model.graph import TFLiteModel

MODELS = ["lenet300.tflite", "lenet5.tflite", "lenet300_ool.tflite"]


def _model_bytes(name):
    return bundled(name).read_bytes()


@pytest.fixture(scope="module")
def packed_lenet300():
    return pydsz.pack_model(_model_bytes("lenet300.tflite"), 0.01)


@pytest.mark.parametrize("name", MODELS)
def test_weights_within_bound_and_rest_identical(name):
    original = _model_bytes(name)
    bound = 0.005
    decoded = pydsz.load(pydsz.pack_model(original, bound)).tflite_bytes()
    assert len(decoded) == len(original)
    before, after = TFLiteModel(original), TFLiteModel(decoded)
    changed = np.zeros(len(original), bool)
    for layer in before.layers(kinds=("fc",)):
        w0, w1 = before.weight(layer), after.weight(layer)
        err = np.abs(w0.astype(np.float64) - w1.astype(np.float64))
        assert err.max() <= bound
        assert not w1[w0 == 0].any()  # zeros stay exact zeros
        changed[layer.offset:layer.offset + layer.nbytes] = True
    a, b = np.frombuffer(original, np.uint8), np.frombuffer(decoded, np.uint8)
    assert np.array_equal(a[~changed], b[~changed])


@pytest.mark.runtime
@pytest.mark.parametrize("name", MODELS)
def test_accuracy_kept_in_the_interpreter(name):
    from pydsz.model.runtime import accuracy

    x, y = load_npz(bundled("fmnist_test.npz"))
    original = _model_bytes(name)
    m = pydsz.load(pydsz.pack_model(original, 0.002))
    before = accuracy(original, x, y)
    after = accuracy(m.tflite_bytes(), x, y)
    assert abs(before - after) <= 0.001
    assert m.interpreter() is not None


@pytest.mark.parametrize("name", MODELS)
def test_lossless_is_byte_identical(name):
    original = _model_bytes(name)
    m = pydsz.load(pydsz.pack_model(original, 0.0))
    assert m.tflite_bytes() == original
    assert m.info()["tensors"] == []


def test_per_layer_bounds_keep_unnamed_layers_lossless():
    original = _model_bytes("lenet300.tflite")
    decoded = pydsz.load(pydsz.pack_model(original, {"fc1": 0.02, "fc3": 0.0}))
    info = decoded.info()
    assert [(t["name"], t["error_bound"]) for t in info["tensors"]] == [("fc1", 0.02)]
    before, after = TFLiteModel(original), TFLiteModel(decoded.tflite_bytes())
    for layer in before.layers(kinds=("fc",))[1:]:
        assert np.array_equal(before.weight(layer), after.weight(layer))


def test_a_default_bound_applies_to_the_layers_not_named():
    data = bundled("lenet300.tflite").read_bytes()
    named = {"fc1": 0.002, "fc2": 0.002, "fc3": 0.01}
    assert pack.pack_model(data, {pack.OTHERS: 0.002, "fc3": 0.01}) == pack.pack_model(data, named)
    assert pack.pack_model(data, {pack.OTHERS: 0.002}) == pack.pack_model(data, 0.002)


def test_info_reports_sizes(packed_lenet300):
    m = pydsz.load(packed_lenet300)
    info = m.info()
    for t in info["tensors"]:
        assert t["ratio"] == pytest.approx(t["original_bytes"] / t["compressed_bytes"])
        assert 0 < t["density"] <= 1
        assert t["data_bytes"] + t["index_bytes"] <= t["compressed_bytes"]
    assert set(m.weights()) == {"fc1", "fc2", "fc3"}


def test_unknown_layer_name_is_refused():
    with pytest.raises(InputError, match="fc9"):
        pydsz.pack_model(_model_bytes("lenet300.tflite"), {"fc9": 0.01})


@pytest.mark.parametrize("bound", [-1.0, float("nan"), float("inf")])
def test_bad_bound_is_refused(bound):
    with pytest.raises(InputError, match="error bound"):
        pydsz.pack_model(_model_bytes("lenet300.tflite"), bound)


def test_shared_buffer_is_compressed_once():
    original = _model_bytes("shared.tflite")
    m = pydsz.load(pydsz.pack_model(original, 0.01))
    tensors = m.info()["tensors"]
    shared = [t for t in tensors if "," in t["name"]]
    assert len(shared) == 1
    weights = m.weights()
    a, b = shared[0]["name"].split(",")
    assert weights[a] is weights[b]


def test_every_truncation_is_refused():
    packed = pydsz.pack_model(_model_bytes("shared.tflite"), 0.01)
    for n in range(len(packed)):
        with pytest.raises(FormatError):
            pydsz.load(packed[:n])


def test_every_bit_flip_is_detected():
    packed = pydsz.pack_model(_model_bytes("shared.tflite"), 0.01)
    buf = bytearray(packed)
    for bit in range(len(buf) * 8):
        buf[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(FormatError):
            pydsz.load(bytes(buf)).tflite_bytes()
        buf[bit // 8] ^= 1 << (bit % 8)


def test_bit_flips_in_a_large_file_are_detected(packed_lenet300):
    rng = np.random.default_rng(7)
    buf = bytearray(packed_lenet300)
    for bit in rng.choice(len(buf) * 8, 300, replace=False):
        buf[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(FormatError):
            pydsz.load(bytes(buf)).tflite_bytes()
        buf[bit // 8] ^= 1 << (bit % 8)


def _with_header_field(packed, offset, fmt, value):
    """Rewrite a header field and fix both checksums, as a newer writer would have."""
    buf = bytearray(packed)
    struct.pack_into(fmt, buf, offset, value)
    head_end = container.HEADER.size + struct.unpack_from("<I", buf, 12)[0]
    struct.pack_into("<I", buf, head_end, zlib.crc32(buf[:head_end]))
    struct.pack_into("<I", buf, len(buf) - 4, zlib.crc32(buf[:-4]))
    return bytes(buf)


def test_newer_format_version_is_named(packed_lenet300):
    newer = _with_header_field(packed_lenet300, 4, "<H", container.FORMAT_VERSION + 1)
    with pytest.raises(FormatError, match=f"version {container.FORMAT_VERSION + 1} is newer"):
        pydsz.load(newer)


def test_wrong_magic_is_named(packed_lenet300):
    with pytest.raises(FormatError, match="magic"):
        pydsz.load(b"XXXX" + packed_lenet300[4:])
    with pytest.raises(FormatError, match="magic"):
        pydsz.load(_model_bytes("lenet300.tflite"))


def test_reserved_flags_must_be_zero(packed_lenet300):
    with pytest.raises(FormatError, match="reserved"):
        pydsz.load(_with_header_field(packed_lenet300, 6, "<H", 4))
    # the lzma rest's flag came with version 4
    older = _with_header_field(_with_header_field(packed_lenet300, 4, "<H", 3), 6, "<H", container.REST_LZMA)
    with pytest.raises(FormatError, match="reserved"):
        pydsz.load(older)


@pytest.mark.parametrize("name", ["shared.tflite", "lenet300.tflite", "lenet5.tflite"])
def test_the_rest_is_lzma_where_that_is_smaller(name):
    # a graph and its lossless tensors without the holes' zero runs: lenet300's 2,668 bytes of zstd
    # are 2,376 of lzma, lenet5's 98,539 (its convolutions lossless) 89,836
    original = _model_bytes(name)
    packed = pydsz.pack_model(original, 0.01)
    m = pydsz.load(packed)
    assert (m.rest_codec, m.version, m.info()["rest_codec"]) == ("lzma", 4, "lzma")
    holes = [h for e in m.entries for h in e.holes]
    assert len(m._rest) < 0.99 * len(pack._rest_compressor(checksum=True).compress(pack._rest(original, holes)))
    decoded = np.frombuffer(m.tflite_bytes(), np.uint8)
    for a, b in container.kept(len(original), holes):  # outside the compressed tensors: the original's bytes
        assert decoded[a:b].tobytes() == original[a:b]
    assert sum(b - a for a, b in container.kept(len(original), holes)) + sum(e.nbytes for e in m.entries) == len(original)


def test_the_rest_stays_zstd_where_lzma_gains_nothing_or_the_model_is_large():
    rng = np.random.default_rng(3)
    noise = rng.integers(0, 256, 100_000, dtype=np.uint8).tobytes()  # lzma's headers cost more than it saves
    assert pack._wrap_rest(noise, [])[0] == 0
    large = bytes(container.LZMA_REST_MAX + 1)  # a model beyond what an lzma rest may hold
    flags, rest = pack._wrap_rest(large, [])
    assert flags == 0 and zstandard.decompress(rest) == large


@pytest.mark.parametrize("damage, said", [
    (lambda raw, kept: raw + b"\0" * 4, "more than"),
    (lambda raw, kept: raw[:-1], "does not decompress|ends before"),  # its end marker cut
    (lambda raw, kept: raw[:len(raw) // 2], r"holds \d+ bytes|does not decompress"),
    (lambda raw, kept: wrapping.lzma_tables(kept[:-1]), r"holds \d+ bytes, the header"),  # one byte short
    (lambda raw, kept: wrapping.lzma_tables(kept + b"\0"), "more than"),
    (lambda raw, kept: lzma.compress(kept), r"does not decompress|holds 0 bytes"),  # .xz where raw LZMA2 belongs
    (lambda raw, kept: bytes(64), r"does not decompress|holds 0 bytes"),
])
def test_a_damaged_lzma_rest_is_a_format_error(monkeypatch, damage, said):
    """The rest's LZMA2 stream is untrusted as any section: every way of it not being the model's rest
    (written here with both checksums right, as a writer's bug or a crafted file would be) is a
    FormatError; its dictionary is the rest's raw size, which no byte of the file declares."""
    def wrap(data, holes):
        outside = b"".join(data[a:b] for a, b in container.kept(len(data), holes))
        return container.REST_LZMA, damage(wrapping.lzma_tables(outside), outside)

    monkeypatch.setattr(pack, "_wrap_rest", wrap)
    packed = pydsz.pack_model(_model_bytes("lenet300.tflite"), 0.01)
    with pytest.raises(FormatError, match=said):
        pydsz.load(packed).tflite_bytes()


def _with_table(packed: bytes, stored: bytes) -> bytes:
    """packed with its table section replaced by `stored` and every size and checksum made right."""
    header = bytearray(packed[:container.HEADER.size])
    old = struct.unpack_from("<I", header, 12)[0]
    struct.pack_into("<I", header, 12, len(stored))
    head = bytes(header) + stored
    body = head + struct.pack("<I", zlib.crc32(head)) + packed[container.HEADER.size + old + 4:-4]
    return body + struct.pack("<I", zlib.crc32(body))


def test_the_table_is_lzma_where_that_is_smaller(packed_lenet300):
    m = pydsz.load(packed_lenet300)
    flags = struct.unpack_from("<H", packed_lenet300, 6)[0]
    assert flags & container.TABLE_LZMA and m.version == 4
    stored_size = struct.unpack_from("<I", packed_lenet300, 12)[0]
    stored = packed_lenet300[container.HEADER.size:container.HEADER.size + stored_size]
    raw, _, _ = container._inflated_table(memoryview(stored))
    assert len(stored) < len(raw) == struct.unpack_from("<I", stored)[0]
    # the same table raw reads the same
    plain = _with_header_field(_with_table(packed_lenet300, bytes(raw)), 6, "<H", flags & ~container.TABLE_LZMA)
    assert [(e.name, e.offset, e.shape) for e in pydsz.load(plain).entries] == [(e.name, e.offset, e.shape)
                                                                                for e in m.entries]
    assert pydsz.load(plain).tflite_bytes() == m.tflite_bytes()


@pytest.mark.parametrize("damage, said", [
    (lambda size, raw: b"", "cannot hold its raw size"),
    (lambda size, raw: struct.pack("<I", size + 1) + wrapping.lzma_tables(raw), "raw size says"),
    (lambda size, raw: struct.pack("<I", size) + b"\xff" * 41, "does not decompress"),  # properties out of range
    (lambda size, raw: struct.pack("<I", size - 1) + wrapping.lzma_tables(raw), "more than"),
    (lambda size, raw: struct.pack("<I", size) + wrapping.lzma_tables(raw) + b"\0", "bytes after"),
    (lambda size, raw: struct.pack("<I", size) + wrapping.lzma_tables(raw)[:-2], "does not decompress|no end marker"),
    (lambda size, raw: struct.pack("<I", 1 << 30) + wrapping.lzma_tables(raw), "more than LZMA2 makes"),
    (lambda size, raw: struct.pack("<I", size) + bytes(32), "holds 0 bytes"),  # LZMA2's end marker alone
])
def test_a_damaged_lzma_table_is_a_format_error(packed_lenet300, damage, said):
    stored_size = struct.unpack_from("<I", packed_lenet300, 12)[0]
    stored = packed_lenet300[container.HEADER.size:container.HEADER.size + stored_size]
    raw = bytes(container._inflated_table(memoryview(stored))[0])
    with pytest.raises(FormatError, match=said):
        pydsz.load(_with_table(packed_lenet300, damage(len(raw), raw)))


def test_an_lzma_rest_may_not_declare_a_large_model(monkeypatch):
    packed = pydsz.pack_model(_model_bytes("lenet300.tflite"), 0.01)
    assert pydsz.load(packed).rest_codec == "lzma"
    large = _with_header_field(packed, 16, "<Q", container.LZMA_REST_MAX + 1)
    with pytest.raises(FormatError, match="LZMA2 rest"):
        pydsz.load(large)


def test_frozen_fixture_keeps_decoding():
    """A file written by format version 1 must decode to the same model forever."""
    import hashlib
    from pathlib import Path

    fixtures = Path(__file__).parent / "fixtures"
    m = pydsz.load(fixtures / "shared-v1.dsz")
    expected = (fixtures / "shared-v1.tflite.sha256").read_text().split()[0]
    assert hashlib.sha256(m.tflite_bytes()).hexdigest() == expected


def test_write_model_from_paths(tmp_path):
    out = tmp_path / "m.dsz"
    m = pydsz.write_model(bundled("lenet300.tflite"), out, 0.01)
    assert out.read_bytes()[:4] == b"DSZM"
    assert pydsz.load(out).tflite_bytes() == m.tflite_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["m.dsz"]
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask


def test_decoded_model_is_a_bytes_object_filled_in_place():
    m = pydsz.load(pydsz.pack_model(_model_bytes("lenet300.tflite"), 0.01))
    decoded = m.tflite_bytes()
    assert type(decoded) is bytes and m.tflite_bytes() is decoded


def test_bytes_writer_is_not_taken_while_viewed():
    from pydsz import _core

    writer = _core.BytesWriter(8)
    view = np.frombuffer(writer, np.uint8)
    view[:] = 3
    with pytest.raises(ValueError, match="views"):
        writer.take()
    del view
    assert writer.take() == b"\x03" * 8
    with pytest.raises(ValueError, match="taken"):
        np.frombuffer(writer, np.uint8)
