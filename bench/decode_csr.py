"""A pruned FC layer's sparse stream into CSR: straight (CSR.from_stream) against through the dense matrix
(CSR.from_dense(decode_sparse)), time and peak memory, in one run.

Layers: AlexNet fc6 (4096x9216 at 9%) and VGG-16 fc6 (4096x25088 at 4%), Laplace weights magnitude-
pruned, encoded at bound 1e-3 under each index codec (predictor none, what weights get). For each,
timed in alternation (best of --repeat) so that all share the machine's noise:
  dense      codec.decode_sparse(s): the dense matrix alone (what the CSR path used to start from)
  via dense  CSR.from_dense(codec.decode_sparse(s)): the dense matrix, then its CSR
  straight    CSR.from_stream(s): libdsz's dsz_decodeSparseCSR, no dense matrix
Peak memory: the largest traced allocation total (tracemalloc sees numpy's arrays) while each path
runs once, the stream itself excluded. Both CSRs are checked equal bit for bit.

    python3 bench/decode_csr.py [--repeat 5] [--json PATH]
"""
import argparse
import json
import os
import sys
import time
import tracemalloc

import numpy as np
from tqdm import tqdm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.dirname(os.path.abspath(__file__))]
from machine import machine_info  # noqa: E402  (bench/machine.py)

from pydsz.format import codec  # noqa: E402
from pydsz.model.sparse import CSR  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

LAYERS = [("AlexNet fc6", 4096, 9216, 0.09), ("VGG-16 fc6", 4096, 25088, 0.04)]
INDEX_CODECS = ("gap8", "huffgap", "bitmap")
BOUND = 1e-3
SEED = 2019
MIB = 1 << 20


def pruned(rows: int, cols: int, density: float) -> np.ndarray:
    """Laplace weights (scale 0.01) with all but the largest `density` of them set to zero."""
    rng = np.random.default_rng(SEED)
    w = rng.laplace(0, 0.01, (rows, cols)).astype(np.float32)
    w[np.abs(w) < np.quantile(np.abs(w[:256]), 1 - density)] = 0  # the threshold from a sample of rows
    return w


def via_dense(s: bytes) -> CSR:
    return CSR.from_dense(codec.decode_sparse(s))


def best_times(fns: dict, repeat: int) -> dict:
    """Best wall time in ms of each function, the functions run in turn `repeat` times."""
    best = {name: float("inf") for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return {name: 1e3 * t for name, t in best.items()}


def peak_mib(fn) -> float:
    """The traced allocation peak above what was allocated when fn started, in MiB."""
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    result = fn()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    del result
    return peak / MIB


def same(a: CSR, b: CSR) -> bool:
    return (a.shape == b.shape and np.array_equal(a.row_ptr, b.row_ptr) and np.array_equal(a.col_index, b.col_index)
            and a.values.tobytes() == b.values.tobytes())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="timing rounds (the best is kept)")
    ap.add_argument("--json", default=os.path.join(ROOT, "bench/results/decode_csr.json"))
    args = ap.parse_args()
    rows = []
    cases = [(layer, ic) for layer in LAYERS for ic in INDEX_CODECS]
    weights = {}
    for (name, r, c, density), ic in tqdm(cases, desc="layers x index codecs"):
        if name not in weights:
            weights = {name: pruned(r, c, density)}  # one layer's matrix held at a time
        w = weights[name]
        s = codec.encode_sparse(w, BOUND, index_codec=ic, predictor="none")
        info = codec.sparse_info(s)
        equal = same(CSR.from_stream(s), via_dense(s))
        ms = best_times({"dense": lambda: codec.decode_sparse(s), "via dense": lambda: via_dense(s),
                         "straight": lambda: CSR.from_stream(s)}, args.repeat)
        mem = {"via dense": peak_mib(lambda: via_dense(s)), "straight": peak_mib(lambda: CSR.from_stream(s))}
        rows.append({"layer": name, "shape": [r, c], "density": info["nnz"] / w.size, "nnz": info["nnz"],
                     "index_codec": ic, "stream_bytes": len(s), "dense_mib": w.nbytes / MIB, "ms": ms,
                     "peak_mib": mem, "time_ratio": ms["straight"] / ms["via dense"],
                     "memory_ratio": mem["straight"] / mem["via dense"], "identical": equal})
    print(format_table(
        ["layer", "index", "nnz", "dense ms", "via dense ms", "straight ms", "time straight/via",
         "via dense peak MiB", "straight peak MiB", "memory straight/via", "identical"],
        [[x["layer"], x["index_codec"], x["nnz"], f"{x['ms']['dense']:.1f}", f"{x['ms']['via dense']:.1f}",
          f"{x['ms']['straight']:.1f}", f"{x['time_ratio']:.2f}", f"{x['peak_mib']['via dense']:.0f}",
          f"{x['peak_mib']['straight']:.0f}", f"{x['memory_ratio']:.3f}", x["identical"]] for x in rows]))
    print(f"best of {args.repeat}, timed in alternation; the machine may have been shared (compare ratios)")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"machine": machine_info(), "bound": BOUND, "repeat": args.repeat, "rows": rows}, f, indent=1)
        f.write("\n")
    return 0 if all(x["identical"] for x in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
