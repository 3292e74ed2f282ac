"""Model updates (issue 38): dsz diff codes a new model against the one a device holds as it decodes
it, within a budget measured on the patched model; dsz patch and pydsz.patch apply it, refusing a
wrong base, a damaged update or one of another model before anything is written; the device's bytes
are the server's, over a chain of updates too; every patched weight is within its layer's bound."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pydsz
from pydsz.budget.rule import Budget
from pydsz.compress.compensation import Compensation
from pydsz.compress.diff import _entries, _patched, diff
from pydsz.errors import FormatError, InputError
from pydsz.format import delta
from pydsz.format.update import Update, held_model, patch
from pydsz.model.data import bundled
from pydsz.model.graph import TFLiteModel

ROOT = Path(__file__).resolve().parents[1]
EDGE = ROOT / "edge_demo"


def dsz(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pydsz.cli", *map(str, args)], capture_output=True, text=True)


def one_line_error(result, *words):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("dsz: error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]


def moved(model: TFLiteModel, layers, scale: float, seed: int) -> bytes:
    """The model with the layers' weights moved by `scale` of their RMS, as a fine-tuning moves them."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in layers:
        w = model.weight(name)
        out[name] = (w + scale * np.sqrt(np.mean(w * w)) * rng.standard_normal(w.shape)).astype(np.float32)
    return model.replace(out)


def within_bounds(result, new: bytes) -> None:
    """Every weight the update coded is within its layer's bound of the new model's."""
    patched, target = TFLiteModel(result.patched), TFLiteModel(new)
    for layer in result.layers:
        if layer.kind in ("delta", "dense", "sparse"):
            gap = np.abs(patched.weight(layer.name).astype(np.float64) - target.weight(layer.name)).max()
            assert gap <= layer.bound, (layer.name, gap, layer.bound)
        elif layer.kind in ("unchanged", "lossless"):
            assert np.array_equal(patched.weight(layer.name), target.weight(layer.name))


@pytest.fixture(scope="module")
def held(lenet300) -> bytes:
    """What the device holds: LeNet-300-100 packed at 0.01."""
    return pydsz.pack_model(lenet300, 0.01)


@pytest.fixture(scope="module")
def head_update(lenet300_model, held, val):
    """The head (fc2, fc3) moved by 10% of its scale, the update from the held .dsz to it."""
    new = moved(lenet300_model, ("fc2", "fc3"), 0.1, 0)
    x, y = val
    return new, diff(held_model(held), new, x, y, Budget("top1", 0.01))


@pytest.mark.slow
@pytest.mark.parametrize("compensate", [True, False])
def test_update_applies_to_the_servers_bytes_within_budget_and_bounds(held, head_update, lenet300_model, val,
                                                                      compensate):
    new, result = head_update if compensate else (head_update[0], diff(
        held_model(held), head_update[0], *val, Budget("top1", 0.01), compensation=Compensation(enabled=False)))
    assert patch(held, result.update) == result.patched
    assert result.loss <= 0.01
    x, y = val
    from pydsz.model.runtime import accuracy

    assert accuracy(new, x, y) - accuracy(result.patched, x, y) <= 0.01
    if compensate:
        # the bound holds on the values stored: the held values plus a compensated difference on its grid
        base, patched = TFLiteModel(held_model(held)), TFLiteModel(result.patched)
        coded = [l for l in result.layers if l.kind == "delta"]
        assert coded
        for l in coded:
            w, b = patched.weight(l.name), base.weight(l.name)
            assert np.array_equal(delta.decode(delta.encode(w, b, l.bound), b), w)
    else:
        within_bounds(result, new)
    # a fraction of shipping the whole model again at the base's bound
    assert len(result.update) < len(held) / 3
    assert {l.name for l in result.layers} == {"fc1", "fc2", "fc3"}


