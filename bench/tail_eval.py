"""How fast the assessment evaluates candidates on the numpy tail, in one run.

1. Per layer of the bundled LeNets (magnitude-pruned, as a pruned model would be), evaluations per
   second of the Evaluator recomputing the whole tail for every candidate (what it did before) and
   recomputing only the layers from the changed one on (what it does now), with the answers
   compared: the outputs must be identical, bit for bit.
2. The sparse tail (pruned layers through libdsz's CSR kernel, pydsz.model.sparse) against the dense
   numpy tail, same run, same thread count: evaluations per second of one candidate per layer (its
   weights decoded from the codec at a bound), and the answers: top-1 counts and losses on both
   paths. Rows for the pruned LeNets (the Evaluator, Fashion-MNIST) and for AlexNet- and
   VGG-16-shaped FC tails (9216/25088 -> 4096 -> 4096 -> 10, fc6/fc7 at 9% (AlexNet) or 4% (VGG)
   and fc8 at 25% density, random weights and features, labels: the dense tail's classes).
3. One pruned layer's product (AlexNet/VGG shapes, 1,000 samples): dense BLAS, scipy.sparse CSR
   and libdsz's CSR kernel; and the kernel's speed-up over BLAS against density on a 4096x4096
   layer, to place the crossover (plotted to tail_eval_density.png).

Usage: python3 bench/tail_eval.py [--repeat 3] [--samples 500,2000]
"""
import argparse
import copy
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
from machine import machine_info  # noqa: E402
from tqdm import tqdm  # noqa: E402

from pydsz.assess.evaluator import Evaluator  # noqa: E402
from pydsz.encode.tensor import encode_weight  # noqa: E402
from pydsz.model import sparse  # noqa: E402
from pydsz.model.data import bundled, load_npz  # noqa: E402
from pydsz.model.graph import TFLiteModel  # noqa: E402
from pydsz.model.tail import Step, Tail  # noqa: E402
from pydsz.prune.masks import magnitude_mask  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

PRUNED = {"lenet300": {"fc1": 0.92, "fc2": 0.92, "fc3": 0.5}, "lenet5": {"fc1": 0.95, "fc2": 0.7}}
# FC tails as (out, in, density) per layer: the 10-class models pruned as in the paper
LARGE = {"alexnet": {"fc6": (4096, 9216, 0.09), "fc7": (4096, 4096, 0.09), "fc8": (10, 4096, 0.25)},
         "vgg16": {"fc6": (4096, 25088, 0.04), "fc7": (4096, 4096, 0.04), "fc8": (10, 4096, 0.25)}}
# single products at the paper's shapes (fc8 with ImageNet's 1,000 classes)
KERNELS = {"alexnet fc6": (4096, 9216, 0.09), "alexnet fc7": (4096, 4096, 0.09), "alexnet fc8": (1000, 4096, 0.25),
           "vgg16 fc6": (4096, 25088, 0.04), "vgg16 fc7": (4096, 4096, 0.04)}
DENSITIES = (0.01, 0.02, 0.04, 0.09, 0.15, 0.25, 0.35, 0.5)
BOUND = 0.01  # the candidates' error bound (absolute), in the range DeepSZ sweeps


def best(repeat: int, *functions) -> list:
    """The best time of each function over `repeat` rounds, the functions taking turns in each round
    so that a burst of load from elsewhere on the (shared) machine hits them alike."""
    times = [[] for _ in functions]
    for _ in range(repeat):
        for f, t in zip(functions, times):
            start = time.perf_counter()
            f()
            t.append(time.perf_counter() - start)
    return [min(t) for t in times]


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
            t_whole, t_down = best(repeat, whole, downstream)
            rows.append({"model": f"{name} pruned", "layer": layer, "samples": len(evaluator.h),
                         "whole_per_s": 1 / t_whole, "downstream_per_s": 1 / t_down, "speedup": t_whole / t_down,
                         "identical": bool(same)})
    return rows


