"""Where the assessment's evaluations run: in this process, or spread over a Dask cluster.

An executor runs tasks, each a module-level function of an Evaluator and some arguments: a list of
them (`map`, results in the order given), or a stream of them handed out by a plan as earlier ones
finish (`stream`: the assessment's (layer, bound) evaluations, whose later bounds depend on earlier
losses). `Local` runs them here, one after the other: the
reference. `Dask` sends the Evaluator's state (the model's bytes, the data, the metric) to every
worker once; each worker builds its Evaluator from it once and keeps it for every later task, so
a task carries only its arguments (a layer's name, a set of bounds). Every task is deterministic
and independent of the others, so the results are the local ones, whichever worker ran each and
however often (Dask reruns the tasks of a worker that dies; where every worker holding the state
died, the state is scattered again and the tasks that read it are sent again).

Dask is optional: pip install pydsz[distributed].
"""

from __future__ import annotations

import weakref
from typing import Callable, Optional, Sequence

from pydsz.errors import DszError, InputError

# Seconds to wait for a scheduler before saying it cannot be reached.
CONNECT_TIMEOUT = 10

# How often one task is sent again after the state it reads was lost with the workers holding it.
RESUBMITS = 3

# Per worker process: each Evaluator state's token -> the Evaluator built from it, the most recently
# used last. A worker keeps WORKER_EVALUATORS of them: one job's, and another's where two clients share a
# cluster; a finished job's goes with its model, data and caches (--prune auto starts a job per share).
_EVALUATORS: dict = {}
WORKER_EVALUATORS = 2


class _Weak:
    """Holds the job's evaluator weakly: an executor outlives a job (the command's Run, across --prune
    auto's rounds), and the evaluator would keep the job's compensation factors and cached activations
    alive (oww_timer: 245 MiB through the next round's pruning, 110 MiB past the printed bound)."""

    _evaluator = None

    @property
    def evaluator(self):
        return None if self._evaluator is None else self._evaluator()


class Local(_Weak):
    """Tasks run in this process, in order."""

    description = "this process"

    def start(self, evaluator) -> None:
        self._evaluator = weakref.ref(evaluator)

    def map(self, task: Callable, args: Sequence[tuple], on_result: Optional[Callable] = None) -> list:
        results = []
        for a in args:
            results.append(task(self.evaluator, *a))
            if on_result:
                on_result(results[-1])
        return results

    def stream(self, task: Callable, plan: Callable, on_result: Callable) -> None:
        """Run task(evaluator, *args) for every args that plan() hands out, until it hands out None;
        on_result(args, result) as each finishes (after which plan may have more)."""
        while (args := plan()) is not None:
            on_result(args, task(self.evaluator, *args))

    def close(self) -> None:
        pass