def test_an_unchanged_model_costs_a_few_hundred_bytes(lenet300):
    result = diff(lenet300, lenet300, np.zeros((4, 28, 28), np.uint8), None, Budget("output-error", 0.01))
    assert len(result.update) < 400
    assert [l.kind for l in result.layers] == ["unchanged"] * 3
    assert patch(lenet300, result.update) == lenet300


def test_a_layer_whose_zeros_change_goes_afresh_and_keeps_them(lenet300_model, lenet300):
    # fc1 pruned in the new model: a difference cannot bring a zero back exactly, its new values go afresh
    w = lenet300_model.weight("fc1").copy()
    w[np.abs(w) < np.quantile(np.abs(w), 0.8)] = 0
    new = lenet300_model.replace({"fc1": w})
    result = diff(lenet300, new, np.random.default_rng(0).integers(0, 255, (64, 28, 28), np.uint8), None,
                  Budget("output-error", 0.01))
    kinds = {l.name: l.kind for l in result.layers}
    assert kinds["fc1"] in ("sparse", "dense", "lossless", "whole") and kinds["fc2"] == "unchanged"
    patched = TFLiteModel(result.patched).weight("fc1")
    assert np.array_equal(patched == 0, w == 0)
    assert patch(lenet300, result.update) == result.patched


@pytest.mark.slow
def test_a_chain_of_five_updates_ends_on_the_servers_bytes_without_drift(lenet300_model, held, val):
    x, y = val[0][:500], None
    budget = Budget("output-error", 0.01)
    device, server, new = held, held_model(held), None
    current = lenet300_model
    for step in range(5):
        new = moved(current, ("fc1", "fc2", "fc3"), 0.05, step)
        result = diff(server, new, x, y, budget)
        device = patch(device, result.update)  # the device keeps the .tflite it patched
        assert device == result.patched
        assert result.loss <= 0.01
        server, current = result.patched, TFLiteModel(new)
    # the fifth patched model against the fifth model, measured afresh: within the budget, no drift
    from pydsz.assess.evaluator import Evaluator

    evaluator = Evaluator(new, x, y, [], budget.metric)
    assert evaluator.measure_model(device).loss / evaluator.samples <= 0.01


@pytest.mark.slow
def test_an_unrelated_model_costs_no_more_than_its_whole_dsz_and_a_header(lenet300_model, lenet300, val):
    rng = np.random.default_rng(3)
    new = lenet300_model.replace({n: rng.permutation(lenet300_model.weight(n).reshape(-1)).reshape(
        lenet300_model.weight(n).shape) for n in ("fc1", "fc2", "fc3")})
    x, y = val[0][:500], val[1][:500]
    result = diff(lenet300, new, x, y, Budget("top1", 0.01))
    whole = pydsz.compress_model(new, x, y, Budget("top1", 0.01)).dsz
    assert len(result.update) <= len(whole) + 512
    assert patch(lenet300, result.update) == result.patched


def test_a_new_graph_is_refused(lenet300, lenet5, val):
    with pytest.raises(InputError, match="graph differs.*dsz compress"):
        diff(lenet300, lenet5, val[0][:10], val[1][:10], Budget("top1", 0.01))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2 ** 32 - 1), scale=st.sampled_from([1e-4, 1e-2, 1.0, 1e3, 1e6]),
       change=st.sampled_from([0.0, 1e-3, 0.1, 1.0, 100.0]), relative=st.floats(1e-4, 2.0))
