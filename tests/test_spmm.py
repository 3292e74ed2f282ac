"""Pruned layers multiplied by their non-zeros: libdsz's CSR kernel, pydsz.model.sparse and the tail that uses it."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydsz import _core
from pydsz.assess.evaluator import Evaluator
from pydsz.assess.tasks import measure_point
from pydsz.encode.tensor import encode_weight
from pydsz.errors import FormatError, InputError
from pydsz.model import sparse
from pydsz.model.activations import capture
from pydsz.model.graph import TFLiteModel
from pydsz.model.tail import Tail
from pydsz.prune.masks import magnitude_mask

DATA = Path(__file__).parents[1] / "pydsz" / "data"


def pruned(rows, cols, density, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.laplace(0, 0.05, (rows, cols)).astype(np.float32)
    w[rng.random((rows, cols)) >= density] = 0
    return w


def in_kernel_order(x, w, bias):
    """x @ w.T + bias summed as the kernel promises: each row's non-zeros by column, then the bias,
    in float32 without fused multiply-add (numpy rounds every operation)."""
    out = np.zeros((x.shape[0], w.shape[0]), np.float32)
    for o in range(w.shape[0]):
        acc = np.zeros(x.shape[0], np.float32)
        for k in np.flatnonzero(w[o]):
            acc = acc + w[o, k] * x[:, k]
        out[:, o] = acc + bias[o]
    return out


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 12), cols=st.integers(1, 300), n=st.integers(0, 300),
       density=st.sampled_from([0.0, 0.03, 0.3, 1.0]), seed=st.integers(0, 2 ** 16), threads=st.integers(1, 3))
def test_matmul_sums_each_row_in_column_order(rows, cols, n, density, seed, threads):
    w = pruned(rows, cols, density, seed)
    rng = np.random.default_rng(seed + 1)
    x = rng.normal(size=(n, cols)).astype(np.float32)
    bias = rng.normal(size=rows).astype(np.float32)
    out = sparse.matmul(x, sparse.CSR.from_dense(w), bias, n_threads=threads)
    assert out.dtype == np.float32 and out.shape == (n, rows)
    np.testing.assert_array_equal(out, in_kernel_order(x, w, bias))


def test_matmul_is_the_same_bits_on_any_thread_count():
    w = pruned(300, 5000, 0.09)  # more than one column slice
    x = np.maximum(np.random.default_rng(1).normal(size=(700, 5000)), 0).astype(np.float32)
    csr = sparse.CSR.from_dense(w)
    one = sparse.matmul(x, csr, n_threads=1)
    np.testing.assert_array_equal(one, sparse.matmul(x, csr, n_threads=2))
    np.testing.assert_array_equal(one, sparse.matmul(x, csr, n_threads=5))
    np.testing.assert_allclose(one, x @ w.T, atol=1e-5)


def test_csr_from_dense_keeps_the_non_zeros_in_order():
    w = np.array([[0, 1.5, 0, -2], [0, 0, 0, 0], [-0.0, 3, 4, 0]], np.float32)
    csr = sparse.CSR.from_dense(w)
    assert csr.shape == (3, 4) and csr.density == 4 / 12
    assert csr.row_ptr.tolist() == [0, 2, 2, 4]
    assert csr.col_index.tolist() == [1, 3, 1, 2] and csr.values.tolist() == [1.5, -2, 3, 4]


def test_matmul_checks_shapes():
    csr = sparse.CSR.from_dense(pruned(4, 6, 0.5))
    with pytest.raises(InputError, match=r"\[n, 6\]"):
        sparse.matmul(np.zeros((3, 5), np.float32), csr)
    with pytest.raises(InputError, match="bias has 3 values"):
        sparse.matmul(np.zeros((3, 6), np.float32), csr, np.zeros(3, np.float32))
    with pytest.raises(InputError, match="2-D"):
        sparse.CSR.from_dense(np.zeros(5, np.float32))


@pytest.mark.parametrize("row_ptr, col_index, why", [
    ([0, 2, 3], [0, 7, 1], "column out of range"),
    ([0, 2, 3], [0, -1, 1], "negative column"),
    ([0, 2, 3], [1, 1, 2], "repeated column"),
    ([0, 2, 3], [2, 1, 0], "columns out of order"),
    ([0, 3, 2], [0, 1, 2], "row pointers decrease"),
    ([1, 2, 3], [0, 1, 2], "first row pointer is not 0"),
    ([0, 2, 4], [0, 1, 2], "last row pointer is not nnz"),
])
def test_the_kernel_refuses_a_broken_csr(row_ptr, col_index, why):
    x = np.ones((2, 4), np.float32)
    out = np.empty((2, 2), np.float32)
    with pytest.raises(FormatError, match="csr_matmul: DSZ_error_corruption_detected"):
        _core.csr_matmul(x, np.array(row_ptr, np.int64), np.array(col_index, np.int32),
                         np.ones(3, np.float32), np.empty(0, np.float32), out)


@pytest.fixture(scope="module")
def lenet300_pruned():
    model = TFLiteModel((DATA / "lenet300.tflite").read_bytes())
    sparsity = {"fc1": 0.92, "fc2": 0.92}
    return TFLiteModel(model.replace({n: np.where(magnitude_mask(model.weight(n), s), model.weight(n), 0)
                                      for n, s in sparsity.items()}))


@pytest.fixture(scope="module")
def activations(lenet300_pruned):
    with np.load(DATA / "fmnist_test.npz") as f:
        x, y = f["x"][:1000], f["y"][:1000]
    tail = Tail.from_model(lenet300_pruned, "fc1")
    return capture(lenet300_pruned.data, x, tail.input_tensor), y


def test_the_tail_multiplies_the_pruned_layers_sparse(lenet300_pruned):
    tail = Tail.from_model(lenet300_pruned, "fc1")
    assert tail.sparse == {"fc1", "fc2"}  # fc3 is dense


def test_the_sparse_tail_agrees_with_the_dense_one(lenet300_pruned, activations):
    h, y = activations
    tail = Tail.from_model(lenet300_pruned, "fc1")
    out = tail.forward(h)
    tail.sparse = frozenset()
    dense = tail.forward(h)
    np.testing.assert_allclose(out, dense, atol=1e-5)
    assert (out.argmax(1) == dense.argmax(1)).mean() >= 0.999


def test_a_candidate_equal_to_the_weights_gives_the_baseline_bit_for_bit(lenet300_pruned, activations):
    h, _ = activations
    tail = Tail.from_model(lenet300_pruned, "fc1")
    base = tail.forward(h)
    for layer in tail.sparse:
        np.testing.assert_array_equal(tail.forward(h, {layer: tail.weights[layer].copy()}), base)
        np.testing.assert_array_equal(tail.forward_from(layer, tail.input_of(h, layer)), base)


def test_a_sparse_candidate_changes_the_output_as_a_replaced_model_does(lenet300_pruned, activations):
    h, _ = activations
    tail = Tail.from_model(lenet300_pruned, "fc1")
    w = tail.weights["fc2"].copy()
    w[w != 0] += np.float32(0.01)
    out = tail.forward(h, {"fc2": w})
    replaced = Tail.from_model(TFLiteModel(lenet300_pruned.replace({"fc2": w})), "fc1")
    np.testing.assert_array_equal(out, replaced.forward(h))
    assert not np.array_equal(out, tail.forward(h))


def test_the_evaluator_decodes_candidates_of_sparse_layers_straight_into_csr(lenet300_pruned):
    """weights_at and measure_point hand the tail a pruned layer's candidate as the CSR its stream
    decodes to, never as a dense matrix, and measure the same losses as with the dense candidate."""
    with np.load(DATA / "fmnist_val.npz") as f:
        x, y = f["x"][:1000], f["y"][:1000]
    evaluator = Evaluator(lenet300_pruned.data, x, y, ["fc1", "fc2", "fc3"])
    bounds = {"fc1": 0.05, "fc2": 0.05, "fc3": 0.05}
    got = evaluator.weights_at(bounds)
    assert isinstance(got["fc1"], sparse.CSR) and isinstance(got["fc2"], sparse.CSR)
    assert isinstance(got["fc3"], np.ndarray)  # the tail multiplies fc3 densely
    dense = {n: encode_weight(lenet300_pruned.weight(n), b)[0] for n, b in bounds.items()}
    for n in ("fc1", "fc2"):
        expected = sparse.CSR.from_dense(dense[n])
        for field in ("row_ptr", "col_index", "values"):
            assert np.array_equal(getattr(got[n], field), getattr(expected, field))
    changed = evaluator.measure(got)
    assert changed == evaluator.measure(dense) and changed.lost + changed.gained > 0
    point = measure_point(evaluator, "fc1", 0.05)
    assert (point.loss, point.lost, point.gained) == (lambda m: (m.loss, m.lost, m.gained))(
        evaluator.measure({"fc1": dense["fc1"]}))
    # the interpreter takes arrays: an evaluator without the tail decodes dense
    slow = Evaluator(lenet300_pruned.data, x, y, ["fc1", "fc2", "fc3"], paths=("cut",))
    assert all(isinstance(w, np.ndarray) for w in slow.weights_at(bounds).values())


def test_the_tail_takes_a_csr_only_for_a_layer_it_multiplies_sparse(lenet300_pruned, activations):
    h, _ = activations
    tail = Tail.from_model(lenet300_pruned, "fc1")
    base = tail.forward(h)
    np.testing.assert_array_equal(tail.forward(h, {"fc2": sparse.CSR.from_dense(tail.weights["fc2"])}), base)
    with pytest.raises(InputError, match="fc3: a CSR matrix, but the tail multiplies fc3 densely"):
        tail.forward(h, {"fc3": sparse.CSR.from_dense(tail.weights["fc3"])})
    with pytest.raises(InputError, match=r"weights for fc2: shape \(100, 200\) instead of \(100, 300\)"):
        tail.forward(h, {"fc2": sparse.CSR.from_dense(np.zeros((100, 200), np.float32))})


def test_only_sparse_layers_with_enough_outputs_pay():
    assert sparse.pays(pruned(300, 784, 0.08))
    assert not sparse.pays(pruned(300, 784, 0.5))  # too dense
    assert not sparse.pays(pruned(10, 4096, 0.05))  # too few outputs to repay transposing the input


def test_matmul_works_in_a_forked_child():
    import multiprocessing

    w = pruned(200, 300, 0.05)
    x = np.random.default_rng(2).normal(size=(400, 300)).astype(np.float32)
    csr = sparse.CSR.from_dense(w)
    expected = sparse.matmul(x, csr, n_threads=2)  # the parent's pool exists before the fork
    with multiprocessing.get_context("fork").Pool(1) as pool:
        np.testing.assert_array_equal(pool.apply(sparse.matmul, (x, csr, None, 2)), expected)


def test_matmul_uses_as_many_threads_as_blas_is_told(monkeypatch):
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert sparse.threads() == 3
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    assert sparse.threads() == 1
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "")
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert sparse.threads() >= 1
