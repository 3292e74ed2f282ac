"""The assessment in process and on local Dask clusters of 1 and 2 workers, in one run, and from
those measurements a projection for larger clusters.

Model: any .tflite and .npz (default: the AlexNet-shaped model of bench/builders/make_large_models.py, pruned
as the paper prunes AlexNet, top-1 at 0.3 points on 1,000 Fashion-MNIST validation images; or the
bundled multitask.tflite with --model multitask). The assessment's tasks are (layer, bound)
evaluations, and the parts of a large float layer's lossless size (assess.LOSSLESS_PART), handed out
as results come in (pydsz.assess.Ladder), one running per worker thread. Measured: the assessment's
wall time in process and with 1 and 2 worker processes (the points must be identical; speed-ups are
against 1 worker, whose numpy runs single-threaded as Dask's workers do), every task's time on the
1-worker cluster, the tasks each run made (a parallel run measures a few bounds early that turn out
not to be needed), and the cluster's per-task overhead (round trips of tasks that do no work).
Projected, and said so: the time with 8, 32 and 128 workers, by running the same assessment code on
a simulated cluster whose tasks take the measured times plus the overhead.

Usage: python3 bench/cluster.py [--samples N | --model M.tflite|multitask --data D.npz --metric NAME --max-loss X]
"""
import argparse
import heapq
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.join(os.path.dirname(os.path.abspath(__file__)), "builders")]
import numpy as np  # noqa: E402
from machine import machine_info  # noqa: E402

from pydsz.assess import executor  # noqa: E402
from pydsz.assess.evaluator import Evaluator  # noqa: E402
from pydsz.assess.ladder import Point  # noqa: E402
from pydsz.assess.plan import assess  # noqa: E402
from pydsz.budget import metrics  # noqa: E402
from pydsz.budget.rule import Budget  # noqa: E402
from pydsz.model.data import bundled, fashion_mnist, load_data, load_npz, split_validation  # noqa: E402
from pydsz.model.graph import TFLiteModel  # noqa: E402
from pydsz.model.selection import compressible_layers  # noqa: E402
from pydsz.prune.masks import magnitude_mask  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

PROJECTED = (2, 8, 32, 128)


def noop(evaluator, i):
    return i


def overhead(cluster, tasks: int = 200) -> float:
    """Seconds per task of a cluster's round trip, for tasks that only touch the worker's evaluator."""
    cluster.map(noop, [(i,) for i in range(20)])  # warm up
    start = time.perf_counter()
    cluster.map(noop, [(i,) for i in range(tasks)])
    return (time.perf_counter() - start) / tasks


class Simulated:
    """An executor whose tasks take the measured seconds (plus the per-task overhead) on `slots`
    workers, and return the measured points: assess() runs on it unchanged, so the projection
    schedules exactly what a real cluster would be handed. A bound the measured run never needed
    (one a parallel run measures early and drops) takes its layer's mean time."""

    def __init__(self, slots: int, points: dict, seconds: dict, per_task: float):
        self.slots, self.points, self.seconds, self.per_task = slots, points, seconds, per_task
        self.clock = 0.0
        self.tasks = 0

    def start(self, evaluator) -> None:
        pass

    def _time(self, *args) -> float:
        if args in self.seconds:
            return self.seconds[args]
        return float(np.mean([s for (n, b, _), s in self.seconds.items() if n == args[0] and b > 0]))

    def stream(self, task, plan, on_result) -> None:
        running = []
        while True:
            while len(running) < self.slots and (args := plan()) is not None:
                heapq.heappush(running, (self.clock + self._time(*args) + self.per_task, self.tasks, args))
                self.tasks += 1
            if not running:
                return
            self.clock, _, args = heapq.heappop(running)
            on_result(args, self.points.get(args, Point(args[0], args[1], 0, 0, 0, float("inf"))))


class Timed:
    """An executor whose tasks' results and times are recorded: on one worker, which runs one task at
    a time, the gaps between results are the tasks' times."""

    def __init__(self, inner):
        self.inner, self.seconds, self.points = inner, {}, {}

    def start(self, evaluator) -> None:
        self.inner.start(evaluator)

    def stream(self, task, plan, on_result) -> None:
        last = [time.perf_counter()]

        def record(args, point):
            now = time.perf_counter()
            self.seconds[args], self.points[args], last[0] = now - last[0], point, now
            on_result(args, point)
        self.inner.stream(task, plan, record)


def default_model(samples: int):
    """The AlexNet-shaped model (bench/builders/make_large_models.py) magnitude-pruned to the paper's sparsities
    (fc6/fc7 91%, fc8 75%; no retraining: the assessment's work is what is measured here), and
    `samples` Fashion-MNIST validation images."""
    import make_large_models

    path = make_large_models.model_path("alexnet")
    model = TFLiteModel(path.read_bytes())
    pruned = model.replace({name: model.weight(name) * magnitude_mask(model.weight(name), sparsity)
                            for name, sparsity in (("fc1", 0.91), ("fc2", 0.91), ("fc3", 0.75))})
    _, (x, y) = split_validation(*fashion_mnist("train"))
    return "alexnet (pruned 91/91/75%)", pruned, x[:samples, ..., None].astype(np.float32), y[:samples]


