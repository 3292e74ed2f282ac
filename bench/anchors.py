"""pydsz head to head with the anchors (DeepSZ, Deep Compression, TFLite quantization, zstd) on the
bundled reference models: `dsz bench` on LeNet-300-100 and LeNet-5, pruned as bench/reference.py
prunes them (pydsz.compress.demo.REFERENCE: the first 55,000 Fashion-MNIST training images from
Debian's dataset-fashion-mnist), budgets decided on the validation split, accuracy judged on the
test split. Prints each model's table and writes bench/results/anchors_<model>.json and .png.

Usage: python3 bench/anchors.py [--models lenet300,lenet5] [--max-loss 0.003] [--quiet]
"""
import argparse
import os
import sys
import time

# The retraining multiplies small matrices: on a shared 2-core machine BLAS threads only spin.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the extension is built in place (setup.py build_ext --inplace)
from pydsz.bench import anchors, summary  # noqa: E402
from pydsz.compress.demo import REFERENCE, TRAIN_SIZE  # noqa: E402
from pydsz.context import Run  # noqa: E402
from pydsz.model.data import bundled, fashion_mnist, load_npz  # noqa: E402
from pydsz.prune.train import Retraining  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="lenet300,lenet5", help="comma-separated: " + ", ".join(REFERENCE))
    parser.add_argument("--max-loss", type=float, default=0.003)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results"), help="results directory")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args()

    x, y = fashion_mnist("train")
    train = (x[:TRAIN_SIZE], y[:TRAIN_SIZE])
    val, test = load_npz(bundled("fmnist_val.npz")), load_npz(bundled("fmnist_test.npz"))
    for name in args.models.split(","):
        spec = REFERENCE[name]
        start = time.perf_counter()
        pruned = anchors.Pruned(train, spec["sparsity"], Retraining(epochs=spec["epochs"], distill=spec["distill"]))
        info = anchors.benchmark(bundled(spec["file"]).read_bytes(), val, test, args.max_loss, pruned=pruned,
                                 sweep=anchors.Sweep(title=spec["title"]), run=Run(progress=not args.quiet))
        info["seconds"] = time.perf_counter() - start
        stem = os.path.join(args.out, f"anchors_{name}")
        summary.write_report(info, args.out, stem=f"anchors_{name}")
        lines = summary.summary_lines(info)
        print(f"\n{lines[0]}\n{summary.main_table(info)}\n" + "\n".join(lines[1:]))
        print(f"\n{summary.sweep_table(info)}\nwrote {stem}.json and .png ({info['seconds']:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
