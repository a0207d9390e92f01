"""Nodes that as many others as a pipeline has stages dominate (alike but for a network
no slower) are left out of the search, but for the cheapest set:
against every pair, the nodes left out are those; against every pipeline, the best over
the nodes kept is the best over them all; and plans keep to the nodes kept.  A plan's
stages then move to idle nodes at least as fast (twins of better network, or a faster
kind at several sequences) where that lowers the cycle."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stowplan.planner as planner
from stowplan import Constraints, NodeDescriptor
from stowplan.calibration import resolve_calibration
from stowplan.cost import CostModel
from stowplan.errors import Infeasible, InputError
from stowplan.model import Metric, Objective
from stowplan.planner import plan_blocks
from stowplan.planner.certify import pricing
from stowplan.planner.problem import prepare
from stowplan.planner.strategies import upgrade
from stowplan.planner.strategies.dominance import undominated
from stowplan.planner.strategies.upgrade import upgraded
from tests.common.brute_force import brute_force, pipelines
from tests.common.instances import instances
from tests.common.toy import TOY_MODEL, toy_node

LINKS = [0.0, 100.0, 1000.0, 10_000.0]
"""Mbit/s drawn (0: unknown, counting no transfer time)."""


NETWORKS = st.lists(
    st.tuples(st.sampled_from(LINKS), st.sampled_from([0.05, 1.0, 10.0])),
    min_size=2,
    max_size=6,
)
"""Each node's (link Mbit/s, hop ms)."""


def _twins(node: NodeDescriptor, networks: list[tuple[float, float]]) -> list[NodeDescriptor]:
    """``node`` once per network, ids ``n0``, ``n1``, …"""
    return [
        replace(node, id=f"n{i}", link_mbps=mbps, link_latency_ms=ms)
        for i, (mbps, ms) in enumerate(networks)
    ]


@st.composite
def fleets(draw: st.DrawFn, most_nodes: int = 9) -> list[NodeDescriptor]:
    """Nodes of one or two kinds (GPU and memory), each with its own network and price
    (which dominance ignores)."""
    kinds = [("RTX 4090", 24), ("L4", 24)][: draw(st.integers(1, 2))]
    nodes = []
    for i in range(draw(st.integers(1, most_nodes))):
        gpu, gb = draw(st.sampled_from(kinds))
        nodes.append(
            NodeDescriptor(
                id=f"n{i:02d}",
                gpu_name=gpu,
                vram_bytes=gb * 10**9,
                link_mbps=draw(st.sampled_from(LINKS)),
                link_latency_ms=draw(st.sampled_from([0.05, 1.0, 10.0])),
                price_per_hour=draw(st.sampled_from([None, 0.2, 0.5])),
            )
        )
    return nodes


def _dominates(d: NodeDescriptor, e: NodeDescriptor, first: bool) -> bool:
    """Whether ``d`` dominates ``e`` (``first``: ``d`` comes before ``e``, which breaks
    a tie of nodes alike in every figure compared)."""
    if (d.gpu_name, d.vram_bytes) != (e.gpu_name, e.vram_bytes):
        return False
    if (d.link_mbps > 0) != (e.link_mbps > 0):
        return False

    def figures(n: NodeDescriptor) -> tuple[float, float]:
        return (-(math.inf if n.link_mbps <= 0 else n.link_mbps), n.link_latency_ms)

    a, b = figures(d), figures(e)
    if a == b:
        return first
    return all(x <= y for x, y in zip(a, b, strict=True))


@settings(max_examples=150, deadline=None)
@given(fleets(), st.integers(1, 5))
def test_left_out_are_those_dominated_by_as_many_as_the_stages(nodes, most) -> None:  # type: ignore[no-untyped-def]
    kept = undominated(nodes, most)
    counts = [
        sum(_dominates(d, e, j < i) for j, d in enumerate(nodes) if j != i)
        for i, e in enumerate(nodes)
    ]
    expected = [n for n, c in zip(nodes, counts, strict=True) if c < most or len(nodes) <= most]
    assert list(kept) == expected
    # A kind that lost nodes keeps as many as the stages at least.
    for gone in set(nodes) - set(kept):
        alike = [n for n in kept if _dominates(n, gone, True)]
        assert len(alike) >= most


