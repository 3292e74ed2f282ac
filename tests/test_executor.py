"""The assessment on a real Dask cluster (LocalCluster, worker processes): the same result as in
process, a worker that dies mid-assessment, a scheduler that cannot be reached."""

import hashlib
import importlib.util
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pydsz.assess import executor
from pydsz.assess.evaluator import Evaluator
from pydsz.budget import calibrated
from pydsz.budget.rule import Budget
from pydsz.compress import pipeline
from pydsz.context import Run
from pydsz.errors import InputError
from pydsz.model.data import bundled

pytest.importorskip("distributed")

KILL_MARKER = "DSZ_TEST_KILL_MARKER"


@pytest.fixture(scope="module")
def local(val):
    return pipeline.compress(bundled("lenet300.tflite").read_bytes(), *val, Budget("top1", 0.003))


def _same(a, b):
    assert hashlib.sha256(a.dsz).digest() == hashlib.sha256(b.dsz).digest()
    assert a.curves == b.curves and a.attempts == b.attempts


@pytest.mark.slow
def test_a_local_dask_cluster_gives_the_same_points_bounds_and_bytes(val, local):
    """Exact by construction: a worker runs the same evaluation on the same arrays with the same BLAS
    as this process (only where it runs differs), so the classes each sample gets, the losses the
    calibrated probabilities give them (from the interpreter's outputs, the same in every process) and
    the bytes match."""
    cluster = executor.Dask(workers=2)
    try:
        _same(pipeline.compress(bundled("lenet300.tflite").read_bytes(), *val, Budget("top1", 0.003),
                                run=Run(executor=cluster)), local)
    finally:
        cluster.close()


@pytest.mark.slow
def test_cuts_fitted_plans_and_their_refinement_give_the_same_bytes_on_dask(val):
    """output-error on every layer of LeNet-5: candidates run from their cuts (each worker computing
    the chain itself), Fitted plans, refined by the allocation: the same points, bounds and bytes."""
    data = bundled("lenet5.tflite").read_bytes()
    x = val[0][:300]
    here = pipeline.compress(data, x, None, Budget("output-error", 0.01), layers="all")
    cluster = executor.Dask(workers=2)
    try:
        there = pipeline.compress(data, x, None, Budget("output-error", 0.01), layers="all", run=Run(executor=cluster))
    finally:
        cluster.close()
    # the same bytes and bounds; the numpy tail's losses (fc1, fc2) may differ in their last digits, BLAS
    # summing in another order on a worker's single thread than on this process's two
    assert hashlib.sha256(here.dsz).digest() == hashlib.sha256(there.dsz).digest()
    assert [l.bound for l in here.layers] == [l.bound for l in there.layers]
    for name, points in here.curves.items():
        others = there.curves[name]
        assert [(p.bound, p.size) for p in points] == [(p.bound, p.size) for p in others]
        assert [p.loss for p in points] == pytest.approx([p.loss for p in others], rel=1e-4)
    assert {info["plan"] for info in here.assessment.values()} <= {"fitted", "group"}


class CalibratedKillingAWorkerOnce(calibrated.CalibratedTop1):
    """calibrated-top1; but the first worker process to compute it dies on the spot (never the test's own
    process), as a machine of a cluster may."""

    def losses(self, outputs, reference, y):
        marker = Path(os.environ[KILL_MARKER])
        if multiprocessing.parent_process() is not None and not marker.exists():
            marker.write_text(str(os.getpid()))
            os._exit(1)
        return super().losses(outputs, reference, y)


@pytest.mark.slow
def test_a_worker_that_dies_mid_assessment_changes_nothing(val, local, tmp_path, monkeypatch):
    marker = tmp_path / "killed"
    monkeypatch.setenv(KILL_MARKER, str(marker))  # the workers inherit it
    # top-1's decisions, the workers' evaluations, measure in a calibrated-top1 that kills one
    monkeypatch.setattr(calibrated, "deciding", lambda metric: CalibratedKillingAWorkerOnce(metric.output))
    cluster = executor.Dask(workers=2)
    try:
        result = pipeline.compress(bundled("lenet300.tflite").read_bytes(), *val,
                                   Budget("top1", 0.003), run=Run(executor=cluster))
    finally:
        cluster.close()
    assert marker.exists(), "no worker was killed"
    _same(result, local)


