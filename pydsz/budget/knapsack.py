"""Step 3 of DeepSZ: one error bound per layer, chosen exactly over the measured grid.

The problem is a multiple-choice knapsack: every layer must take exactly one of its measured
options (bound, compressed size, accuracy loss); minimize the total size subject to the sum of
losses staying within the budget (or, for a target ratio, minimize the summed loss subject to a
size limit). Losses are counted in integer units (one unit = one validation sample, 1/N of
accuracy), which makes the dynamic programme exact and free of floating-point ties.

An option whose loss is negative (compression happened to fix a few samples) counts as 0: gains
measured on one layer alone do not carry over reliably when all layers are compressed together,
and spending them on another layer would bet on noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from pydsz.errors import InputError

# A continuous loss's budget is split into this many units (each option's loss rounds up to units).
RESOLUTION = 1000


@dataclass(frozen=True)
class Option:
    """One measured point of a layer: compressing it at `bound` takes `size` bytes and costs `loss`."""

    bound: float
    size: int
    loss: float


@dataclass(frozen=True)
class Plan:
    """The chosen option per layer and its predicted totals (losses in the caller's unit)."""

    choice: dict[str, Option]
    size: int
    loss: float


def loss_unit(samples: int, discrete: bool, scale: float) -> float:
    """The knapsack's loss unit (in the mean's unit) for losses summed over `samples`: one sample for
    a discrete metric, which makes the programme exact; else `scale` (a summed loss: the budget)
    split into RESOLUTION units."""
    if discrete:
        return 1 / samples
    return max(scale, 1e-300) / samples / RESOLUTION


def _units(loss: float, unit: float) -> int:
    # Round up (conservative) but forgive float noise such as 3 * (1/5000) = 0.000600...01.
    return max(0, math.ceil(loss / unit - 1e-6))


def _knapsack(
    table: Mapping[str, Sequence[Option]], unit: float, capacity: int
) -> list[tuple[int, int, list[int]]]:
    """best[b] = (size, loss units, option index per layer) minimizing (size, loss) with loss <= b."""
    names = list(table)
    for name in names:
        if not table[name]:
            raise InputError(f"layer {name}: no measured options to choose from")
    # best[b] holds the lexicographically smallest (size, loss) of the layers so far with loss <= b.
    best: list[tuple[int, int, list[int]]] = [(0, 0, [])] * (capacity + 1)
    for name in names:
        options = [(o.size, _units(o.loss, unit)) for o in table[name]]
        nxt: list[tuple[int, int, list[int]] | None] = [None] * (capacity + 1)
        for b in range(capacity + 1):
            for i, (size, loss) in enumerate(options):
                if loss > b:
                    continue
                prev_size, prev_loss, prev_pick = best[b - loss]
                cand = (prev_size + size, prev_loss + loss)
                cur = nxt[b]
                if cur is None or cand < (cur[0], cur[1]):
                    nxt[b] = (cand[0], cand[1], prev_pick + [i])
        if any(entry is None for entry in nxt):
            # Capacity b too small for any option of this layer: mark as infeasible.
            nxt = [e if e is not None else (math.inf, math.inf, []) for e in nxt]  # type: ignore[misc]
        best = nxt  # type: ignore[assignment]
    return best


def _plan(table: Mapping[str, Sequence[Option]], entry: tuple[int, int, list[int]], unit: float) -> Plan:
    choice = {name: table[name][i] for name, i in zip(table, entry[2])}
    return Plan(choice, int(entry[0]), entry[1] * unit)


def minimize_size(table: Mapping[str, Sequence[Option]], allowed: float, unit: float) -> Plan | None:
    """The smallest total size whose summed per-layer loss is <= allowed; None if nothing fits.

    `table` maps layer name -> its measured options; `unit` is the loss granularity (1/N for N
    validation samples).
    """
    if unit <= 0:
        raise InputError(f"loss unit {unit}: must be > 0")
    if allowed < 0:
        return None
    capacity = int(math.floor(allowed / unit + 1e-6))
    entry = _knapsack(table, unit, capacity)[capacity]
    return None if math.isinf(entry[0]) else _plan(table, entry, unit)


def minimize_loss(table: Mapping[str, Sequence[Option]], max_size: int, unit: float) -> Plan | None:
    """The smallest summed loss whose total size is <= max_size (ties: smaller size); None if none fits."""
    if unit <= 0:
        raise InputError(f"loss unit {unit}: must be > 0")
    capacity = sum(max(_units(o.loss, unit) for o in opts) for opts in table.values() if opts)
    for entry in _knapsack(table, unit, capacity):
        if entry[0] <= max_size:
            return _plan(table, entry, unit)
    return None
