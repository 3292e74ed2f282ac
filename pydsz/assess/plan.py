"""The evaluation planner: which layers to assess and at what resolution, given what each evaluation
costs and what each layer can save; and the assessment that carries the plan out on an executor.

- Cost: a candidate of a layer runs the ops from its cut on (pydsz.assess.evaluator) on every sample,
  after a copy of the model with the candidate in place; its cost is counted in the work model's units
  (multiply-adds of the conv and FC layers, the values every other op writes: op_work) and the model's
  bytes copied (COPY_WORK each). Counted, not timed, so that the triage, and with it the file written,
  is the same on every machine and every run; the seconds the report and the progress bar give are
  those units at the rate the Evaluator's timed run of the whole model went.
- Saving: a layer's stored bytes less its stream at a bound of its own scale (encoded, not evaluated).
- Triage: a layer whose bytes saved per unit of evaluation work fall below KAPPA times the average of
  the whole assessment, and which holds less than SHARE of what all layers can save, is measured
  together with the others like it, as one group (pydsz.assess.measure_group): a few evaluations for
  all of them, each layer at its own scale times the group's level, each taking an equal share of the
  group's loss (its points marked estimated). For discrete metrics every layer is measured alone
  (a share of a sample is no count of samples).
- Resolution: under a smooth metric every layer measured alone follows a Fitted plan
  (pydsz.assess.ladder); when all plans are done the allocation (`choose`: the pipeline's knapsack) runs on
  the measured points and the fit's predictions between them, and every predicted bound it picks is
  measured, up to REFINE_ROUNDS times: evaluations go to the bounds the result is made of.
The final choice is verified whole, as always (pydsz.compress.pipeline).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Sequence

import numpy as np

from pydsz.assess import tasks
from pydsz.assess.evaluator import Evaluator
from pydsz.assess.ladder import EXPONENTS, Fitted, Ladder, Point, scale, top
from pydsz.assess.tasks import group_bounds, measure_task
from pydsz.encode.tensor import encode
from pydsz.format import codec
from pydsz.model import cut

KAPPA = 0.1
SHARE = 0.02
REFINE_ROUNDS = 3
# evaluations one plan takes, about: what the triage and the progress bar's estimates count with
EVALUATIONS = {"fitted": 7, "ladder": 12, "group": 5}
# an op's fixed cost in the work model, as values written (the interpreter's per-op overhead)
OP_WORK = 2000
# a byte of the model copied for a candidate, in the work model's units: copying goes at about 1 GB/s,
# the interpreter at a median 0.14 ns per unit (0.03-0.67 on 11 zoo models, 2 cores)
COPY_WORK = 7.0


@dataclass
class Assessment:
    """What the assessment measured and how: the points per layer, and per layer its plan ("fitted",
    "ladder" or "group"), its evaluations and their seconds (a group's are shared by its layers),
    the estimated seconds per evaluation and bytes it can save that the triage weighed."""

    table: dict[str, list[Point]]
    layers: dict[str, dict] = field(default_factory=dict)
    group: list[str] = field(default_factory=list)
    rounds: int = 0  # allocation rounds whose picks were measured
    evaluations: int = 0  # candidates evaluated (a group's once)


def op_work(model) -> list[float]:
    """Each op's work per sample, in values written (times the inputs each one reads, for layers)."""
    work = []
    for op in model.ops:
        out = sum(int(np.prod(model.tensors[t].shape[1:])) for t in op.outputs if t >= 0)
        if op.name in ("CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV") and len(op.inputs) > 1 and op.inputs[1] >= 0:
            out *= int(np.prod(model.tensors[op.inputs[1]].shape[1:]))
        elif op.name == "DEPTHWISE_CONV_2D" and len(op.inputs) > 1 and op.inputs[1] >= 0:
            out *= int(np.prod(model.tensors[op.inputs[1]].shape[1:3]))
        work.append(float(out + OP_WORK))
    return work


def _order(cut: Optional[int]) -> float:
    return math.inf if cut is None else cut


def costs(evaluator: Evaluator, names: Sequence[str]) -> dict[str, float]:
    """Estimated work of one evaluation of each layer's candidates, in op_work's units (see the module's
    docstring): the same for the same model and data on any machine."""
    model = evaluator.model
    work = op_work(model)
    total = sum(work)
    graph = cut.Graph(model) if "cut" in evaluator.paths else None
    out = {}
    for name in names:
        start = evaluator.cut_of(name)
        if start is None:  # a layer of another subgraph: the whole model runs
            share = 1.0
        elif graph is not None and graph.reason is None:
            share = sum(work[i] for i in graph.tail(start).ops) / total
        else:
            share = 1.0 if evaluator.path([name]) != "tail" else sum(work[start:]) / total
        out[name] = evaluator.samples * total * share + COPY_WORK * len(evaluator.bytes)
    return out


def seconds_per_work(evaluator: Evaluator) -> float:
    """The rate at which the Evaluator's timed run of the whole model (with its copy) went: what turns
    costs' units into the seconds people read."""
    return evaluator.seconds / (evaluator.samples * sum(op_work(evaluator.model)) + COPY_WORK * len(evaluator.bytes))


def savings(evaluator: Evaluator, names: Sequence[str]) -> dict[str, int]:
    """Bytes each layer can save, about: stored bytes less its stream at its own scale / 32."""
    out = {}
    for name in names:
        stored, pattern = tasks.stored_pattern(evaluator, name)
        w = codec.stored_array(stored)
        bound = 1.0 if w.dtype.kind in "iu" else scale(w) / 32
        out[name] = max(0, w.nbytes - encode(w, bound, pattern)[2][0])
    return out


def triage(evaluator: Evaluator, names: Sequence[str]) -> tuple[list, list, dict]:
    """(layers measured alone, layers measured as one group, {layer: {cost, saving}})."""
    cost, saving = costs(evaluator, names), savings(evaluator, names)
    rate = seconds_per_work(evaluator)
    info = {n: {"seconds_per_evaluation": cost[n] * rate, "saving": saving[n]} for n in names}
    if evaluator.metric.discrete or evaluator.metric.name not in EXPONENTS:
        return list(names), [], info
    spent = {n: EVALUATIONS["fitted"] * cost[n] for n in names}
    average = sum(saving.values()) / max(sum(spent.values()), 1e-12)
    total = sum(saving.values())
    floats = {n for n in names if np.asarray(evaluator.model.stored(n)).dtype.kind == "f"}
    group = [n for n in names if n in floats and saving[n] < KAPPA * average * spent[n]
             and saving[n] < SHARE * total]
    if len(group) < 2:
        group = []
    return [n for n in names if n not in group], group, info


def assess(evaluator: Evaluator, names: Sequence[str], allowed: float, progress: bool = False, executor=None,
           on_point: Optional[Callable[[Point], None]] = None,
           choose: Optional[Callable[[dict], Optional[dict]]] = None) -> Assessment:
    """Every named layer's points, as the triage plans them (see the module's docstring), each task an
    evaluation on `executor` (pydsz.assess.executor; default: this process), with a progress bar that counts
    evaluations and says how long is left. `allowed` is the loss the budget allows, summed over the samples.
    choose(table) -> {layer: bound}: the allocation, to refine the smooth metrics' plans with. The
    points are the same on any executor. on_point sees every measured point, as it comes."""
    from tqdm import tqdm

    from pydsz.assess.executor import Local

    executor = executor or Local()
    executor.start(evaluator)
    run = _Run(evaluator, names, allowed)
    # the total is an estimate (each plan says how many evaluations it takes only as they come, and the
    # allocation's refinement adds some at the end): "~", and it only grows, never jumps back
    bar = tqdm(total=run.estimate(), desc="assess", unit="eval", disable=not progress, leave=False,
               bar_format="{desc}: {n}/~{total} evaluations [{elapsed}, {rate_fmt}{postfix}]")

    def task():
        args = run.next()
        if args is None and choose is not None and run.refine(choose):
            args = run.next()
        return args

    def done(args, result):
        for point in run.add(args, result):
            if on_point:
                on_point(point)
        if args[1] > 0:  # an evaluation (bound 0 is sized, not evaluated)
            bar.total = max(bar.total, run.estimate(), bar.n + 1)
            bar.set_postfix_str(run.left(), refresh=False)
            bar.update()

    try:
        executor.stream(measure_task, task, done)
    finally:
        bar.close()
    return run.assessment()


class _Run:
    """The plans of one assessment, their tasks and results, and the clock."""

    def __init__(self, evaluator: Evaluator, names: Sequence[str], allowed: float):
        self.evaluator, self.allowed = evaluator, allowed
        metric = evaluator.metric
        alone, self.group, self.info = triage(evaluator, names)
        smooth = not metric.discrete and metric.name in EXPONENTS
        count = len(alone) + (1 if self.group else 0)
        low = allowed / (4 * (math.sqrt(count) if metric.quadrature else count))
        self.plans: dict = {}
        for name in alone:
            w = np.asarray(evaluator.model.stored(name))
            self.plans[name] = (Fitted(name, w, allowed, EXPONENTS[metric.name], low)
                                if smooth and w.dtype.kind == "f" else Ladder(name, w, allowed, metric.discrete))
        if self.group:
            stored = [codec.stored_array(np.asarray(evaluator.model.stored(n))) for n in self.group]
            highest = max(top(w) / scale(w) for w in stored)
            self.plans[tuple(self.group)] = Fitted("group", None, allowed, EXPONENTS[metric.name], low,
                                                   unit=1.0, highest=highest, parts=1)
        # layer by layer in execution order, so that the chain of cuts only moves forward
        # (the layers of other subgraphs, which have no cut, last)
        first = {key: min(_order(evaluator.cut_of(n)) for n in _members(key)) for key in self.plans}
        self.order = sorted(self.plans, key=lambda key: first[key])
        # a group runs from its earliest layer's cut: the dearest of its layers' evaluations
        self.cost = {key: max(self.info[n]["seconds_per_evaluation"] for n in _members(key)) for key in self.plans}
        self.group_points: dict[float, tuple] = {}
        self.seconds = dict.fromkeys(self.plans, 0.0)
        self.started: dict = {}
        self.rounds = 0
        self.spent = self.predicted = 0.0  # measured and estimated seconds of the evaluations done

    def next(self) -> Optional[tuple]:
        for key in self.order:
            task = self.plans[key].next()
            if task is not None:
                self.plans[key].issue(task)
                args = (key, *task)
                self.started[args] = time.perf_counter()
                return args
        return None

    def add(self, args, result) -> list[Point]:
        key, bound, part = args
        elapsed = time.perf_counter() - self.started.pop(args)
        self.seconds[key] += elapsed
        if bound > 0:
            self.spent += elapsed
            self.predicted += self.cost[key]
        plan = self.plans[key]
        if isinstance(key, tuple):
            self.group_points[bound] = result
            sizes = [sum(getattr(p, f) for p in result) for f in ("size", "data_bytes", "index_bytes")]
            first = result[0]
            point = plan.add((bound, part), Point("group", bound, *sizes, first.loss, first.noise, first.lost,
                                                  first.gained))
            return list(result) if point is not None else []
        point = plan.add((bound, part), result)
        return [point] if point is not None else []

    def refine(self, choose: Callable) -> bool:
        """Run the allocation on the points and the fits' predictions; want every predicted bound it
        picks. Whether anything new is to be measured."""
        if self.rounds >= REFINE_ROUNDS or not all(plan.done for plan in self.plans.values()):
            return False
        fitted = {key: plan for key, plan in self.plans.items() if isinstance(plan, Fitted) and not isinstance(key, tuple)}
        if not fitted:
            return False
        table = self.table()
        for name, plan in fitted.items():
            table[name] = sorted(table[name] + plan.predicted(None), key=lambda p: p.bound)
        chosen = choose(table) or {}
        self.rounds += 1
        new = False
        for name, plan in fitted.items():
            bound = chosen.get(name, 0.0)
            if bound <= 0:
                continue
            # and the grid step below: where the verification tightens a choice that the layers' losses
            # together overshoot, a step of 2**(1/GRID) costs less than one down to the next point
            for wanted in (bound, plan.bound(plan.step(bound) - 1)):
                if wanted not in plan.measured and wanted not in plan.wanted:
                    plan.want(wanted)
                    new = True
        return new

    def table(self) -> dict[str, list[Point]]:
        out = {}
        for key, plan in self.plans.items():
            if isinstance(key, tuple):
                out.update(self._group_table(plan))
            else:
                out[key] = plan.points()
        return {name: out[name] for name in self._names() if name in out}

    def _names(self) -> list:
        return [n for key in self.order for n in _members(key)]

    def _group_table(self, plan: Fitted) -> dict:
        """Each group layer's points: bound 0 as measured, and at each level measured its own bound,
        sizes and an equal share of the group's loss and noise."""
        k = len(self.group)
        share = math.sqrt(k) if self.evaluator.metric.quadrature else k
        out = {name: [] for name in self.group}
        for level in sorted(p.bound for p in plan.points()):
            bounds = group_bounds(self.evaluator, self.group, level) if level > 0 else {}
            for p in self.group_points[level]:
                if level == 0:
                    out[p.layer].append(p)
                elif all(q.bound != bounds[p.layer] for q in out[p.layer]):
                    out[p.layer].append(replace(p, bound=bounds[p.layer], loss=p.loss / share,
                                                noise=p.noise / share, estimated=True))
        return out

    def estimate(self) -> int:
        """Evaluations in all, as far as they can be told: what each plan took, at least its estimate."""
        total = 0
        for key, plan in self.plans.items():
            taken = sum(1 for b, _ in plan.issued if b > 0)
            total += taken if plan.done else max(taken + 1, EVALUATIONS[_kind(key, plan)])
        return total

    def left(self) -> str:
        """About how long the rest takes, from the cost estimates scaled by how they compared so far."""
        if all(plan.done for plan in self.plans.values()):
            return "checking the allocation"  # its refinement may measure more
        ratio = self.spent / self.predicted if self.predicted > 0 else 1.0
        seconds = 0.0
        for key, plan in self.plans.items():
            if not plan.done:
                taken = sum(1 for b, _ in plan.issued if b > 0)
                seconds += max(1, EVALUATIONS[_kind(key, plan)] - taken) * self.cost[key] * ratio
        return f"about {_duration(seconds)} left"

    def assessment(self) -> Assessment:
        table = self.table()
        layers = {}
        for key, plan in self.plans.items():
            kind = _kind(key, plan)
            for name in _members(key):
                layers[name] = {"plan": kind, "evaluations": sum(1 for b in plan.measured if b > 0),
                                "seconds": round(self.seconds[key], 3), **self.info[name]}
        evaluations = sum(sum(1 for b in plan.measured if b > 0) for plan in self.plans.values())
        return Assessment(table, layers, list(self.group), self.rounds, evaluations)


def _members(key) -> tuple:
    return key if isinstance(key, tuple) else (key,)


def _kind(key, plan) -> str:
    return "group" if isinstance(key, tuple) else "fitted" if isinstance(plan, Fitted) else "ladder"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"
