"""pydsz.model.data: IDX and .npz loaders on real files, their errors, and the bundled models and data."""

import gzip
import os
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydsz.errors import InputError
from pydsz.format.interpreter import interpreter_class
from pydsz.model.data import (
    FASHION_MNIST_DIR,
    bundled,
    fashion_mnist,
    load_groups,
    load_images,
    load_npz,
    read_idx,
    split_validation,
    two_halves,
)

# these run a TFLite interpreter: CI runs them again under tflite-runtime
pytestmark = pytest.mark.runtime

MODELS = ["lenet300.tflite", "lenet5.tflite", "lenet300_ool.tflite"]
needs_debian_fmnist = pytest.mark.skipif(
    not os.path.isdir(FASHION_MNIST_DIR), reason="apt-get install dataset-fashion-mnist"
)


def idx_bytes(array: np.ndarray, code: int) -> bytes:
    header = bytes([0, 0, code, array.ndim]) + np.array(array.shape, ">u4").tobytes()
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


# --- bundled files -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["fmnist_val.npz", "fmnist_test.npz"])
def test_bundled_npz_holds_uint8_fashion_mnist(name):
    x, y = load_npz(bundled(name))
    assert x.dtype == np.uint8 and x.shape[1:] == (28, 28)
    assert y.dtype == np.uint8 and y.shape == (len(x),)
    assert len(x) == {"fmnist_val.npz": 5000, "fmnist_test.npz": 10000}[name]
    assert set(np.unique(y)) == set(range(10))


def test_bundled_unknown_name_lists_what_is_there():
    with pytest.raises(InputError, match=r"nope\.tflite: no such file in .*lenet5\.tflite"):
        bundled("nope.tflite")


def test_without_the_data_folder_bundled_says_where_to_find_it(tmp_path, monkeypatch):
    """A wheel carries no data: the reference models are in a checkout, or where DSZ_DATA says."""
    monkeypatch.setenv("DSZ_DATA", str(tmp_path / "empty"))
    with pytest.raises(InputError, match="not installed.*pip install -e.*DSZ_DATA"):
        bundled("lenet5.tflite")


def test_bundled_rejects_paths():
    with pytest.raises(InputError):
        bundled("../data.py")


# --- Fashion-MNIST from Debian's package -----------------------------------------------------------


@needs_debian_fmnist
@pytest.mark.parametrize("split,n", [("train", 60000), ("test", 10000)])
def test_fashion_mnist_reads_debian_files(split, n):
    x, y = fashion_mnist(split)
    assert x.shape == (n, 28, 28) and x.dtype == np.uint8
    assert y.shape == (n,) and y.dtype == np.uint8 and y.max() == 9


@needs_debian_fmnist
def test_bundled_splits_match_debian_files():
    (_, _), (x_val, y_val) = split_validation(*fashion_mnist("train"))
    x, y = load_npz(bundled("fmnist_val.npz"))
    assert np.array_equal(x, x_val) and np.array_equal(y, y_val)
    x, y = load_npz(bundled("fmnist_test.npz"))
    x_test, y_test = fashion_mnist("test")
    assert np.array_equal(x, x_test) and np.array_equal(y, y_test)


def test_fashion_mnist_directory_from_env(tmp_path, monkeypatch):
    x = np.arange(3 * 28 * 28, dtype=np.uint8).reshape(3, 28, 28)
    y = np.array([1, 2, 3], np.uint8)
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(idx_bytes(x, 0x08)))
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(y, 0x08))
    monkeypatch.setenv("DSZ_FASHION_MNIST_DIR", str(tmp_path))
    got_x, got_y = fashion_mnist("test")
    assert np.array_equal(got_x, x) and np.array_equal(got_y, y)


def test_fashion_mnist_absent_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setenv("DSZ_FASHION_MNIST_DIR", str(tmp_path / "missing"))
    with pytest.raises(InputError, match=r"missing.*apt-get install dataset-fashion-mnist"):
        fashion_mnist("train")


def test_fashion_mnist_unknown_split():
    with pytest.raises(InputError, match="'validation'"):
        fashion_mnist("validation")


