"""Seed 000 §9.1 property tests and §9.2 scenarios for balance-by-vram (V1)."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from stowplan import (
    Constraints,
    InsufficientVram,
    ModelLayout,
    NodeDescriptor,
    NoNodeFitsHead,
    StowplanError,
    lookup,
    plan,
    plan_to_json,
)
from stowplan.errors import Infeasible
from tests.common.refusals import or_none, plan_or_reject
from tests.common.strategies import GiB, constraints, models, node_lists

V1 = Constraints(strategy="balance-by-vram")
GB = 10**9


def _v1(**kw: object) -> Constraints:
    return Constraints(strategy="balance-by-vram", **kw)  # type: ignore[arg-type]


def _nodes(*sizes_gb: float) -> list[NodeDescriptor]:
    return [
        NodeDescriptor(
            id=f"n{i}-{s}g",
            gpu_name=f"{s} GB card",
            vram_bytes=int(s * GB),
            flops_estimate=100.0,
            link_mbps=1000.0,
        )
        for i, s in enumerate(sizes_gb)
    ]


@given(models, node_lists(), constraints)
def test_blocks_are_covered_exactly_once(model, nodes, c) -> None:  # type: ignore[no-untyped-def]
    p = plan_or_reject(model, nodes, c)
    covered = [b for a in p.assignments for b in range(*a.block_range)]
    assert covered == list(range(model.num_blocks))
    assert all(a.num_blocks >= 1 for a in p.assignments)


@given(models, node_lists(), constraints)
def test_every_stage_respects_its_usable_vram(model, nodes, c) -> None:  # type: ignore[no-untyped-def]
    p = plan_or_reject(model, nodes, c)
    by_id = {n.id: n for n in nodes}
    for a in p.assignments:
        budget = math.floor(by_id[a.node_id].vram_bytes * (1 - c.headroom))
        assert a.estimated_vram_bytes <= budget
        lo, hi = a.block_range
        expected = (hi - lo) * model.block_params_bytes
        expected += model.embed_params_bytes if a.owns_embed else 0
        expected += model.head_params_bytes if a.owns_head else 0
        assert a.estimated_vram_bytes == expected


@given(models, node_lists(), constraints)
def test_anchors_sit_at_the_ends(model, nodes, c) -> None:  # type: ignore[no-untyped-def]
    p = plan_or_reject(model, nodes, c)
    assert [a.owns_embed for a in p.assignments].count(True) == 1
    assert p.assignments[0].owns_embed
    assert [a.owns_head for a in p.assignments].count(True) == 1
    assert p.assignments[-1].owns_head
    lo = c.min_stages or 1
    hi = min(c.max_stages or len(nodes), len(nodes))
    assert lo <= p.num_stages <= hi
    assert len({a.node_id for a in p.assignments}) == p.num_stages


@given(models, node_lists(), constraints)
def test_same_input_gives_byte_identical_json(model, nodes, c) -> None:  # type: ignore[no-untyped-def]
    first = or_none(plan, model, nodes, c)
    second = or_none(plan, model, list(nodes), c)
    if first is None:
        assert second is None
        return
    assert second is not None
    assert plan_to_json(first) == plan_to_json(second)


@given(models, node_lists(), constraints)
def test_smallest_fitting_n_is_chosen(model, nodes, c) -> None:  # type: ignore[no-untyped-def]
    """Seed §6 step 3: no smaller N (within the constraints) has enough usable VRAM."""
    p = plan_or_reject(model, nodes, c)
    usable = sorted((math.floor(n.vram_bytes * (1 - c.headroom)) for n in nodes), reverse=True)
    lo = c.min_stages or 1
    for n in range(lo, p.num_stages):
        # a smaller N was skipped only if its VRAM or its block granularity did not suffice
        assert sum(usable[:n]) < model.weight_bytes or any(
            "no contiguous split" in note for note in p.rationale.notes
        )


finite = st.floats(allow_nan=True, allow_infinity=True)


@given(
    nb=st.integers(-5, 10**6),
    block=st.integers(-(2**70), 2**70),
    vram=st.integers(-(2**70), 2**70),
    flops=finite,
    link=finite,
    headroom=finite,
    lo=st.integers(-3, 10**4),
)
@example(nb=1, block=2**70, vram=2**70, flops=1.0, link=1.0, headroom=0.0, lo=1)
@example(nb=0, block=0, vram=0, flops=math.nan, link=math.inf, headroom=1.0, lo=0)
def test_arbitrary_numbers_raise_only_stowplan_errors(
    nb, block, vram, flops, link, headroom, lo
) -> None:  # type: ignore[no-untyped-def]
    try:
        model = ModelLayout(
            name="fuzz",
            num_blocks=nb,
            hidden_dim=1,
            bytes_per_activation_elem=2,
            block_params_bytes=block,
            head_params_bytes=abs(block) // 3,
            embed_params_bytes=abs(block) // 5,
        )
        nodes = [
            NodeDescriptor(
                id=f"n{i}", gpu_name="x", vram_bytes=vram, flops_estimate=flops, link_mbps=link
            )
            for i in range(3)
        ]
        c = Constraints(min_stages=lo, vram_headroom_frac=headroom, strategy="balance-by-vram")
        plan(model, nodes, c)
    except StowplanError:
        pass


# -- seed §9.2 scenarios ----------------------------------------------------------------


def test_case_a_two_homogeneous_nodes_split_evenly_with_large_slack() -> None:
    model = lookup("llama3.2:1b")
    assert model is not None
    p = plan(model, _nodes(24, 24), _v1(min_stages=2))
    assert p.num_stages == 2
    assert p.block_counts() == (8, 8)
    for a in p.assignments:
        assert a.usable_vram_bytes is not None
        assert 1 - a.estimated_vram_bytes / a.usable_vram_bytes > 0.8


def test_case_a_without_a_stage_floor_uses_one_node() -> None:
    model = lookup("llama3.2:1b")
    assert model is not None
    assert plan(model, _nodes(24, 24), V1).num_stages == 1


def test_case_b_smallest_n_that_fits_even_when_more_nodes_exist() -> None:
    # 8B bf16 (16.1 GB) does not fit one 24 GB node at 20 % headroom (19.2 GB usable)? it does;
    # 70B-q4 (39.7 GB) needs two of (24, 16, 12): 19.2 + 12.8 = 32 < 39.7, so three.
    model = lookup("llama3.1:8b")
    assert model is not None
    nodes = _nodes(24, 16, 12)
    p = plan(model, nodes, _v1(vram_headroom_frac=0.4))  # 14.4 GB usable on the 24 GB node
    assert p.num_stages == 2
    assert {a.node_id for a in p.assignments} == {"n0-24g", "n1-16g"}
    forced = plan(model, nodes, _v1(vram_headroom_frac=0.4, min_stages=3))
    assert forced.num_stages == 3


def test_case_b_seed_fleet_with_a_stage_floor() -> None:
    model = lookup("llama3.2:1b")
    assert model is not None
    nodes = _nodes(24, 16, 12)
    assert plan(model, nodes, _v1(min_stages=2)).num_stages == 2
    assert plan(model, nodes, _v1(min_stages=3)).num_stages == 3


def test_case_c_four_nodes_anchors_on_the_big_ends_and_small_middles() -> None:
    model = lookup("llama3.1:70b-q4")
    assert model is not None
    p = plan(model, _nodes(24, 24, 8, 8), _v1(min_stages=4))
    assert p.num_stages == 4
    first, *middle, last = p.assignments
    assert first.node_id.endswith("24g") and last.node_id.endswith("24g")
    assert all(a.node_id.endswith("8g") for a in middle)
    assert all(m.num_blocks < first.num_blocks and m.num_blocks < last.num_blocks for m in middle)
    # "proportionally fewer": blocks per usable byte within 25 % between big and small nodes
    density = [a.num_blocks / (a.usable_vram_bytes or 1) for a in p.assignments]
    assert max(density) / min(density) < 1.25


def test_case_c_default_picks_the_fewest_stages_that_fit() -> None:
    model = lookup("llama3.1:70b-q4")
    assert model is not None
    p = plan(model, _nodes(24, 24, 8, 8), V1)
    # 39.7 GB of weights: the two 24 GB nodes (38.4 GB usable) are not enough, three are.
    assert p.num_stages == 3


def test_case_d_head_does_not_fit_any_node() -> None:
    model = lookup("llama3.1:405b")
    assert model is not None
    with pytest.raises(NoNodeFitsHead) as info:
        plan(model, _nodes(2, 2), V1)
    assert info.value.needed == model.head_params_bytes
    assert str(info.value) == (
        f"no node can hold the largest indivisible component ({model.head_params_bytes} bytes)"
    )


def test_insufficient_vram_reports_needed_and_available() -> None:
    model = lookup("llama3.1:70b")
    assert model is not None
    with pytest.raises(InsufficientVram) as info:
        plan(model, _nodes(24, 24), V1)
    assert info.value.needed == model.weight_bytes
    assert info.value.available == 2 * int(24 * GB * 0.8)


def test_min_stages_above_node_count_is_infeasible() -> None:
    model = lookup("llama3.2:1b")
    assert model is not None
    with pytest.raises(Infeasible, match=r"min_stages=3 but only 2 nodes are available"):
        plan(model, _nodes(24, 24), _v1(min_stages=3))


def test_multi_gpu_nodes_hold_more_stages_than_nodes() -> None:
    """Three nodes of 8 × H100: their GPU groups give a pipeline up to 24 stages, so
    ``min_stages=4`` plans four (a node holding two), and only ``min_stages=25`` is
    refused, naming the GPUs."""
    from tests.common.gpu_fleets import nodes_of

    model = lookup("llama3.1:70b")
    assert model is not None
    nodes = nodes_of([("H100 SXM5", 80, 8, 100_000.0, 0.05)] * 3)
    got = plan(model, nodes, Constraints(min_stages=4, max_stages=4))
    assert len(got.assignments) == 4
    assert len({a.node_id for a in got.assignments}) <= 3
    assert sum(a.tensor_parallel for a in got.assignments) <= 24
    with pytest.raises(Infeasible, match=r"min_stages=25 but only 3 nodes are available \(24 GPUs"):
        plan(model, nodes, Constraints(min_stages=25))


def test_kv_reserve_counts_against_vram() -> None:
    model = lookup("llama3.1:8b")
    assert model is not None and model.kv_bytes_per_token is not None
    nodes = _nodes(24, 24)
    no_kv = plan(model, nodes, V1)
    with_kv = plan(model, nodes, _v1(context_tokens=32768, batch=4))
    assert no_kv.num_stages == 1
    kv_total = sum(a.kv_reserve_bytes for a in with_kv.assignments)
    assert kv_total == 32 * 4096 * 32768 * 4  # 32 blocks × 4 KiB per token × context × batch
    assert with_kv.num_stages == 2


def test_rationale_names_strategy_and_utilisation() -> None:
    model = lookup("llama3.2:1b")
    assert model is not None
    p = plan(model, _nodes(24, 16), _v1(min_stages=2))
    assert p.rationale.strategy == "balance-by-vram"
    assert any(note.startswith("N=2: the smallest number of stages") for note in p.rationale.notes)
    assert sum("slack" in note for note in p.rationale.notes) == 2


def test_block_granularity_can_need_one_more_stage_than_the_byte_sum() -> None:
    model = lookup("llama3.1:405b")
    assert model is not None
    nodes = [
        NodeDescriptor(
            id=f"h{i:02d}", gpu_name="H100", vram_bytes=80 * GiB, flops_estimate=989, link_mbps=4e5
        )
        for i in range(16)
    ]
    p = plan(model, nodes, V1)
    usable = math.floor(80 * GiB * 0.8)
    by_bytes = math.ceil(model.weight_bytes / usable)  # 12 nodes by the byte sum alone
    per_node = usable // model.block_params_bytes  # but only 10 whole blocks fit a node
    assert by_bytes == 12 and per_node == 10
    assert p.num_stages == 13
    assert any(note.startswith("N=12: usable VRAM") for note in p.rationale.notes)


def test_an_empty_model_fits_nodes_without_vram() -> None:
    empty = ModelLayout(
        name="empty", num_blocks=4, hidden_dim=1, bytes_per_activation_elem=2,
        block_params_bytes=0, head_params_bytes=0, embed_params_bytes=0,
    )  # fmt: skip
    nodes = [
        NodeDescriptor(id=f"z{i}", gpu_name="x", vram_bytes=0, flops_estimate=1, link_mbps=1)
        for i in range(2)
    ]
    p = plan(empty, nodes, _v1(min_stages=2))
    assert p.num_stages == 2 and sum(p.block_counts()) == 4