@settings(max_examples=120, deadline=None)
@given(
    instances(max_nodes=1, max_blocks=3),
    NETWORKS,
    st.sampled_from([1, 4]),
    st.sampled_from([None, "generic"]),
)
def test_the_nodes_kept_hold_an_optimum(inst, networks, batch, engine) -> None:  # type: ignore[no-untyped-def]
    """Against every pipeline (order, count, split): the least cycle over the nodes kept
    is the least over every node, first-order and calibrated."""
    model, (node,) = inst
    nodes = _twins(node, networks)
    c = Constraints(
        batch=batch, calibration=None if engine is None else resolve_calibration(engine)
    )
    kept = undominated(nodes, model.num_blocks)
    every, on_kept = brute_force(model, nodes, c, "cycle"), brute_force(model, kept, c, "cycle")
    assert on_kept == every or math.isclose(on_kept, every, rel_tol=1e-12)


def _fleet() -> list[NodeDescriptor]:
    """Eight alike toy nodes, each link slower and its hop longer than the one before."""
    return [
        toy_node(i, link_mbps=8.0 * (8 - i), link_latency_ms=1.0 + i, price_per_hour=1.0 + i / 10)
        for i in range(8)
    ]


def test_a_plan_keeps_to_the_nodes_kept_in_any_order() -> None:
    """Two stages at most: every node but the two of fastest network is dominated twice
    over; the plan is the best of every pipeline, on those two, whatever order the nodes
    come in."""
    nodes = _fleet()
    c = Constraints(batch=4, max_stages=2)
    assert [n.id for n in undominated(nodes, 2)] == ["n0", "n1"]
    p = plan_blocks(TOY_MODEL, nodes, c)
    assert {a.node_id for a in p.assignments} <= {"n0", "n1"}
    assert p.rationale.prediction is not None
    cycle = 1 / p.rationale.prediction.tokens_per_s * c.batch
    assert math.isclose(cycle, brute_force(TOY_MODEL, nodes, c, "cycle"), rel_tol=1e-9)
    shuffled = nodes[:]
    random.Random(3).shuffle(shuffled)
    again = plan_blocks(TOY_MODEL, shuffled, c)
    assert again.assignments == p.assignments


def test_the_cheapest_set_keeps_every_node() -> None:
    """Dearer nodes of a faster network dominate a cheaper one, but the cheapest set is
    sought over every node: the cheapest, of the slowest network, is the plan."""
    nodes = _fleet()
    cheap = replace(nodes[7], price_per_hour=0.1)
    nodes[7] = cheap
    assert cheap not in undominated(nodes, 2)
    c = Constraints(batch=1, max_stages=2, objective=Objective.COST, target_tokens_per_s=1e-3)
    p = plan_blocks(TOY_MODEL, nodes, c)
    assert [a.node_id for a in p.assignments] == ["n7"]


@settings(max_examples=100, deadline=None)
@given(
    instances(max_nodes=1, max_blocks=4),
    NETWORKS,
    st.sampled_from([1, 4]),
    st.data(),
)
def test_upgraded_moves_stages_to_better_networks(inst, networks, batch, data) -> None:  # type: ignore[no-untyped-def]
    """Any pipeline, upgraded: the same blocks on nodes alike, distinct, never slower; and
    where an idle node of better network (alike otherwise) lowers the cycle in some
    stage's place, the pipeline upgraded is faster."""
    model, (node,) = inst
    nodes = _twins(node, networks)
    cm = CostModel(model, nodes, Constraints(batch=batch))
    every = list(pipelines(cm))
    if not every:
        return
    order, bounds = data.draw(st.sampled_from(every))
    got, got_bounds = upgraded(cm, (order, bounds))
    assert got_bounds == bounds and len(got) == len(set(got)) == len(order)
    before = cm.evaluate(order, bounds).cycle_s
    after = cm.evaluate(got, bounds).cycle_s
    assert after <= before
    better = [
        cm.evaluate([*order[:k], j, *order[k + 1 :]], bounds).cycle_s
        for k, d in enumerate(order)
        for j in set(range(len(nodes))) - set(order)
        if _dominates(nodes[j], nodes[d], True)
    ]
    if min(better, default=before) < before * (1 - 1e-9):
        assert after < before * (1 - 1e-9)


