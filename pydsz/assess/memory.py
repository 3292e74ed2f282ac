"""Evaluation within --max-memory: the batch and the cached activations an Evaluator may hold."""

from __future__ import annotations

from typing import Optional

from pydsz.errors import InputError
from pydsz.model import cache

MIB = 1 << 20


def within(evaluator, allowance: int, compensator) -> Optional[str]:
    """Fit what `evaluator` (being built: its data, model and probe known) holds (footprint()'s parts, with
    the model's copies and the cached activations) within `allowance` bytes: a smaller batch, and cached
    activations beyond what is left mapped from disk
    (pydsz.model.cache: file pages, which the kernel writes out and drops when memory runs short); an
    InputError, before any work, where the fixed parts and two samples' tensors do not fit. The note
    says what changed."""
    n = len(evaluator.x[0])
    one = evaluator.probe.tensors or {}
    fixed = {"the data": sum(a.nbytes for a in evaluator.x), "4 x the model": 4 * len(evaluator.bytes),
             "the outputs": 3 * n * sum(one.get(t, 0) for t in evaluator.model.outputs),
             **(compensator.footprint() if compensator is not None else {})}
    working = max(evaluator.probe.working_bytes, evaluator.probe.sample_bytes)
    room = allowance - sum(fixed.values())
    if room < 2 * working:  # the probe's two samples
        parts = " + ".join(f"{name} {value / MIB:.0f}" for name, value in {**fixed, "two samples' tensors":
                                                                           2 * working}.items() if value)
        raise InputError(f"--max-memory leaves {allowance / MIB:.0f} MiB beside the process; evaluating this model "
                         f"on these samples needs at least {(sum(fixed.values()) + 2 * working) / MIB:.0f} MiB "
                         f"({parts} MiB): give fewer samples or more memory")
    # the batch takes at most half of what is left, the cached activations (the tail's inputs, a chain's
    # cuts: known only as the layers are assessed) the rest, and beyond it go to disk
    was = evaluator.batch
    evaluator.batch = min(evaluator.batch, max(1, room // (2 * working)))
    notes = [f"batch {was} -> {evaluator.batch}"] if evaluator.batch < was else []
    spare = room - max(evaluator.batch, 2) * working
    if cache.limit() is None or cache.limit() > spare:
        cache.set_limit(str(spare))
        notes.append(f"cached activations beyond {spare / MIB:.0f} MiB on disk")
    return f"--max-memory: {', '.join(notes)}" if notes else None
