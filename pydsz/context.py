"""How a command's work runs, as one value passed along instead of four keywords at every level."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Run:
    """num_threads: the interpreter's threads (None: its default); device: where the FC tail retrains
    and is evaluated, "cpu" or "gpu" (pydsz.gpu.device.resolve); executor: where the assessment's
    evaluations run (pydsz.assess.executor; None: this process); progress: show progress bars."""

    num_threads: Optional[int] = None
    device: str = "cpu"
    executor: object = None
    progress: bool = False
