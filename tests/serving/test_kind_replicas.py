"""serve() on fleets too large to enumerate: replicas that mix node types, each kind
planned once and moved onto groups of real nodes, scored on their own links."""

from __future__ import annotations

from dataclasses import replace

import pytest

import stowplan.planner
from stowplan import Constraints, NodeDescriptor, PlanError, Workload, serve
from stowplan.cost.predict import predict
from stowplan.cost.serving import serving_constraints
from stowplan.serving.candidates import replica_of, settle
from stowplan.serving.kind_replicas import link_rank
from stowplan.serving.reuse import moved
from tests.common.serving_referee import Load, Referee
from tests.common.toy import TOY_MODEL, toy_node

GB = 10**9
WORK = Workload(prompt_tokens=100, output_tokens=100, ttft_s=1.0, tpot_s=0.1)
LOAD = Load(prompt_tokens=100, output_tokens=100, ttft_s=1.0, tpot_s=0.1)


def _big(i: int, link: float) -> NodeDescriptor:
    """Holds the toy model's embedding and three blocks: two of them serve it."""
    return toy_node(
        i,
        gpu_name="RTX 5090",
        vram_bytes=int(5.5 * GB),
        mem_bandwidth_gbps=400.0,
        flops_estimate=50.0,
        link_mbps=link,
        price_per_hour=1.0 + i / 100,
    )


def _small(i: int, link: float) -> NodeDescriptor:
    """Holds two of the toy model's 1 GB parts: two of them cannot serve it, three can,
    and so can one beside a big node."""
    return toy_node(
        i,
        gpu_name="RTX 3090",
        vram_bytes=int(3.2 * GB),
        mem_bandwidth_gbps=300.0,
        flops_estimate=40.0,
        link_mbps=link,
        price_per_hour=0.5 + i / 100,
    )


def _fleet() -> list[NodeDescriptor]:
    """6 big and 20 small nodes, each link its own (26 classes: too many to enumerate)."""
    return [_big(i, 50.0 + 30 * i) for i in range(6)] + [
        _small(i, 20.0 + 40 * (i - 6)) for i in range(6, 26)
    ]


def _pipeline(ref_index: dict[str, int], plan) -> tuple[list[int], list[int]]:  # type: ignore[no-untyped-def]
    a = plan.assignments
    return [ref_index[s.node_id] for s in a], [s.block_range[0] for s in a] + [a[-1].block_range[1]]


def test_replicas_mixing_node_types_serve_more_than_single_type_ones():
    nodes = _fleet()
    ref = Referee(TOY_MODEL, nodes, LOAD)
    index = {n.id: i for i, n in enumerate(nodes)}
    big = [index[n.id] for n in sorted(nodes[:6], key=link_rank)]
    small = [index[n.id] for n in sorted(nodes[6:], key=link_rank)]
    # By hand: each big node beside one of the best-linked small ones, the rest of the
    # small ones in threes.
    pairs = sum(ref.best_replica([b, s])[0] for b, s in zip(big, small[:6], strict=True))
    threes = sum(ref.best_replica(small[j : j + 3])[0] for j in range(6, 18, 3))
    # One type to a replica: the big nodes in pairs, the small ones in threes at most.
    alike = ref.fleet_users(sum(1 << i for i in big)) + 6 * ref.best_replica(small[:3])[0]
    assert pairs + threes > alike
    sp = serve(TOY_MODEL, nodes, WORK)
    assert sp.users >= pairs + threes
    assert sp.certificate.bound >= sp.users
    kinds = [{nodes[index[i]].gpu_name for i in r.node_ids} for r in sp.replicas]
    assert {"RTX 5090", "RTX 3090"} in kinds
    used = [i for r in sp.replicas for i in r.node_ids]
    assert len(used) == len(set(used))
    # Each replica's figures are the formulas' on the nodes it runs on.
    for r in sp.replicas:
        order, bounds = _pipeline(index, r.plan)
        assert ref.max_users(order, bounds) == r.users
        assert r.ttft_s == pytest.approx(ref.ttft(order, bounds, r.users), rel=1e-9)
        assert r.tpot_s == pytest.approx(ref.tpot(order, bounds, r.users), rel=1e-9)
        pred = r.plan.rationale.prediction
        assert pred is not None
        again = predict(
            TOY_MODEL, nodes, replace(serving_constraints(WORK), batch=pred.batch), r.plan
        )
        assert pred.stage_time_s == pytest.approx(again.stage_time_s, rel=1e-9)


def test_a_plan_moved_onto_other_nodes_is_scored_and_predicted_on_their_links(
    monkeypatch: pytest.MonkeyPatch,
):
    fast = [_small(0, 800.0), _big(1, 800.0)]
    slow = [_small(2, 20.0), _big(3, 20.0)]
    c = Constraints()
    cand = replica_of(TOY_MODEL, fast, WORK, c, 300)
    assert cand is not None and len(cand.node_ids) == 2
    by_id = {n.id: n for n in slow}
    there = [slow[0] if i == "n0" else slow[1] for i in cand.node_ids]
    got = moved(TOY_MODEL, cand, there, WORK, c)
    assert got.reused and got.node_ids == tuple(n.id for n in there)
    assert {a.node_id for a in got.plan.assignments} == set(by_id)
    ref = Referee(TOY_MODEL, slow, LOAD)
    order, bounds = _pipeline({n.id: i for i, n in enumerate(slow)}, got.plan)
    # The slow links cost time: the moved plan serves fewer, as the formulas say.
    assert got.serving.users == ref.max_users(order, bounds) < cand.serving.users
    assert got.serving.tpot_s == pytest.approx(ref.tpot(order, bounds, got.serving.users))
    first = got.plan.rationale.prediction
    assert first is not None
    again = predict(
        TOY_MODEL, slow, replace(serving_constraints(WORK), batch=first.batch), got.plan
    )
    assert first.stage_time_s != pytest.approx(again.stage_time_s)  # still the fast nodes'
    done = settle(TOY_MODEL, got, WORK, c)
    assert not done.reused
    assert done.serving.users >= got.serving.users
    pred = done.plan.rationale.prediction
    assert pred is not None and pred.batch == done.serving.users
    own = predict(TOY_MODEL, slow, replace(serving_constraints(WORK), batch=pred.batch), done.plan)
    assert pred.stage_time_s == pytest.approx(own.stage_time_s, rel=1e-9)

    # No new plan for its own U*: the moved plan stays, predicted on its own nodes.
    def refuse(*args: object, **kwargs: object) -> None:
        raise PlanError("no plan")

    monkeypatch.setattr(stowplan.planner, "plan_blocks", refuse)
    kept = settle(TOY_MODEL, got, WORK, c)
    assert not kept.reused and kept.serving == got.serving
    assert kept.plan.assignments == got.plan.assignments
    pred = kept.plan.rationale.prediction
    assert pred is not None and pred.batch == first.batch
    assert pred.stage_time_s == pytest.approx(again.stage_time_s, rel=1e-9)
