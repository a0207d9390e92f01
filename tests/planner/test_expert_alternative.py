"""The expert-parallel plan beside a block-local one: sketched for the note's figure,
and planned in full where no block-local plan fits and it becomes the plan."""

from __future__ import annotations

import pytest

from stowplan import Constraints, ExpertInputs, ExpertPlacement, NodeDescriptor, lookup
from stowplan.plan import plan_to_dict
from stowplan.planner import plan
from stowplan.planner.certify import SKETCHED, is_sketching
from stowplan.planner.experts import choice
from stowplan.planner.tensor import groups
from tests.common.h100 import h100_nodes
from tests.common.plans import plan_cycle


def test_where_no_block_local_plan_fits_the_plan_is_the_full_expert_parallel_one(
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    # 32 nodes, each with room for one block of 1.25 GB but not two: block-local holds
    # 32 of the 48 blocks; the experts, spread, fit.
    model = lookup("qwen3:30b-a3b")
    assert model is not None
    nodes = [
        NodeDescriptor(id=f"n{i:02d}", gpu_name="RTX 3090", vram_bytes=2_450_000_000)
        for i in range(32)
    ]
    sketched: list[bool] = []
    real = choice.place_experts

    def placed(*args, **kwargs):  # type: ignore[no-untyped-def]
        sketched.append(is_sketching())
        return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(choice, "place_experts", placed)
        got = plan(model, nodes, Constraints())
    # The note's figure was sketched; the plan's experts were placed on a full plan.
    assert sketched[0] and not sketched[-1]
    forced = plan(
        model,
        nodes,
        Constraints(),
        experts=ExpertInputs(placement=ExpertPlacement.EXPERT_PARALLEL),
    )
    assert "no block-local plan (what engines run) fits" in got.rationale.notes[-1]
    mine, theirs = plan_to_dict(got), plan_to_dict(forced)
    mine["rationale"]["notes"] = mine["rationale"]["notes"][:-1]  # the note that says why
    assert mine == theirs


def test_a_sketched_grouping_search_skips_the_joint_bound_only_beyond_the_exact_solve(
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    """Under :func:`sketching`, a fleet the joint solve does not cover exactly is not
    bounded (its bound brings no pipeline); a small fleet's exact solve still runs."""
    from stowplan.planner.certify import sketching

    calls: list[int] = []
    real = groups.joint_cycle

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(groups, "joint_cycle", counted)
    model = lookup("llama3.1:70b")
    assert model is not None
    big = h100_nodes(24)
    c = Constraints(batch=16)
    full = plan(model, big, c)
    assert calls and full.rationale.certificate is not None
    assert full.rationale.certificate.method != SKETCHED
    calls.clear()
    with sketching():
        sketched = plan(model, big, c)
    assert not calls
    # The certified plan is the sketch's, or one its bound pointed at (a stage count the
    # search left out, planned after the bound): never slower.
    assert plan_cycle(full) <= plan_cycle(sketched)
    monkeypatch.setattr(groups, "REFINED_COUNTS", 0)
    assert plan(model, big, c).assignments == sketched.assignments  # the same, uncertified
    small = big[:2]
    calls.clear()
    with sketching():
        plan(model, small, c)
    assert calls  # the exact solve over two nodes may bring a better pipeline


def test_a_figure_runs_the_joint_solve_only_where_every_microbatch_is_affordable(
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    """Under :func:`figuring` the exact joint solve runs where its work, counted once per
    microbatch of the stage counts, is within ``INLINE_GROUPED_WORK``; under
    :func:`sketching` where one solve's is.  With the limit between the two, a sketch
    solves and a figure does not (its certificate is then not computed)."""
    from stowplan.cost import microbatches
    from stowplan.planner.certify import figuring, is_figuring, sketching
    from stowplan.planner.problem import prepare
    from stowplan.planner.tensor import joint
    from stowplan.planner.tensor.exact import grouped_work
    from stowplan.planner.tensor.layouts import engine_rule

    model = lookup("llama3.1:70b")
    assert model is not None
    nodes = h100_nodes(2)
    c = Constraints(batch=16)
    problem = prepare(model, nodes, c)
    rule = engine_rule(problem)
    work = sum(grouped_work(problem, a) for a in joint.exact_allowed(rule, problem))
    counts = len({microbatches(16, s)[1] for s in range(1, 17)})
    assert counts > 2
    monkeypatch.setattr(joint, "INLINE_GROUPED_WORK", 2 * work)
    solved: list[int] = []
    real = joint.solve_grouped

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        solved.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(joint, "solve_grouped", counted)
    monkeypatch.setattr(groups, "BOUNDS_FIRST", False)  # the solve runs, not only bounds
    with sketching():
        sketched = plan(model, nodes, c)
    assert solved
    assert sketched.rationale.certificate is not None
    assert sketched.rationale.certificate.method != SKETCHED
    solved.clear()
    with figuring():
        assert is_sketching() and is_figuring()
        figured = plan(model, nodes, c)
    assert not solved
    assert figured.rationale.certificate is not None
    assert figured.rationale.certificate.method == SKETCHED
    assert not is_figuring() and not is_sketching()


@pytest.mark.parametrize("batch", [1, 8])
def test_the_figure_on_two_nodes_is_the_expert_parallel_plan(batch: int) -> None:
    """On the shipped two 8 × H100 nodes the joint solve is affordable at every
    microbatch: the note's figure is the forced expert-parallel plan's (without the
    solve and the local search the figure was 0.548 ms/token at one stream, where the
    plan runs 0.214, 67 % faster than block-local, and 3,625 tokens/s at 8 sequences,
    where it runs 13,851)."""
    from stowplan import load_nodes
    from stowplan.models import resolve_model
    from tests.common.paths import EXAMPLES

    model = resolve_model("qwen3:30b-a3b-q4_0")
    nodes = load_nodes(EXAMPLES / "fleets" / "two-h100-nodes.yaml")
    c = Constraints(batch=batch)
    got = plan(model, nodes, c)
    forced = plan(model, nodes, c, experts=ExpertInputs(placement=ExpertPlacement.EXPERT_PARALLEL))
    pred = forced.rationale.prediction
    assert pred is not None
    value = pred.time_per_token_s * 1e3 if batch == 1 else pred.tokens_per_s
    unit = "ms/token" if batch == 1 else "tokens/s"
    note = next(n for n in got.rationale.notes if "expert-parallel (a custom" in n)
    figure = f"{choice._figure(value)} {unit}"
    assert f"--expert-parallel) {figure}" in note, (note, figure)


def test_the_expert_parallel_figure_is_planned_under_figuring(
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    from stowplan.planner.certify import is_figuring

    figured: list[bool] = []
    real = choice.place_experts

    def placed(*args, **kwargs):  # type: ignore[no-untyped-def]
        figured.append(is_figuring())
        return real(*args, **kwargs)

    monkeypatch.setattr(choice, "place_experts", placed)
    model = lookup("mixtral:8x7b")
    assert model is not None
    nodes = [
        NodeDescriptor(id=f"n{i}", gpu_name="A100 80GB SXM", vram_bytes=80 * 10**9)
        for i in range(3)
    ]
    got = plan(model, nodes, Constraints(batch=16))
    assert figured == [True]
    assert any("expert-parallel (a custom stage worker" in n for n in got.rationale.notes)
