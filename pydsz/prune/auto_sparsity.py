"""Auto sparsity as a plan: how much to prune each layer for the smallest file, decided the way compress
decides bounds.

Per layer, a curve: the loss with that layer alone pruned at each rung of masks.AUTO_LADDER, measured
cheaply (no retraining: magnitude masks, or one-shot SparseGPT masks with their compensation), and the
bytes the layer then takes in a .dsz: libdsz's index and value bytes of the pruned layer at a reference
bound, not the kept count (a sparser layer's index costs more bits per kept weight). pydsz.budget.knapsack's
knapsack allocates across layers: for each budget of that loss, the sparsities of the fewest bytes.
Ordered from the least pruned to the most, those plans are the family that `search` walks with measured
trials. The curves only choose what to measure: every plan a user sees was measured on the data, and a
retrained one is checked again after the retraining.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from pydsz.budget.knapsack import Option, minimize_size
from pydsz.format import codec
from pydsz.prune.masks import AUTO_LADDER, by_size, magnitude_mask

# The size model's bound, as a share of the standard deviation of the layer's unpruned weights: about
# where compress's bounds land on pruned layers (bench/results/reference.json: 0.15-0.2 of it on the
# LeNets' large layers at 0.3 points, where the index takes half the bytes or more); the ranking of
# plans, not the bytes themselves, is what it decides.
REFERENCE_BOUND = 0.15
# Layers beyond this many weights are sized on a sample of their rows (the index codes gaps along
# rows, so rows spread over the layer size it in proportion).
SIZE_SAMPLE = 1 << 21
# Proxy budgets the family is planned at (geometric between the smallest and the largest loss).
BUDGETS = 40
# The knapsack counts each budget in this many units: plans exact to a fraction of it.
UNITS = 200

Plan = dict  # {layer: sparsity}; layers left out are not pruned


@dataclass(frozen=True)
class Curve:
    """One layer alone: its loss (non-decreasing) and bytes at each sparsity, sparsity 0 first."""

    name: str
    sparsity: tuple
    loss: tuple
    size: tuple


def reference_bound(weight: np.ndarray) -> float:
    """The size model's absolute bound for a layer: REFERENCE_BOUND of its non-zero weights' spread."""
    w = np.asarray(weight, np.float32).reshape(-1)
    if w.size > SIZE_SAMPLE:
        w = w[:: w.size // SIZE_SAMPLE]
    nonzero = w[w != 0]
    return max(float(np.std(nonzero)) if nonzero.size else 0.0, 1e-12) * REFERENCE_BOUND


def stored_bytes(weight: np.ndarray, bound: float) -> int:
    """libdsz's index + value bytes of a pruned weight tensor at absolute `bound`, on a sample of its
    rows (scaled up) when it is large."""
    w = np.asarray(weight, np.float32)
    w = w.reshape(w.shape[0] if w.ndim else 1, -1)
    scale = 1.0
    if w.size > SIZE_SAMPLE and w.shape[0] > 1:
        step = -(-w.size // SIZE_SAMPLE)
        sample = w[::step]
        scale = w.shape[0] / len(sample)
        w = sample
    if not np.count_nonzero(w):
        return 0
    info = codec.sparse_info(codec.encode_sparse(np.ascontiguousarray(w), bound))
    return int(round(scale * (int(info["data_bytes"]) + int(info["index_bytes"]))))


def magnitude(weight: np.ndarray, sparsity: float) -> np.ndarray:
    """The weight with its smallest (sparsity) share zeroed."""
    return weight * magnitude_mask(weight, sparsity) if sparsity else np.asarray(weight)


def measure_curves(weights: Mapping[str, np.ndarray], prune: Callable[[str, float], np.ndarray],
                   loss: Callable[[str, np.ndarray], float], *, ladder: Sequence[float] = AUTO_LADDER,
                   progress: bool = False) -> dict[str, Curve]:
    """Each layer's Curve: prune(name, sparsity) gives its pruned weight, loss(name, weight) the loss
    with that weight in place and every other layer as it is (a sum over samples, larger is worse).
    A dip in a loss curve is noise: the curve keeps its running maximum."""
    from tqdm import tqdm

    out = {}
    with tqdm(total=len(weights) * len(ladder), desc="sparsity curves", disable=not progress, leave=False) as bar:
        for name, weight in weights.items():
            bound = reference_bound(weight)
            losses, sizes = [0.0], [stored_bytes(weight, bound)]
            for s in ladder:
                pruned = prune(name, s)
                losses.append(max(losses[-1], float(loss(name, pruned))))
                sizes.append(stored_bytes(pruned, bound))
                bar.update()
            out[name] = Curve(name, (0.0, *ladder), tuple(losses), tuple(sizes))
    return out


def plans(curves: Mapping[str, Curve]) -> list[Plan]:
    """The family: for each proxy budget, the sparsities of the fewest predicted bytes whose summed
    loss stays within it (pydsz.budget.knapsack's knapsack), distinct plans from the least pruned (nothing)
    to the most, each predicted smaller than the one before."""
    table = {name: [Option(s, size, loss) for s, size, loss in zip(c.sparsity, c.size, c.loss)]
             for name, c in curves.items()}
    positive = [l for c in curves.values() for l in c.loss if l > 0]
    family: list[Plan] = [{}]
    sizes = [predicted_bytes(curves, {})]
    if not positive:
        return family
    lo, hi = min(positive), sum(max(c.loss) for c in curves.values())
    for budget in np.geomspace(lo, hi, BUDGETS) if hi > lo else [hi]:
        # each layer's loss rounds up by less than a unit: as many units more keep every plan within
        # the budget in reach
        unit = budget / UNITS
        chosen = minimize_size(table, budget + len(table) * unit, unit)
        if chosen is None:
            continue
        plan = {name: o.bound for name, o in chosen.choice.items() if o.bound > 0}
        size = predicted_bytes(curves, plan)
        if size < sizes[-1]:
            family.append(plan)
            sizes.append(size)
    return family


def predicted_bytes(curves: Mapping[str, Curve], plan: Mapping[str, float]) -> int:
    """The size model's bytes of a plan (rungs off a curve take the next lower one's)."""
    total = 0
    for name, c in curves.items():
        s = plan.get(name, 0.0)
        total += c.size[max(i for i, rung in enumerate(c.sparsity) if rung <= s + 1e-9)]
    return total


def global_plans(weights: Mapping[str, np.ndarray], ladder: Sequence[float] = AUTO_LADDER) -> list[Plan]:
    """Global magnitude pruning as a family: one threshold over every layer's magnitudes, each layer
    then pruned by the share of its weights below it (rounded down to a rung of the ladder), for
    overall sparsities along the ladder; distinct plans, the least pruned first."""
    sample = {name: np.sort(np.abs(np.asarray(w, np.float32).reshape(-1)[:: max(1, w.size // SIZE_SAMPLE)]))
              for name, w in weights.items()}
    every = np.sort(np.concatenate(list(sample.values())))
    family: list[Plan] = [{}]
    for overall in ladder:
        threshold = every[min(len(every) - 1, int(overall * len(every)))]
        plan = {}
        for name, mags in sample.items():
            share = np.searchsorted(mags, threshold) / max(1, len(mags))
            rungs = [s for s in ladder if s <= share + 1e-9]
            if rungs:
                plan[name] = rungs[-1]
        if plan and plan != family[-1]:
            family.append(plan)
    return family


@dataclass
class Trial:
    """A plan as measured: whether it is within the budget, its summed loss and the noise of that."""

    plan: Plan
    within: bool
    loss: float
    noise: float


def search(family: Sequence[Plan], trial: Callable[[Plan], Trial], progress: bool = False,
           desc: str = "auto sparsity") -> tuple[int, list[Trial]]:
    """The most pruned plan of the family whose trial is within the budget, by bisection (the loss
    grows along the family): its index (0, nothing pruned, when none is) and the trials measured."""
    from tqdm import tqdm

    measured: list[Trial] = []
    lo, hi, lo_ok = 1, len(family), 0  # family[0] prunes nothing; family[hi:] failed
    steps = int(np.ceil(np.log2(max(2, len(family)))))
    with tqdm(total=steps, desc=desc, disable=not progress, leave=False) as bar:
        while lo < hi:
            mid = (lo + hi) // 2
            t = trial(family[mid])
            measured.append(t)
            bar.update()
            if t.within:
                lo_ok, lo = mid, mid + 1
            else:
                hi = mid
    return lo_ok, measured


def check_resolvable(trial: Callable[[Plan], Trial], sizes: Mapping[str, int], judged, n: int,
                     allowed: float) -> None:
    """Raises the errors.NoiseError of `judged` (a pydsz.budget.rule.Budget) where n samples cannot judge
    pruning at all: the smallest step a search takes, the largest of the layers (`sizes`: weights by name)
    pruned by the ladder's first rung, has a noise that alone, with the budget's margin, exceeds `allowed`."""
    largest = by_size(list(sizes), sizes)[0]
    first = trial({largest: AUTO_LADDER[0]})
    if judged.risk(0, first.noise) > allowed:
        raise judged.noise_error(f"pruning {largest}, the largest layer, by {AUTO_LADDER[0]}", n, first.noise)


def describe(plan: Mapping[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in plan.items()) or "nothing pruned"


def best_of(candidates: Sequence[tuple[str, Optional[Plan], int]]) -> tuple[str, Optional[Plan], int]:
    """The candidate (name, plan, predicted bytes) of the fewest predicted bytes; the first on a tie."""
    return min(candidates, key=lambda c: c[2])
