"""Make edge_demo/lenet5-update.dszu: an update of the edge demo's LeNet-5 (edge_demo/lenet5.dsz, as a
device decodes it) to that model with its FC layers retrained one more epoch, their masks held.

    python3 bench/builders/edge_update.py

The update's decisions are on the bundled validation split within 0.2% relative output error of the
retrained model: a budget tight enough that every layer's difference carries values (under 0.3 top-1
points the device's model would nearly all be kept), so that the devices run the difference decoder.
Writes the update and lenet5-update.sha256, the SHA-256 of the model it makes: tests/test_updates.py
checks that it still applies to those bytes (the format as shipped), .ci/device that the emulated
devices apply it to the bytes x86-64 does.
"""
import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.updates import trained  # noqa: E402
from pydsz.budget.rule import Budget  # noqa: E402
from pydsz.compress.diff import diff  # noqa: E402
from pydsz.format.update import held_model  # noqa: E402
from pydsz.model.data import bundled, fashion_mnist, load_npz  # noqa: E402
from pydsz.prune.train import Retraining  # noqa: E402

EDGE = ROOT / "edge_demo"


def main() -> int:
    held = held_model(EDGE / "lenet5.dsz")
    x, y = fashion_mnist("train")
    new = trained(held, "fc1", x[:55000], y[:55000].astype("int64"), Retraining(epochs=1, lr=1e-3, distill=0.0))
    val = load_npz(bundled("fmnist_val.npz"))
    result = diff(held, new, val[0], None, Budget("output-error", 0.002))
    (EDGE / "lenet5-update.dszu").write_bytes(result.update)
    digest = hashlib.sha256(result.patched).hexdigest()
    (EDGE / "lenet5-update.sha256").write_text(f"{digest}  lenet5.dsz patched by lenet5-update.dszu\n")
    print(f"lenet5-update.dszu: {len(result.update)} bytes ({', '.join(f'{l.name} {l.kind}' for l in result.layers)}); "
          f"output error of the patched model against the retrained one on validation: {100 * result.loss:.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
