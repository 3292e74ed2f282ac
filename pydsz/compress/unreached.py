"""Layers no sample of the data reaches (a branch of an IF the data never takes): their loss cannot be
measured, so compress gives them bounds by analogy with the layers it measured."""

from __future__ import annotations

import numpy as np

from pydsz.assess.evaluator import Evaluator
from pydsz.format import codec


def unreached_layers(evaluator: Evaluator, table: dict) -> list[str]:
    """The layers no sample of the data reaches: every point measured moves nothing, and neither do
    the layer's weights all zero (a branch that the data never takes)."""
    model = evaluator.model
    # a layer of another subgraph may be measured in a group, its points then estimates: it is checked
    # whatever they say (one evaluation each)
    still = [name for name, points in table.items() if model.layer(name).subgraph
             or all(p.loss == 0 and p.noise == 0 and not p.lost and not p.gained for p in points)]
    return [name for name in evaluator.layer_names if name in still and not evaluator.reaches(name)]


def by_analogy(evaluator: Evaluator, table: dict, bounds: dict, unreached: list) -> tuple[dict, str]:
    """Bounds for the layers the data does not reach, whose losses cannot be measured: each takes the
    finest of the bounds the measured layers of its kind (float, or integer steps) were given, relative
    to their weights' scale (ladder.scale), measured once more to know its size: its error then adds
    no more to the outputs, where it runs, than the measured layer that was kept closest. Without such
    layers it stays lossless. Returns the bounds and the note that says so."""
    from pydsz.assess import tasks
    from pydsz.assess.ladder import scale

    def stored(name):
        return codec.stored_array(np.asarray(evaluator.model.stored(name)))

    measured = {name: b / scale(stored(name)) for name, b in bounds.items() if name not in unreached and b > 0}
    out = dict(bounds)
    for name in unreached:
        w = stored(name)
        alike = [r for n, r in measured.items() if (stored(n).dtype.kind == "f") == (w.dtype.kind == "f")]
        bound = min(alike) * scale(w) if alike else 0.0
        if w.dtype.kind in "iu":
            bound = float(round(bound))
        if bound > 0 and not any(p.bound == bound for p in table[name]):
            table[name] = sorted(table[name] + [tasks.measure_point(evaluator, name, bound)], key=lambda p: p.bound)
        out[name] = bound
    note = (f"no sample of the data reaches {', '.join(unreached)} (with their weights all zero no output moves: "
            "a branch the data never takes), so their loss cannot be measured: each takes the finest bound the "
            "measured layers got, relative to its weights' scale; data that runs them would measure them")
    return out, note
