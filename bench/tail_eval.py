"""How fast the assessment evaluates candidates on the numpy tail, in one run.

1. Per layer of the bundled LeNets (magnitude-pruned, as a pruned model would be), evaluations per
   second of the Evaluator recomputing the whole tail for every candidate (what it did before) and
   recomputing only the layers from the changed one on (what it does now), with the answers
   compared: the outputs must be identical, bit for bit.
2. The matrix product of a pruned layer at AlexNet's FC shapes and densities (fc6 4096x9216 and fc7
   4096x4096 at 9%, fc8 1000x4096 at 25%; 1,000 samples, random values): dense BLAS against
   scipy.sparse (CSR), to decide whether a sparse kernel would pay (not wired in: its sums run in
   another order, so its answers would not be the dense path's bit for bit).

Usage: python3 bench/tail_eval.py [--repeat 5]
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

from machine import machine_info  # noqa: E402
from pydsz.assess import Evaluator, encode_weight  # noqa: E402
from pydsz.data import bundled, load_npz  # noqa: E402
from pydsz.model import TFLiteModel  # noqa: E402
from pydsz.prune import magnitude_mask  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

PRUNED = {"lenet300": {"fc1": 0.92, "fc2": 0.92, "fc3": 0.5}, "lenet5": {"fc1": 0.95, "fc2": 0.7}}
ALEXNET = {"fc6": (4096, 9216, 0.09), "fc7": (4096, 4096, 0.09), "fc8": (1000, 4096, 0.25)}


def best(f, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return min(times)


def tail_rows(repeat: int) -> list:
    x, y = load_npz(bundled("fmnist_val.npz"))
    rows = []
    for name, sparsity in PRUNED.items():
        model = TFLiteModel(bundled(f"{name}.tflite").read_bytes())
        pruned = model.replace({n: np.where(magnitude_mask(model.weight(n), s), model.weight(n), 0)
                                for n, s in sparsity.items()})
        evaluator = Evaluator(pruned, x, y, list(sparsity))
        tail = evaluator.tail
        for layer in tail.layers:
            weights = {layer: encode_weight(TFLiteModel(pruned).weight(layer), 0.01)[0]}
            evaluator.measure(weights)  # caches the activations reaching the layer
            whole = lambda: tail.forward(evaluator.h, weights)  # noqa: E731
            downstream = lambda: evaluator._outputs(weights, True)  # noqa: E731
            same = np.array_equal(whole().reshape(-1), downstream()[evaluator._tail_output].reshape(-1))
            t_whole, t_down = best(whole, repeat), best(downstream, repeat)
            rows.append({"model": f"{name} pruned", "layer": layer, "samples": len(evaluator.h),
                         "whole_per_s": 1 / t_whole, "downstream_per_s": 1 / t_down, "speedup": t_whole / t_down,
                         "identical": bool(same)})
    return rows


def kernel_rows(repeat: int) -> list:
    from scipy import sparse

    rng = np.random.default_rng(0)
    rows = []
    for name, (out, inp, density) in ALEXNET.items():
        w = rng.normal(scale=0.01, size=(out, inp)).astype(np.float32)
        w[rng.random((out, inp)) >= density] = 0
        v = np.maximum(rng.normal(size=(1000, inp)), 0).astype(np.float32)
        csr = sparse.csr_matrix(w)
        t_dense = best(lambda: v @ w.T, repeat)
        t_sparse = best(lambda: (csr @ v.T).T, repeat)
        rows.append({"layer": name, "shape": [out, inp], "density": density, "dense_ms": 1000 * t_dense,
                     "sparse_ms": 1000 * t_sparse, "sparse_over_dense": t_dense / t_sparse,
                     "max_difference": float(np.max(np.abs(v @ w.T - (csr @ v.T).T)))})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "tail_eval.json"))
    args = parser.parse_args()
    tails = tail_rows(args.repeat)
    print("evaluations per second on the numpy tail (5,000 validation images), best of", args.repeat)
    print(format_table(["model", "layer", "whole tail /s", "from the layer /s", "speed-up", "identical"],
                       [[r["model"], r["layer"], f"{r['whole_per_s']:.1f}", f"{r['downstream_per_s']:.1f}",
                         f"{r['speedup']:.2f}x", "yes" if r["identical"] else "NO"] for r in tails]))
    kernels = kernel_rows(args.repeat)
    print("\none pruned layer's product with 1,000 samples (AlexNet FC shapes), best of", args.repeat)
    print(format_table(["layer", "shape", "density", "dense BLAS ms", "scipy CSR ms", "CSR speed-up", "max |diff|"],
                       [[r["layer"], "x".join(map(str, r["shape"])), f"{r['density']:.2f}", f"{r['dense_ms']:.1f}",
                         f"{r['sparse_ms']:.1f}", f"{r['sparse_over_dense']:.2f}x", f"{r['max_difference']:.1e}"]
                        for r in kernels]))
    with open(args.json, "w") as f:
        json.dump({"machine": machine_info(), "tail": tails, "kernels": kernels}, f, indent=1)
    return 0 if all(r["identical"] for r in tails) else 1


if __name__ == "__main__":
    sys.exit(main())
