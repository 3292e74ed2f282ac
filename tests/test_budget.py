"""The budget's margin: for several looks (pydsz.budget.rule.Budget.margin_of) the most favourable of k
noisy passes kept must not pass an over-budget choice more often than one pass at the margin does; by
default the metric's (two standard errors for the output metrics, one for the labels')."""

import math
import re
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pydsz.budget import metrics
from pydsz.budget.rule import Budget
from pydsz.errors import InputError


def budget(margin):
    return Budget(metrics.get("top1"), 0.01, margin)


@pytest.mark.parametrize("margin", [0.5, 1.0, 2.0])
def test_k_looks_at_the_wider_margin_fail_together_as_often_as_one_look(margin):
    tail = 1 - NormalDist().cdf(margin)
    previous = margin
    for looks in range(1, 9):
        z = budget(margin).margin_of(looks)
        assert looks * (1 - NormalDist().cdf(z)) == pytest.approx(tail, rel=1e-9)
        assert z >= previous  # more looks, more in hand
        previous = z
    assert budget(1.0).margin_of(4) == pytest.approx(1.754, abs=1e-3)


def test_no_margin_stays_none_and_one_look_keeps_its_own():
    assert budget(0.0).margin_of(4) == 0.0
    assert budget(1.3).margin_of(1) == 1.3


def test_the_luckiest_of_four_passes_keeps_the_confidence_of_one():
    # a choice exactly at the budget, measured four times with independent noise, the most favourable
    # measurement kept: at the plain 1 sd it passes three times as often as one measurement does
    # (1 - (1 - 0.159)^4 = 0.50 against 0.159); at margin_of(4) no more often
    rng = np.random.default_rng(0)
    noise = rng.standard_normal((200_000, 4))
    one = float(np.mean(noise[:, 0] > 1.0))
    plain = float(np.mean((noise > 1.0).any(axis=1)))
    widened = float(np.mean((noise > budget(1.0).margin_of(4)).any(axis=1)))
    assert plain > 2.5 * one
    assert widened <= one + 3 * math.sqrt(one / len(noise))


def test_a_budget_of_a_handful_of_samples_is_noisy():
    top1 = Budget(metrics.get("top1"), 0.01)  # 1 point, 1 sd: 5 of 500 samples, 50 of 5000
    assert top1.noisy(500) and top1.warnings(500)
    assert not top1.noisy(5000) and not top1.warnings(5000)
    assert not Budget(metrics.get("output-error"), 0.01).noisy(64)  # continuous: no samples to count


def test_the_output_metrics_keep_two_standard_errors_in_hand_and_the_labels_one():
    from pydsz.model.data import bundled
    from pydsz.model.graph import TFLiteModel

    for name, margin in [("output-error", 2.0), ("psnr", 2.0), ("cosine", 2.0), ("top1", 1.0), ("agreement", 1.0),
                         ("expected-top1", 1.0)]:
        assert Budget(name).margin == margin, name
        assert Budget(name).risk(3.0, 0.5) == 3.0 + margin * 0.5
    assert Budget("output-error", 0.01, 0.5).margin == 0.5  # --margin given: it stands
    assert Budget("output-error", 0.01, 0.0).margin == 0.0
    # no metric named: the model's default decides, and its margin with it
    assert Budget.of(0.01).margin is None
    lenet = TFLiteModel(bundled("lenet300.tflite").read_bytes())
    assert Budget.of(0.01).for_model(lenet, labelled=True).margin == 1.0
    assert Budget.of(0.01).for_model(lenet, labelled=False).margin == 1.0  # expected-top1
    with pytest.raises(Exception, match="margin -1"):
        Budget("output-error", 0.01, -1.0)


def test_what_an_earlier_step_spent_is_counted_by_each_metric_as_it_measured_it():
    # a one-shot pruning that lost 4 of 500 labels where calibrated-top1 counts 1.5 samples: the bounds are
    # chosen within what calibrated-top1 says is left, the labels check the file within what they say is left
    pruned = Budget("top1", 0.01, spent=4 / 500, spent_deciding=1.5 / 500)
    decisions = pruned.decisions(labelled=True)
    assert decisions.metric.name == "calibrated-top1"
    assert decisions.allowed(500) == pytest.approx(5 - 1.5)
    assert pruned.allowed(500) == 1  # the labels' whole samples
    # as one count where nothing says otherwise, and without labels the decisions are the budget itself
    assert Budget("top1", 0.01, spent=4 / 500).decisions(labelled=True).allowed(500) == pytest.approx(1)
    assert pruned.decisions(labelled=False) is pruned


def test_a_budget_that_cannot_hold_the_cheapest_changes_is_refused_with_the_samples_that_would():
    # expected-top1 at 0.3 points on 32 samples allows 0.096; with 1 sd in hand the two cheapest changes count
    judged = Budget("expected-top1", 0.003)
    costs = np.concatenate([[0.05, 0.06], np.full(30, 0.9)])
    with pytest.raises(InputError, match=r"32 samples are too few .* the 2 whose predictions are the cheapest to "
                                         r"change would lose 0\.11 .* use about \d+ samples drawn alike, or "
                                         r"--max-loss 0\.0035 or more, or --margin 0$"):
        judged.warnings(32, costs)
    assert judged.warnings(32, np.concatenate([[0.04, 0.05], np.full(30, 0.9)])) == []
    assert Budget("expected-top1", 0.003, 0.5).warnings(32, costs) == []  # 0.05 + half of 0.06
    assert judged.warnings(32) == []  # no costs, no such check (the metrics that have none)
    assert Budget("expected-top1", 0.0035).warnings(32, costs) == []  # the --max-loss it named
    with pytest.raises(InputError, match=r"use --max-loss 0\.0065 or more$"):
        Budget("expected-top1", 0.003, spent=0.003).warnings(32, costs)  # nothing left to spend


@given(costs=hnp.arrays(np.float64, st.integers(2, 60), elements=st.floats(0, 1)),
       max_loss=st.floats(0.0005, 0.05), margin=st.sampled_from([0.0, 0.5, 1.0, 2.0]))
def test_the_cheapest_changes_are_refused_exactly_where_they_exceed_the_budget(costs, max_loss, margin):
    judged, n = Budget("expected-top1", max_loss, margin), len(costs)
    ascending = np.sort(costs)
    whole = int(1 + margin)
    cheapest = ascending[:whole].sum() + ((1 + margin - whole) * ascending[whole] if whole < n else 0.0)
    try:
        judged.warnings(n, costs)
    except InputError as error:
        assert cheapest > max_loss * n
        least = re.search(r"--max-loss (\S+) or more", str(error))
        if least:  # the --max-loss named holds them: no InputError
            Budget("expected-top1", float(least.group(1)), margin).warnings(n, costs)
        said = re.search(r"use about (\d+) samples", str(error))
        if said:  # the samples named hold the cheapest changes of as many drawn like these
            need = int(said.group(1))
            grown = np.quantile(costs, (np.arange(math.ceil(1 + margin)) + 0.5) / need)
            assert need > n and grown[:whole].sum() + (1 + margin - whole) * (grown[whole] if whole < len(grown) else 0) \
                <= max_loss * need + 1e-12
    else:
        assert cheapest <= max_loss * n
