"""The GPU path: device selection and the numpy reference everywhere; the kernels (marked gpu)
where pycuda and a CUDA device are present, against the CPU answers they must reproduce.

Bit-identity with the numpy reference is asserted where the kernels guarantee it: quantization codes,
reconstruction and Adam are elementwise float32 operations in the reference's order (no sum whose
association the hardware picks); sums (the tail's matrix products) are compared within a bound."""

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pydsz.context import Run
from pydsz.errors import InputError
from pydsz.gpu import device, reference

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- device selection (no GPU needed)

def test_resolve_cpu_is_always_cpu():
    assert device.resolve("cpu") == "cpu"


def test_resolve_auto_falls_back_to_cpu_without_gpu(monkeypatch):
    monkeypatch.setattr(device, "missing", lambda: "no CUDA device is present")
    assert device.resolve("auto") == "cpu"


def test_resolve_gpu_without_pycuda_says_how_to_install(monkeypatch):
    monkeypatch.setattr(device, "missing", lambda: "pycuda is not installed (pip install pydsz[gpu])")
    with pytest.raises(InputError, match=r"pip install pydsz\[gpu\]"):
        device.resolve("gpu")


def test_resolve_gpu_without_device_says_so(monkeypatch):
    monkeypatch.setattr(device, "missing", lambda: "no CUDA device is present")
    with pytest.raises(InputError, match="no CUDA device"):
        device.resolve("gpu")


def test_resolve_rejects_unknown_device():
    with pytest.raises(InputError, match="cpu, gpu, auto"):
        device.resolve("tpu")


def test_available_never_raises():
    assert device.available() in (True, False)


# ---------------------------------------------------------------- the numpy reference vs libdsz

def _awkward_values(eb: float, rng) -> np.ndarray:
    """Values that catch rounding differences: half steps, near-radius codes, tiny, huge, NaN/Inf."""
    step = 2 * eb
    k = rng.integers(-3000, 3000, 2000)
    half = ((k + 0.5) * step).astype(np.float32)
    nudged = np.concatenate([np.nextafter(half, np.float32(np.inf)), np.nextafter(half, np.float32(-np.inf))])
    edge = (np.array([32766.4, 32766.6, 32767.0, -32766.4, -32767.5]) * step).astype(np.float32)
    tiny = np.array([eb / 3, -eb / 3, eb, -eb, 1e-45, -1e-45, 1e-38], np.float32)
    odd = np.array([np.nan, np.inf, -np.inf, 3e38, -3e38], np.float32)
    normal = (rng.standard_normal(20000) * 40 * eb).astype(np.float32)
    return np.concatenate([half, nudged, edge, tiny, odd, normal])


BOUNDS = [1e-4, 1e-3, 3.7e-3, 1e-2]