def multitask_data():
    x, _ = load_npz(bundled("fmnist_val.npz"))
    x = x[:1000]
    flat = x.reshape(len(x), -1).astype(np.float32)
    stats = np.stack([flat.mean(1) / 255, flat.std(1) / 255, (flat > 25).mean(1)], 1).astype(np.float32)
    return {"pixels": x, "stats": stats}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help=".tflite, or multitask (default: the pruned AlexNet-shaped model)")
    parser.add_argument("--data", default=None, help=".npz (default: 1,000 validation images)")
    parser.add_argument("--metric", default=None, help="default: top1 for the AlexNet-shaped model, output-error for multitask")
    parser.add_argument("--max-loss", type=float, default=None, help="default: 0.003 (top1) or 0.01 (output-error)")
    parser.add_argument("--layers", default=None, help="default: fc for the AlexNet-shaped model, all for the others")
    parser.add_argument("--samples", type=int, default=1000, help="validation images for the default model")
    parser.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "cluster.json"))
    args = parser.parse_args()
    if args.model is None:
        label, model, x, y = default_model(args.samples)
        metric = metrics.get(args.metric or "top1")
    else:
        path = str(bundled("multitask.tflite")) if args.model == "multitask" else args.model
        label, model = os.path.basename(path), open(path, "rb").read()
        metric = metrics.get(args.metric or "output-error")
        if args.model == "multitask" and args.data is None:
            x, y = multitask_data(), None
        elif args.data is None:
            parser.error("--data is needed with --model")
        else:
            x, y = load_data(args.data, TFLiteModel(model))
    parsed = TFLiteModel(model)
    max_loss = args.max_loss if args.max_loss is not None else metric.default_max_loss
    layers = args.layers or ("fc" if args.model is None else "all")
    names = [layer.name for layer in compressible_layers(parsed, layers)]
    evaluator = Evaluator(model, x, y, names, metric=metric)
    budget = Budget(metric, max_loss).allowed(evaluator.samples)

    start = time.perf_counter()
    local = Timed(executor.Local())
    reference = assess(evaluator, names, budget, executor=local).table
    rows = [{"executor": "in process", "workers": 0, "seconds": time.perf_counter() - start, "identical": True,
             "tasks": len(local.seconds)}]
    per_task, seconds, points = None, {}, {}
    for workers in (1, 2):
        cluster = executor.Dask(workers=workers)
        try:
            start_up = time.perf_counter()
            cluster.start(evaluator)
            cluster.map(noop, [(i,) for i in range(workers * 4)])  # every worker has built its evaluator
            ready = time.perf_counter() - start_up
            timed = Timed(cluster)
            start = time.perf_counter()
            table = assess(evaluator, names, budget, executor=timed).table
            wall = time.perf_counter() - start
            if workers == 1:
                seconds, points = timed.seconds, timed.points
            if workers == 2:
                per_task = overhead(cluster)
        finally:
            cluster.close()
        rows.append({"executor": f"Dask, {workers} worker(s)", "workers": workers, "seconds": wall,
                     "start_seconds": ready, "identical": table == reference, "tasks": len(timed.seconds)})
    serial = rows[1]["seconds"]  # 1 worker
    for r in rows:
        r["speedup"] = serial / r["seconds"]
    projection = []
    for w in PROJECTED:
        simulated = Simulated(w, points, seconds, per_task)
        same = assess(evaluator, names, budget, executor=simulated).table == reference
        projection.append({"workers": w, "seconds": simulated.clock, "tasks": simulated.tasks, "identical": same})

    print(f"{label}: {len(names)} layers, {evaluator.samples} samples, metric {metric.name} "
          f"at {max_loss:g}; {rows[0]['tasks']} tasks ((layer, bound) evaluations and parts of lossless sizes)")
    print(format_table(["executor", "assessment s", "vs 1 worker", "start-up s", "tasks", "same points"],
                       [[r["executor"], f"{r['seconds']:.1f}", f"{r['speedup']:.2f}x",
                         f"{r.get('start_seconds', 0):.1f}", r["tasks"], "yes" if r["identical"] else "NO"]
                        for r in rows]))
    per_layer = {name: sum(s for (n, _, _), s in seconds.items() if n == name) for name in names}
    lossless = {name: sum(s for (n, b, _), s in seconds.items() if n == name and b == 0) for name in names}
    print(f"per-task overhead of the 2-worker cluster: {1000 * per_task:.1f} ms; seconds per layer (1 worker): "
          + ", ".join(f"{k} {v:.1f} (lossless size {lossless[k]:.1f})" for k, v in per_layer.items()))
    print("PROJECTION (not measured): the same assessment on a simulated cluster whose tasks take the times "
          "measured on 1 worker plus the per-task overhead")
    print(format_table(["workers", "assessment s", "vs 1 worker", "tasks"],
                       [[p["workers"], f"{p['seconds']:.1f}", f"{serial / p['seconds']:.2f}x", p["tasks"]]
                        for p in projection]))
    target = next(r for r in rows if r["workers"] == 2)["speedup"]
    print(f"{'MET' if target >= 1.7 else 'NOT MET'}  2 workers at least 1.7x 1 worker: {target:.2f}x")
    with open(args.json, "w") as f:
        json.dump({"model": label, "layers": names, "samples": evaluator.samples,
                   "metric": metric.name, "max_loss": max_loss, "machine": machine_info(), "runs": rows,
                   "per_layer_seconds": per_layer, "lossless_size_seconds": lossless, "per_task_overhead_s": per_task,
                   "projection": projection},
                  f, indent=1)
    return 0 if all(r["identical"] for r in rows) and all(p["identical"] for p in projection) else 1


if __name__ == "__main__":
    sys.exit(main())
