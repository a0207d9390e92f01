"""The trip knapsack over the few nodes that can hold its optimum
(stowplan.planner.exact.trip_nodes): the bound it gives over every node, listed one by
one, where nodes of one kind differ only in their links."""

from __future__ import annotations

import math
from dataclasses import replace
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from stowplan import Constraints, NodeDescriptor
from stowplan.cost import CostModel
from stowplan.models import resolve_model
from stowplan.plan import Metric
from stowplan.planner.exact import trip
from stowplan.planner.exact.pipelines import solve_exact
from stowplan.planner.exact.trip_nodes import useful
from stowplan.planner.problem import prepare
from tests.common.gpu_fleets import single_gpu_kinds
from tests.common.instances import GPUS, instances
from tests.common.refusals import rejected_if_refused


def _every_node(figures, num_blocks, fewest, least, empty=None):
    return figures


def _both(model, nodes, c, stages):
    """The bound over the nodes kept, and over every node, on fresh cost models."""
    problem = prepare(model, nodes, c)
    problem = replace(problem, min_stages=stages[0], max_stages=stages[1])
    got = trip.trip_bound(problem, CostModel(model, nodes, c))
    with patch.object(trip, "useful", _every_node):
        full = trip.trip_bound(problem, CostModel(model, nodes, c))
    return got, full


@st.composite
def kind_fleets(draw: st.DrawFn) -> tuple:
    """A small model on a few kinds of node, several nodes of each, links drawn per node."""
    model, _ = draw(instances(max_nodes=1, max_blocks=10))
    nodes = []
    for k in range(draw(st.integers(1, 3))):
        gpu, gb = draw(st.sampled_from(GPUS))
        vram = draw(st.integers(gb // 2, gb)) * 10**9
        gpus = draw(st.sampled_from([1, 1, 2]))
        for i in range(draw(st.integers(1, 6))):
            nodes.append(
                NodeDescriptor(
                    id=f"k{k}n{i}",
                    gpu_name=gpu,
                    vram_bytes=vram * gpus,
                    num_gpus=gpus,
                    flops_estimate=0.0,
                    link_mbps=draw(st.sampled_from([100.0, 1000.0, 10_000.0, 100_000.0])),
                    link_latency_ms=draw(st.floats(0.05, 60.0)),
                )
            )
    return model, nodes


@settings(max_examples=150, deadline=None)
@given(kind_fleets(), st.sampled_from([1, 3, 16]), st.integers(1, 5), st.integers(0, 12))
def test_the_nodes_kept_give_the_bound_of_every_node(fleet, batch, fewest, span):
    """Never below the knapsack of every node (the same but where that is a relaxation
    below every solution), never above the least time per token (the subset DP)."""
    model, nodes = fleet
    c = Constraints(batch=batch)
    stages = (fewest, fewest + span)
    with rejected_if_refused():
        got, full = _both(model, nodes, c, stages)
    if full is None or math.isinf(full):
        assert got == full
        return
    assert got is not None
    assert full <= got
    if len(nodes) <= 7:
        problem = replace(prepare(model, nodes, c), min_stages=stages[0], max_stages=stages[1])
        exact = solve_exact(problem, CostModel(model, nodes, c), Metric.LATENCY).value
        assert got <= exact * (1 + 1e-9)
    equal.append(got <= full * (1 + 1e-12))


equal: list[bool] = []
"""Whether each bound drawn was that of every node."""


def test_mostly_the_bound_of_every_node():
    equal.clear()
    test_the_nodes_kept_give_the_bound_of_every_node()
    assert sum(equal) >= 0.9 * len(equal)


def test_on_a_fleet_of_few_kinds_few_nodes_are_solved_for_the_same_bound():
    """llama3.1:70b at 16 sequences over 48 nodes of four kinds: the knapsack is solved
    over a fifth of them at most, and gives the bound of every node, on every range of
    stage counts a certificate asks."""
    model = resolve_model("llama3.1:70b")
    nodes = single_gpu_kinds(48, 7)
    c = Constraints(batch=16)
    for stages in [(1, 48), (4, 7), (8, 15), (16, 31), (2, 3)]:
        got, full = _both(model, nodes, c, stages)
        assert got is not None
        assert got == full
    kept: list[int] = []

    def recorded(figures, num_blocks, fewest, least, empty=None):
        got = useful(figures, num_blocks, fewest, least, empty)
        kept.append(len(got))
        return got

    problem = replace(prepare(model, nodes, c), min_stages=4, max_stages=7)
    with patch.object(trip, "useful", recorded):
        trip.trip_bound(problem, CostModel(model, nodes, c))
    assert kept
    assert 0 < max(kept) <= len(nodes) // 5


def test_where_the_few_nodes_are_half_or_more_every_node_is_solved_unasked():
    """llama3.1:70b at 16 sequences over 16 nodes of four kinds: pipelines of 12 stages or
    more need most of the nodes, and the few asked first would be half of them or more:
    every node is returned without asking (solving the few first costs more than it
    could leave out).  Of two stages or more, the few are asked first."""
    model = resolve_model("llama3.1:70b")
    cm = CostModel(model, single_gpu_kinds(16, 7), Constraints(batch=16))
    figures = trip._figures(cm)
    asked: list[int] = []

    def least(of: list[trip.Figures]) -> float:
        asked.append(len(of))
        return 1.0

    assert useful(figures, cm.num_blocks, 12, least) == figures
    assert asked == []
    useful(figures, cm.num_blocks, 2, least)
    assert asked and 2 * asked[0] < len(figures)