def dense_copy(tail: Tail) -> Tail:
    """The same tail with every layer multiplied by dense BLAS (today's path before the kernel)."""
    dense = copy.copy(tail)
    dense.sparse = frozenset()
    return dense


def compare(name, samples, layer, evaluate, repeat, extra) -> dict:
    """Time and answers of evaluate(path) on the "dense" and "sparse" paths."""
    row = {"model": name, "layer": layer, "samples": samples}
    t_dense, t_sparse = best(repeat, lambda: evaluate("dense"), lambda: evaluate("sparse"))
    row["dense_per_s"], row["sparse_per_s"] = 1 / t_dense, 1 / t_sparse
    row.update(extra())
    row["speedup"] = row["sparse_per_s"] / row["dense_per_s"]
    return row


def lenet_sparse_rows(repeat: int) -> list:
    """The Evaluator on the pruned LeNets, its tail dense and sparse: speed, top-1 counts, losses."""
    x, y = load_npz(bundled("fmnist_val.npz"))
    rows = []
    for name, sparsity in PRUNED.items():
        model = TFLiteModel(bundled(f"{name}.tflite").read_bytes())
        pruned = TFLiteModel(model.replace({n: np.where(magnitude_mask(model.weight(n), s), model.weight(n), 0)
                                            for n, s in sparsity.items()}))
        evaluators = {"sparse": Evaluator(pruned.data, x, y, list(sparsity))}
        evaluators["dense"] = Evaluator(pruned.data, x, y, list(sparsity))
        evaluators["dense"].tail.sparse = frozenset()  # before any evaluation: every cache is dense
        for layer in evaluators["sparse"].tail.layers:
            weights = {layer: encode_weight(pruned.weight(layer), BOUND)[0]}

            def answers(weights=weights):
                out = {}
                for path, ev in evaluators.items():
                    m = ev.measure(weights)
                    logits = ev._outputs(weights, True)[ev._tail_output]
                    out[f"{path}_top1"] = int(np.sum(np.argmax(logits.reshape(len(y), -1), 1) == y))
                    out[f"{path}_loss"] = [m.loss, m.lost, m.gained]
                out["sparse_layer"] = layer in evaluators["sparse"].tail.sparse
                return out

            rows.append(compare(f"{name} pruned", len(y), layer,
                                lambda path, w=weights: evaluators[path]._outputs(w, True), repeat, answers))
    return rows


def large_tail(layers: dict, seed: int) -> Tail:
    """A FC tail of the given shapes with random pruned weights, He-scaled on the kept inputs."""
    rng = np.random.default_rng(seed)
    steps, weights, biases = [], {}, {}
    for i, (name, (out, inp, density)) in enumerate(layers.items()):
        w = rng.normal(scale=np.sqrt(2 / (inp * density)), size=(out, inp)).astype(np.float32)
        w[rng.random((out, inp)) >= density] = 0
        weights[name], biases[name] = w, rng.normal(scale=0.01, size=out).astype(np.float32)
        last = i == len(layers) - 1
        steps.append(Step("fc", "FULLY_CONNECTED", name=name, activation="NONE" if last else "RELU", shape=(out,)))
    steps.append(Step("softmax", "SOFTMAX", shape=(steps[-1].shape)))
    first = next(iter(layers.values()))
    return Tail(0, (first[1],), 1, steps, weights, biases)


