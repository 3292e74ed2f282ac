"""How a command's work runs, as one value passed along instead of four keywords at every level."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Run:
    """num_threads: the interpreter's threads (None: its default); device: where the FC tail retrains
    and is evaluated, "cpu" or "gpu" (pydsz.gpu.device.resolve); executor: where the assessment's
    evaluations run (pydsz.assess.executor; None: this process); progress: show progress bars; max_memory:
    the bytes evaluating may hold beside the process itself (dsz compress --max-memory less what the
    process holds before it loads the user's files), which the Evaluator fits its batch and cached
    activations within or refuses before any work (None: no limit)."""

    num_threads: Optional[int] = None
    device: str = "cpu"
    executor: object = None
    progress: bool = False
    max_memory: Optional[int] = None