def test_split_validation_takes_the_last_samples():
    x, y = np.arange(10), np.arange(10) % 3
    (xt, yt), (xv, yv) = split_validation(x, y, 4)
    assert list(xt) == list(range(6)) and list(xv) == [6, 7, 8, 9]
    assert list(yv) == [0, 1, 2, 0] and len(yt) == 6


# --- IDX -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,code", [("u1", 0x08), ("i2", 0x0B), ("i4", 0x0C), ("f4", 0x0D)])
def test_read_idx_round_trips_plain_and_gzipped(tmp_path, dtype, code):
    a = (np.arange(24) - 5).astype(dtype).reshape(2, 3, 4)
    for name, raw in (("a.idx", idx_bytes(a, code)), ("a.idx.gz", gzip.compress(idx_bytes(a, code)))):
        (tmp_path / name).write_bytes(raw)
        got = read_idx(tmp_path / name)
        assert got.dtype == np.dtype(dtype) and np.array_equal(got, a)


@pytest.mark.parametrize(
    "raw,message",
    [
        (b"", "bad magic"),
        (b"\x01\x00\x08\x01", "bad magic"),
        (b"\x00\x00\x07\x01\x00\x00\x00\x01x", "unknown IDX type code 0x07"),
        (b"\x00\x00\x08\x02\x00\x00\x00\x01", "truncated IDX header"),
        (b"\x00\x00\x08\x01\x00\x00\x00\x05abc", r"needs 5 data bytes, file has 3"),
        (b"\x00\x00\x08\x01\x00\x00\x00\x01ab", r"needs 1 data bytes, file has 2"),
        (b"\x1f\x8bnot really gzip", "corrupt gzip"),
        (gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x05abcde")[:-6], "corrupt gzip"),
    ],
    ids=["empty", "magic", "type", "header", "truncated", "trailing", "gzip", "gzip-truncated"],
)
def test_read_idx_bad_file(tmp_path, raw, message):
    path = tmp_path / "bad.idx"
    path.write_bytes(raw)
    with pytest.raises(InputError, match=message) as info:
        read_idx(path)
    assert str(path) in str(info.value)


def test_read_idx_missing_file(tmp_path):
    with pytest.raises(InputError, match=r"nothing\.idx: no such file"):
        read_idx(tmp_path / "nothing.idx")


# --- .npz ----------------------------------------------------------------------------------------


def test_load_npz_returns_arrays_as_stored(tmp_path):
    x = np.random.default_rng(0).normal(size=(7, 3)).astype(np.float16)
    y = np.arange(7, dtype=np.int64)
    np.savez(tmp_path / "d.npz", x=x, y=y, extra=np.zeros(2))
    got_x, got_y = load_npz(str(tmp_path / "d.npz"))
    assert got_x.dtype == np.float16 and np.array_equal(got_x, x)
    assert got_y.dtype == np.int64 and np.array_equal(got_y, y)


def _save(path: Path, **arrays):
    np.savez(path, **arrays)
    return path


BAD_NPZ = {
    "no-x": (lambda p: _save(p, y=np.zeros(3, np.uint8)), "no array 'x'"),
    "no-y": (lambda p: _save(p, x=np.zeros((3, 2))), "no array 'y'"),
    "lengths": (lambda p: _save(p, x=np.zeros((3, 2)), y=np.zeros(4, np.int32)), "3 samples, 'y' has 4"),
    "float-y": (lambda p: _save(p, x=np.zeros((3, 2)), y=np.zeros(3)), "1-D integer labels"),
    "2d-y": (lambda p: _save(p, x=np.zeros((3, 2)), y=np.zeros((3, 1), np.int8)), "1-D integer labels"),
    "scalar-x": (lambda p: _save(p, x=np.float32(1), y=np.zeros(1, np.int8)), "array 'x' must be numeric"),
    "str-x": (lambda p: _save(p, x=np.array(["a"]), y=np.zeros(1, np.int8)), "array 'x' must be numeric"),
    "empty": (lambda p: _save(p, x=np.zeros((0, 2)), y=np.zeros(0, np.int8)), "no samples"),
    "object": (lambda p: _save(p, x=np.array([[1], None], dtype=object), y=np.zeros(2, np.int8)), "not a valid"),
    "npy": (lambda p: np.save(open(p, "wb"), np.zeros(3)), "not an .npz archive"),
    "text": (lambda p: p.write_text("x,y\n1,2\n"), "not a valid .npz"),
    "truncated-zip": (
        lambda p: p.write_bytes(_save(p, x=np.zeros((50, 9)), y=np.zeros(50, np.int8)).read_bytes()[:300]),
        "not a valid .npz",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_NPZ))
def test_load_npz_bad_file(tmp_path, case):
    make, message = BAD_NPZ[case]
    path = tmp_path / "data.npz"
    make(path)
    with pytest.raises(InputError, match=message) as info:
        load_npz(path)
    assert str(path) in str(info.value)


def test_load_npz_missing_file(tmp_path):
    path = tmp_path / "absent.npz"
    with pytest.raises(InputError, match=f"^{path}: no such file$"):
        load_npz(path)


def test_load_npz_directory(tmp_path):
    with pytest.raises(InputError, match="cannot read") as info:
        load_npz(tmp_path)
    assert str(tmp_path) in str(info.value)


# --- bundled models in the real interpreter (LiteRT; tflite-runtime in CI's second run) ----------


@pytest.mark.parametrize("name", MODELS)
def test_bundled_model_accuracy_in_the_interpreter(name):
    x, y = load_npz(bundled("fmnist_test.npz"))
    interp = interpreter_class()(model_path=str(bundled(name)))
    inp = interp.get_input_details()[0]
    assert inp["shape_signature"][0] == -1, "batch dimension must be dynamic"
    shape = [len(x), *inp["shape"][1:]]
    interp.resize_tensor_input(inp["index"], shape)
    interp.allocate_tensors()
    interp.set_tensor(inp["index"], x.reshape(shape).astype(np.float32))
    interp.invoke()
    probs = interp.get_tensor(interp.get_output_details()[0]["index"])
    assert probs.shape == (len(x), 10)
    assert np.mean(probs.argmax(1) == y) > 0.85


def test_bundled_out_of_line_model_matches_inline():
    x, _ = load_npz(bundled("fmnist_val.npz"))
    x = x[:500].reshape(500, 784).astype(np.float32)
    outputs = []
    for name in ("lenet300.tflite", "lenet300_ool.tflite"):
        interp = interpreter_class()(model_content=bundled(name).read_bytes())
        inp = interp.get_input_details()[0]
        interp.resize_tensor_input(inp["index"], x.shape)
        interp.allocate_tensors()
        interp.set_tensor(inp["index"], x)
        interp.invoke()
        outputs.append(interp.get_tensor(interp.get_output_details()[0]["index"]))
    assert np.array_equal(outputs[0], outputs[1])


def test_bundled_out_of_line_model_has_no_inline_weights():
    tflite = pytest.importorskip("tflite")
    raw = bundled("lenet300_ool.tflite").read_bytes()
    model = tflite.Model.GetRootAsModel(raw, 0)
    sizes = [model.Buffers(i).Size() for i in range(model.BuffersLength())]
    assert sorted(sizes)[-3:] == [4 * 10 * 100, 4 * 100 * 300, 4 * 300 * 784]
    for i in range(model.BuffersLength()):
        buf = model.Buffers(i)
        if buf.Size() > 0:
            assert buf.Offset() > 1 and buf.DataLength() == 0
            assert buf.Offset() + buf.Size() <= len(raw)


def test_bundled_shared_model_feeds_one_buffer_to_two_fc_ops():
    tflite = pytest.importorskip("tflite")
    model = tflite.Model.GetRootAsModel(bundled("shared.tflite").read_bytes(), 0)
    graph = model.Subgraphs(0)
    weight_buffers = []
    for i in range(graph.OperatorsLength()):
        op = graph.Operators(i)
        code = model.OperatorCodes(op.OpcodeIndex())
        if max(code.BuiltinCode(), code.DeprecatedBuiltinCode()) == tflite.BuiltinOperator.FULLY_CONNECTED:
            weight_buffers.append(graph.Tensors(op.Inputs(1)).Buffer())
    assert len(weight_buffers) == 3
    assert weight_buffers[0] == weight_buffers[1] != weight_buffers[2]


# --- directories of images -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def garments(tmp_path_factory):
    """Fashion-MNIST test images as PNG and JPEG files: real images, as users have them."""
    from PIL import Image

    x, _ = load_npz(bundled("fmnist_test.npz"))
    d = tmp_path_factory.mktemp("images")
    for i in range(4):
        Image.fromarray(x[i]).save(d / f"{i}.png")
    Image.fromarray(x[4]).save(d / "4.JPG", quality=95)
    (d / "notes.txt").write_text("not an image")
    return d, x[:5]


def test_images_load_sorted_resized_and_normalized(garments):
    d, x = garments
    same = load_images(d, (1, 28, 28, 1), np.float32, "0,1")
    assert same.shape == (5, 28, 28, 1) and same.dtype == np.float32
    assert np.allclose(same[:4, ..., 0], x[:4] / 255, rtol=0, atol=1e-6)
    assert np.max(np.abs(same[4, ..., 0] - x[4] / 255)) < 0.1  # JPEG is lossy
    raw = load_images(d, (1, 28, 28, 1), np.uint8)
    assert raw.dtype == np.uint8 and np.array_equal(raw[:4, ..., 0], x[:4])
    half = load_images(d, (1, 14, 14, 1), np.float32, "-1,1")
    assert half.shape == (5, 14, 14, 1) and -1 <= half.min() and half.max() <= 1


def test_colour_images_with_alpha_feed_a_colour_input(tmp_path):
    from PIL import Image

    rgba = np.zeros((10, 12, 4), np.uint8)
    rgba[..., 0], rgba[..., 3] = 200, 255
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    x = load_images(tmp_path, (1, 5, 6, 3), np.float32, "0,255")
    assert x.shape == (1, 5, 6, 3) and np.allclose(x[..., 0], 200) and np.allclose(x[..., 1:], 0)


@pytest.mark.parametrize("shape, dtype, normalize, words", [
    ((1, 28, 28, 3), np.float32, "0,1", "grayscale image"),
    ((1, 28, 28, 1), np.float32, None, "--normalize"),
    ((1, 28, 28, 1), np.uint8, "0,1", "leave out --normalize"),
    ((1, 784), np.float32, "0,1", "[batch, height, width, 1 or 3]"),
    ((1, 28, 28, 1), np.int8, None, "give an .npz"),
])
def test_images_that_do_not_fit_the_input_are_input_errors(garments, shape, dtype, normalize, words):
    with pytest.raises(InputError, match=re.escape(words)):
        load_images(garments[0], shape, dtype, normalize)


def test_a_directory_without_images_is_an_input_error(tmp_path):
    (tmp_path / "readme.txt").write_text("")
    with pytest.raises(InputError, match="no PNG or JPEG images"):
        load_images(tmp_path, (1, 28, 28, 1), np.float32, "0,1")


def test_an_npz_without_labels_or_with_several_inputs(tmp_path):
    np.savez(tmp_path / "x.npz", x=np.zeros((3, 2)))
    x, y = load_npz(tmp_path / "x.npz", need_labels=False)
    assert y is None and x.shape == (3, 2)
    np.savez(tmp_path / "multi.npz", x0=np.zeros((3, 2)), x1=np.ones((3, 4)))
    x, y = load_npz(tmp_path / "multi.npz", need_labels=False)
    assert y is None and sorted(x) == ["x0", "x1"]
    with pytest.raises(InputError, match="no array 'y'"):
        load_npz(tmp_path / "multi.npz")


def test_data_that_never_moves_an_output_is_named_and_data_that_does_is_not(lenet300, val):
    from pydsz.assess.evaluator import Evaluator
    from pydsz.model.data import unexercised

    x, y = val[0][:64], val[1][:64]
    assert Evaluator(lenet300, x, y, ["fc1"], "output-error").data_note is None
    # one picture 64 times, a gray level up or down here and there: the outputs barely move
    rng = np.random.default_rng(3)
    still = np.repeat(x[:1], 64, axis=0).astype(np.int16) + rng.integers(-1, 2, size=(64, *x.shape[1:]))
    note = Evaluator(lenet300, np.clip(still, 0, 255).astype(np.uint8), y, ["fc1"], "output-error").data_note
    assert note is not None and "barely move" in note and "of their size" in note
    # a quantized output that only ever takes two adjacent values (a silent detector's uint8 score)
    assert "uint8 values 0..1" in unexercised({"score": rng.integers(0, 2, size=(64, 1)).astype(np.uint8)})
    assert unexercised({"score": rng.integers(0, 4, size=(64, 1)).astype(np.uint8)}) is None


# --- groups: each sample's source, which cross-fitting keeps apart ---------------------------------


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 30), min_size=2, max_size=12), seed=st.integers(0, 2**32 - 1),
       names=st.sampled_from(["int", "str"]))