def _upgraded_whole(cm: CostModel, p: tuple[list[int], list[int]]) -> tuple[list[int], list[int]]:
    """:func:`upgraded` with every move evaluated whole (as a pipeline of the cost model)."""
    order, bounds = p
    if not cm.own_hosts or len(cm.nodes) <= len(order):
        return p
    nodes, view = cm.nodes, cm.for_stages(len(order))
    kind, members = upgrade._kinds(cm)
    best = list(order)
    least = cm.evaluate(best, bounds).cycle_s
    used = set(best)

    def figures(i: int) -> tuple[float, ...]:
        return (view.inv_bw[i], view.flop_s_per_byte[i], view.block_s[i], view.stage_s[i])

    for k in range(len(order)):
        ev = cm.evaluate(best, bounds)
        slowest = ev.bottleneck_s
        if ev.num_microbatches * slowest > sum(ev.stage_time_s) + ev.hops_s and (
            ev.stage_time_s[k] < slowest
        ):
            continue
        here, moved = best[k], None
        for c in range(len(members)) if cm.batch > 1 else (kind[here],):
            for j in upgrade._front(cm, members[c], used):
                if (
                    view.usable[j] < view.usable[here]
                    or (
                        nodes[j].link_mbps < nodes[here].link_mbps
                        and nodes[j].link_latency_ms > nodes[here].link_latency_ms
                    )
                    or not all(a <= b for a, b in zip(figures(j), figures(here), strict=True))
                ):
                    continue
                trial = [*best[:k], j, *best[k + 1 :]]
                if not cm.fits_pipeline(trial, bounds):
                    continue
                cycle = cm.evaluate(trial, bounds).cycle_s
                if cycle < least * (1 - 1e-9):
                    moved, least = trial, cycle
        if moved is not None:
            used.discard(here)
            used.add(moved[k])
            best = moved
    return p if best == list(order) else (best, list(bounds))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_upgraded_figures_each_move_as_the_whole_pipeline_evaluated(data) -> None:  # type: ignore[no-untyped-def]
    """A move's cycle figured from the one stage it changes decides as the pipeline
    evaluated whole does: on nodes of two speeds and two sizes, each of its own network,
    any pipeline is upgraded to the same pipeline."""
    n = data.draw(st.integers(2, 9))
    nodes = [
        toy_node(
            i,
            mem_bandwidth_gbps=data.draw(st.sampled_from([100.0, 200.0])),
            vram_bytes=data.draw(st.sampled_from([3, 10])) * 10**9,
            link_mbps=data.draw(st.sampled_from(LINKS)),
            link_latency_ms=data.draw(st.sampled_from([0.05, 1.0, 10.0])),
        )
        for i in range(n)
    ]
    cm = CostModel(TOY_MODEL, nodes, Constraints(batch=data.draw(st.sampled_from([1, 4, 16]))))
    stages = data.draw(st.integers(1, min(n, TOY_MODEL.num_blocks)))
    order = data.draw(st.permutations(range(n)))[:stages]
    cuts = sorted(
        data.draw(
            st.sets(
                st.integers(1, TOY_MODEL.num_blocks - 1), min_size=stages - 1, max_size=stages - 1
            )
        )
    )
    p = (order, [0, *cuts, TOY_MODEL.num_blocks])
    assert upgraded(cm, p) == _upgraded_whole(cm, p)