def large_sparse_rows(repeat: int, sample_counts: list) -> list:
    """AlexNet- and VGG-shaped tails, dense and sparse, one candidate per layer: speed and answers."""
    rows = []
    for model, layers in LARGE.items():
        tail = large_tail(layers, seed=len(rows))
        paths = {"sparse": tail, "dense": dense_copy(tail)}
        first = next(iter(layers.values()))
        for n in sample_counts:
            h = np.maximum(np.random.default_rng(n).normal(size=(n, first[1])), 0).astype(np.float32)
            # labels: the dense tail's own classes (the agreement metric), so the baseline is exact on
            # the dense path and any class the sparse path's rounding changes shows up as a loss
            y = np.argmax(paths["dense"].forward(h), 1)
            for layer in tqdm(tail.layers, desc=f"{model}, {n} samples", leave=False):
                weights = {layer: encode_weight(tail.weights[layer], BOUND)[0]}
                inputs = {path: t.input_of(h, layer) for path, t in paths.items()}
                run = lambda path, w=weights: paths[path].forward_from(layer, inputs[path], w)  # noqa: E731

                def answers(weights=weights):
                    out = {}
                    for path, t in paths.items():
                        base = int(np.sum(np.argmax(t.forward_from(layer, inputs[path]), 1) == y))
                        cand = int(np.sum(np.argmax(t.forward_from(layer, inputs[path], weights), 1) == y))
                        out[f"{path}_top1"], out[f"{path}_loss"] = cand, [base - cand]
                    out["sparse_layer"] = layer in tail.sparse
                    return out

                rows.append(compare(f"{model}-shaped", n, layer, run, repeat, answers))
    return rows


def pruned_matrix(rng, out: int, inp: int, density: float) -> np.ndarray:
    w = rng.normal(scale=0.01, size=(out, inp)).astype(np.float32)
    w[rng.random((out, inp)) >= density] = 0
    return w


def kernel_rows(repeat: int) -> list:
    """One layer's product with 1,000 samples: dense BLAS, scipy CSR, libdsz's CSR kernel."""
    from scipy import sparse as scipy_sparse

    rng = np.random.default_rng(0)
    rows = []
    for name, (out, inp, density) in tqdm(KERNELS.items(), desc="single products", leave=False):
        w = pruned_matrix(rng, out, inp, density)
        v = np.maximum(rng.normal(size=(1000, inp)), 0).astype(np.float32)
        scipy_csr, csr = scipy_sparse.csr_matrix(w), sparse.CSR.from_dense(w)
        t_dense, t_scipy, t_dsz = best(repeat, lambda: v @ w.T, lambda: (scipy_csr @ v.T).T,
                                       lambda: sparse.matmul(v, csr))
        rows.append({"layer": name, "shape": [out, inp], "density": density, "dense_ms": 1000 * t_dense,
                     "scipy_ms": 1000 * t_scipy, "libdsz_ms": 1000 * t_dsz, "libdsz_speedup": t_dense / t_dsz,
                     "scipy_speedup": t_dense / t_scipy,
                     "max_difference": float(np.max(np.abs(v @ w.T - sparse.matmul(v, csr))))})
    return rows


def density_rows(repeat: int) -> list:
    """The kernel's speed-up over dense BLAS on a 4096x4096 layer, 1,000 samples, by density."""
    rng = np.random.default_rng(1)
    v = np.maximum(rng.normal(size=(1000, 4096)), 0).astype(np.float32)
    rows = []
    for density in tqdm(DENSITIES, desc="density sweep", leave=False):
        w = pruned_matrix(rng, 4096, 4096, density)
        csr = sparse.CSR.from_dense(w)
        t_dense, t_dsz = best(repeat, lambda: v @ w.T, lambda: sparse.matmul(v, csr))
        rows.append({"density": density, "dense_ms": 1000 * t_dense, "libdsz_ms": 1000 * t_dsz,
                     "speedup": t_dense / t_dsz})
    return rows


