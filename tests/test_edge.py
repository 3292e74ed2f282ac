"""Decoding on the device side: the staged decoder edge_demo times, the in-place decode of a whole
model (tensor placement, inflating the rest around the tensors), and the refusal of big-endian builds."""
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_model import build_tflite

import pydsz
from pydsz import _core
from pydsz.encode import pack
from pydsz.encode.pack import _serialize
from pydsz.format import codec, container, wrapping
from pydsz.format.container import TensorEntry
from pydsz.model.data import bundled

ROOT = Path(__file__).resolve().parents[1]
# edge_demo is not installed: it is copied to devices. Appended, so that an installed pydsz still
# comes first where the tests run against one (CI's runtime environment)
sys.path.append(str(ROOT))
from edge_demo.stages import _values_alone, decode_timed  # noqa: E402


def fc_model(shapes, densities, seed=0):
    """A .tflite of FC layers with pruned Laplace weights, and the weights ([out, in], as stored)."""
    rng = np.random.default_rng(seed)
    tensors, ops, weights = [{"shape": [1, shapes[0][1]]}], [], []
    for (rows, cols), density in zip(shapes, densities):
        w = rng.laplace(0, 0.05, (rows, cols)).astype(np.float32)
        w[rng.random(w.shape) >= density] = 0
        x = len(tensors) - 1
        tensors += [{"shape": [rows, cols], "data": w.tobytes()},
                    {"shape": [rows], "data": rng.normal(0, 0.1, rows).astype(np.float32).tobytes()},
                    {"shape": [1, rows]}]
        ops.append(("FULLY_CONNECTED", [x, x + 1, x + 2], [x + 3]))
        weights.append(w)
    return build_tflite(tensors, ops, inputs=[0], outputs=[len(tensors) - 1]), weights


@pytest.fixture(scope="module")
def sparse_model():
    model, weights = fc_model([(300, 784), (100, 300), (10, 100)], [0.09, 0.09, 0.25])
    return model, weights, pydsz.pack_model(model, 0.01)


def test_staged_decode_gives_the_bytes_tflite_bytes_gives(sparse_model):
    _, _, packed = sparse_model
    assert {e.representation for e in pydsz.load(packed).entries} == {"sparse"}
    tflite, stages = decode_timed(pydsz.load(packed))
    assert tflite == pydsz.load(packed).tflite_bytes()
    assert min(stages.lossless, stages.values, stages.reconstruction) >= 0
    assert stages.total == pytest.approx(stages.lossless + stages.values + stages.reconstruction)
    assert set(stages.per_tensor) == {"fc1", "fc2", "fc3"}


def test_staged_decode_of_dense_streams():
    packed = pydsz.pack_model(bundled("lenet300.tflite").read_bytes(), 0.01)  # unpruned: dense streams
    assert {e.representation for e in pydsz.load(packed).entries} == {"dense"}
    tflite, stages = decode_timed(pydsz.load(packed))
    assert tflite == pydsz.load(packed).tflite_bytes()
    assert stages.reconstruction == 0


def test_values_alone_are_the_fused_passes_nonzeros(sparse_model):
    # the premise of timing value decoding on its own: a sparse stream's data section decodes as an
    # array stream of its nnz values, to exactly the non-zeros the fused pass scatters
    _, weights, _ = sparse_model
    stream = codec.encode_sparse(weights[0], 0.01)
    info = _core.frame_info(np.frombuffer(stream, np.uint8))
    hs, ds = info["header_size"], info["data_stored"]
    data = wrapping.inflate(info["data_lossless"], np.frombuffer(stream, np.uint8)[hs:hs + ds], info["data_raw"], "t")
    values = np.empty(info["nnz"], np.float32)
    _core.decompress_array(_values_alone(info), data, values)
    dense = codec.decode_sparse(stream)
    np.testing.assert_array_equal(values, dense[dense != 0])


def test_rest_inflated_around_tensors_in_small_chunks(sparse_model, monkeypatch):
    # chunks far smaller than a tensor, so that spans start and end inside chunks and chunks fall
    # wholly inside tensors; every byte outside the tensors must be the model's own
    model, weights, packed = sparse_model
    monkeypatch.setattr(container, "_INFLATE_CHUNK", 1000)
    m = pydsz.load(packed)
    decoded = np.frombuffer(m.tflite_bytes(), np.uint8)
    original = np.frombuffer(model, np.uint8)
    outside = np.ones(len(original), bool)
    for e in m.entries:
        outside[e.offset:e.offset + e.nbytes] = False
        w = decoded[e.offset:e.offset + e.nbytes].view("<f4").reshape(e.shape)
        ref = weights[int(e.name[2:]) - 1]
        assert np.all((w != 0) == (ref != 0)) and np.abs(w - ref).max() <= 0.01
    np.testing.assert_array_equal(decoded[outside], original[outside])


def test_tensor_at_an_unaligned_offset_decodes_through_a_copy():
    # no TFLite writer puts a float tensor at an offset that is not a multiple of 4, but a .dsz may
    w = np.zeros((4, 6), np.float32)
    w[1, 2], w[3, 5] = 0.5, -0.25
    model = bytes(range(2)) + bytes(w.nbytes) + b"tail"
    entry = TensorEntry(name="fc1", buffer_index=1, offset=2, nbytes=w.nbytes, shape=w.shape,
                        representation="sparse", error_bound=1e-3, stream=codec.encode_sparse(w, 1e-3))
    packed = _serialize(model, [entry])
    out = pydsz.load(packed).tflite_bytes()
    assert out[:2] == model[:2] and out[-4:] == b"tail"
    np.testing.assert_allclose(np.frombuffer(out[2:2 + w.nbytes], "<f4").reshape(w.shape), w, atol=1e-3)
    with pytest.raises(pydsz.FormatError, match="not a multiple of 4"):
        decode_timed(pydsz.load(packed))


@pytest.mark.skipif(not shutil.which("cc"), reason="no C compiler")
def test_libdsz_refuses_big_endian_hosts(tmp_path):
    src = tmp_path / "probe.c"
    src.write_text('#include "common.h"\nint main(void) { return 0; }\n')
    r = subprocess.run(["cc", "-U__BYTE_ORDER__", "-D__BYTE_ORDER__=__ORDER_BIG_ENDIAN__",
                        f"-I{ROOT / 'libdsz/include'}", f"-I{ROOT / 'libdsz/src'}", "-c", str(src),
                        "-o", str(tmp_path / "probe.o")], capture_output=True, text=True)
    assert r.returncode != 0 and "little-endian hosts only" in r.stderr


def test_the_edge_demo_decodes_gathered_entries_as_the_library_does():
    lenet5 = bundled("lenet5.tflite").read_bytes()
    bounds = {"conv1": 0.01, "conv2": 0.01, "fc1": 0.01, "fc2": 0.01}
    model = pydsz.load(pack.pack_model(lenet5, bounds, "all", gather_small=True, constants_rel=2.0 ** -10))
    assert any(e.representation == "gathered" for e in model.entries)
    tflite, stages = decode_timed(model)
    assert tflite == model.tflite_bytes() and stages.total > 0
