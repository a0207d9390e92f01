"""The expert placement's shortcuts give what the plain computations give, value for value."""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stowplan import Constraints, ExpertInputs, ExpertPlacement, NodeDescriptor, Plan, lookup, plan
from stowplan.calibration.profile import Calibration, DeviceCalibration, Engine, Figure
from stowplan.cost import experts as cost_experts
from stowplan.cost.experts import expert_prediction
from stowplan.model import ExpertId, ModelLayout
from stowplan.moe.routing import Pairs, experts_on_nodes, experts_per_node, holders_of
from stowplan.moe.stats import zipf_load
from stowplan.planner.experts import expert_summary
from stowplan.planner.experts.packing import (
    _counts,
    _replica_counts,
    _replica_order,
    pack_experts,
    pack_shared,
)
from tests.common.moe import node
from tests.common.seeded import seeded_cluster

HALF = Calibration(
    name="half",
    engine=Engine.GENERIC,
    devices=(DeviceCalibration(device="*", bandwidth_fraction={"default": Figure(value=0.5)}),),
)


def _fleets() -> list[tuple[str, list[NodeDescriptor]]]:
    many_kinds = [node(i, 24 + i % 7, 500 + 37 * i, link=1000 + i, lat=i % 3) for i in range(90)]
    return [
        ("seeded", seeded_cluster(7, 12)),
        ("seeded-wide", seeded_cluster(3, 40)),
        ("many-kinds", many_kinds),
    ]


def _expert_plan(model: ModelLayout, nodes: Sequence[NodeDescriptor], c: Constraints) -> Plan:
    ex = model.experts
    assert ex is not None
    load = zipf_load(len(ex.moe_blocks), ex.num_experts, exponent=1.1)
    inputs = ExpertInputs(placement=ExpertPlacement.EXPERT_PARALLEL, load=load)
    return plan(model, nodes, c, experts=inputs)