def _libdsz_quantizer(tmp_path):
    """libdsz/src/quantize.c compiled alone, called through ctypes (its internal dszi_quantize)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    lib = tmp_path / "libquant.so"
    subprocess.run([cc, "-O2", "-std=c99", "-shared", "-fPIC", "-ffp-contract=off", "-I", str(ROOT / "libdsz/include"),
                    "-I", str(ROOT / "libdsz/src"), str(ROOT / "libdsz/src/quantize.c"), str(ROOT / "libdsz/src/dtype.c"), "-o", str(lib)], check=True)
    return ctypes.CDLL(str(lib))


class _Quant(ctypes.Structure):  # dszi_quant in libdsz/src/common.h
    _fields_ = [("eb", ctypes.c_double), ("step", ctypes.c_double), ("inv", ctypes.c_double),
                ("radius", ctypes.c_uint), ("keepNonzero", ctypes.c_int), ("dtype", ctypes.c_uint)]
DTYPE_FLOAT32 = 1  # DSZ_DTYPE_FLOAT32 in libdsz/include/dsz.h


@pytest.mark.parametrize("keep_nonzero", [True, False])
def test_reference_codes_are_libdsz_codes(tmp_path, keep_nonzero):
    lib = _libdsz_quantizer(tmp_path)
    rng = np.random.default_rng(1)
    for eb in BOUNDS:
        x = _awkward_values(eb, rng)
        q = _Quant()
        lib.dszi_quant_init(ctypes.byref(q), ctypes.c_double(eb), ctypes.c_uint(32768), ctypes.c_int(keep_nonzero),
                           ctypes.c_uint(DTYPE_FLOAT32))
        sym = np.zeros(x.size, np.uint32)
        outl = np.zeros(x.size, np.uint32)
        hist = np.zeros(2 * 32768, np.uint64)
        nout = lib.dszi_quantize(ctypes.byref(q), ctypes.c_uint(0), x.ctypes.data_as(ctypes.c_void_p),
                                ctypes.c_size_t(x.size), sym.ctypes.data_as(ctypes.c_void_p),
                                outl.ctypes.data_as(ctypes.c_void_p), hist.ctypes.data_as(ctypes.c_void_p))
        ref_sym, ref_outl, ref_hist = reference.quantize(x, eb, keep_nonzero=keep_nonzero)
        np.testing.assert_array_equal(ref_sym, sym)
        assert ref_outl.view(np.uint32).tolist() == outl[:nout].tolist()
        np.testing.assert_array_equal(ref_hist, hist)


def _pruned(rng, shape, sparsity, scale=0.05):
    w = (rng.standard_normal(shape) * scale).astype(np.float32)
    w[np.abs(w) < np.quantile(np.abs(w), sparsity)] = 0
    return w


def test_reference_reconstruction_is_the_decoders():
    codec = pytest.importorskip("pydsz.format.codec")
    rng = np.random.default_rng(2)
    w = _pruned(rng, (64, 300), 0.9)
    for eb in BOUNDS:
        decoded = codec.decode_sparse(codec.encode_sparse(w, eb, predictor="none"))
        index = np.flatnonzero(w)
        _, recon = reference.quantize_values(w.reshape(-1)[index], eb)
        expected = np.zeros(w.size, np.float32)
        expected[index] = recon
        np.testing.assert_array_equal(np.asarray(decoded).reshape(-1).view(np.uint32), expected.view(np.uint32))


def test_estimate_bytes_is_entropy_plus_outliers():
    hist = np.zeros(8, np.uint64)
    hist[[0, 3, 4, 5, 6]] = [2, 2, 2, 1, 1]  # 8 symbols: 3 x 2/8 and 2 x 1/8, plus symbol 0 twice
    bits = 3 * 2 * 2 + 2 * 1 * 3
    assert reference.estimate_bytes(hist) == -(-bits // 8) + 4 * 2
    assert reference.estimate_bytes(np.zeros(8)) == 0


def test_reference_correct_is_prunes_count():
    trainer = pytest.importorskip("pydsz.prune.train")
    rng = np.random.default_rng(3)
    layers = [trainer.Dense("fc1", _pruned(rng, (32, 50), 0.5), rng.standard_normal(32).astype(np.float32), "RELU"),
              trainer.Dense("fc2", _pruned(rng, (10, 32), 0.5), rng.standard_normal(10).astype(np.float32), "NONE")]
    h = rng.standard_normal((500, 50)).astype(np.float32)
    y = rng.integers(0, 10, 500)
    assert reference.correct(reference.plan(layers), h, y) == trainer.count_correct(layers, h, y)


def test_reference_sweep_rejects_unknown_layer():
    rng = np.random.default_rng(4)
    layers = _tail(rng, (20, 10, 5))
    with pytest.raises(InputError, match="no layer 'fc9'"):
        reference.sweep(layers, rng.standard_normal((8, 20)), np.zeros(8, int), {"fc9": [1e-3]})


# ---------------------------------------------------------------- the kernels (need a GPU)

@pytest.fixture(scope="module")
def gpu():
    pytest.importorskip("pycuda")
    if not device.available():
        pytest.skip(f"no GPU: {device.missing()}")
    from pydsz.gpu import _cuda

    _cuda.module()  # compile once; a compile error fails here, loudly
    return _cuda


def _tail(rng, widths, sparsity=0.9):
    from types import SimpleNamespace

    acts = ["RELU"] * (len(widths) - 2) + ["NONE"]
    return [SimpleNamespace(name=f"fc{i + 1}", weight=_pruned(rng, (o, n), sparsity, 1 / np.sqrt(n)),
                            bias=(rng.standard_normal(o) * 0.1).astype(np.float32), activation=a)
            for i, (n, o, a) in enumerate(zip(widths, widths[1:], acts))]


@pytest.mark.gpu
@pytest.mark.parametrize("keep_nonzero", [True, False])
def test_gpu_codes_identical(gpu, keep_nonzero):
    from pydsz.gpu import quantize

    rng = np.random.default_rng(5)
    for eb in BOUNDS + [1e-30, 1e30]:
        x = _awkward_values(eb if eb < 1 else 1e-3, rng)
        sym, outl, hist = quantize.quantize(x, eb, keep_nonzero=keep_nonzero)
        ref_sym, ref_outl, ref_hist = reference.quantize(x, eb, keep_nonzero=keep_nonzero)
        np.testing.assert_array_equal(sym, ref_sym)
        np.testing.assert_array_equal(outl.view(np.uint32), ref_outl.view(np.uint32))
        np.testing.assert_array_equal(hist, ref_hist)


@pytest.mark.gpu
def test_gpu_histograms_of_many_bounds(gpu):
    from pydsz.gpu import quantize

    rng = np.random.default_rng(6)
    x = (rng.standard_normal(300_000) * 0.05).astype(np.float32)  # codes beyond the shared window at 1e-5
    bounds = [1e-5, 1e-4, 1e-3, 1e-2, 1e-1]
    hists = quantize.histograms(x, bounds)
    for eb, hist in zip(bounds, hists):
        np.testing.assert_array_equal(hist, reference.quantize(x, eb)[2])
    assert quantize.estimated_sizes(x, bounds) == [reference.estimate_bytes(reference.quantize(x, eb)[2])
                                                   for eb in bounds]


@pytest.mark.gpu
def test_gpu_reconstruction_is_the_decoders(gpu):
    from pydsz.gpu import quantize

    codec = pytest.importorskip("pydsz.format.codec")
    rng = np.random.default_rng(7)
    w = _pruned(rng, (300, 257), 0.9)
    for eb in BOUNDS:
        decoded = np.asarray(codec.decode_sparse(codec.encode_sparse(w, eb, predictor="none")), np.float32)
        np.testing.assert_array_equal(quantize.reconstruct(w, eb).view(np.uint32), decoded.view(np.uint32))


@pytest.mark.gpu
def test_gpu_codes_give_the_encoders_bytes(gpu):
    """The encoder's data section is a function of the symbol sequence and the outliers: equal
    codes give equal bytes; check the codes on the very values the sparse encoder quantizes."""
    from pydsz.gpu import quantize

    codec = pytest.importorskip("pydsz.format.codec")
    rng = np.random.default_rng(8)
    w = _pruned(rng, (128, 200), 0.91)
    values = w.reshape(-1)[np.flatnonzero(w)]
    for eb in BOUNDS:
        sym, outl, hist = quantize.quantize(values, eb)
        ref_sym, ref_outl, _ = reference.quantize(values, eb)
        np.testing.assert_array_equal(sym, ref_sym)
        np.testing.assert_array_equal(outl.view(np.uint32), ref_outl.view(np.uint32))
        info = codec.sparse_info(codec.encode_sparse(w, eb, predictor="none"))
        assert info["nnz"] == values.size


@pytest.mark.gpu
@pytest.mark.parametrize("rows,cols,k", [(300, 130, 77), (257, 1000, 256), (1, 1, 1), (129, 4096, 9216 // 8)])
def test_gpu_dense_layer_matches_numpy(gpu, rows, cols, k):
    rng = np.random.default_rng(9)
    a = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((cols, k)).astype(np.float32)
    b = rng.standard_normal(cols).astype(np.float32)
    out = gpu.empty(rows * cols)
    gpu.gemm(gpu.to_gpu(a), gpu.to_gpu(w), out, rows, cols, k, bias=gpu.to_gpu(b), act=gpu.activation_code("relu"))
    expected = np.maximum(a @ w.T + b, 0)
    np.testing.assert_allclose(out.get().reshape(rows, cols), expected, rtol=1e-4, atol=1e-4 * np.sqrt(k))


@pytest.mark.gpu
def test_gpu_top1_counts_like_numpy_argmax(gpu):
    rng = np.random.default_rng(10)
    scores = rng.integers(0, 3, (1000, 37)).astype(np.float32)  # many ties: the first maximum wins
    scores[5, 7] = np.nan
    y = rng.integers(0, 37, 1000)
    y[:200] = np.argmax(scores[:200], axis=1)
    expected = np.argmax(scores, axis=1) == y
    counter = gpu.zeros(1, np.uint64)
    hits = gpu.zeros(1000, np.uint8)
    gpu.top1_count(gpu.to_gpu(scores), 1000, 37, gpu.to_gpu(y, np.int32), counter=counter, hits=hits)
    assert int(counter.get()[0]) == int(np.sum(expected))
    np.testing.assert_array_equal(hits.get().astype(bool), expected)
    # rows from an offset: the label and hit pointers move together
    counter.fill(0)
    gpu.top1_count(gpu.to_gpu(scores[600:]), 400, 37, gpu.to_gpu(y, np.int32), 600, counter=counter, hits=hits)
    assert int(counter.get()[0]) == int(np.sum(expected[600:]))
    np.testing.assert_array_equal(hits.get().astype(bool), expected)


def _numpy_tail(rng, widths):
    """A pydsz.model.tail.Tail of dense layers and a final softmax, as Tail.from_model builds one."""
    from pydsz.model.tail import Step, Tail

    layers = _tail(rng, widths)
    steps = [Step("fc", "FULLY_CONNECTED", name=l.name, activation=l.activation, shape=(l.weight.shape[0],))
             for l in layers] + [Step("softmax", "SOFTMAX", shape=(widths[-1],))]
    return Tail(0, (widths[0],), 1, steps, {l.name: l.weight for l in layers}, {l.name: l.bias for l in layers})


@pytest.mark.gpu
def test_gpu_tail_hits_match_numpy(gpu):
    from pydsz.gpu.evaluate import TailHits

    rng = np.random.default_rng(14)
    tail = _numpy_tail(rng, (300, 200, 100, 10))
    h = np.maximum(rng.standard_normal((5000, 300)), 0).astype(np.float32)
    y = np.argmax(tail.forward(h), axis=1)
    y[::7] = rng.integers(0, 10, len(y[::7]))
    hits = TailHits(tail, h, y, chunk=2000)  # several chunks, a partial last one
    noisy = {name: w + (w != 0) * rng.standard_normal(w.shape).astype(np.float32) * 0.02
             for name, w in tail.weights.items()}
    for weights in ({}, {"fc2": noisy["fc2"]}, {"fc1": noisy["fc1"], "fc3": noisy["fc3"]}):
        expected = np.argmax(tail.forward(h, weights), axis=1) == y
        got = hits.hits(weights)
        assert got.dtype == bool and got.shape == expected.shape
        assert np.sum(got != expected) <= 1e-3 * len(y)  # float summation order may flip a near tie
    with pytest.raises(InputError, match="shape"):
        hits.hits({"fc1": np.zeros((3, 3), np.float32)})
    with pytest.raises(InputError, match="10 classes"):
        TailHits(tail, h, np.full(len(h), 10))


def _dense_layers(trainer, rng):
    """A small half-pruned tail as pydsz.prune.train trains it (train.Dense layers)."""
    return [trainer.Dense(l.name, l.weight, l.bias, l.activation) for l in _tail(rng, (50, 40, 10), 0.5)]


@pytest.mark.gpu
def test_gpu_forward_matches_numpy(gpu):
    trainer = pytest.importorskip("pydsz.prune.train")
    from pydsz.gpu import train

    rng = np.random.default_rng(15)
    layers = _dense_layers(trainer, rng)
    h = rng.standard_normal((7000, 50)).astype(np.float32)
    np.testing.assert_allclose(train.forward(layers, h, chunk=3000), trainer.forward(layers, h), rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_gpu_first_call_may_be_an_upload(gpu):
    """In a fresh process nothing has compiled the kernels yet: dsz prune --device gpu's first GPU call is
    the teacher's forward, which uploads weights first (a real H200 refused that with "invalid device
    context" until the upload made the context current)."""
    import os
    import sys

    script = ("import numpy as np\n"
              "from types import SimpleNamespace as L\n"
              "from pydsz.gpu import train\n"
              "w = np.eye(3, dtype=np.float32)\n"
              "print(train.forward([L(name='fc1', weight=w, bias=np.zeros(3, np.float32), activation='NONE')],\n"
              "                    np.arange(6, dtype=np.float32).reshape(2, 3)).tolist())\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=dict(os.environ),
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]"


