"""Which bounds one layer is measured at, decided as the measurements come in.

Two plans, chosen by the metric:
- `Ladder` (discrete and step-like metrics, and int8/uint8 weights): a geometric ladder (factor 2)
  from the layer's own scale, down while the loss is not zero and up until it clearly exceeds the
  budget, then every step where the loss leaves zero within the budget split into REFINE_STEPS.
- `Fitted` (metrics whose loss grows smoothly with the bound: output-error, psnr, cosine): near
  zero the loss follows a power of the bound, so a fit through the points so far says which bound
  reaches each loss the allocation may want; the plan measures one bound at a time, jumping to the
  next wanted loss, and `want()` adds the bounds the allocation then picks (pydsz.assess.plan), which are
  measured to confirm the choice.
Both hand out tasks (bound, part): a float layer's bound 0 is measured in parts (LOSSLESS_PART),
any other bound in one, part 0. Both start at the layer's scale: the RMS of its non-zero weights.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np

from pydsz.encode.tensor import lossless_parts
from pydsz.format import codec

# Ladder: bounds scale * 2**k from k = START_STEP on, factor 2, never beyond twice the layer's
# largest magnitude (past that every value is reconstructed as zero and nothing changes any more);
# for discrete metrics FIRST_BOUND * 2**k instead
FIRST_BOUND = 1e-4
START_STEP = -6
LOWEST_STEP = -16
# Refinement splits a ladder step (factor 2) into this many geometric sub-steps.
REFINE_STEPS = 4
# int8/uint8 weights: bounds in quantization steps, every one up to 4, then about x1.5 apart
STEP_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 255)
# Fitted: bounds on a grid of GRID steps per doubling from the scale; the first probe at scale * 2**PROBE
GRID = 4
PROBE = -7
# the most bounds a Fitted plan measures before the allocation asks for any
MAX_FITTED = 7
# the power of the bound each smooth metric's loss grows with near zero (the fit's prior)
EXPONENTS = {"output-error": 1.0, "output-error:mean": 1.0, "psnr": 2.0, "cosine": 2.0}


@dataclass(frozen=True)
class Point:
    """One measurement: `layer` alone compressed at `bound` (0: kept lossless).

    loss and noise are summed over the samples (divide by their number for the metric's unit): for
    top-1, loss is samples lost minus samples gained and noise sqrt(lost + gained). estimated: not a
    measurement of the layer alone but its share of a group's (pydsz.assess.plan), or a prediction.
    """

    layer: str
    bound: float
    size: int  # bytes the layer takes in the .dsz (its whole codec stream)
    data_bytes: int  # the paper's sizes: coded non-zero values and coded index
    index_bytes: int
    loss: float  # sum over samples of the per-sample loss, compressed minus original
    noise: float = 0.0  # the standard deviation of `loss`
    lost: int = 0  # samples whose loss grew
    gained: int = 0  # samples whose loss shrank
    estimated: bool = False
    # a model update's candidate that keeps the values a device holds (pydsz.compress.diff): not a
    # point of the curve of bounds, whose loss is made non-decreasing without it
    held: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def scale(weight: np.ndarray) -> float:
    """The RMS of a layer's non-zero stored values (1 for integers: bounds count steps), without a
    copy of the layer (392 MiB for VGG-16's fc1)."""
    w = np.asarray(weight)
    if w.dtype.kind in "iu":
        return 1.0
    flat = w.reshape(-1)
    if flat.dtype != np.float32:
        flat = flat.astype(np.float32)
    nonzero = int(np.count_nonzero(flat))
    return math.sqrt(float(np.dot(flat, flat)) / nonzero) if nonzero else 1.0


def top(weight: np.ndarray) -> float:
    """Twice the largest magnitude: beyond it every value decodes to zero."""
    w = np.asarray(weight)
    return 2 * max(float(w.max()), -float(w.min())) if w.size else 1.0


class _Plan:
    """What both plans share: bound 0 in parts, the results, the tasks handed out."""

    def __init__(self, name: str, weight: Optional[np.ndarray], allowed: float, parts: Optional[int] = None):
        self.name, self.allowed = name, allowed
        self.integer = weight is not None and weight.dtype.kind in "iu"
        if parts is None:
            parts = 1 if self.integer else len(lossless_parts(codec.stored_array(weight)))
        self.parts = parts
        self.measured: dict[float, Point] = {}
        self._lossless: dict[int, Point] = {}  # bound 0's parts, until all are in
        self.issued: set[tuple[float, int]] = set()

    def issue(self, task: tuple[float, int]) -> None:
        self.issued.add(task)

    def add(self, task: tuple[float, int], point: Point) -> Optional[Point]:
        """The result of a task; returns the point it completes (bound 0's once all of its parts are
        in), else None."""
        bound, part = task
        if bound == 0 and self.parts > 1:
            self._lossless[part] = point
            if len(self._lossless) < self.parts:
                return None
            size = sum(p.size for p in self._lossless.values())
            point = Point(self.name, 0.0, size, size, 0, 0.0)
        self.measured[bound] = point
        return point

    def _lossless_tasks(self) -> list:
        return [(0.0, part) for part in range(self.parts)]


class Ladder(_Plan):
    """Bound 0, then a geometric ladder (factor 2 from the layer's scale * 2**START_STEP, descending
    while the loss at the lowest step is not zero; for discrete metrics from FIRST_BOUND; int8/uint8:
    STEP_LADDER steps) climbing until the loss exceeds `stop` or every value would be reconstructed
    as zero; then every ladder step
    where the loss leaves zero while still within the budget split into REFINE_STEPS. `next()` may
    hand out a ladder bound before the ones below it are measured (so that parallel executors have
    work); `points()` is what measuring one bound after the other gives, whatever else was measured
    and in whichever order the results came."""

    def __init__(self, name: str, weight: np.ndarray, allowed: float, discrete: bool,
                 unit: Optional[float] = None, parts: Optional[int] = None):
        super().__init__(name, weight, allowed, parts)
        # clearly beyond the budget, with margin for noise (a point may overshoot and the next fall back)
        self.stop = max(2 * allowed, allowed + 10) if discrete else 2 * allowed
        highest = 1.0 if self.integer else top(weight)
        if self.integer:
            self.ladder, self.start = [float(steps) for steps in STEP_LADDER], 0
        elif discrete:
            # a count of samples is noise-bound: the ladder of before issue 27, from FIRST_BOUND up, whose
            # points the tests pin (on the LeNets the scale's grid came out 4-9% larger at top-1 0.3)
            self.ladder, self.start = [FIRST_BOUND], 0
            while self.ladder[-1] < highest:
                self.ladder.append(self.ladder[-1] * 2)
        else:
            unit = scale(weight) if unit is None else unit
            self.ladder = [unit * 2.0 ** k for k in range(LOWEST_STEP, START_STEP)]
            self.start = len(self.ladder)
            k = START_STEP
            while self.ladder[-1] < highest:
                self.ladder.append(unit * 2.0 ** k)
                k += 1

    def _climbed(self) -> tuple[list, bool, Optional[float]]:
        """The ladder's points as far as they are known and count, in order of bound; whether the
        ladder is settled; else the next bound it needs (None: waiting for one handed out)."""
        up = []
        for bound in self.ladder[self.start:]:
            point = self.measured.get(bound)
            if point is None:
                return up, False, bound
            up.append(point)
            if point.loss > self.stop:
                break
        down = []
        for bound in reversed(self.ladder[:self.start]):
            if (down or up)[-1].loss <= 0:
                break
            point = self.measured.get(bound)
            if point is None:
                return up, False, bound
            down.append(point)
        return down[::-1] + up, True, None

    def _refinements(self, climbed: list) -> list:
        if self.integer:
            return []
        return [lo.bound * 2 ** (k / REFINE_STEPS) for lo, hi in zip(climbed, climbed[1:])
                if hi.loss > 0 and lo.loss <= self.allowed for k in range(1, REFINE_STEPS)]

    def next(self) -> Optional[tuple[float, int]]:
        """A task, (bound, part), to measure now, or None: all handed out, or waiting for results."""
        wanted = self._lossless_tasks()
        for bound in self.ladder[self.start:]:
            wanted.append((bound, 0))
            point = self.measured.get(bound)
            if point is not None and point.loss > self.stop:
                break
        climbed, settled, needed = self._climbed()
        if settled:
            wanted += [(bound, 0) for bound in self._refinements(climbed)]
        elif needed is not None:
            wanted.append((needed, 0))
        return next((task for task in wanted if task not in self.issued), None)

    @property
    def done(self) -> bool:
        climbed, settled, _ = self._climbed()
        return settled and 0.0 in self.measured and all(b in self.measured for b in self._refinements(climbed))

    def points(self) -> list[Point]:
        """The measured points, sorted by bound, bound 0 first (once done)."""
        climbed, _, _ = self._climbed()
        refined = [self.measured[b] for b in self._refinements(climbed)]
        return sorted([self.measured[0.0]] + climbed + refined, key=lambda p: p.bound)


class Fitted(_Plan):
    """Bound 0, a probe at the layer's scale * 2**PROBE, then one bound at a time: the bound a power
    law fitted through the points so far (loss = c * bound**p, p from `exponent` until two points
    say otherwise) gives for the next loss in `targets` that no point has come near (within a
    factor sqrt 2), snapped to a grid of GRID steps per doubling; at most MAX_FITTED of them. Then
    `want(bound)` adds bounds (on the same grid) that the allocation picked, one at a time.
    Sequential: nothing is handed out while a bound is being measured."""

    def __init__(self, name: str, weight: Optional[np.ndarray], allowed: float, exponent: float, low: float,
                 unit: Optional[float] = None, highest: Optional[float] = None, parts: Optional[int] = None):
        super().__init__(name, weight, allowed, parts)
        self.unit = scale(weight) if unit is None else unit
        self.highest = top(weight) if highest is None else highest
        self.exponent = exponent
        self.targets = []  # the losses the allocation may want: the budget down to `low`, factor 4 apart
        target = allowed
        while target >= low or len(self.targets) < 2:
            self.targets.append(target)
            target /= 4
        self.wanted: list[float] = []
        self._fitted: list[float] = []  # the bounds the fit chose, in order
        self._memo: tuple = (None, None)  # (points measured, _next_fitted's answer then)

    def bound(self, step: int) -> float:
        return self.unit * 2.0 ** (step / GRID)

    def step(self, bound: float) -> int:
        return round(GRID * math.log2(bound / self.unit))

    def fit(self) -> Optional[tuple[float, float]]:
        """(log2 c, p) of loss = c * bound**p through the measured points of positive loss, or None."""
        pts = [(math.log2(b), math.log2(p.loss)) for b, p in sorted(self.measured.items()) if b > 0 and p.loss > 0]
        if not pts:
            return None
        p = self.exponent
        if len(pts) >= 2:
            xs, ys = np.array(pts).T
            if np.ptp(xs) > 0:
                p = float(np.clip(np.polyfit(xs, ys, 1)[0], 0.25, 4.0))
        # through the points' centre with that slope
        c = float(np.mean([y - p * x for x, y in pts]))
        return c, p

    def _next_fitted(self) -> Optional[float]:
        key = (len(self.measured), len(self._fitted))
        if self._memo[0] != key:
            self._memo = key, self._next_fitted_now()
        return self._memo[1]

    def _next_fitted_now(self) -> Optional[float]:
        if len(self._fitted) >= MAX_FITTED:
            return None
        positive = [p for b, p in self.measured.items() if b > 0 and p.loss > 0]
        if not positive:
            measured = sorted(b for b in self.measured if b > 0)
            step = PROBE * GRID if not measured else self.step(measured[-1]) + 2 * GRID
            return self.bound(step) if self.bound(step) <= self.highest or not measured else None
        c, p = self.fit()
        for target in self.targets:
            if any(target / math.sqrt(2) <= q.loss <= target * math.sqrt(2) for q in positive):
                continue
            step = self.step(2.0 ** ((math.log2(target) - c) / p))
            step = min(step, self.step(self.highest))
            bound = self.bound(step)
            if bound in self.measured:
                continue  # the fit cannot get nearer on this grid
            return bound
        return None

    def next(self) -> Optional[tuple[float, int]]:
        """A task, (bound, part), to measure now, or None: all handed out, or waiting for a result."""
        task = next((t for t in self._lossless_tasks() if t not in self.issued), None)
        if task is not None:
            return task
        if any(b not in self.measured for b, _ in self.issued if b > 0):
            return None
        bound = self._next_fitted()
        if bound is not None:
            self._fitted.append(bound)
            return bound, 0
        bound = next((b for b in self.wanted if b not in self.measured), None)
        return None if bound is None else (bound, 0)

    def want(self, bound: float) -> None:
        """Measure `bound` too (a grid bound the allocation picked)."""
        if bound > 0 and bound not in self.measured and bound not in self.wanted:
            self.wanted.append(bound)

    @property
    def done(self) -> bool:
        return (0.0 in self.measured and all(b in self.measured for b, _ in self.issued if b > 0)
                and self._next_fitted() is None and all(b in self.measured for b in self.wanted))

    def points(self) -> list[Point]:
        """The measured points, sorted by bound, bound 0 first."""
        return sorted(self.measured.values(), key=lambda p: p.bound)

    def predicted(self, size_at) -> list[Point]:
        """Points on the grid between the measured ones and a little beyond, their losses, noises and
        sizes interpolated from the measured points (log against log of the bound), marked estimated:
        what the allocation chooses among to say what to measure next. size_at(bound) -> (size,
        data bytes, index bytes) where the caller can encode; None interpolates sizes as well."""
        measured = [p for p in self.points() if p.bound > 0]
        positive = [p for p in measured if p.loss > 0]
        if len(positive) < 1:
            return []
        lo, hi = self.step(positive[0].bound) - GRID, self.step(measured[-1].bound)
        hi = min(hi, self.step(self.highest))
        xs = np.log2([p.bound for p in positive])
        c, p = self.fit()
        out = []
        for step in range(lo, hi + 1):
            bound = self.bound(step)
            if bound in self.measured:
                continue
            x = math.log2(bound)
            if len(positive) >= 2 and xs[0] <= x <= xs[-1]:
                loss = 2.0 ** float(np.interp(x, xs, np.log2([q.loss for q in positive])))
                noise = 2.0 ** float(np.interp(x, xs, np.log2([max(q.noise, 1e-300) for q in positive])))
            else:
                ref = positive[0] if x < xs[0] else positive[-1]
                loss = 2.0 ** (c + p * x)
                noise = ref.noise * loss / ref.loss
            sizes = size_at(bound) if size_at else None
            if sizes is None:
                order = sorted(measured, key=lambda q: q.bound)
                bx = np.log2([q.bound for q in order])
                size = int(round(float(np.interp(x, bx, [q.size for q in order]))))
                sizes = (size, size, 0)
            out.append(Point(self.name, bound, *sizes, loss, noise, estimated=True))
        return out