def test_two_halves_keep_each_group_within_one_half_and_balance_them(sizes, seed, names):
    labels = np.repeat(np.arange(len(sizes)), sizes)
    groups = np.random.default_rng(seed).permutation(labels)  # interleaved, as crops drawn photo by photo are
    groups = groups if names == "int" else np.array([f"photo{g}" for g in groups])
    halves = two_halves(len(groups), groups)
    assert sorted(np.concatenate(halves).tolist()) == list(range(len(groups)))  # every sample, once
    assert all(len(h) for h in halves)
    assert not set(groups[halves[0]].tolist()) & set(groups[halves[1]].tolist())
    # the largest first, each to the lighter half: the halves differ by at most one group's samples
    assert abs(len(halves[0]) - len(halves[1])) <= max(sizes)
    assert all(np.array_equal(a, b) for a, b in zip(halves, two_halves(len(groups), groups)))  # seeded


def test_two_halves_without_groups_are_the_seeded_random_split():
    order = np.random.default_rng(0).permutation(64)
    assert [h.tolist() for h in two_halves(64)] == [sorted(order[:32].tolist()), sorted(order[32:].tolist())]


@pytest.mark.parametrize("groups, words", [(np.arange(63), "63 values for 64 samples"),
                                           (np.zeros(64, int), "one group")])