@pytest.mark.gpu
def test_gpu_running_mean_is_numpys(gpu):
    rng = np.random.default_rng(16)
    a = rng.standard_normal(1000).astype(np.float32)
    a_gpu = gpu.to_gpu(a)
    for k in range(1, 6):
        p = rng.standard_normal(1000).astype(np.float32)
        a += (p - a) / k
        p_gpu = gpu.to_gpu(p)  # held: a pointer alone does not keep the device memory alive
        gpu.kernel("dsz_running_mean")(gpu.ptr(a_gpu), gpu.ptr(p_gpu), np.int64(1000), np.float32(k),
                                       block=(gpu.THREADS, 1, 1), grid=(gpu.blocks(1000), 1))
        np.testing.assert_array_equal(a_gpu.get().view(np.uint32), a.view(np.uint32))


@pytest.mark.gpu
def test_gpu_sweep_matches_cpu(gpu):
    from pydsz.gpu import sweep

    rng = np.random.default_rng(11)
    layers = _tail(rng, (300, 200, 100, 10))
    h = np.maximum(rng.standard_normal((10_000, 300)), 0).astype(np.float32)
    y = np.argmax(reference.run(reference.plan(layers), h), axis=1)
    y[::7] = rng.integers(0, 10, len(y[::7]))
    bounds = {name: [1e-3, 5e-3, 1e-2, 3e-2, 1e-1] for name in ("fc1", "fc2", "fc3")}
    cpu = reference.sweep(layers, h, y, bounds)
    gpu_points = sweep.sweep(layers, h, y, bounds, chunk=3000)  # several chunks, a partial last one
    for name in bounds:
        for c, g in zip(cpu[name], gpu_points[name]):
            assert (g.layer, g.bound, g.est_bytes, g.outliers) == (c.layer, c.bound, c.est_bytes, c.outliers)
            assert abs(g.correct - c.correct) / len(y) <= 1e-4, (name, c, g)


