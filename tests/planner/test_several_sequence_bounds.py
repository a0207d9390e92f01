"""The bounds that certify plans of several sequences, against every pipeline of small
random fleets (tests.common.brute_force): the knapsack on time per token between stage
limits, the whole-block capacity bound on the slowest stage, the two-stage cycle solved
outright, and the stage swaps that only ever lower a plan's cycle."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stowplan import Constraints, NodeDescriptor, plan
from stowplan.cost import CostModel
from stowplan.models import resolve_model
from stowplan.planner.exact import trip
from stowplan.planner.exact.pipelines import CYCLE_EXACT_LIMIT, least_cycle
from stowplan.planner.problem import prepare
from stowplan.planner.strategies import cycle
from stowplan.planner.strategies.cycle import swapped
from stowplan.planner.strategies.throughput import relaxed_bottleneck
from tests.common.bounded_apart import bounded_apart
from tests.common.brute_force import pipelines_of
from tests.common.instances import RANGED, instances, ranged
from tests.common.refusals import rejected_if_refused


@settings(max_examples=80, deadline=None)
@given(
    *RANGED,
    st.sampled_from([1, 2, 8]),
)
def test_the_knapsack_between_stage_limits_is_never_above_their_least_time_per_token(
    inst, batch, fewest, most, counted
):
    model, nodes = inst
    problem, c, lo, hi = ranged(inst, batch, fewest, most)
    sub = replace(problem, min_stages=lo, max_stages=hi)
    cm = CostModel(model, nodes, c)
    truth = min(
        (
            cm.evaluate_here(*p).time_per_token_s
            for s in range(lo, hi + 1)
            for p in pipelines_of(cm, s)
        ),
        default=math.inf,
    )
    # Counting up to ``counted`` stages: fewer than the limits when 1 or 2 (the top count
    # then stands for that many or more).
    with patch.object(trip, "COUNTED_STAGES", counted):
        got = trip.trip_bound(sub, cm)
    assert got is not None
    assert got <= truth * (1 + 1e-9)


@settings(max_examples=80, deadline=None)
@given(instances(max_nodes=4, max_blocks=6), st.sampled_from([1, 3, 8]), st.integers(1, 4))
def test_the_capacity_bound_is_never_above_the_least_slowest_stage(inst, batch, most):
    model, nodes = inst
    c = Constraints(batch=batch)
    with rejected_if_refused():
        problem = prepare(model, nodes, c)
    hi = min(most, problem.max_stages)
    sub = replace(problem, max_stages=hi)
    cm = CostModel(model, nodes, c)
    got = relaxed_bottleneck(sub, cm)
    if not cm.uniform:
        assert got is None  # blocks differ: no bound
        return
    truth = min(
        (cm.evaluate_here(*p).bottleneck_s for s in range(1, hi + 1) for p in pipelines_of(cm, s)),
        default=math.inf,
    )
    assert got is not None
    assert got <= truth * (1 + 1e-9)


@settings(max_examples=60, deadline=None)
@given(instances(max_nodes=8, max_blocks=6), st.sampled_from([1, 2, 3, 16]))
def test_the_two_stage_cycle_is_the_least_over_every_pair_and_split(inst, batch):
    model, nodes = inst
    c = Constraints(batch=batch)
    with rejected_if_refused():
        problem = prepare(model, nodes, c)
    cm = CostModel(model, nodes, c)
    truth = min((cm.evaluate(*p).cycle_s for p in pipelines_of(cm, 2)), default=math.inf)
    got = least_cycle(problem, cm.for_stages(2), 2)
    assert got.exact
    assert got.value == truth or math.isclose(got.value, truth, rel_tol=1e-12)
    if got.pipeline is not None:
        assert len(got.pipeline[0]) == 2 and cm.fits_pipeline(*got.pipeline)
        assert cm.evaluate(*got.pipeline).cycle_s == got.value


@settings(max_examples=60, deadline=None)
@given(instances(max_nodes=6, max_blocks=6), st.sampled_from([2, 3, 16]), st.data())
def test_swaps_keep_the_blocks_and_never_raise_the_cycle(inst, batch, data):
    model, nodes = inst
    c = Constraints(batch=batch)
    cm = CostModel(model, nodes, c)
    stages = data.draw(st.integers(1, min(len(nodes), model.num_blocks)))
    found = list(pipelines_of(cm, stages))
    if not found:
        return
    p = data.draw(st.sampled_from(found))
    order, bounds = swapped(cm, p)
    assert bounds == p[1] and len(set(order)) == len(order) == stages
    assert cm.fits_pipeline(order, bounds)
    assert cm.evaluate(order, bounds).cycle_s <= cm.evaluate(*p).cycle_s


def _fleet() -> list[NodeDescriptor]:
    """Eight L40S on slow links of 10-60 ms, two of them 30 ms faster to reach than the
    others: two stages hold llama3.1:70b."""
    return [
        NodeDescriptor(
            id=f"n{i}",
            gpu_name="L40S",
            vram_bytes=48 * 10**9,
            link_mbps=1000.0,
            link_latency_ms=10.0 if i in (5, 6) else 40.0 + i,
        )
        for i in range(8)
    ]


def test_on_eight_nodes_the_two_stage_plan_is_proven(monkeypatch):
    """On eight nodes a 16-sequence plan of two stages is proven optimal: its pipeline
    takes the two nodes nearest.  The search's pipeline split again
    (``cycle.resplit``) meets the bounds at once; without that step the two-stage cycle
    solved outright certifies it."""
    for again in (True, False):
        with monkeypatch.context() as m:
            if not again:
                m.setattr(cycle, "resplit", lambda problem, cm, p: p)
            p = plan(resolve_model("llama3.1:70b-q4_0"), _fleet(), Constraints(batch=16))
        cert = p.rationale.certificate
        assert cert is not None and p.num_stages == 2
        assert {a.node_id for a in p.assignments} == {"n5", "n6"}
        assert cert.exact and cert.gap == 0.0
        assert ("two stages" in cert.method) == (not again)


def test_a_stage_count_past_the_subset_dp_is_solved_by_the_milp(monkeypatch) -> None:
    """Nine WAN nodes, 405B at 16 sequences: the search's two stages on the MI300X cards
    are 4 % slower than three through the two low-latency A100s; the least bound is that
    one stage count's, too many nodes for the subset DP's least cycle, so the MILP solves
    its time per token outright: the three-stage pipeline is the plan, proven at gap 0
    (without the coupled bound, whose pipeline finds the same cycle)."""
    kinds = [
        ("MI300X", 192, 447.4, 52.23),
        ("A10G", 24, 945.4, 44.91),
        ("A10G", 24, 251.4, 51.85),
        ("A100 80GB PCIe", 80, 684.6, 52.25),
        ("A100 80GB SXM4", 80, 525.4, 11.47),
        ("A100 80GB PCIe", 80, 845.0, 11.42),
        ("MI300X", 192, 453.6, 46.57),
        ("A100 80GB PCIe", 80, 188.1, 40.51),
        ("A10G", 24, 120.0, 58.3),
    ]
    assert len(kinds) > CYCLE_EXACT_LIMIT
    nodes = [
        NodeDescriptor(
            id=f"n{i}", gpu_name=g, vram_bytes=gb * 10**9, link_mbps=mbps, link_latency_ms=lat
        )
        for i, (g, gb, mbps, lat) in enumerate(kinds)
    ]
    model = resolve_model("llama3.1:405b-q4_0")
    with monkeypatch.context() as m:
        bounded_apart(m)
        got = plan(model, nodes, Constraints(batch=16))
    coupled = plan(model, nodes, Constraints(batch=16))
    best = plan(model, nodes, Constraints(batch=16, strategy="exact", min_stages=3, max_stages=3))
    certified = coupled.rationale.certificate
    assert certified is not None and certified.exact
    assert certified.bound == pytest.approx(best.rationale.certificate.value, rel=1e-9)
    got_p, best_p = got.rationale.prediction, best.rationale.prediction
    assert got_p is not None and best_p is not None
    assert got_p.tokens_per_s >= best_p.tokens_per_s * (1 - 1e-9)
    assert [a.node_id for a in got.assignments] == ["n5", "n4", "n6"]
    cert = got.rationale.certificate
    assert cert is not None and cert.exact and "MILP" in cert.method


@pytest.mark.parametrize("seed", range(6))
def test_swaps_timed_on_arrays_are_the_swaps_timed_node_by_node(seed: int) -> None:
    """On a fleet large enough for the arrays, the moves chosen equal those of the
    node-by-node estimate (no two nodes share a host: the estimate is the cycle)."""
    rng = random.Random(seed)
    nodes = [
        NodeDescriptor(
            id=f"n{i:03d}",
            gpu_name=rng.choice(["RTX 4090", "A100 80GB PCIe", "L40S", "RTX 3090"]),
            vram_bytes=rng.choice([24, 48, 80]) * 10**9,
            link_mbps=rng.uniform(100, 10_000),
            link_latency_ms=rng.uniform(0.1, 60),
        )
        for i in range(cycle.SWAP_ARRAY_NODES + rng.randint(0, 40))
    ]
    model = resolve_model(rng.choice(["llama3.1:70b", "llama3.1:405b-q4_0"]))
    cm = CostModel(model, nodes, Constraints(batch=rng.choice([4, 16])))
    stages = rng.randint(3, 6)
    per = model.num_blocks // stages
    bounds = [0, *(per * (s + 1) for s in range(stages - 1)), model.num_blocks]
    order = sorted(
        rng.sample(range(len(nodes)), len(nodes)),
        key=lambda d: -cm.usable[d],
    )[:stages]
    assert cm.fits_pipeline(order, bounds)
    on_arrays = swapped(cm, (order, bounds))
    with patch.object(cycle, "SWAP_ARRAY_NODES", 10**9):
        node_by_node = swapped(cm, (order, bounds))
    assert on_arrays == node_by_node
    assert on_arrays != (order, bounds)
