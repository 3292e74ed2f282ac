"""The sparsity planner (pydsz.prune.auto_sparsity): the size model, the family of plans, the search along it."""

import numpy as np
import pytest

from pydsz.format import codec
from pydsz.prune import auto_sparsity
from pydsz.prune.masks import AUTO_LADDER


def _layer(rows=64, cols=96, scale=1.0, seed=0):
    return (np.random.default_rng(seed).laplace(0, 0.05 * scale, (rows, cols))).astype(np.float32)


def test_the_size_model_is_libdszs_index_and_value_bytes():
    w = auto_sparsity.magnitude(_layer(), 0.9)
    info = codec.sparse_info(codec.encode_sparse(w, 0.01))
    assert auto_sparsity.stored_bytes(w, 0.01) == info["data_bytes"] + info["index_bytes"]


def test_a_large_layer_is_sized_on_a_sample_of_its_rows_in_proportion(monkeypatch):
    w = auto_sparsity.magnitude(_layer(rows=512, cols=256), 0.9)
    whole = auto_sparsity.stored_bytes(w, 0.01)
    monkeypatch.setattr(auto_sparsity, "SIZE_SAMPLE", w.size // 8)
    assert auto_sparsity.stored_bytes(w, 0.01) == pytest.approx(whole, rel=0.1)


def test_a_sparser_layer_pays_more_bytes_per_kept_weight():
    """Not the kept count: the index's gaps grow with the sparsity, so do their codes."""
    w = _layer(rows=128, cols=256)
    bound = auto_sparsity.reference_bound(w)
    per_kept = [auto_sparsity.stored_bytes(auto_sparsity.magnitude(w, s), bound) / ((1 - s) * w.size) for s in (0.5, 0.95)]
    assert per_kept[1] > per_kept[0]


def test_no_rung_of_the_ladder_keeps_more_than_a_third_more_weights_than_the_next_up_to_97_percent():
    """A coarse step is a plan auto cannot choose: with 70% then 80%, one-shot auto kept an MLP's fc1 at 70%
    where 75% passed (bench/results/oneshot_frontier.json)."""
    kept = [1 - s for s in AUTO_LADDER if s <= 0.97 + 1e-9]
    assert list(AUTO_LADDER) == sorted(set(AUTO_LADDER)) and AUTO_LADDER[0] == 0.5
    assert max(a / b for a, b in zip(kept, kept[1:])) <= 4 / 3 + 1e-9


def _curve(name, losses, sizes):
    return auto_sparsity.Curve(name, (0.0, *AUTO_LADDER[:len(losses) - 1]), tuple(losses), tuple(sizes))


def test_the_family_starts_from_nothing_and_shrinks_at_every_step():
    curves = {"a": _curve("a", [0, 1, 2, 4, 8], [1000, 500, 400, 300, 200]),
              "b": _curve("b", [0, 0.5, 3, 9, 20], [800, 400, 320, 240, 160])}
    family = auto_sparsity.plans(curves)
    assert family[0] == {}
    sizes = [auto_sparsity.predicted_bytes(curves, plan) for plan in family]
    assert all(b < a for a, b in zip(sizes, sizes[1:]))
    assert family[-1] == {"a": AUTO_LADDER[3], "b": AUTO_LADDER[3]}  # everything, at the largest budget


def test_the_plan_prunes_the_layer_that_costs_less_loss_per_byte_first():
    curves = {"cheap": _curve("cheap", [0, 0.1, 0.2, 0.3], [1000, 500, 300, 200]),
              "dear": _curve("dear", [0, 5, 10, 20], [1000, 500, 300, 200])}
    family = auto_sparsity.plans(curves)
    first = family[1]
    assert first.get("cheap", 0) > first.get("dear", 0)


def test_search_finds_the_most_pruned_passing_plan_in_few_trials():
    family = [{}] + [{"fc1": s} for s in AUTO_LADDER]
    limit = 0.93

    def trial(plan):
        return auto_sparsity.Trial(plan, plan["fc1"] <= limit, 0.0, 0.0)

    index, trials = auto_sparsity.search(family, trial)
    assert family[index] == {"fc1": limit}
    assert len(trials) <= int(np.ceil(np.log2(len(family)))) + 1


def test_search_returns_nothing_pruned_when_no_plan_passes():
    family = [{}, {"fc1": 0.5}, {"fc1": 0.9}]
    index, trials = auto_sparsity.search(family, lambda plan: auto_sparsity.Trial(plan, False, 9.0, 1.0))
    assert index == 0 and trials


def test_global_magnitude_prunes_the_layer_of_smaller_weights_more_on_the_ladder():
    weights = {"small": _layer(scale=0.1, seed=1), "large": _layer(scale=1.0, seed=2)}
    family = auto_sparsity.global_plans(weights)
    assert family[0] == {}
    middle = family[len(family) // 2]
    assert middle.get("small", 0) > middle.get("large", 0)
    assert all(s in AUTO_LADDER for plan in family for s in plan.values())