@pytest.mark.parametrize("fleet", range(3))
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("calibrated", [False, True])
def test_prediction_on_the_stage_nodes_is_the_whole_fleets(
    fleet: int, batch: int, calibrated: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prediction's cost model over the stages' nodes alone predicts as over every node."""
    model = lookup("mixtral:8x7b")
    assert model is not None
    _, nodes = _fleets()[fleet]
    c = Constraints(batch=batch)
    got = _expert_plan(model, nodes, c)
    assert got.num_stages < len(nodes) or fleet == 0
    cal = HALF if calibrated else None
    short = expert_prediction(model, nodes, c, got, calibration=cal)
    assert len(cost_experts._stage_nodes(got, nodes)) == len({a.node_id for a in got.assignments})
    monkeypatch.setattr(cost_experts, "_stage_nodes", lambda _plan, every: every)
    assert expert_prediction(model, nodes, c, got, calibration=cal) == short


def test_stage_nodes_fall_back_to_the_fleet_when_ids_repeat() -> None:
    nodes = seeded_cluster(7, 12)
    model = lookup("mixtral:8x7b")
    assert model is not None
    got = _expert_plan(model, nodes, Constraints())
    assert cost_experts._stage_nodes(got, [*nodes, nodes[0]]) == [*nodes, nodes[0]]
    assert cost_experts._stage_nodes(got, nodes[:1]) == nodes[:1]


def _plain_owned(got: Plan, model: ModelLayout) -> list[list[ExpertId]]:
    """Every stage's experts as the packing lists them, expert by expert."""
    ex = model.experts
    assert ex is not None
    holders = holders_of(got, model)
    owned: list[list[ExpertId]] = [[] for _ in got.assignments]
    for block, block_holders in zip(ex.moe_blocks, holders, strict=True):
        for e, hs in enumerate(block_holders):
            for j in hs:
                owned[j].append(ExpertId(block=block, expert=e))
    return owned


def _plain_per_block(got: Plan) -> list[tuple[tuple[int, tuple[int, ...]], ...]]:
    """Every stage's experts per block, read off its owned experts one by one."""
    out = []
    for a in got.assignments:
        per: dict[int, list[int]] = {}
        for x in a.owned_experts:
            per.setdefault(x.block, []).append(x.expert)
        out.append(tuple((b, tuple(sorted(es))) for b, es in sorted(per.items())))
    return out


@pytest.mark.parametrize("fleet", range(3))
@pytest.mark.parametrize("name", ["mixtral:8x7b", "qwen3:30b-a3b"])
@pytest.mark.parametrize("skewed", [False, True])
def test_owned_experts_and_summary_rows_are_the_plain_ones(
    fleet: int, name: str, skewed: bool
) -> None:
    model = lookup(name)
    assert model is not None and model.experts is not None
    ex = model.experts
    _, nodes = _fleets()[fleet]
    load = zipf_load(len(ex.moe_blocks), ex.num_experts, exponent=1.1) if skewed else None
    inputs = ExpertInputs(placement=ExpertPlacement.EXPERT_PARALLEL, load=load)
    got = plan(model, nodes, Constraints(), experts=inputs)
    assert [list(a.owned_experts) for a in got.assignments] == _plain_owned(got, model)
    plain = _plain_per_block(got)
    assert [r.per_block for r in expert_summary(got, model, nodes, load).nodes] == plain
    shared = expert_summary(got, model, nodes, load, holders_by_block=holders_of(got, model))
    assert [r.per_block for r in shared.nodes] == plain


def test_experts_on_nodes_lists_each_nodes_copies() -> None:
    holders = [[0, 2], [1], [2], [0], [2, 1, 0]]
    assert experts_on_nodes(holders, 4) == [[0, 3, 4], [1, 4], [0, 2, 4], []]


def test_experts_per_node_lists_each_nodes_blocks_in_order() -> None:
    shared: list[list[int]] = [[0], [1], [1, 0]]
    alike_copy = [list(hs) for hs in shared]
    got = experts_per_node([3, 5, 9], [shared, [[1], [1], [1]], alike_copy], 3)
    assert got == [
        [(3, (0, 2)), (9, (0, 2))],
        [(3, (1, 2)), (5, (0, 1, 2)), (9, (1, 2))],
        [],
    ]


def _plain_replica_counts(w: list[float], redundant: int, num_nodes: int) -> list[int]:
    """EPLB's rule step by step, for ``redundant`` extra copies alone."""
    counts = [1] * len(w)
    heap = [(-x, e) for e, x in enumerate(w) if x > 0]
    heapq.heapify(heap)
    light = sum(w) / num_nodes / 2
    for _ in range(redundant):
        if not heap or -heap[0][0] <= light:
            break
        _, e = heapq.heappop(heap)
        counts[e] += 1
        heapq.heappush(heap, (-w[e] / counts[e], e))
    return counts


@settings(max_examples=300, deadline=None)
@given(
    w=st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.0, 3.0, 7.0]), min_size=1, max_size=16),
    most=st.integers(0, 12),
    num_nodes=st.integers(1, 8),
)
def test_replica_counts_are_read_off_one_order(w: list[float], most: int, num_nodes: int) -> None:
    order = _replica_order(w, most, num_nodes)
    for r in range(most + 1):
        plain = _plain_replica_counts(w, r, num_nodes)
        assert _replica_counts(w, r, num_nodes) == plain
        assert _counts(len(w), order[:r]) == plain


@pytest.mark.parametrize("with_pairs", [False, True])
@pytest.mark.parametrize("rows", [1, 3])
def test_shared_packing_is_pack_experts_and_pack_experts_shares_nothing(
    with_pairs: bool, rows: int
) -> None:
    rng = random.Random(rows)
    distinct = [[rng.choice([1.0, 2.0, 3.0, 0.5]) for _ in range(16)] for _ in range(rows)]
    weight = [distinct[li % rows] for li in range(24)]
    speeds = [1.0, 1.0, 1.5, 2.0, 1.0]
    slots = [90, 80, 80, 100, 60]
    pairs: list[Pairs] | None = [[(0, 1, 0.9), (2, 3, 0.8)]] * 24 if with_pairs else None
    args = (weight, speeds, slots)
    kw: dict[str, Any] = {"redundant_per_layer": 3, "experts_per_token": 2, "pairs": pairs}
    shared = pack_shared(*args, **kw)
    got = pack_experts(*args, **kw)
    assert got == shared
    assert len({id(h) for h in shared.holders}) < len(shared.holders)  # layers alike share
    lists = [*got.holders, *(got.load_only or ())]
    assert len({id(h) for h in lists}) == len(lists)
    assert len({id(hs) for h in lists for hs in h}) == sum(map(len, lists))
