"""The expert planner hands its packing's holders to the summary and the prediction
instead of rebuilding them from the plan: the figures must be those read off the plan."""

from __future__ import annotations

import pytest

from stowplan.cost.experts import expert_prediction
from stowplan.moe.routing import block_reaches, holders_of, node_reach, token_routing
from stowplan.planner.experts import expert_summary
from tests.common.moe import spread_mixtral


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("skewed", [False, True])
def test_prediction_and_summary_match_the_plan(batch: int, skewed: bool) -> None:
    model, nodes, c, load, got = spread_mixtral(skewed, batch)
    assert got.rationale.prediction == expert_prediction(model, nodes, c, got, load)
    kept = expert_summary(got, model, nodes, load)
    assert any(f"{kept.transfers_per_token:.2f}" in n for n in got.rationale.notes)


@pytest.mark.parametrize("skewed", [False, True])
def test_block_reaches_are_each_blocks_node_reach(skewed: bool) -> None:
    """The reach the summary and the prediction share is :func:`node_reach` per block."""
    model, _, _, load, got = spread_mixtral(skewed)
    routing = token_routing(model, load, None)
    holders = holders_of(got, model)
    n = got.num_stages
    reaches = block_reaches(holders, routing, n)
    assert list(reaches) == [
        node_reach(h, routing.p[li], None, routing.k, n) for li, h in enumerate(holders)
    ]
