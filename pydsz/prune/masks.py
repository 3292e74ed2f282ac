"""Which weights pruning removes, and how many: the mask policy shared by retraining (pydsz.prune.retraining) and
one-shot pruning (pydsz.prune.oneshot).

Masks are by magnitude (the largest share kept) unless the one-shot sweep chooses them. A layer that
is already sparse enough is taken as pruned and left alone; `auto` chooses each layer's sparsity among
AUTO_LADDER's rungs (pydsz.prune.auto_sparsity).
"""

from __future__ import annotations

from typing import Mapping, Sequence, Union

import numpy as np

from pydsz.encode.pack import OTHERS
from pydsz.errors import InputError

# A layer whose weights are at least this sparse is taken as already pruned and left alone.
ALREADY_SPARSE = 0.5
# The sparsities `auto` chooses among, per layer (pydsz.prune.auto_sparsity plans over them). Up to 97%,
# no rung keeps more than a third more weights than the next: with 70% then 80% (30% of the weights kept,
# then 20%), one-shot auto on an MLP's 400k-weight fc1 stayed at 70% where 80% lost too much, its ratio
# 0.83-0.85 of the best fixed plan's at the same test loss (bench/results/oneshot_frontier.json)
AUTO_LADDER = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.875, 0.9, 0.92, 0.93, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99)
# Standard deviations of validation noise `auto` keeps in hand (compress's default margin on labels).
AUTO_MARGIN = 1.0

# Elements per slice of the elementwise arithmetic over a layer (magnitude_mask here, the trainer's
# Adam and running mean): they run slice by slice through small scratch buffers, so that nothing
# allocates a temporary the size of a layer.
SLICE = 1 << 18

Sparsity = Union[float, Mapping[str, float], str]


def slices(n: int):
    return (slice(i, min(n, i + SLICE)) for i in range(0, n, SLICE))


def density(weight: np.ndarray) -> float:
    """Fraction of non-zero entries."""
    return float(np.count_nonzero(weight)) / max(1, weight.size)


def magnitude_mask(weight: np.ndarray, sparsity: float) -> np.ndarray:
    """Boolean mask keeping the largest-magnitude (1 - sparsity) share of the entries."""
    if not 0 <= sparsity < 1:
        raise InputError(f"sparsity {sparsity}: must be in [0, 1)")
    n_prune = int(round(sparsity * weight.size))
    if not n_prune:
        return np.ones(weight.shape, bool)
    flat = weight.ravel()
    mask = flat != 0
    zeros = flat.size - int(np.count_nonzero(mask))
    # zeros are the smallest magnitudes; among the non-zeros the threshold is found without a copy
    threshold = _smallest(flat, n_prune - zeros) if n_prune > zeros else np.zeros((), flat.dtype)
    scratch = np.empty(min(SLICE, flat.size), flat.dtype)
    for part in slices(flat.size):
        s = scratch[: part.stop - part.start]
        np.greater(np.abs(flat[part], out=s), threshold, out=mask[part])
    # ties at the threshold: prune exactly n_prune entries, keeping the first of the tied ones
    missing = (weight.size - n_prune) - int(np.count_nonzero(mask))
    for part in slices(flat.size):
        if missing <= 0:
            break
        tied = np.flatnonzero(np.abs(flat[part]) == threshold)[:missing]
        mask[part.start + tied] = True
        missing -= len(tied)
    return mask.reshape(weight.shape)


def _smallest(flat: np.ndarray, k: int) -> np.ndarray:
    """The k-th smallest magnitude among the non-zeros of `flat` (k >= 1), in two passes over slices
    instead of a sorted copy of the layer: non-negative floats order as their bits, so a histogram of
    the top 16 bits finds the bin that holds it, and only that bin's values are sorted."""
    if flat.dtype.kind != "f":
        members = np.abs(flat[flat != 0])
        members.partition(k - 1)
        return members[k - 1]
    as_bits = np.dtype(f"u{flat.dtype.itemsize}")
    shift = 8 * flat.dtype.itemsize - 16
    scratch = np.empty(min(SLICE, flat.size), flat.dtype)
    counts = np.zeros(1 << 16, np.int64)
    for part in slices(flat.size):
        top = np.abs(flat[part], out=scratch[: part.stop - part.start]).view(as_bits) >> shift
        counts += np.bincount(top, minlength=1 << 16)
    counts[0] -= flat.size - int(np.count_nonzero(flat))  # the zeros (+0 and -0) are not among them
    below = np.cumsum(counts)
    b = int(np.searchsorted(below, k))
    k -= int(below[b - 1]) if b else 0
    members = []
    for part in slices(flat.size):
        m = np.abs(flat[part], out=scratch[: part.stop - part.start])
        members.append(m[(m.view(as_bits) >> shift == b) & (m != 0)])
    members = np.concatenate(members)
    members.partition(k - 1)
    return members[k - 1]


def sparsity_targets(names: Sequence[str], sparsity: Sparsity) -> dict[str, float] | str:
    """The sparsity of each named layer: one for all, or name=value pairs, where the key OTHERS
    (pydsz.format.container's) gives every layer not named ("auto" as it is); InputError for a name that is
    not among `names` or a sparsity outside [0, 1)."""
    if isinstance(sparsity, str):
        if sparsity != "auto":
            raise InputError(f"sparsity {sparsity!r}: give a number, name=value pairs or 'auto'")
        return "auto"
    if isinstance(sparsity, Mapping):
        unknown = sorted(set(sparsity) - set(names) - {OTHERS})
        if unknown:
            raise InputError(f"no prunable layer named {', '.join(unknown)} (have: {', '.join(names)})")
        others = {name: sparsity[OTHERS] for name in names} if OTHERS in sparsity else {}
        targets = {k: float(v) for k, v in {**others, **sparsity}.items() if k != OTHERS}
    else:
        targets = {name: float(sparsity) for name in names}
    for name, s in targets.items():
        if not 0 <= s < 1:
            raise InputError(f"layer {name}: sparsity {s} must be in [0, 1)")
    return targets


def masks_for(layers: Sequence, targets: Mapping[str, float]) -> dict[str, np.ndarray]:
    """Magnitude masks for the targeted layers (pydsz.prune.train.Dense: a name and a weight); every other layer keeps its own zeros, and has no mask
    where it has none (retraining it unmasked is the same, and an all-true mask takes a quarter of
    the layer's bytes for the whole retraining)."""
    out = {}
    for l in layers:
        mask = magnitude_mask(l.weight, targets[l.name]) if l.name in targets else l.weight != 0
        if l.name in targets or not mask.all():
            out[l.name] = mask
    return out


def by_size(names: Sequence[str], sizes: Mapping[str, int]) -> list[str]:
    """The largest layers first: they hold most of the bytes, so they get the budget first."""
    return sorted(names, key=lambda name: -sizes[name])
