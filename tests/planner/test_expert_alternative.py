"""The expert-parallel plan beside a block-local one: sketched for the note's figure,
and planned in full where no block-local plan fits and it becomes the plan."""

from __future__ import annotations

from stowplan import Constraints, ExpertInputs, ExpertPlacement, NodeDescriptor, lookup
from stowplan.plan import plan_to_dict
from stowplan.planner import plan
from stowplan.planner.certify import SKETCHED, is_sketching
from stowplan.planner.experts import choice
from stowplan.planner.tensor import groups
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
    big = [
        NodeDescriptor(
            id=f"h{i:02d}", gpu_name="H100 SXM5", vram_bytes=8 * 80 * 10**9, num_gpus=8,
            link_mbps=100_000.0,
        )
        for i in range(24)
    ]  # fmt: skip
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


def test_the_note_figure_skips_the_joint_solve_and_the_local_search(
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    """Under :func:`figuring` (the expert-parallel figure beside a block-local plan) even
    a small fleet's exact joint solve is skipped, and the local search over splits:
    under :func:`sketching` both run on these three nodes."""
    from stowplan.planner.certify import figuring, is_figuring, sketching
    from tests.common.gpu_fleets import nodes_of

    solved: list[int] = []
    improved: list[int] = []
    real_cycle, real_improve = groups.joint_cycle, groups._improve

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        solved.append(1)
        return real_cycle(*args, **kwargs)

    def searched(*args, **kwargs):  # type: ignore[no-untyped-def]
        improved.append(1)
        return real_improve(*args, **kwargs)

    monkeypatch.setattr(groups, "joint_cycle", counted)
    monkeypatch.setattr(groups, "_improve", searched)
    model = lookup("llama3.1:70b")
    assert model is not None
    # Blocks alike, but a GPU link dearer than the network (PCIe cards behind an
    # 800 Gbit/s fabric): the joint solve is no bound alone and the local search runs.
    fabric = 800_000.0
    nodes = nodes_of(
        [("RTX 4090", 24, 4, fabric, 0.05), ("L40S", 48, 2, fabric, 0.05),
         ("A100 80GB SXM", 80, 2, fabric, 0.05)]
    )  # fmt: skip
    c = Constraints(batch=16)
    with sketching():
        sketched = plan(model, nodes, c)
    assert solved and improved
    assert sketched.rationale.certificate is not None
    assert sketched.rationale.certificate.method != SKETCHED
    solved.clear()
    improved.clear()
    with figuring():
        assert is_sketching() and is_figuring()
        figured = plan(model, nodes, c)
    assert not solved and not improved
    assert figured.rationale.certificate is not None
    assert figured.rationale.certificate.method == SKETCHED
    assert not is_figuring() and not is_sketching()


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