class Dask(_Weak):
    """Tasks run on a Dask cluster: a running scheduler at `address`, or a local cluster of
    `workers` processes (one thread each) started here and stopped by close()."""

    def __init__(self, address: Optional[str] = None, workers: Optional[int] = None, gpu: bool = False):
        if (address is None) == (workers is None):
            raise InputError("give a Dask scheduler's address or a number of local workers, not both or neither")
        try:
            import distributed
        except ImportError:
            raise InputError("distributing the assessment needs Dask: pip install pydsz[distributed]") from None
        self.cluster = None
        try:
            if address is None:
                if workers < 1:
                    raise InputError(f"--workers {workers}: give at least 1")
                self.cluster, self.description = _local_cluster(distributed, workers, gpu)
                self.client = distributed.Client(self.cluster)
            else:
                self.client = distributed.Client(address, timeout=CONNECT_TIMEOUT)
                self.description = f"the Dask cluster at {address}"
        except InputError:
            raise
        except (OSError, TimeoutError) as exc:
            raise InputError(f"cannot reach the Dask scheduler at {address}: {exc}") from None
        try:
            self.client.get_versions(check=True)
        except ValueError as exc:  # distributed's own message lists the packages that differ
            self.close()
            raise InputError(f"the Dask cluster's versions do not match this client's: {exc}".replace("\n", " ")) from None
        self.state = None

    def start(self, evaluator) -> None:
        if self.evaluator is evaluator:
            return
        self.state = self._evaluator = None  # the last job's: Dask lets it go once no future refers to it
        # every worker gets the state once, now; tasks then refer to it
        try:
            self.state = self.client.scatter(evaluator.state(), broadcast=True, hash=False)
        except (TypeError, AttributeError, ValueError) as exc:  # pickling: e.g. a metric holding a lock or a file
            raise InputError(f"the evaluation cannot be sent to the Dask workers: {exc}") from None
        self._evaluator = weakref.ref(evaluator)

    def map(self, task: Callable, args: Sequence[tuple], on_result: Optional[Callable] = None) -> list:
        results = [None] * len(args)
        order = iter(enumerate(args))

        def done(i, result):
            results[i] = result
            if on_result:
                on_result(result)

        self._run(task, lambda: next(order, None), done, slots=len(args))
        return results

    def stream(self, task: Callable, plan: Callable, on_result: Callable) -> None:
        """Local.stream's contract, with as many tasks running as the cluster has worker threads:
        whenever one finishes, plan() is asked for more."""

        def keyed():
            args = plan()
            return None if args is None else (args, args)

        self._run(task, keyed, on_result, slots=max(1, sum(self.client.nthreads().values())))

    def _run(self, task: Callable, plan: Callable, on_result: Callable, slots: int) -> None:
        """Submit task(evaluator, *args) for each (key, args) that plan() hands out, at most `slots`
        running at a time; on_result(key, result) as each finishes. A task cancelled because the
        scattered state it reads was lost (every worker holding it died: Dask reruns a dead worker's
        tasks but cannot recompute scattered data) is sent again with the state scattered anew."""
        from distributed import as_completed

        running, finished = {}, as_completed()

        def submit(key, args, tries=0):
            future = self.client.submit(_on_worker, task, self.state, *args, pure=False)
            running[future] = (key, args, tries)
            finished.add(future)

        def fill():
            while len(running) < slots and (item := plan()) is not None:
                submit(*item)

        try:
            fill()
            for future in finished:
                key, args, tries = running.pop(future)
                if future.status == "cancelled" and tries < RESUBMITS:
                    self._rescatter()
                    submit(key, args, tries + 1)
                    continue
                on_result(key, future.result())  # a task's own error is raised here
                fill()
        except DszError:
            raise
        except Exception as exc:  # workers killed more often than Dask retries, a lost scheduler
            raise DszError(f"the Dask cluster failed to run the assessment: {type(exc).__name__}: {exc}") from None

    def _rescatter(self) -> None:
        if self.state.status != "finished":
            self.state = self.client.scatter(self.evaluator.state(), broadcast=True, hash=False)

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def _local_cluster(distributed, workers: int, gpu: bool) -> tuple:
    """A local cluster of `workers` processes and what to call it. For GPU evaluation, dask-cuda's
    LocalCUDACluster where it is installed: each worker sees one GPU of its own (CUDA_VISIBLE_DEVICES)."""
    if gpu:
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            note = " sharing the GPU (dask-cuda, not installed, would give each worker a GPU of its own)"
        else:
            return (LocalCUDACluster(n_workers=workers, threads_per_worker=1, dashboard_address=None),
                    f"a local Dask-CUDA cluster of {workers} worker(s), one per GPU")
    else:
        note = ""
    return (distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None),
            f"a local Dask cluster of {workers} worker process(es){note}")


def _on_worker(task: Callable, state, *args):
    """Run task on this worker's Evaluator for `state`, built on first use."""
    evaluator = _EVALUATORS.pop(state.token, None)
    if evaluator is None:
        while len(_EVALUATORS) >= WORKER_EVALUATORS:
            del _EVALUATORS[next(iter(_EVALUATORS))]
        evaluator = state.build()
    _EVALUATORS[state.token] = evaluator
    return task(evaluator, *args)


def make(address: Optional[str] = None, workers: Optional[int] = None, device: str = "cpu"):
    """The executor the command line asks for: Dask with an address or a number of workers (on GPUs:
    one worker per GPU where dask-cuda is installed), else Local."""
    if address is None and workers is None:
        return Local()
    return Dask(address, workers, gpu=device == "gpu")
