"""The time per token of GPU groups with every stage within a slowest stage
(:meth:`~stowplan.planner.tensor.capacity.StageCapacity.trip_within`) and the cycle
bound it gives each stage count (:func:`~stowplan.planner.tensor.joint.joint_cycle`)."""

from __future__ import annotations

import math

import pytest

from stowplan import Constraints, plan
from stowplan.cost.cycle import microbatches
from stowplan.models import resolve_model
from stowplan.planner.tensor.capacity import StageCapacity
from stowplan.planner.tensor.joint import WITHIN
from stowplan.planner.tensor.nodes import GroupCosts
from tests.common.gpu_fleets import mixed_link_fleet, slow_hop_fleet
from tests.common.referee_pipelines import pipelines_with_layouts, referee_cases


@pytest.mark.parametrize("first", range(0, 64, 16))
def test_the_time_per_token_within_a_pipelines_slowest_stage_is_never_above_its_own(
    first: int,
) -> None:
    """Against the tensor-parallel referee (every pipeline of two or more stages of 3–4
    blocks on 2–3 nodes of 1–8 GPUs, LAN or WAN links, at its count's microbatch): the
    bound within the pipeline's own slowest stage is never above its time per token, is
    positive, and falls as the limit rises."""
    checked = 0
    for inst, spec, problem, top in referee_cases(range(first, first + 16)):
        held: dict[int, StageCapacity] = {}
        for count, _, score in pipelines_with_layouts(spec, top):
            if count < 2:
                continue
            u = microbatches(spec.batch, count)[1]
            if u not in held:
                at = problem.at_microbatch(u)
                held[u] = StageCapacity(at, GroupCosts(at, None))
            slowest = max(score.stage_time_s)
            bound = held[u].trip_within(slowest)
            assert 0 < bound <= score.trip_s * (1 + 1e-9), (inst.text(), count, bound, score)
            assert held[u].trip_within(slowest * 2) <= bound
            checked += 1
    assert checked >= 100


def test_below_every_stage_of_one_block_nothing_holds_the_model() -> None:
    """A limit under every stage's time holds no pipeline (inf); with no limit the bound
    is positive and no more than any two-stage pipeline's time per token."""
    checked = 0
    for _, spec, problem, top in referee_cases(range(16)):
        u = microbatches(spec.batch, 2)[1]
        at = problem.at_microbatch(u)
        held = StageCapacity(at, GroupCosts(at, None))
        two = [score for count, _, score in pipelines_with_layouts(spec, top) if count == 2]
        if not two:
            continue
        least = min(min(score.stage_time_s) for score in two)
        assert held.trip_within(least * 1e-6) == math.inf
        assert 0 < held.trip_within(math.inf) <= min(score.trip_s for score in two)
        checked += 1
    assert checked >= 3


def test_hops_that_outlast_the_plan_prove_one_h100_stage_optimal() -> None:
    """Nine nodes (:func:`~tests.common.gpu_fleets.slow_hop_fleet`); qwen3:30b-a3b at 16
    sequences.  The plan is one stage on the H100
    node (1.80 ms a token per sequence).  Bounded apart, the slowest stage and the time
    per token of a pipeline of 2–25 stages left it 16 % below; bounded together (within
    a slowest stage of C / m, the H100's groups hold too few blocks, and each node more
    adds its 0.5 ms hop), no count comes below its cycle: proven optimal."""
    got = plan(resolve_model("qwen3:30b-a3b"), slow_hop_fleet(), Constraints(batch=16))
    assert [(a.node_id, a.tensor_parallel) for a in got.assignments] == [("n06", 8)]
    cert = got.rationale.certificate
    assert cert is not None and cert.exact and cert.gap == 0.0, cert
    assert WITHIN in cert.method


def test_a_plan_far_from_its_bound_has_its_groups_searched_in_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fifteen nodes of mixed links (:func:`~tests.common.gpu_fleets.mixed_link_fleet`),
    qwen3:30b-a3b at 16 sequences.  The layouts' sketches kept four stages through an
    8 × A100 node behind a 0.5 ms link (1.68 ms a token per sequence, 28 % above the
    bound); every node on its largest groups searched in full gives four stages behind
    0.05 ms links, 1.26 ms, within 4 % of it."""
    from stowplan.planner.tensor import groups

    model, c = resolve_model("qwen3:30b-a3b"), Constraints(batch=16)
    got = plan(model, mixed_link_fleet(), c)
    pred, cert = got.rationale.prediction, got.rationale.certificate
    assert pred is not None and cert is not None
    assert pred.time_per_token_s < 1.26e-3
    assert cert.gap < 0.04
    assert any("the search of its GPU groups in full" in n for n in got.rationale.notes)
    links = {n.id: n.link_latency_ms for n in mixed_link_fleet()}
    assert all(links[a.node_id] == 0.05 for a in got.assignments)
    monkeypatch.setattr(groups, "IN_FULL_GAP", math.inf)  # the sketches alone
    sketched = plan(model, mixed_link_fleet(), c).rationale.prediction
    assert sketched is not None and sketched.time_per_token_s > 1.6e-3