def test_every_patched_value_is_within_its_bound(seed, scale, change, relative):
    # held and new weights of any scale, any change between them, any bound: the update's values
    # (a difference added in float32 on the device, or the values afresh) are all within it
    rng = np.random.default_rng(seed)
    shared = TFLiteModel(bundled("shared.tflite").read_bytes())
    layers = {l.buffer: l for l in reversed(shared.layers(("fc",))) if l.compressible}.values()
    held = {l.name: (scale * rng.standard_normal(l.shape)).astype(np.float32) for l in layers}
    new = {n: (w + change * scale * rng.standard_normal(w.shape)).astype(np.float32) for n, w in held.items()}
    held_bytes, new_bytes = shared.replace(held), shared.replace(new)
    bounds = {n: relative * scale for n in new}
    entries, _ = _entries(TFLiteModel(held_bytes), TFLiteModel(new_bytes), TFLiteModel(new_bytes), bounds, held)
    patched = TFLiteModel(_patched(held_bytes, new_bytes, entries))
    for e in entries:
        gap = np.abs(patched.weight(e.name).astype(np.float64) - new[e.name]).max()
        assert gap <= bounds[e.name], (e.name, e.kind, gap, bounds[e.name])


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), n=st.integers(1, 3000), scale=st.floats(1e-6, 1e6),
       change=st.floats(0.0, 10.0), relative=st.floats(1e-8, 10.0))
def test_a_difference_decodes_within_its_bound_of_the_target(seed, n, scale, change, relative):
    # the device adds the decoded difference to its float32 values: every sum within the bound, or no
    # stream at all where the bound is within a few ulps of the weights (such a layer goes afresh)
    rng = np.random.default_rng(seed)
    base = (scale * rng.standard_normal(n)).astype(np.float32)
    target = (base + scale * change * rng.standard_normal(n)).astype(np.float32)
    bound = relative * scale
    stream = delta.encode(target, base, bound)
    largest = max(np.abs(base).max(), np.abs(target).max())
    if stream is None:
        assert bound <= 8 * np.spacing(np.float32(largest))
    else:
        out = delta.decode(stream, base)
        assert np.all(np.abs(out.astype(np.float64) - target) <= bound)


# ---- the command line, the device's side, untrusted updates


@pytest.fixture(scope="module")
def files(tmp_path_factory, held, head_update, val):
    folder = tmp_path_factory.mktemp("updates")
    new, _ = head_update
    (folder / "held.dsz").write_bytes(held)
    (folder / "new.tflite").write_bytes(new)
    np.savez(folder / "val.npz", x=val[0][:500], y=val[1][:500])
    return folder


@pytest.mark.slow
def test_dsz_diff_and_patch(files):
    r = dsz("diff", files / "held.dsz", files / "new.tflite", "--data", files / "val.npz", "--max-loss", "0.01",
            "-o", files / "u.dszu")
    assert r.returncode == 0, r.stderr
    assert "coded as" in r.stdout and "wrote" in r.stdout
    update = Update((files / "u.dszu").read_bytes())
    for out in ("new_patched.tflite", "new_patched.dsz"):
        r = dsz("patch", files / "held.dsz", files / "u.dszu", "-o", files / out)
        assert r.returncode == 0, r.stderr
    patched = (files / "new_patched.tflite").read_bytes()
    assert hashlib.sha256(patched).digest() == update.result_sha256
    # the .dsz the device may keep instead decodes to the same bytes, the base of the next update
    assert pydsz.load(files / "new_patched.dsz").tflite_bytes() == patched
    assert patch(files / "new_patched.dsz", diff(
        patched, patched, np.zeros((2, 28, 28), np.uint8)).update) == patched


def test_patch_refuses_a_wrong_base_before_writing(files, lenet300):
    diffed = diff(held_model(files / "held.dsz"), lenet300, np.zeros((2, 28, 28), np.uint8), None,
                  Budget("output-error", 0.01))
    (files / "other.dszu").write_bytes(diffed.update)
    r = dsz("patch", bundled("lenet300.tflite"), files / "other.dszu", "-o", files / "wrong.tflite")
    one_line_error(r, "another model than the base given")
    assert not (files / "wrong.tflite").exists()
    with pytest.raises(FormatError, match="another model"):
        patch(bundled("lenet300.tflite"), diffed.update)