@pytest.mark.gpu
def test_gpu_adam_step_is_numpys_and_keeps_the_mask(gpu):
    trainer = pytest.importorskip("pydsz.prune.train")
    from pydsz.gpu import train

    rng = np.random.default_rng(12)
    p = rng.standard_normal((64, 33)).astype(np.float32)
    mask = rng.random((64, 33)) > 0.9
    p *= mask
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    opt = trainer._Adam()
    expected = p.copy()
    for t in range(1, 4):
        grad = rng.standard_normal(p.shape).astype(np.float32)
        opt.t = t
        g = grad.copy()
        g *= mask
        opt.step("w", expected, g, 1e-3 * (1 - t / 10))
        expected *= mask
        p, m, v = train.adam_step(p, grad, (m, v), mask, t, 1e-3 * (1 - t / 10))
        np.testing.assert_array_equal(p.view(np.uint32), expected.view(np.uint32))
        assert not np.any(p[~mask])


@pytest.mark.gpu
def test_gpu_gradients_match_numpy(gpu):
    trainer = pytest.importorskip("pydsz.prune.train")
    from pydsz.gpu import train

    rng = np.random.default_rng(13)
    layers = _dense_layers(trainer, rng)
    x = rng.standard_normal((128, 50)).astype(np.float32)
    # the labels' one-hot mixed with a teacher's softmax, as retraining with distillation makes them
    target = 0.4 * np.eye(10, dtype=np.float32)[rng.integers(0, 10, 128)] + 0.6 * trainer._softmax(
        rng.standard_normal((128, 10)).astype(np.float32))
    for (gw, gb), (ew, eb) in zip(train.gradients(layers, x, target), trainer._gradients(layers, x, target)):
        np.testing.assert_allclose(gw, ew, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(gb, eb, rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
def test_gpu_retrain_matches_numpy(gpu):
    """pydsz.prune.train.retrain's loop on GpuSteps against NumpySteps: gradual pruning, distillation and the
    running mean; the same sparsity exactly, the weights equal up to float summation order."""
    trainer = pytest.importorskip("pydsz.prune.train")

    rng = np.random.default_rng(17)
    layers = [trainer.Dense(l.name, l.weight * 4, l.bias, l.activation) for l in _tail(rng, (30, 40, 10), 0.0)]
    h = (rng.standard_normal((640, 30)) * 3).astype(np.float32)
    y = np.argmax(trainer.forward(layers, h), axis=1)
    settings, kw = trainer.Retraining(epochs=2, distill=0.5), dict(targets={"fc1": 0.8}, teacher=layers)
    cpu = trainer.retrain(layers, {}, h, y, settings, run=Run(device="cpu"), **kw)
    gpu_layers = trainer.retrain(layers, {}, h, y, settings, run=Run(device="gpu"), **kw)
    for c, g in zip(cpu, gpu_layers):
        assert np.count_nonzero(g.weight) == np.count_nonzero(c.weight)
        assert np.mean((g.weight != 0) == (c.weight != 0)) >= 0.99  # a magnitude tie may break differently
        both = (g.weight != 0) & (c.weight != 0)
        np.testing.assert_allclose(g.weight[both], c.weight[both], rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(g.bias, c.bias, rtol=1e-3, atol=1e-4)
    assert abs(trainer.count_correct(gpu_layers, h, y, device="gpu") - trainer.count_correct(gpu_layers, h, y)) <= 1