def test_upgraded_decides_near_ties_as_the_whole_pipeline(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The last stage's node (a 50 ms hop) has three idle twins whose hops (1 ms, then two
    a hair shorter) put their cycles within a billionth of one another, some within the
    rounding of the bar a move must pass: those moves are evaluated whole, and every one
    is decided as evaluating each move whole decides it."""
    bounds = [0, 2, TOY_MODEL.num_blocks]

    def fleet(hops: tuple[float, float, float]) -> CostModel:
        nodes = [
            toy_node(0, link_latency_ms=0.1, link_mbps=10_000.0),
            toy_node(1, link_latency_ms=50.0),
            *(
                toy_node(2 + i, link_latency_ms=h, link_mbps=1000.0 / 2**i)
                for i, h in enumerate(hops)
            ),
        ]
        return CostModel(TOY_MODEL, nodes, Constraints(batch=1))

    def hop_for(cycle: float, j: int) -> float:
        """The hop (ms) of twin ``j`` that gives it ``cycle``."""
        flat = fleet((0.0, 0.0, 0.0)).evaluate([0, j], bounds).cycle_s
        return (cycle - flat) * 1e3

    first = fleet((1.0, 0.0, 0.0)).evaluate([0, 2], bounds).cycle_s
    whole = []
    real = upgrade.evaluated

    def counted(cm: CostModel, order: list[int], b: list[int]):  # type: ignore[no-untyped-def]
        whole.append(list(order))
        return real(cm, order, b)

    monkeypatch.setattr(upgrade, "evaluated", counted)
    moved = set()
    for a in range(-6, 7):
        second = first * (1 - 1e-9 + a * 2e-13)
        for b in range(-6, 7):
            third = min(first, second) * (1 - 1e-9 + b * 2e-13)
            cm = fleet((1.0, hop_for(second, 3), hop_for(third, 4)))
            got = upgraded(cm, ([0, 1], bounds))
            assert got == _upgraded_whole(cm, ([0, 1], bounds))
            moved.add(got[0][1])
    assert moved == {3, 4}  # either near twin taken somewhere in the sweep
    assert any(order[1] in (3, 4) for order in whole)  # near ties evaluated whole


def test_upgraded_moves_a_stage_its_node_cannot_hold() -> None:
    """Stage 0 does not fit its node (3 GB): a larger idle node alike but for its memory
    and of a shorter hop takes it; then the last stage moves off its 40 ms hop to the
    idle node left, the pipeline now fitting.  As evaluating each move whole decides."""
    nodes = [
        toy_node(0, vram_bytes=3 * 10**9),
        toy_node(1, link_latency_ms=40.0),
        toy_node(2, link_mbps=1000.0),
        toy_node(3, link_latency_ms=1.0),
    ]
    cm = CostModel(TOY_MODEL, nodes, Constraints(batch=4))
    p = ([0, 1], [0, 2, TOY_MODEL.num_blocks])
    assert not cm.fits_pipeline(*p)
    got = upgraded(cm, p)
    assert got == _upgraded_whole(cm, p) == ([3, 2], p[1])
    assert cm.fits_pipeline(*got)


def test_upgraded_takes_the_idle_twin_of_faster_network() -> None:
    """Two stages on the two slowest networks of eight alike nodes: the first, whose link
    sends the activations on, moves to the fastest; the last sends nothing on, and its
    node stays (no move lowers the cycle)."""
    nodes = _fleet()
    cm = CostModel(TOY_MODEL, nodes, Constraints(batch=4))
    got = upgraded(cm, ([7, 6], [0, 2, 4]))
    assert got == ([0, 6], [0, 2, 4])
    assert cm.evaluate(*got).cycle_s < cm.evaluate([7, 6], [0, 2, 4]).cycle_s
    assert cm.evaluate([0, 1], [0, 2, 4]).cycle_s == cm.evaluate(*got).cycle_s


def test_the_cheapest_sets_keep_their_nodes(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A plan's stages move to idle twins of better network, but not a set's of the
    cheapest-set search: a twin may cost more, and the set is priced by the nodes used."""
    problem = prepare(TOY_MODEL, _fleet(), Constraints(batch=4))
    cm = problem.cost_model()
    monkeypatch.setattr(planner, "_cycle_search", lambda *a: ([7, 6], [0, 2, 4]))
    assert planner._searched(problem, cm, Metric.THROUGHPUT) == ([0, 6], [0, 2, 4])
    with pricing():
        assert planner._searched(problem, cm, Metric.THROUGHPUT) == ([7, 6], [0, 2, 4])


def test_upgraded_takes_an_idle_faster_kind_for_the_slowest_stage() -> None:
    """Three blocks on the first of two alike nodes: at several sequences that stage moves
    to the idle node of twice the bandwidth; at one stream the latency search has weighed
    the other kinds, and only twins are tried."""
    nodes = [toy_node(0), toy_node(1), toy_node(2, mem_bandwidth_gbps=200.0)]
    p = ([0, 1], [0, 3, 4])
    cm = CostModel(TOY_MODEL, nodes, Constraints(batch=4))
    got = upgraded(cm, p)
    assert got == ([2, 1], [0, 3, 4])
    assert cm.evaluate(*got).cycle_s < cm.evaluate(*p).cycle_s
    one = CostModel(TOY_MODEL, nodes, Constraints(batch=1))
    assert upgraded(one, p) == p
    assert one.evaluate([2, 1], [0, 3, 4]).cycle_s < one.evaluate(*p).cycle_s


def test_a_refusal_counts_every_node_given() -> None:
    """More stages asked than the blocks allow: the refusal names the blocks, not the
    nodes a search would keep."""
    nodes = _fleet() + [toy_node(i, link_mbps=1.0) for i in range(8, 12)]
    with pytest.raises(Infeasible, match="only 4 blocks"):
        plan_blocks(TOY_MODEL, nodes, Constraints(min_stages=6, batch=4))


def test_nodes_of_one_id_are_refused_before_any_is_left_out() -> None:
    """Five copies of one node under one id, one stage at most: the ids are refused, not
    four copies left out."""
    with pytest.raises(InputError, match="n0"):
        plan_blocks(TOY_MODEL, [toy_node(0)] * 5, Constraints(max_stages=1))