def test_two_halves_refuse_groups_that_do_not_split(groups, words):
    with pytest.raises(InputError, match=words):
        two_halves(64, groups)


def test_an_npz_gives_its_groups_apart_from_its_inputs(tmp_path):
    groups = np.array(["coffee", "astronaut", "coffee", "china"])
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 2)), y=np.arange(4), groups=groups)
    x, y = load_npz(tmp_path / "d.npz")
    assert x.shape == (4, 2) and y.tolist() == [0, 1, 2, 3]
    np.savez(tmp_path / "multi.npz", x0=np.zeros((4, 2)), x1=np.ones((4, 3)), groups=np.arange(4) // 2)
    assert sorted(load_npz(tmp_path / "multi.npz", need_labels=False)[0]) == ["x0", "x1"]  # no input of groups
    assert load_groups(tmp_path / "d.npz", 4).tolist() == groups.tolist()
    assert load_groups(tmp_path / "multi.npz", 4).tolist() == [0, 0, 1, 1]
    np.savez(tmp_path / "plain.npz", x=np.zeros((4, 2)))
    assert load_groups(tmp_path / "plain.npz", 4) is None and load_groups(tmp_path, 4) is None


@pytest.mark.parametrize("groups, words", [
    (np.arange(8.0), "1-D integers or strings"),
    (np.arange(8).reshape(4, 2), "1-D integers or strings"),
    (np.arange(3), "3 values for 4 samples"),
    (np.zeros(4, int), "all 4 samples in one group"),
])
def test_groups_that_cannot_split_the_data_are_input_errors_naming_the_file(tmp_path, groups, words):
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 2)), groups=groups)
    with pytest.raises(InputError, match=words) as e:
        load_groups(tmp_path / "d.npz", 4)
    assert "d.npz" in str(e.value) and "'groups'" in str(e.value)
