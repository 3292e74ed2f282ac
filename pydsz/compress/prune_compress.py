"""DeepSZ's whole pipeline under one budget (`dsz compress --prune auto`): prune with auto sparsity, then
compress with what is left of the same --max-loss.

The budget is split between the two steps: pruning gets a share of it (its auto sparsity, pydsz.prune.auto_retrain
with training data, else one-shot, pydsz.prune.oneshot), the loss pruning then measurably cost on the data
(from the unpruned model) is spent, and pipeline.compress chooses the bounds within the rest. A top1 budget
is decided in calibrated-top1 and the file checked on the labels (Budget.decisions): one-shot pruning's
trials decide in calibrated-top1 alone, and the labels check the file, pruning and bounds together.
Which split gives the smaller file depends on the model: each share of SHARES is tried (one with retraining,
which costs minutes each) and the smallest .dsz kept; every candidate ends within the whole budget, as
compress verifies it. Where the data cannot tell pruning's smallest step from noise at a share
(errors.NoiseError, which stops `dsz prune`), that share compresses the model as it is and says why.
`dsz prune` stays for those who want the steps apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional, Union

from pydsz.assess.evaluator import Evaluator
from pydsz.budget import metrics
from pydsz.budget.rule import Budget
from pydsz.compress.compensation import Compensation
from pydsz.compress.pipeline import Result, compress
from pydsz.context import Run
from pydsz.errors import InputError, NoiseError
from pydsz.model.graph import TFLiteModel
from pydsz.model.selection import KINDS, Selection, compressible_layers
from pydsz.prune import oneshot, retraining
from pydsz.prune.train import Retraining

# Shares of the budget pruning may spend, tried in turn (one-shot) ...
SHARES = (0.5, 0.75)
# ... and the one with retraining, where each candidate costs a full retraining: the brief trials of auto
# keep a margin of noise in hand and the retrained model usually loses less than they allowed.
RETRAIN_SHARES = (2 / 3,)


@dataclass
class Split:
    """How `--prune auto` split the budget: pruning's share and measured loss, compression's."""

    method: str  # "retrain" or "oneshot"
    share: float  # of max_loss given to pruning's auto
    max_loss: float
    pruning_loss: float  # measured on the data, from the unpruned model (the metric's unit; one-shot's labels as
    # measured, a gain too, where the decisions count apart)
    compression_loss: float  # measured, from the pruned model
    sparsity: dict
    notes: list = field(default_factory=list)
    deciding_loss: Optional[float] = None  # pruning's loss as the bounds' decisions counted it, where apart
    tried: list = field(default_factory=list)  # per share tried: {share, bytes, pruning_loss, loss}

    def line(self) -> str:
        counted = "" if self.deciding_loss is None else f" (the bounds counted {self.deciding_loss:.4g})"
        return (f"--prune auto ({self.method}): pruning {self.pruning_loss:.4g}{counted} + compression "
                f"{self.compression_loss:.4g} of --max-loss {self.max_loss:g} (pruning's auto given "
                f"{self.share:.0%}); sparsity " + ", ".join(f"{k}={v:.3f}" for k, v in self.sparsity.items()))


@dataclass(frozen=True)
class Pruning:
    """How `--prune auto` prunes: retraining the FC tail on `train` = (x, y) as `settings` say, or
    one-shot where `train` is None, calibrated on `calibration` (inputs; None: the data's)."""

    train: Optional[tuple] = None
    calibration: object = None
    settings: Retraining = Retraining()


def compress_pruned(tflite_bytes: bytes, x, y=None, budget: Union[None, float, Budget] = None, *,
                    layers: Union[str, Selection] = "fc", pruning: Pruning = Pruning(),
                    compensation: Compensation = Compensation(), run: Run = Run()) -> tuple[Result, Split]:
    """Prune `tflite_bytes` with auto sparsity and compress it, the loss of both together within
    `budget` on (x, y) (pipeline.compress's arguments). pruning: retraining (top-1 only, FC layers
    only) or one-shot (the layers of `layers`). compensation: each compress's (pipeline.compress's, whose
    default it is); its `groups`, x's, one-shot trials cross-fitted on x keep apart too. Returns compress's
    Result for the smallest .dsz and the Split."""
    data = bytes(tflite_bytes)
    model = TFLiteModel(data)
    budget = Budget.of(budget).for_model(model, y is not None)
    metric, max_loss, margin = budget.metric, budget.max_loss, budget.margin
    choice = Selection.of(layers)
    layers, train = choice.spec, pruning.train
    if layers not in KINDS:
        raise InputError(f"--prune auto prunes the layers of a kind: --layers fc, conv or all, not {layers}")
    retrain = train is not None
    if retrain:
        if not isinstance(metric, metrics.Top1):
            raise InputError(f"--prune auto with --train retrains by top-1 on the labels; --metric {metric.spec} "
                             "needs one-shot pruning (leave out --train)")
        if layers != "fc":
            raise InputError(f"--prune auto with --train prunes FC layers only; --layers {layers} needs one-shot "
                             "pruning (leave out --train)")
    names = [l.name for l in compressible_layers(model, layers)]
    judge = Evaluator(data, x, y, names, metric, run=replace(run, device="cpu", executor=None))
    n = judge.samples
    costs = judge.metric.change_costs(judge.outputs)
    budget.warnings(n, costs)  # the whole budget, named as the user gave it
    shares = _resolvable(RETRAIN_SHARES if retrain else SHARES, metric, max_loss, margin, n, costs)
    best: Optional[tuple[Result, Split]] = None
    tried = []
    calibration = x if pruning.calibration is None else pruning.calibration
    if not retrain:  # what one-shot pruning holds, each share alike: the unpruned model's layers
        first = calibration[0] if isinstance(calibration, (list, tuple)) else calibration
        pruning_memory = oneshot.footprint(model, judge.probe, len(first), KINDS[layers], auto=True)
    # what compress decides in, and whether apart from the budget's own metric (a top1 budget: calibrated-top1)
    decisions = budget.decisions(y is not None)
    apart = decisions is not budget
    deciding = decisions.metric.fitted(judge.outputs, judge.y).knowing(model)
    for share in shares:
        share_budget = replace(budget, max_loss=share * max_loss)
        try:
            if retrain:
                # the labels check the file within the whole budget: the plan's own count on them may reach it
                pruned = retraining.prune_model(data, train, (x, y), "auto", settings=pruning.settings,
                                                auto_budget=share_budget, checked=max_loss,
                                                run=replace(run, executor=None))
            else:  # its trials judged in the decisions' metric alone: the labels check the file, below
                pruned = _oneshot(data, calibration, (x, y), layers, share_budget.decisions(y is not None), run,
                                  compensation.groups)
            out = judge.outputs_of(pruned.tflite)
            labelled = judge.measure_model_in(out, [metric])[0].loss
            if not retrain and apart and labelled > budget.allowed(n):
                # the labels see the plan lose more than the whole budget, which no bounds could take back: its
                # trials checked on the labels too (within the share, as `dsz prune` checks its own budget)
                pruned = _oneshot(data, calibration, (x, y), layers, share_budget, run, compensation.groups)
                out = judge.outputs_of(pruned.tflite)
                labelled = judge.measure_model_in(out, [metric])[0].loss
        except NoiseError as exc:
            # the data cannot judge pruning at this share: the model compressed as it is, within the whole budget,
            # is still the file asked for, where an error would leave the user without one
            pruned = retraining.PruneResult(data, {}, [], [], None, None, "retrain" if retrain else "oneshot",
                                            notes=[f"--prune auto pruned nothing: {exc}"])
            out, labelled = judge.outputs, 0.0
        if not any(pruned.sparsity.values()) and any(not t["sparsity"] for t in tried):
            continue  # the model as it is, compressed already at an earlier share
        # what pruning spent, from the unpruned model, as the bounds count it: the larger of the labels' count
        # and the decisions' metric's (a gain by pruning is noise the bounds should not spend; a loss the labels
        # see smaller than calibrated-top1 expects is their luck, one they see larger a warning). A model
        # retrained on the labels is judged by what it and the original know together (calibrated.change): by
        # the original's probabilities alone, retrained plans that lost a few tenths of a point on unseen
        # images spent one to two points, the whole budget, and left the bounds lossless
        counted = deciding.pooled_change(out, judge.y) if retrain else judge.measure_model_in(out, [deciding])[0].loss
        spent, spent_deciding = max(0.0, labelled, counted) / n, None
        if apart and not retrain:
            # the labels check a one-shot file within what they say is left, as measured, so that its top-1 on
            # them, from the original, is within the budget. Checked within what the larger count left, a plan
            # losing no labels for 2.3 samples calibrated (mlp-d, 500 labels) left the bounds' check 2 of 5
            spent, spent_deciding = labelled / n, spent
        # without labels, the bounds' losses priced as pruning's were, by the original (counted_from)
        priced = budget.metric if apart else deciding.counted_from(judge.outputs)
        result = compress(pruned.tflite, x, y, replace(budget, metric=priced, spent=spent, spent_deciding=spent_deciding),
                          compensation=compensation, run=run, layers=choice)
        if not retrain:
            _count_pruning(result.memory, pruning_memory)
        split = Split("retrain" if retrain else "oneshot", share, max_loss, spent, result.loss,
                      {k: v for k, v in pruned.sparsity.items() if v > 0}, pruned.notes, spent_deciding)
        tried.append({"share": share, "bytes": len(result.dsz), "ratio": result.ratio, "pruning_loss": spent,
                      "loss": spent + result.loss, "sparsity": split.sparsity})
        if best is None or len(result.dsz) < len(best[0].dsz):
            best = (result, split)
    result, split = best
    split.tried = tried
    return result, split


def _oneshot(data: bytes, calibration, val: tuple, layers: str, budget: Budget, run: Run, groups=None):
    """oneshot.prune_model's auto plan for `budget`, its layers of kind `layers`."""
    return oneshot.prune_model(data, calibration, val, "auto", kinds=KINDS[layers], run=replace(run, executor=None),
                               auto_budget=budget, groups=groups)


def _count_pruning(memory: dict, pruning: dict) -> None:
    """Add to compress's footprint (Evaluator.footprint: the interpreter's parts, then compensation's) what
    one-shot pruning held beyond compensation: pruning has let its Hessians go before the bounds are
    chosen, so only the larger of the two stands at once."""
    evaluating = ("data", "batch_bytes", "outputs")
    beyond = sum(pruning.values()) - sum(v for k, v in memory.items() if k not in evaluating)
    if beyond > 0:
        memory["one-shot pruning's Hessians" + (", beyond that" if len(memory) > len(evaluating) else "")] = beyond


def _resolvable(shares, metric, max_loss: float, margin: float, n: int, costs) -> list[float]:
    """The shares whose pruning budget n samples can resolve (costs: the metric's change_costs on them); an
    InputError naming --max-loss where none can."""
    kept, error = [], None
    for share in shares:
        try:
            Budget(metric, share * max_loss, margin).warnings(n, costs)
            kept.append(share)
        except InputError as exc:
            error = exc
    if not kept:
        raise InputError(f"--prune auto gives pruning {shares[-1]:.0%} of --max-loss {max_loss:g}: {error}")
    return kept

