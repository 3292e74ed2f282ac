"""The activations that cross each cut of a model, computed once, cut after cut.

The assessment measures one layer after the other, in execution order; each candidate of a layer runs
only the ops from its cut on (pydsz.model.cut), fed with what crosses the cut. Those tensors are computed
along a chain: from the model inputs to the first cut, from there to the next, each step running
only the ops between two cuts. Only the current cut's tensors are held (in pydsz.model.cache: memory-mapped
beyond --max-cache-memory). Asking for an earlier cut starts again from the inputs, so that a cut's
values never depend on which cuts were asked for before (a Dask worker gets the same numbers as this
process, whatever else it measured).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from pydsz.model import activations, cut, runtime
from pydsz.model.graph import TFLiteModel


class Chain:
    """The tensors fed to each cut of `starts` (op indices), for the inputs x (fitted: one array per
    model input)."""

    def __init__(self, model: TFLiteModel, graph: cut.Graph, x: list, starts: Sequence[int],
                 num_threads: Optional[int] = None, batch_size: Optional[int] = None):
        self.model, self.graph, self.x, self.num_threads = model, graph, x, num_threads
        # the whole model's batch (runtime.batch_size): a segment's tensors are some of the whole's
        self.batch_size = batch_size or runtime.batch_size(model, x)
        self.starts = sorted(set(starts))
        self.tails = {s: graph.tail(s) for s in self.starts}
        self._at: Optional[int] = None  # the cut whose tensors are held, None: the inputs
        self._values: dict = dict(zip(model.inputs, x))
        self.steps = 0  # segments run so far (a benchmark's and a test's view of the work done)

    def feeds(self, start: int) -> list:
        """The arrays fed to the tail from cut `start`, in its segment's input order."""
        if start not in self.tails:
            raise ValueError(f"op {start} is not a cut of this chain")
        if self._at is not None and start < self._at:
            self._at, self._values = None, dict(zip(self.model.inputs, self.x))
        for s in self.starts:
            if (self._at is None or s > self._at) and s <= start:
                self._advance(s)
        return [self._values[t] for t in self.tails[start].inputs]

    def _advance(self, start: int) -> None:
        have = set(self._values)
        wanted = [t for t in self.tails[start].inputs if t not in have]
        if wanted:
            begin = 0 if self._at is None else self._at
            segment = self.graph.segment(range(begin, start), have, wanted)
            fed = [self._values[t] for t in segment.inputs]
            values = activations.tensors(cut.model_bytes(self.model, segment), fed, batch_size=self.batch_size,
                                     num_threads=self.num_threads)
            self._values.update(zip(segment.outputs, values))
            self.steps += 1
        keep = set(self.tails[start].inputs) | set(self.model.inputs)
        self._values = {t: v for t, v in self._values.items() if t in keep}
        self._at = start

    @property
    def held_bytes(self) -> int:
        """Bytes of the activations held now, the model inputs left out."""
        return sum(np.asarray(v).nbytes for t, v in self._values.items() if t not in self.model.inputs)
