"""The bound optimizer against brute force over small grids."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydsz.budget.knapsack import Option, minimize_loss, minimize_size
from pydsz.errors import InputError

UNIT = 1 / 5000

option = st.builds(
    lambda bound, size, loss: Option(bound, size, loss * UNIT),
    st.floats(1e-4, 1e-1),
    st.integers(1, 2000),
    st.integers(-3, 12),
)
tables = st.dictionaries(
    st.sampled_from(["fc1", "fc2", "fc3", "conv1"]), st.lists(option, min_size=1, max_size=5), min_size=1
)


def _combos(table):
    names = list(table)
    for picks in itertools.product(*(table[n] for n in names)):
        size = sum(o.size for o in picks)
        units = sum(max(0, round(o.loss / UNIT)) for o in picks)
        yield size, units


@settings(max_examples=200, deadline=None)
@given(tables, st.integers(0, 30))
def test_minimize_size_matches_brute_force(table, budget_units):
    plan = minimize_size(table, budget_units * UNIT, UNIT)
    feasible = [size for size, units in _combos(table) if units <= budget_units]
    if not feasible:
        assert plan is None
        return
    assert plan is not None
    assert plan.size == min(feasible)
    assert set(plan.choice) == set(table)
    assert sum(o.size for o in plan.choice.values()) == plan.size
    assert sum(max(0, round(o.loss / UNIT)) for o in plan.choice.values()) <= budget_units


@settings(max_examples=200, deadline=None)
@given(tables, st.integers(0, 8000))
def test_minimize_loss_matches_brute_force(table, max_size):
    plan = minimize_loss(table, max_size, UNIT)
    feasible = [units for size, units in _combos(table) if size <= max_size]
    if not feasible:
        assert plan is None
        return
    assert plan is not None
    assert round(plan.loss / UNIT) == min(feasible)
    assert plan.size <= max_size


def test_negative_loss_counts_as_zero():
    table = {
        "fc1": [Option(0.01, 100, -5 * UNIT), Option(0.001, 300, 0.0)],
        "fc2": [Option(0.02, 50, 3 * UNIT), Option(0.001, 200, 0.0)],
    }
    # With the -5 counted, fc2's 3-unit option would fit a 0 budget; counted as 0 it must not.
    plan = minimize_size(table, 0.0, UNIT)
    assert plan.choice["fc1"].bound == 0.01 and plan.choice["fc2"].bound == 0.001


def test_float_noise_in_losses_does_not_break_the_budget():
    table = {n: [Option(0.01, 10, 0.0002), Option(0.0, 100, 0.0)] for n in ("a", "b", "c")}
    plan = minimize_size(table, 0.0006, UNIT)
    assert plan.size == 30


def test_layer_without_options_is_an_input_error():
    with pytest.raises(InputError, match="fc2"):
        minimize_size({"fc1": [Option(0.1, 1, 0.0)], "fc2": []}, 0.01, UNIT)