def plot(rows: list, path: str) -> None:
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([100 * r["density"] for r in rows], [r["speedup"] for r in rows], "o-", label="libdsz CSR kernel")
    ax.axhline(1, color="gray", lw=1, ls="--", label="dense BLAS")
    ax.axvline(100 * sparse.DENSITY_THRESHOLD, color="tab:red", lw=1, ls=":", label="Tail's threshold")
    ax.set_xlabel("density of the layer (% non-zeros)")
    ax.set_ylabel("speed-up over dense BLAS")
    ax.set_yscale("log")
    ax.set_yticks([0.25, 0.5, 1, 2, 4, 8, 16])
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%gx"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_title(f"4096x4096 layer, 1,000 samples, {sparse.threads()} threads each")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def same(r: dict) -> str:
    if r["dense_top1"] == r["sparse_top1"] and r["dense_loss"] == r["sparse_loss"]:
        return "yes"
    return f"NO: top-1 {r['dense_top1']} vs {r['sparse_top1']}, loss {r['dense_loss']} vs {r['sparse_loss']}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--samples", default="500,2000", help="sample counts of the large tails")
    parser.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "tail_eval.json"))
    args = parser.parse_args()
    blas_threads = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS") if k in os.environ}
    print(f"dense BLAS: numpy's ({blas_threads or 'default threads: one per core'}); "
          f"sparse: libdsz's CSR kernel on {sparse.threads()} threads; best of {args.repeat}")
    tails = tail_rows(args.repeat)
    print("\nevaluations per second on the numpy tail (5,000 validation images)")
    print(format_table(["model", "layer", "whole tail /s", "from the layer /s", "speed-up", "identical"],
                       [[r["model"], r["layer"], f"{r['whole_per_s']:.1f}", f"{r['downstream_per_s']:.1f}",
                         f"{r['speedup']:.2f}x", "yes" if r["identical"] else "NO"] for r in tails]))
    sparse_tails = lenet_sparse_rows(args.repeat)
    sparse_tails += large_sparse_rows(args.repeat, [int(n) for n in args.samples.split(",")])
    print(f"\ncandidate evaluations per second (one layer decoded at bound {BOUND}, the layers from it on "
          "recomputed): dense tail vs sparse tail; top-1 = correct samples, loss = samples lost "
          "(LeNets: the Evaluator's loss, samples lost, gained)")
    print(format_table(["model", "layer", "sparse", "samples", "dense /s", "sparse /s", "speed-up", "top-1",
                        "loss", "same answers"],
                       [[r["model"], r["layer"], "yes" if r["sparse_layer"] else "no", r["samples"],
                         f"{r['dense_per_s']:.2f}", f"{r['sparse_per_s']:.2f}", f"{r['speedup']:.2f}x",
                         r["sparse_top1"], r["sparse_loss"], same(r)] for r in sparse_tails]))
    kernels = kernel_rows(args.repeat)
    print("\none pruned layer's product with 1,000 samples")
    print(format_table(["layer", "shape", "density", "dense BLAS ms", "scipy CSR ms", "libdsz CSR ms",
                        "libdsz speed-up", "scipy speed-up", "max |diff|"],
                       [[r["layer"], "x".join(map(str, r["shape"])), f"{r['density']:.2f}", f"{r['dense_ms']:.1f}",
                         f"{r['scipy_ms']:.1f}", f"{r['libdsz_ms']:.1f}", f"{r['libdsz_speedup']:.2f}x",
                         f"{r['scipy_speedup']:.2f}x", f"{r['max_difference']:.1e}"] for r in kernels]))
    densities = density_rows(args.repeat)
    print("\nlibdsz CSR kernel vs dense BLAS by density (4096x4096, 1,000 samples)")
    print(format_table(["density", "dense BLAS ms", "libdsz CSR ms", "speed-up"],
                       [[f"{r['density']:.2f}", f"{r['dense_ms']:.1f}", f"{r['libdsz_ms']:.1f}",
                         f"{r['speedup']:.2f}x"] for r in densities]))
    plot(densities, os.path.splitext(args.json)[0] + "_density.png")
    with open(args.json, "w") as f:
        json.dump({"machine": machine_info(), "threads": sparse.threads(), "blas_env": blas_threads,
                   "repeat": args.repeat, "tail": tails, "sparse_tail": sparse_tails, "kernels": kernels,
                   "density": densities}, f, indent=1)
    return 0 if all(r["identical"] for r in tails) else 1


if __name__ == "__main__":
    sys.exit(main())
