"""`--sparsity auto` with retraining (dsz prune --method retrain): the plan of pydsz.prune.auto_sparsity on the FC tail,
its trials by brief retraining, and the candidates compared.

The curves are measured on the tail's cached training activations with one layer magnitude-pruned and
nothing retrained, their loss the divergence (KL) of the tail's class probabilities from the unpruned
tail's: smooth where top-1 on a few hundred samples moves by whole samples, and a ranking is all the
curves give. Retraining recovers most of that loss, so the family of plans is walked much further than
the curves alone would allow, each step a brief retraining judged on the validation labels. Two families
are candidates: the knapsack's per-layer plans and global magnitude pruning (one threshold over every
layer); the one whose passing plan is predicted smaller is kept. The final retraining then compares two
schedules at that plan, gradual magnitude pruning and one-shot SparseGPT masks retrained, and keeps the
one that loses less on the validation set; a plan the full retraining does not keep within the budget
steps down its family.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Sequence

import numpy as np

from pydsz.budget.rule import Budget
from pydsz.context import Run
from pydsz.prune import auto_sparsity
from pydsz.prune.gptq import DAMP, MAX_HESSIAN_BYTES, inverse_factor, sweep
from pydsz.prune.masks import masks_for
from pydsz.prune.train import ACTIVATIONS, Dense, Retraining, _softmax, logits, retrain

# Multiply-adds the curves may spend per evaluation of the tail: their samples are as many as fit (at
# least PROXY_MIN, at most PROXY_MAX), so that VGG-16's 103M-weight fc1 is not run on thousands.
PROXY_MACS = 2e9
PROXY_MIN, PROXY_MAX = 128, 2000
# One-shot masks need a layer's Hessian (inputs x inputs, four float64 copies while it is inverted, as
# gptq.hessian_bytes counts them): beyond this, the schedule is not a candidate for that model.
ONESHOT_HESSIAN_BYTES = MAX_HESSIAN_BYTES


@dataclass
class AutoPlan:
    """What the search chose: the plan, its family (to step down), and how it was chosen."""

    plan: dict
    family: list
    index: int
    candidate: str  # "per-layer" or "global magnitude"
    notes: list = field(default_factory=list)
    # raises choose's NoiseError where the validation set cannot tell the smallest pruning from noise; for the
    # caller to call where the plan ends at nothing pruned, by the search or by the full retraining stepping down
    resolvable: Callable[[], None] = lambda: None


def tail_curves(layers: Sequence[Dense], h: np.ndarray, names: Sequence[str], progress: bool = False) -> dict:
    """Each named layer's auto_sparsity.Curve on up to PROXY_MAX training samples: magnitude-pruned alone, the
    summed KL divergence of the tail's class probabilities from the unpruned tail's."""
    widest = max(l.weight.size for l in layers)
    n = int(np.clip(PROXY_MACS / widest, PROXY_MIN, PROXY_MAX))
    x = h[:n].reshape(min(n, len(h)), -1).astype(np.float32)
    inputs, a = {}, x
    for l in layers:
        inputs[l.name] = a
        a = ACTIVATIONS[l.activation][0](a @ l.weight.T + l.bias)
    p = _softmax(a.astype(np.float64))
    index = {l.name: i for i, l in enumerate(layers)}

    def loss(name: str, weight: np.ndarray) -> float:
        i = index[name]
        out = logits([replace(layers[i], weight=weight), *layers[i + 1:]], inputs[name])
        q = _softmax(out.astype(np.float64))
        return float(np.sum(p * (np.log(p + 1e-12) - np.log(q + 1e-12))))

    weights = {l.name: l.weight for l in layers if l.name in names}
    return auto_sparsity.measure_curves(weights, lambda name, s: auto_sparsity.magnitude(weights[name], s), loss,
                                  progress=progress)


def choose(layers: list[Dense], train: tuple, val: tuple, names: Sequence[str], judged: Budget, *,
           settings: Retraining = Retraining(epochs=1), teacher: Optional[Sequence[Dense]] = None,
           run: Run = Run()) -> AutoPlan:
    """The most pruned plan whose brief retraining (`settings`: one epoch by default) stays within
    `judged` on the validation labels, from the candidate family predicted smallest. train, val: the
    tail's cached inputs and their labels, (h, y). A brief retraining moves a converged model by
    itself, so a trial is compared with the same brief retraining of the unpruned tail, sample by
    sample (McNemar's noise of the flips). The AutoPlan's `resolvable` raises errors.NoiseError where the
    validation set cannot tell the smallest pruning of the largest layer from noise."""
    (h, y), (h_val, y_val) = train, val
    quiet = replace(run, progress=False)  # a bar per brief retraining would drown the search's own
    warnings = judged.warnings(len(y_val))  # an InputError where the samples cannot resolve the budget
    allowed = judged.allowed(len(y_val))

    def trained(targets):
        return retrain(layers, masks_for(layers, {}), h, y, settings, targets=targets or None, teacher=teacher,
                       run=quiet)

    def hits(candidate):
        return np.argmax(logits(candidate, h_val, run.device), axis=1) == y_val

    reference = hits(trained({}))

    def trial(plan) -> auto_sparsity.Trial:
        candidate = hits(trained(plan))
        lost, gained = int(np.sum(reference & ~candidate)), int(np.sum(~reference & candidate))
        noise = math.sqrt(lost + gained)
        # the net loss alone, without the margin: a brief retraining flips hundreds of samples by itself
        # (its own noise, not the plan's), which as a margin would stop every search at the first rungs;
        # the plan is kept only once its full retraining is within the budget (prune._final_auto)
        return auto_sparsity.Trial(plan, lost - gained <= allowed, lost - gained, noise)

    curves = tail_curves(layers, h, names, run.progress)
    families = {"per-layer": auto_sparsity.plans(curves),
                "global magnitude": auto_sparsity.global_plans({l.name: l.weight for l in layers if l.name in names})}
    found, notes = [], list(warnings)
    for name, family in families.items():
        index, trials = auto_sparsity.search(family, trial, run.progress, desc=f"auto sparsity ({name})")
        size = auto_sparsity.predicted_bytes(curves, family[index])
        found.append((name, family, index, size))
        notes.append(f"auto, {name}: {auto_sparsity.describe(family[index])} (predicted {size} bytes; "
                     f"{len(trials)} brief retrainings)")
    name, family, index, _ = min(found, key=lambda f: f[3])

    sizes = {l.name: l.weight.size for l in layers if l.name in names}
    notes.append(f"auto chose the {name} plan")
    return AutoPlan(dict(family[index]), family, index, name, notes,
                    lambda: auto_sparsity.check_resolvable(trial, sizes, judged, len(y_val), allowed))


def oneshot_masks(layers: Sequence[Dense], h: np.ndarray, targets: dict) -> Optional[list[Dense]]:
    """The tail pruned one-shot to `targets` (SparseGPT on its cached inputs, layer after layer, each on
    the inputs the pruned layers before it give), or None where a Hessian would be too large."""
    if any(4 * 8 * l.weight.shape[1] ** 2 > ONESHOT_HESSIAN_BYTES for l in layers if l.name in targets):
        return None
    x = h[: min(len(h), 5000)].reshape(min(len(h), 5000), -1).astype(np.float64)
    out = []
    for l in layers:
        w = l.weight
        if targets.get(l.name):
            factor = inverse_factor(2.0 / len(x) * (x.T @ x), DAMP, overwrite=True)
            w = sweep(np.asarray(l.weight, np.float64), factor, sparsity=targets[l.name]).astype(np.float32)
        out.append(replace(l, weight=w))
        x = ACTIVATIONS[l.activation][0](x @ w.T.astype(np.float64) + l.bias)
    return out


GRADUAL, ONESHOT = "gradual magnitude", "one-shot masks, retrained"


def retrain_as(schedule: str, dense: list[Dense], train: tuple, targets: dict, *, settings: Retraining,
               teacher: Optional[Sequence[Dense]], run: Run) -> Optional[list[Dense]]:
    """The full retraining of the tail on train = (h, y) at `targets` by `schedule`: GRADUAL (magnitude
    masks tightening on Zhu & Gupta's cubic ramp) or ONESHOT (SparseGPT's masks and compensated
    weights, held while retraining); None where ONESHOT's Hessians would be too large."""
    h, y = train
    if schedule == GRADUAL:
        return retrain(dense, masks_for(dense, {}), h, y, settings, targets=targets, teacher=teacher, run=run)
    start = oneshot_masks(dense, h, targets)
    return None if start is None else retrain(start, masks_for(start, {}), h, y, settings, teacher=teacher, run=run)


def final(dense: list[Dense], train: tuple, targets: dict, lost: Callable, *, settings: Retraining,
          teacher: Optional[Sequence[Dense]], run: Run) -> tuple[list[Dense], str, int]:
    """The full retraining at `targets`, the two schedules of retrain_as compared. Returns the layers that
    lose fewer validation samples (`lost(layers)`), the schedule's name and that count."""
    results = []
    for schedule in (GRADUAL, ONESHOT):
        layers = retrain_as(schedule, dense, train, targets, settings=settings, teacher=teacher, run=run)
        if layers is not None:
            results.append((lost(layers), schedule, layers))
    count, name, layers = min(results, key=lambda r: r[0])
    return layers, name, count
