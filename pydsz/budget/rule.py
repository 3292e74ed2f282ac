"""The budget arithmetic every decision shares: what may be lost, and when a measurement is within it.

A budget is a loss in a metric (pydsz.budget.metrics) on a data set of n samples. Inside, losses are sums
over the samples (for top-1: samples). A measurement is within the budget when its loss plus
`margin` standard deviations of its noise is at most what is allowed: the decisions keep that much
in hand so that they do not fit the data they are measured on. Compression, pruning's `auto` and
the one-shot search all judge by this one rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Callable, Optional, Union

import numpy as np

from pydsz.budget import calibrated, metrics
from pydsz.errors import InputError, NoiseError


def risk(loss: float, noise: float, margin: float) -> float:
    """A summed loss as the decisions count it: plus `margin` standard deviations of its noise."""
    return loss + margin * noise


@dataclass(frozen=True)
class Budget:
    """The loss a step may cost: `max_loss` in the metric's unit, less what an earlier step `spent`
    (e.g. pruning, counted from a reference model), judged with `margin` standard deviations of
    noise in hand (None: the metric's default_margin, once the metric is known); `spent_deciding`, the
    earlier step's loss in the decisions' metric where the two count it differently. `option` names
    the command-line option that sets max_loss, so that a budget the data cannot resolve says what to
    change; `margin_option` the one that sets the margin, if any.

    metric: a name (pydsz.budget.metrics), a Metric or a function f(outputs, original_outputs, y) ->
    per-sample losses, judged on the model output `output` (None: all of them); None takes the model's
    default when the budget meets its model (for_model: top1 with labels, expected-top1 without,
    output-error for a model whose output is not class scores), and `reason` then says why. max_loss
    None is the metric's default. One Budget is made where a command starts and passed whole."""

    metric: Union[None, str, Callable, metrics.Metric] = None
    max_loss: Optional[float] = None
    margin: Optional[float] = None
    spent: float = 0.0
    # what that earlier step spent as the decisions' metric counts it (decisions: calibrated-top1's count of
    # a top1 budget), where it differs from `spent` as the labels measure it; None: the same
    spent_deciding: Optional[float] = None
    option: str = "--max-loss"
    margin_option: Optional[str] = "--margin"
    output: Optional[str] = None
    reason: str = ""

    def __post_init__(self):
        if self.margin is not None and not (math.isfinite(self.margin) and self.margin >= 0):
            raise InputError(f"margin {self.margin}: must be a number >= 0")
        if self.metric is None:
            return
        metric = metrics.get(self.metric, self.output)
        object.__setattr__(self, "metric", metric)
        if self.margin is None:
            object.__setattr__(self, "margin", metric.default_margin)
        if self.max_loss is None:
            object.__setattr__(self, "max_loss", metric.default_max_loss)
        metric.allowed_mean(self.max_loss)  # checks the value before anything runs

    @classmethod
    def of(cls, budget: Union[None, float, "Budget"], **defaults) -> "Budget":
        """`budget` as a Budget: itself, a number as max_loss in the model's default metric, None as
        every default; `defaults` fill the fields of a Budget made here (option, margin, ...)."""
        if isinstance(budget, Budget):
            return budget
        return cls(max_loss=budget, **defaults)

    def for_model(self, model, labelled: bool) -> "Budget":
        """This budget with the metric the model takes by default where it names none (and why);
        model: a pydsz.model.graph.TFLiteModel, labelled: whether the data has labels."""
        if self.metric is not None:
            return self
        metric, reason = metrics.default(model, labelled, self.output)
        return replace(self, metric=metric, reason=reason)

    def allowed(self, n: int) -> float:
        """The loss that may be spent, summed over n samples; whole samples for a discrete metric."""
        budget = self.metric.allowed_mean(self.max_loss) - self.spent
        if self.metric.discrete:
            # the epsilon forgives float noise in max_loss * n (0.003 * 5000)
            return max(0, math.floor(budget * n + 1e-6))
        return max(0.0, budget * n)

    def risk(self, loss: float, noise: float) -> float:
        return risk(loss, noise, self.margin)

    def within(self, loss: float, noise: float, allowed: float) -> bool:
        return self.risk(loss, noise) <= allowed

    def margin_of(self, looks: int) -> float:
        """The margin at which `looks` measurements, the most favourable of which is kept, pass an
        over-budget choice no more often together than one measurement does at `margin` (Bonferroni on
        the normal tail: 1 sd and 4 looks give 1.75 sd). 0 stays 0: the measurements taken as they are."""
        if self.margin <= 0 or looks <= 1:
            return self.margin
        normal = NormalDist()
        return normal.inv_cdf(1 - (1 - normal.cdf(self.margin)) / looks)

    def noisy(self, n: int) -> bool:
        """Whether a discrete budget lets fewer than FEW_SAMPLES changed samples of n through, its noise
        margin included: the decisions then rest on a handful of samples (`warnings` says so)."""
        budget = self.metric.allowed_mean(self.max_loss)
        return (self.metric.discrete and budget > 0
                and math.floor(budget * n + 1e-6) < metrics.FEW_SAMPLES * (1 + self.margin))

    def warnings(self, n: int, costs=None) -> list[str]:
        """Whether n samples can resolve the budget: InputError where the only possible answer would be
        to keep everything as it is, or where only a plan that changes none of them could pass (costs: the
        metric's change_costs on the data, for a metric that has them); a warning where the decisions rest
        on very few samples."""
        metric, max_loss, margin = self.metric, self.max_loss, self.margin
        if costs is not None:
            self._holds_cheapest_changes(n, np.asarray(costs, np.float64))
        if metric.discrete:
            one = 1 + margin  # a single changed sample as the decisions count it, noise margin included
            budget = metric.allowed_mean(max_loss)
            resolved = math.floor(budget * n + 1e-6)
            if not self.noisy(n):
                return []
            needed = math.ceil(metrics.FEW_SAMPLES * one / budget)
            name = self.option.lstrip("-")
            if resolved < one:
                instead = f"a larger {self.option}" + (f", or {self.margin_option} 0" if self.margin_option else "")
                raise InputError(
                    f"{n} samples are too few to resolve {name} {max_loss:g} in {metric.name}: one changed sample is "
                    f"{1 / n:.2g} and with the noise margin ({margin:g} sd) counts as {one:g} samples, more than the "
                    f"{resolved} the budget allows, so nothing but the model as it is could pass; use at least "
                    f"{needed} samples (or {instead})")
            return [f"{name} {max_loss:g} lets only {resolved} of {n} samples change ({metric.name}): the decisions "
                    f"are noisy and the result is likely weaker than it could be; about {needed} samples would "
                    "resolve the budget"]
        if n < 2:
            raise InputError(f"{metric.name} needs at least 2 samples to estimate its noise, got {n}")
        if n < metrics.MIN_SAMPLES:
            return [f"{n} samples: the noise of {metric.name} is estimated from very few; "
                    f"use at least {metrics.MIN_SAMPLES}"]
        return []

    def _holds_cheapest_changes(self, n: int, costs: np.ndarray) -> None:
        """InputError where the budget cannot hold the 1 + margin changes cheapest among the n samples
        (Metric.change_costs), counted as a discrete metric counts one changed sample and its noise: a
        plan could then pass only by changing none of them, and none changed among n bounds the share a
        plan changes on other data only to about 1/n, whatever the plan. LeNet-300-100 and LeNet-5, as given
        and magnitude-pruned, compressed at expected-top1 0.003 on three unlabelled draws each of the
        validation images: on 32, 7 of the 12 lost more than 0.3 points of top-1 on the 10,000 test images
        (up to 3.8), 6 of them refused here, and 2 that held; on 128 all 12 held, none refused."""
        count = 1 + self.margin
        ascending = np.sort(costs)
        cost, allowed = _cheapest(ascending, count), self.allowed(n)
        if cost <= allowed:
            return
        share, need = self.metric.allowed_mean(self.max_loss) - self.spent, n
        while share > 0 and need < 10 ** 7:  # the cheapest among more samples drawn alike: their quantiles
            need = math.ceil(need * 1.1)
            if _cheapest(np.quantile(costs, (np.arange(math.ceil(count)) + 0.5) / need), count) <= share * need:
                break
        else:
            need = None
        ways = [f"about {need} samples drawn alike"] if need else []
        least = _round_up(cost / n + self.spent)  # the max_loss whose allowance holds them
        try:
            self.metric.allowed_mean(least)
            ways.append(f"{self.option} {least:g} or more")
        except InputError:  # beyond what the metric can state
            pass
        if self.margin_option and self.margin > 0 and _cheapest(ascending, 1.0) <= allowed:
            ways.append(f"{self.margin_option} 0")
        raise InputError(
            f"{n} samples are too few to resolve {self.option.lstrip('-')} {self.max_loss:g} in {self.metric.name}: "
            f"the {count:g} whose predictions are the cheapest to change would lose {cost:.2g} of a sample "
            f"together, more than the {allowed:.2g} the budget allows, so a plan could pass only by changing none "
            f"of the {n}, which bounds what it changes on other data only to about 1 in {n}; use "
            + (", or ".join(ways) or "more samples"))

    def decisions(self, labelled: bool) -> "Budget":
        """The budget the decisions measure in: with labels, a top1 budget's in calibrated-top1
        (calibrated.deciding), whose noise is the samples' where top1's is the labels' coin tosses, the
        result then checked on the labels in this budget's metric as measured; otherwise this one."""
        deciding = calibrated.deciding(self.metric) if labelled else self.metric
        if deciding is self.metric:
            return self
        spent = self.spent if self.spent_deciding is None else self.spent_deciding
        return replace(self, metric=deciding, spent=spent, spent_deciding=None)

    def checked_warnings(self, n: int, decisions: "Budget", costs=None) -> list[str]:
        """`warnings` for decisions made in `decisions` (self.decisions): this budget's own where they are
        this budget; for decisions in another metric (calibrated-top1 for top1, on every sample's
        probabilities) whose result is then checked on n labels in this budget's metric as measured,
        without a margin, the labels need only resolve one changed sample. InputError where they allow
        none; a warning where the check rests on a handful of samples."""
        if decisions is self:
            return self.warnings(n, costs)
        warnings = decisions.warnings(n, costs)
        if not self.noisy(n):
            return warnings
        budget = self.metric.allowed_mean(self.max_loss)
        resolved = math.floor(budget * n + 1e-6)
        needed = math.ceil(metrics.FEW_SAMPLES * (1 + self.margin) / budget)
        name = self.option.lstrip("-")
        if resolved < 1:
            raise InputError(
                f"{n} samples are too few to resolve {name} {self.max_loss:g} in {self.metric.name}: one changed "
                f"sample is {1 / n:.2g}, more than the budget, so nothing but the model as it is could pass the "
                f"check on the labels; use at least {math.ceil(1 / budget)} samples (or a larger {self.option})")
        return warnings + [
            f"{name} {self.max_loss:g} lets only {resolved} of {n} labelled samples change ({self.metric.name}): "
            f"the decisions are made in {decisions.metric.name} on all {n} samples, then checked on the labels, "
            f"which resolve no more than {resolved} changed; about {needed} samples would resolve "
            "the budget"]

    def noise_error(self, change: str, n: int, noise: float) -> NoiseError:
        """The data cannot tell `change` (the smallest step a search takes) from noise: its noise alone,
        with the margin, exceeds what is allowed. The noise of a sum grows with sqrt(n), the budget
        with n: the samples needed follow."""
        budget = self.metric.allowed_mean(self.max_loss)
        need = math.ceil((self.margin * noise / (budget * n)) ** 2 * n) if budget > 0 else math.inf
        spread = (f"flips {round(noise ** 2)} predictions, a noise of {self.margin * noise:.1f} samples"
                  if self.metric.discrete else f"changes the summed loss by a noise of {self.margin * noise:.3g}")
        return NoiseError(f"validation set of {n} samples too small for {self.option} {self.max_loss:g} "
                          f"({self.metric.name}): {change} {spread} against {self.allowed(n):.3g} allowed; give "
                          f"about {need} samples or a larger {self.option}")


def _cheapest(ascending: np.ndarray, count: float) -> float:
    """The sum of the first `count` values (a fraction of the next for a fractional count)."""
    whole = int(count)
    partial = (count - whole) * ascending[whole] if whole < len(ascending) else 0.0
    return float(np.sum(ascending[:whole]) + partial)


def _round_up(x: float, digits: int = 2) -> float:
    """x > 0 rounded up to `digits` significant digits."""
    step = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    return max(x, round(math.ceil(x / step) * step, 12))