@pytest.mark.parametrize("damage", ["truncated", "flipped", "empty", "a .dsz"])
def test_patch_refuses_a_damaged_update_in_one_line(files, held, damage):
    good = diff(held_model(held), held_model(held), np.zeros((2, 28, 28), np.uint8)).update
    data = {"truncated": good[:-7], "flipped": good[:60] + bytes([good[60] ^ 4]) + good[61:], "empty": b"",
            "a .dsz": held}[damage]
    (files / "bad.dszu").write_bytes(data)
    r = dsz("patch", files / "held.dsz", files / "bad.dszu", "-o", files / "bad.tflite")
    one_line_error(r, "bad.dszu")
    assert not (files / "bad.tflite").exists()


def test_diff_refuses_another_graph_and_an_output_over_an_input(files):
    r = dsz("diff", files / "held.dsz", bundled("lenet5.tflite"), "--data", files / "val.npz", "-o", files / "x.dszu")
    one_line_error(r, "graph differs")
    assert not (files / "x.dszu").exists()
    r = dsz("patch", files / "held.dsz", files / "held.dsz", "-o", files / "held.dsz")
    one_line_error(r, "held.dsz")
    assert pydsz.load(files / "held.dsz")  # untouched


def test_the_edge_demo_update_applies_as_recorded():
    # a frozen update (bench/builders/edge_update.py) of the edge demo's LeNet-5: the format as shipped
    update = Update((EDGE / "lenet5-update.dszu").read_bytes())
    patched = patch(EDGE / "lenet5.dsz", update)
    assert hashlib.sha256(patched).hexdigest() == (EDGE / "lenet5-update.sha256").read_text().split()[0]
    assert len(EDGE.joinpath("lenet5-update.dszu").read_bytes()) < os.path.getsize(EDGE / "lenet5.dsz") / 5


def test_a_rest_asking_for_a_huge_window_is_refused_not_allocated(lenet300):
    # found by fuzzing (tests/fuzz_load.py): a rest frame declaring a 2 GiB window made zstandard
    # allocate it (MemoryError); the window is now capped at what the base and the result need
    import struct
    import zlib

    import zstandard

    good = diff(lenet300, lenet300, np.zeros((2, 28, 28), np.uint8)).update
    params = zstandard.ZstdCompressionParameters(window_log=31, write_content_size=False, write_checksum=True)
    chunker = zstandard.ZstdCompressor(compression_params=params).compressobj()
    rest = chunker.compress(lenet300) + chunker.flush()
    head = bytearray(good[:104])
    struct.pack_into("<Q", head, 88, len(rest))
    body = bytes(head) + struct.pack("<I", zlib.crc32(head)) + rest
    bad = body + struct.pack("<I", zlib.crc32(body))
    with pytest.raises(FormatError, match="rest does not decompress"):
        patch(lenet300, bad)


def test_a_layer_moved_farther_than_its_scale_goes_afresh_as_assessed(lenet300_model, lenet300):
    # held values far from the new ones (the layer retrained to a tenth of its scale): its values
    # afresh are smaller than the difference, and the update stores the candidate the assessment measured
    from pydsz.assess.evaluator import Evaluator
    from pydsz.encode.tensor import DELTA, encode_update

    rng = np.random.default_rng(5)
    w = lenet300_model.weight("fc2")
    small = (0.1 * w + 0.001 * rng.standard_normal(w.shape)).astype(np.float32)
    stream, kind, _ = encode_update(small, w, 0.002)
    assert kind is not DELTA and stream == encode_update(small, None, 0.002)[0]
    stream, kind, _ = encode_update(w + np.float32(1e-3), w, 0.002)
    assert kind is DELTA
    new = lenet300_model.replace({"fc2": small})
    evaluator = Evaluator(new, np.zeros((4, 28, 28), np.uint8), None, ["fc2"], "output-error")
    evaluator.predict_from({"fc2": w})
    entries, _ = _entries(TFLiteModel(lenet300), TFLiteModel(new), TFLiteModel(new), {"fc2": 0.002}, {"fc2": w})
    assert entries[0].kind in ("dense", "sparse") and entries[0].stream == evaluator.encode("fc2", 0.002)[0]
