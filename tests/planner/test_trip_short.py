"""The capped trip knapsack (stowplan.planner.exact.trip) answers at once where no
pipeline of its stage counts holds every block within the cap: the same bound as the
knapsack solved over every node, without solving it."""

from __future__ import annotations

import math
from dataclasses import replace
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from stowplan import Constraints
from stowplan.cost import CostModel
from stowplan.models import resolve_model
from stowplan.planner.exact import trip
from stowplan.planner.problem import prepare
from tests.common.gpu_fleets import single_gpu_kinds
from tests.common.instances import RANGED, ranged


def _never_short(figures, most):
    return math.inf


@settings(max_examples=120, deadline=None)
@given(*RANGED, st.floats(0.05, 1.5))
def test_the_shortfall_check_leaves_every_capped_bound_as_it_was(inst, batch, fewest, most, share):
    model, nodes = inst
    problem, c, lo, hi = ranged(inst, batch, fewest, most)
    sub = replace(problem, min_stages=lo, max_stages=hi)
    cm = CostModel(model, nodes, c).for_stages(hi)
    free = trip.capped_trip_bound(sub, cm, math.inf)
    if free is None or not math.isfinite(free):
        return
    cap = share * free
    got = trip.capped_trip_bound(sub, cm, cap)
    with patch.object(trip, "_most_held", _never_short):
        solved = trip.capped_trip_bound(sub, CostModel(model, nodes, c).for_stages(hi), cap)
    assert got == solved


def test_a_cap_no_pipeline_of_the_counts_meets_is_answered_without_a_knapsack():
    """llama3.1:70b at 16 sequences over 48 nodes, pipelines of exactly 6 stages: a
    tenth below the least cap at which one holds its 80 blocks, the bound is inf (no
    pipeline) and no knapsack is solved; the same cap with the check left out solves one
    over every node for the same answer."""
    model = resolve_model("llama3.1:70b")
    nodes = single_gpu_kinds(48, 3)
    c = Constraints(batch=16)
    problem = replace(prepare(model, nodes, c), min_stages=6, max_stages=6)
    cm = CostModel(model, nodes, c).for_stages(6)
    free = trip.capped_trip_bound(problem, cm, math.inf)
    assert free is not None and math.isfinite(free)
    # The least cap with a finite bound, to 1e-6 of the trip: below it every pipeline of
    # six stages holds fewer than 80 blocks.
    lo, hi = 0.0, free
    while hi - lo > 1e-6 * free:
        mid = (lo + hi) / 2
        if math.isfinite(trip.capped_trip_bound(problem, cm, mid) or math.inf):
            hi = mid
        else:
            lo = mid
    cap = 0.9 * hi
    solved: list[int] = []
    knapsack = trip._knapsack

    def counted(np, cm, figures, *rest):
        solved.append(len(figures))
        return knapsack(np, cm, figures, *rest)

    with patch.object(trip, "_knapsack", counted):
        assert trip.capped_trip_bound(problem, cm, cap) == math.inf
        assert solved == []
        with patch.object(trip, "_most_held", _never_short):
            fresh = CostModel(model, nodes, c).for_stages(6)
            assert trip.capped_trip_bound(problem, fresh, cap) == math.inf
    assert solved and max(solved) == len(nodes)
