"""The assessment in process and on local Dask clusters of 1 and 2 workers, in one run, and from
those measurements a projection for larger clusters.

Model: by default the bundled multitask.tflite (two inputs, three outputs, seven conv and FC layers)
judged by output-error at 1% on 1,000 Fashion-MNIST validation images, every layer assessed; any
.tflite and .npz can be given. Measured: the assessment's wall time in process and with 1 and 2 worker
processes (the results must be identical; speed-ups are against 1 worker, whose numpy runs
single-threaded as Dask's workers do), each layer's assessment time on the 1-worker cluster, and the
per-task overhead of the cluster (round trips of tasks that do no work). Projected, and said so: the
time with 8, 32 and 128 workers, scheduling the measured per-layer times longest first on that many
workers plus the overhead per task. The assessment is split by layer, so the largest layer bounds
what any number of workers can reach.

Usage: python3 bench/cluster.py [--model M.tflite --data D.npz --metric NAME --max-loss X]
"""
import argparse
import heapq
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

from machine import machine_info  # noqa: E402
from pydsz import executor, metrics  # noqa: E402
from pydsz.assess import Evaluator, assess, assess_one, compressible_layers  # noqa: E402
from pydsz.data import bundled, load_data, load_npz  # noqa: E402
from pydsz.model import TFLiteModel  # noqa: E402
from pydsz.pipeline import allowed_loss  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

PROJECTED = (8, 32, 128)


def noop(evaluator, i):
    return i


def overhead(cluster, tasks: int = 200) -> float:
    """Seconds per task of a cluster's round trip, for tasks that only touch the worker's evaluator."""
    cluster.map(noop, [(i,) for i in range(20)])  # warm up
    start = time.perf_counter()
    cluster.map(noop, [(i,) for i in range(tasks)])
    return (time.perf_counter() - start) / tasks


def makespan(times: list, workers: int, per_task: float) -> float:
    """Longest-first scheduling of the layer tasks on `workers` workers."""
    loads = [0.0] * workers
    for t in sorted(times, reverse=True):
        heapq.heapreplace(loads, loads[0] + t + per_task)
    return max(loads)


def default_data():
    x, _ = load_npz(bundled("fmnist_val.npz"))
    x = x[:1000]
    flat = x.reshape(len(x), -1).astype(np.float32)
    stats = np.stack([flat.mean(1) / 255, flat.std(1) / 255, (flat > 25).mean(1)], 1).astype(np.float32)
    return {"pixels": x, "stats": stats}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(bundled("multitask.tflite")))
    parser.add_argument("--data", default=None, help=".npz (default: 1,000 validation images for multitask)")
    parser.add_argument("--metric", default="output-error")
    parser.add_argument("--max-loss", type=float, default=0.01)
    parser.add_argument("--layers", default="all")
    parser.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "cluster.json"))
    args = parser.parse_args()
    model = open(args.model, "rb").read()
    parsed = TFLiteModel(model)
    x, y = (default_data(), None) if args.data is None else load_data(args.data, parsed)
    metric = metrics.get(args.metric)
    names = [layer.name for layer in compressible_layers(parsed, args.layers)]
    evaluator = Evaluator(model, x, y, names, metric=metric)
    budget = allowed_loss(metric, args.max_loss, evaluator.samples)

    start = time.perf_counter()
    reference = assess(evaluator, names, budget)
    rows = [{"executor": "in process", "workers": 0, "seconds": time.perf_counter() - start, "identical": True}]
    per_task, per_layer = None, {}
    for workers in (1, 2):
        cluster = executor.Dask(workers=workers)
        try:
            start_up = time.perf_counter()
            cluster.start(evaluator)
            cluster.map(noop, [(i,) for i in range(workers * 4)])  # every worker has built its evaluator
            ready = time.perf_counter() - start_up
            start = time.perf_counter()
            if workers == 1:  # one task at a time: the gaps between results are the layers' times
                last = [start]

                def record(points):
                    now = time.perf_counter()
                    per_layer[points[0].layer] = now - last[0]
                    last[0] = now
                table = dict(zip(names, cluster.map(assess_one, [(name, budget) for name in names], on_result=record)))
            else:
                table = assess(evaluator, names, budget, executor=cluster)
            seconds = time.perf_counter() - start
            if workers == 2:
                per_task = overhead(cluster)
        finally:
            cluster.close()
        rows.append({"executor": f"Dask, {workers} worker(s)", "workers": workers, "seconds": seconds,
                     "start_seconds": ready, "identical": table == reference})
    serial = rows[1]["seconds"]  # 1 worker
    for r in rows:
        r["speedup"] = serial / r["seconds"]
    projection = [{"workers": w, "seconds": makespan(list(per_layer.values()), w, per_task)} for w in PROJECTED]

    print(f"{os.path.basename(args.model)}: {len(names)} layers, {evaluator.samples} samples, metric {metric.name} "
          f"at {args.max_loss:g}; {sum(len(p) for p in reference.values())} evaluations")
    print(format_table(["executor", "assessment s", "vs 1 worker", "start-up s", "same points"],
                       [[r["executor"], f"{r['seconds']:.1f}", f"{r['speedup']:.2f}x",
                         f"{r.get('start_seconds', 0):.1f}", "yes" if r["identical"] else "NO"] for r in rows]))
    print(f"per-task overhead of the 2-worker cluster: {1000 * per_task:.1f} ms; per-layer seconds (1 worker): "
          + ", ".join(f"{k} {v:.1f}" for k, v in per_layer.items()))
    print("PROJECTION (not measured): longest-first scheduling of the measured per-layer times plus the "
          "per-task overhead")
    print(format_table(["workers", "assessment s", "vs 1 worker"],
                       [[p["workers"], f"{p['seconds']:.1f}", f"{serial / p['seconds']:.2f}x"] for p in projection]))
    target = next(r for r in rows if r["workers"] == 2)["speedup"]
    print(f"{'MET' if target >= 1.7 else 'NOT MET'}  2 workers at least 1.7x 1 worker: {target:.2f}x")
    with open(args.json, "w") as f:
        json.dump({"model": os.path.basename(args.model), "layers": names, "samples": evaluator.samples,
                   "metric": metric.name, "max_loss": args.max_loss, "machine": machine_info(), "runs": rows,
                   "per_layer_seconds": per_layer, "per_task_overhead_s": per_task, "projection": projection},
                  f, indent=1)
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
