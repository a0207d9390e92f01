"""Expert-parallel plans take the fewest stages whose nodes hold every expert: the
count the planner reaches by jumping over counts that fall short equals the first count
that holds them, counted up one at a time."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from stowplan import Constraints, ExpertInputs, ExpertPlacement, InsufficientVram, PlanError
from stowplan.model import usable_bytes
from stowplan.models import resolve_model
from stowplan.moe.routing import backbone_layout
from stowplan.plan import plan_to_dict
from stowplan.planner import plan, plan_blocks
from stowplan.planner.experts import choice, place_experts
from tests.common.toy import toy_node


def _one_at_a_time(model, nodes, c: Constraints):  # type: ignore[no-untyped-def]
    """The backbone on 1, 2, … stages (from the fewest whose largest nodes could hold
    everything) until its nodes hold every expert."""
    ex = model.experts
    routed = len(ex.moe_blocks) * ex.routed_bytes_per_block
    backbone = backbone_layout(model)
    needed = backbone.weight_bytes + routed
    ranked = sorted((usable_bytes(n, c.headroom) for n in nodes), reverse=True)
    most = min(len(nodes), model.num_blocks)
    first = 1
    while first < most and sum(ranked[:first]) < needed:
        first += 1
    for n in range(first, most + 1):
        base = plan_blocks(backbone, nodes, replace(c, min_stages=n))
        try:
            return place_experts(base, model, nodes, c)
        except InsufficientVram:
            continue
    return None


@pytest.mark.parametrize("seed", range(10))
def test_the_fewest_stages_holding_every_expert(seed: int) -> None:
    rng = random.Random(seed)
    model = resolve_model(rng.choice(["qwen3:30b-a3b", "qwen3:30b-a3b-q4_0"]))
    nodes = [
        toy_node(
            i,
            vram_bytes=rng.choice([6, 8, 12, 16, 24]) * 10**9,
            mem_bandwidth_gbps=rng.uniform(200, 1000),
            link_mbps=rng.choice([1000.0, 10_000.0]),
        )
        for i in range(rng.randint(6, 16))
    ]
    c = Constraints(batch=rng.choice([1, 8]), context_tokens=2048)
    forced = ExpertInputs(placement=ExpertPlacement.EXPERT_PARALLEL)
    try:
        got = plan(model, nodes, c, experts=forced)
    except PlanError:
        assert _one_at_a_time(model, nodes, c) is None
        return
    expected = _one_at_a_time(model, nodes, c)
    assert expected is not None
    assert plan_to_dict(got) == plan_to_dict(expected)


def test_the_counts_start_from_the_fastest_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fast small nodes and slow large ones: the backbone takes the fast ones, on which
    the count of the largest nodes falls short.  Counting from the fewest fastest nodes
    that hold every byte gives the same plan with fewer backbones planned."""
    model = resolve_model("qwen3:30b-a3b")
    nodes = [
        toy_node(
            i,
            vram_bytes=(12 if i < 10 else 24) * 10**9,
            mem_bandwidth_gbps=1000.0 if i < 10 else 200.0,
            link_mbps=10_000.0,
        )
        for i in range(14)
    ]
    c = Constraints(batch=8, context_tokens=2048)
    forced = ExpertInputs(placement=ExpertPlacement.EXPERT_PARALLEL)
    placed: list[int] = []
    real = choice.place_experts

    def counted(base, *args, **kwargs):  # type: ignore[no-untyped-def]
        placed.append(base.num_stages)
        return real(base, *args, **kwargs)

    monkeypatch.setattr(choice, "place_experts", counted)
    got = plan(model, nodes, c, experts=forced)
    from_fastest = list(placed)
    placed.clear()

    def largest_first(ns, headroom):  # type: ignore[no-untyped-def]
        """The counts from the largest nodes instead, as before."""
        return sorted((usable_bytes(n, headroom) for n in ns), reverse=True)

    monkeypatch.setattr(choice, "_fastest_first", largest_first)
    again = plan(model, nodes, c, experts=forced)
    assert plan_to_dict(got) == plan_to_dict(again)
    assert len(from_fastest) < len(placed), (from_fastest, placed)