def test_workers_that_all_die_lose_the_state_and_it_is_sent_again(val):
    """Every worker dies at once (client.restart()) and the scattered state dies with them: Dask cannot
    recompute it and cancels the tasks that read it. The executor scatters it anew and sends them again:
    the same risks as in this process, by map and by stream."""
    evaluator = Evaluator(bundled("lenet300.tflite").read_bytes(), *val, ["fc1", "fc2"])
    steps = [({"fc1": b, "fc2": b / 2}, 1.0) for b in (1e-3, 1e-2, 4e-2, 8e-2)]
    here = executor.Local()
    here.start(evaluator)
    expected = here.map(pipeline.trial_risk, steps)
    cluster = executor.Dask(workers=2)
    try:
        cluster.start(evaluator)
        assert cluster.map(pipeline.trial_risk, steps) == expected
        cluster.client.restart()
        assert cluster.state.status != "finished"
        assert cluster.map(pipeline.trial_risk, steps) == expected
        cluster.client.restart()
        pending, streamed = iter(steps), {}
        cluster.stream(pipeline.trial_risk, lambda: next(pending, None),
                       lambda args, risk: streamed.__setitem__(steps.index(args), risk))
        assert [streamed[i] for i in range(len(steps))] == expected
    finally:
        cluster.close()


@pytest.mark.slow
def test_jobs_one_after_the_other_leave_no_finished_evaluator_behind(val):
    """--prune auto runs a compress per pruning share on one executor: neither this process nor a worker
    keeps every finished job's Evaluator (its model, data, compensation factors and cached activations)."""
    import gc

    cluster = executor.Dask(workers=2)
    run = Run(executor=cluster)
    try:
        for n in (300, 350, 400, 450):
            pipeline.compress(bundled("lenet300.tflite").read_bytes(), val[0][:n], val[1][:n], Budget("top1", 0.01),
                              run=run)
        gc.collect()
        assert cluster.evaluator is None
        held = cluster.client.run(lambda: len(executor._EVALUATORS))
        assert len(held) == 2 and all(1 <= n <= executor.WORKER_EVALUATORS for n in held.values())
    finally:
        cluster.close()


def test_an_unreachable_scheduler_is_an_input_error(monkeypatch):
    monkeypatch.setattr(executor, "CONNECT_TIMEOUT", 2)
    with pytest.raises(InputError, match="cannot reach the Dask scheduler at tcp://127.0.0.1:9"):
        executor.Dask(address="tcp://127.0.0.1:9")


class LossesUnderALock:
    """A metric function holding what no pickler can send (a lock)."""

    def __init__(self):
        import threading

        self.lock = threading.Lock()

    def __call__(self, outputs, original, y):
        return np.zeros(len(next(iter(original.values()))))


def test_a_metric_that_cannot_travel_is_an_input_error(val):
    cluster = executor.Dask(workers=1)
    try:
        with pytest.raises(InputError, match="cannot be sent to the Dask workers"):
            pipeline.compress(bundled("lenet300.tflite").read_bytes(), val[0], None, Budget(LossesUnderALock(), 0.01),
                              run=Run(executor=cluster))
    finally:
        cluster.close()


def _dsz(*args):
    return subprocess.run([sys.executable, "-m", "pydsz.cli", *map(str, args)], capture_output=True, text=True)


@pytest.mark.slow
def test_cli_workers_and_cluster(val, local, tmp_path):
    data = tmp_path / "val.npz"
    np.savez(data, x=val[0], y=val[1])
    out = tmp_path / "m.dsz"
    result = _dsz("compress", bundled("lenet300.tflite"), "--data", data, "--workers", "2", "-o", out)
    assert result.returncode == 0, result.stderr
    assert "local Dask cluster of 2 worker" in result.stdout
    assert out.read_bytes() == local.dsz
    bad = _dsz("compress", bundled("lenet300.tflite"), "--data", data, "--cluster", "tcp://127.0.0.1:9",
               "-o", tmp_path / "n.dsz")
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 1 and len(lines) == 1 and "cannot reach the Dask scheduler" in lines[0], bad.stderr
    assert not (tmp_path / "n.dsz").exists()


def test_gpu_workers_without_dask_cuda_share_the_gpu_and_say_so():
    if importlib.util.find_spec("dask_cuda") is not None:
        pytest.skip("dask-cuda is installed: LocalCUDACluster needs GPUs")
    cluster = executor.make(workers=1, device="gpu")
    try:
        assert "sharing the GPU" in cluster.description and "dask-cuda" in cluster.description
    finally:
        cluster.close()
