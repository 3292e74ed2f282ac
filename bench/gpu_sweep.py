"""The assessment sweep on the CPU (numpy) and on the GPU (pycuda) in the same run.

An AlexNet-shaped FC tail: fc6 4096x9216, fc7 4096x4096, fc8 1000x4096 pruned 91/91/75%
(synthetic weights), 10k synthetic cached activations; each layer alone quantized at 16 bounds,
the rest of the tail run, top-1 counted (pydsz.gpu.reference.sweep vs pydsz.gpu.sweep.sweep).
Checks that both give the same size estimates and outlier counts and correct counts within 1e-4
of the samples, and reports speedup = CPU time / GPU time (target >= 20).

On a GPU machine it writes bench/results/gpu_sweep.json; without one it runs the CPU part and
says the GPU part is skipped. Usage: python3 bench/gpu_sweep.py [--samples N] [--scale S] [--json PATH]
(--scale 0.125 shrinks every width for a quick smoke run; the JSON is written only at scale 1).
"""
import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the extension is built in place (setup.py build_ext --inplace)
from machine import machine_info  # noqa: E402  (bench/machine.py)

from pydsz.gpu import device, reference  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

# (name, out, in, pruned share): AlexNet's FC layers and Deep Compression's pruning (ANCHORS.md)
LAYERS = (("fc6", 4096, 9216, 0.91), ("fc7", 4096, 4096, 0.91), ("fc8", 1000, 4096, 0.75))
BOUNDS = tuple(float(b) for b in np.geomspace(1e-4, 5e-2, 16))
TARGET = 20.0
SEED = 2019


class Dense:
    def __init__(self, name, weight, bias, activation):
        self.name, self.weight, self.bias, self.activation = name, weight, bias, activation


def make_tail(scale: float, rng):
    layers = []
    for i, (name, out, inp, pruned) in enumerate(LAYERS):
        out = out if i == len(LAYERS) - 1 else max(8, int(out * scale))
        inp = max(8, int(inp * scale))
        if i:
            inp = layers[-1].weight.shape[0]
        w = (rng.standard_normal((out, inp), dtype=np.float32) * np.float32(2 / np.sqrt(inp * (1 - pruned))))
        w[np.abs(w) < np.quantile(np.abs(w[: min(out, 256)]), pruned)] = 0  # magnitude pruning
        b = (rng.standard_normal(out, dtype=np.float32) * np.float32(0.01))
        layers.append(Dense(name, w, b, "NONE" if i == len(LAYERS) - 1 else "RELU"))
    return layers


def make_data(layers, samples: int, rng):
    """ReLU'd activations (like pooled conv features) and labels: the tail's own top-1, 10% flipped."""
    h = np.maximum(rng.standard_normal((samples, layers[0].weight.shape[1]), dtype=np.float32), 0)
    ops = reference.plan(layers)
    y = np.concatenate([np.argmax(reference.run(ops, h[i:i + 4096]), axis=1) for i in range(0, samples, 4096)])
    flip = rng.random(samples) < 0.1
    y[flip] = rng.integers(0, layers[-1].weight.shape[0], int(flip.sum()))
    return h, y


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--scale", type=float, default=1.0, help="width scale of fc6/fc7 (1 = AlexNet)")
    parser.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "gpu_sweep.json"))
    args = parser.parse_args()

    rng = np.random.default_rng(SEED)
    layers = make_tail(args.scale, rng)
    h, y = make_data(layers, args.samples, rng)
    bounds = {l.name: list(BOUNDS) for l in layers}
    shapes = {l.name: list(l.weight.shape) for l in layers}
    density = {l.name: round(float(np.count_nonzero(l.weight)) / l.weight.size, 4) for l in layers}
    print(f"tail {shapes}, density {density}, {args.samples} samples, {len(BOUNDS)} bounds per layer")

    why = device.missing()
    gpu_name = None
    if why is None:
        from pydsz.gpu import _cuda, sweep

        gpu_name = device.name()
        _, compile_s = timed(_cuda.module)
        small = {layers[-1].name: BOUNDS[:1]}  # warm-up: context, allocations, kernel loads
        sweep.sweep(layers, h[:256], y[:256], small)
        print(f"GPU: {gpu_name} (kernels compiled in {compile_s:.1f} s)")

    cpu, cpu_s = timed(lambda: reference.sweep(layers, h, y, bounds))
    baseline = reference.correct(reference.plan(layers), h, y)
    print(f"CPU (numpy, {os.cpu_count()} cores): {cpu_s:.2f} s; baseline {baseline}/{len(y)} correct")
    if why is not None:
        print(f"GPU part skipped: {why}")
        return 0

    gpu, gpu_s = timed(lambda: sweep.sweep(layers, h, y, bounds))
    speedup = cpu_s / gpu_s
    rows, points, worst, same_sizes = [], [], 0.0, True
    for name in bounds:
        for c, g in zip(cpu[name], gpu[name]):
            diff = abs(c.correct - g.correct) / len(y)
            worst = max(worst, diff)
            same_sizes &= (c.est_bytes, c.outliers) == (g.est_bytes, g.outliers)
            rows.append([name, c.bound, c.correct, g.correct, c.est_bytes, g.est_bytes, c.outliers])
            points.append({"layer": name, "bound": c.bound, "correct_cpu": c.correct, "correct_gpu": g.correct,
                           "est_bytes_cpu": c.est_bytes, "est_bytes_gpu": g.est_bytes, "outliers": c.outliers})
    print(format_table(["layer", "bound", "correct cpu", "correct gpu", "est bytes cpu", "est bytes gpu", "outliers"],
                       rows))
    agree = same_sizes and worst <= 1e-4
    print(f"\nGPU {gpu_s:.2f} s, CPU {cpu_s:.2f} s: speedup {speedup:.1f}x (target >= {TARGET:.0f}x) "
          f"{'PASS' if speedup >= TARGET else 'FAIL'}")
    print(f"answers: size estimates {'identical' if same_sizes else 'DIFFER'}, largest accuracy difference "
          f"{worst:.2g} (<= 1e-4) {'PASS' if agree else 'FAIL'}")
    if args.scale != 1.0:
        print("--scale != 1: no JSON written")
        return 0 if agree else 1
    result = {
        "benchmark": "gpu_sweep", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": gpu_name, "machine": machine_info(), "samples": args.samples, "shapes": shapes,
        "density": density, "bounds": list(BOUNDS), "evaluations": sum(len(b) for b in bounds.values()),
        "baseline_correct": baseline, "cpu_s": round(cpu_s, 3), "gpu_s": round(gpu_s, 3),
        "speedup": round(speedup, 2), "target": TARGET, "speedup_pass": speedup >= TARGET,
        "size_estimates_identical": same_sizes, "max_accuracy_difference": worst, "answers_pass": agree,
        "points": points,
    }
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.json}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
