"""The context a plan reserves KV cache for: the default, the largest that fits
(``--context max``), and the refusal of one that does not fit, with its numbers."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from stowplan import Constraints, ModelLayout, NodeDescriptor, lookup, plan
from stowplan.errors import Infeasible, InputError, InsufficientVram, PlanError
from stowplan.files.fleets import load_nodes
from stowplan.planner.context import (
    DEFAULT_CONTEXT_TOKENS,
    default_context_tokens,
    fit_context,
    plan_within_context,
)
from stowplan.planner.problem import most_blocks
from tests.common.h100 import h100_nodes
from tests.common.paths import EXAMPLES

GiB = 2**30
CASE_C = load_nodes(EXAMPLES / "fleets" / "case-c.yaml")
MIXED = load_nodes(EXAMPLES / "fleets" / "mixed-consumer.yaml")


def _model(name: str) -> ModelLayout:
    m = lookup(name)
    assert m is not None
    return m


def _fits(model: ModelLayout, nodes: list[NodeDescriptor], c: Constraints, ctx: int) -> bool:
    try:
        plan(model, nodes, replace(c, context_tokens=ctx))
    except PlanError:
        return False
    return True


def test_the_default_context_is_8192_tokens_or_the_models_maximum_when_smaller() -> None:
    assert DEFAULT_CONTEXT_TOKENS == 8192
    assert default_context_tokens(_model("llama3.1:70b")) == 8192
    assert default_context_tokens(_model("gemma2:9b")) == 8192  # its maximum is 8,192 too
    short = replace(_model("llama3.1:8b"), max_context_tokens=2048)
    assert default_context_tokens(short) == 2048
    assert default_context_tokens(replace(short, max_context_tokens=None)) == 8192


def test_the_library_default_reserves_no_kv_cache() -> None:
    p = plan(_model("llama3.1:70b-q4_0"), CASE_C)
    assert p.context_tokens is None
    assert all(a.kv_reserve_bytes == 0 for a in p.assignments)


@pytest.mark.parametrize(("batch", "found"), [(1, 32710), (2, 16355), (4, 8177)])
def test_the_largest_context_fits_and_one_token_more_does_not(batch: int, found: int) -> None:
    model = _model("llama3.1:70b-q4_0")
    c = Constraints(batch=batch)
    fit = fit_context(model, CASE_C, c)
    assert (fit.context_tokens, fit.batch, fit.limited_by_model) == (found, batch, False)
    assert fit.limit_tokens == 131072
    assert fit.plan.context_tokens == found
    assert fit.plan == plan(model, CASE_C, replace(c, context_tokens=found))
    # Every stage holds its weights and the KV cache of ``found`` tokens × ``batch``.
    kv = 327_680  # bytes per token: 80 blocks × 2 × 8 KV heads × 128 × 2 bytes
    assert sum(a.kv_reserve_bytes for a in fit.plan.assignments) == kv * found * batch
    for a in fit.plan.assignments:
        assert a.usable_vram_bytes is not None
        assert a.estimated_vram_bytes <= a.usable_vram_bytes
    assert not _fits(model, CASE_C, c, found + 1)


def test_the_largest_context_stops_at_the_models_maximum() -> None:
    model = _model("mixtral:8x7b")
    fit = fit_context(model, MIXED, Constraints())  # the default planner places the experts
    assert (fit.context_tokens, fit.limit_tokens, fit.limited_by_model) == (32768, 32768, True)
    assert fit.plan.context_tokens == 32768


def test_the_search_bound_is_kept() -> None:
    fit = fit_context(_model("llama3.1:70b-q4_0"), CASE_C, upper=1000)
    assert (fit.context_tokens, fit.limit_tokens, fit.limited_by_model) == (1000, 1000, False)


def test_when_the_weights_alone_do_not_fit_no_context_is_found() -> None:
    with pytest.raises(InsufficientVram):
        fit_context(_model("llama3.1:405b"), CASE_C)


def test_a_layout_without_kv_figure_or_maximum_cannot_be_searched() -> None:
    bare = replace(_model("llama3.1:8b"), kv_bytes_per_token=None, max_context_tokens=None)
    with pytest.raises(InputError) as info:
        fit_context(bare, CASE_C)
    assert str(info.value) == (
        "context_tokens='max': llama3.1:8b has no KV-cache figure, so no context is too long; "
        "give a number of tokens"
    )
    # With a maximum, that is what fits.
    fit = fit_context(replace(bare, max_context_tokens=4096), CASE_C)
    assert (fit.context_tokens, fit.limited_by_model) == (4096, True)


def test_a_context_that_does_not_fit_is_refused_with_the_numbers_and_the_way_out() -> None:
    c = Constraints(context_tokens=30000, batch=2)
    with pytest.raises(Infeasible) as info:
        plan_within_context(_model("llama3.1:70b-q4_0"), CASE_C, c)
    assert str(info.value) == (
        "constraints unsatisfiable: a context of 30,000 tokens × 2 sequences does not fit: "
        "weights 37.2 GiB + KV 18.3 GiB (320.0 KiB/token × 30,000 tokens × 2 sequences) = "
        "55.5 GiB against usable VRAM 47.7 GiB on 4 nodes (20% headroom kept free); the "
        "largest context that fits is 16,355 tokens (--context max); 1 sequence fits 30,000 "
        "tokens each (--batch); or add nodes"
    )


def test_the_refusal_names_the_most_sequences_that_fit() -> None:
    c = Constraints(context_tokens=10000, batch=4)
    with pytest.raises(Infeasible, match=r"3 sequences fit 10,000 tokens each \(--batch\)"):
        plan_within_context(_model("llama3.1:70b-q4_0"), CASE_C, c)
    assert _fits(_model("llama3.1:70b-q4_0"), CASE_C, replace(c, batch=3), 10000)


def test_a_context_that_fits_plans_as_plan_does() -> None:
    model, c = _model("llama3.1:70b-q4_0"), Constraints(context_tokens=8192)
    assert plan_within_context(model, CASE_C, c) == plan(model, CASE_C, c)


def test_a_context_beyond_the_models_maximum_is_an_input_error() -> None:
    with pytest.raises(InputError) as info:
        plan_within_context(_model("gemma2:9b"), MIXED, Constraints(context_tokens=8193))
    assert str(info.value) == (
        "context_tokens=8193: must be at most gemma2:9b's maximum context (8,192)"
    )


def test_weights_that_do_not_fit_are_reported_as_such_not_as_the_contexts_fault() -> None:
    c = Constraints(context_tokens=8192, batch=400, max_stages=1)
    with pytest.raises(InsufficientVram) as info:
        plan_within_context(_model("gemma2:9b"), CASE_C, c)
    assert info.value.needed == _model("gemma2:9b").weight_bytes
    assert str(info.value).endswith(
        "; the weights alone, before any KV cache (8,192 tokens × 400 sequences)"
    )


TINY = ModelLayout(
    name="tiny",
    num_blocks=6,
    hidden_dim=256,
    bytes_per_activation_elem=2,
    block_params_bytes=GiB // 2,
    head_params_bytes=GiB // 8,
    embed_params_bytes=GiB // 8,
    kv_bytes_per_token=(4096,) * 6,
    max_context_tokens=1 << 20,
)


@settings(max_examples=25)
@given(
    vram=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    batch=st.integers(1, 8),
    headroom=st.sampled_from([0.0, 0.1, 0.2]),
)
def test_the_found_context_fits_and_the_next_does_not_or_is_the_limit(
    vram: list[int], batch: int, headroom: float
) -> None:
    nodes = [
        NodeDescriptor(id=f"n{i}", gpu_name="RTX 4090", vram_bytes=v * GiB, link_mbps=1000)
        for i, v in enumerate(vram)
    ]
    c = Constraints(batch=batch, vram_headroom_frac=headroom)
    try:
        fit = fit_context(TINY, nodes, c)
    except PlanError:
        assert not _fits(TINY, nodes, c, 0)  # refused only when the weights alone do not fit
        return
    assert _fits(TINY, nodes, c, fit.context_tokens)
    assert fit.context_tokens == fit.limit_tokens or not _fits(
        TINY, nodes, c, fit.context_tokens + 1
    )


def _largest_batch_brute_force(
    model: ModelLayout, nodes: list[NodeDescriptor], c: Constraints
) -> int | None:
    """The most sequences below ``c.batch`` whose plan fits, by planning every count."""
    ctx = c.context_tokens or 0
    fitting = [b for b in range(1, c.batch) if _fits(model, nodes, replace(c, batch=b), ctx)]
    return max(fitting, default=None)


@settings(max_examples=20, deadline=None)
@given(
    vram=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    context=st.sampled_from([4096, 16384, 65536]),
    batch=st.integers(2, 12),
)
def test_the_most_sequences_named_are_the_most_that_fit(
    vram: list[int], context: int, batch: int
) -> None:
    nodes = [
        NodeDescriptor(id=f"n{i}", gpu_name="RTX 4090", vram_bytes=v * GiB, link_mbps=1000)
        for i, v in enumerate(vram)
    ]
    c = Constraints(batch=batch, context_tokens=context)
    if _fits(TINY, nodes, c, context):
        return  # nothing to refuse
    expected = _largest_batch_brute_force(TINY, nodes, c)
    try:
        plan_within_context(TINY, nodes, c)
    except Infeasible as exc:
        found = re.search(r"; ([\d,]+) sequences? fits? [\d,]+ tokens each", exc.reason)
        assert (int(found.group(1).replace(",", "")) if found else None) == expected
    except PlanError:
        assert not _fits(TINY, nodes, c, 0)  # the weights alone do not fit
    else:
        raise AssertionError("a context that does not fit was planned")


@settings(max_examples=20, deadline=None)
@given(
    vram=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    batch=st.integers(1, 8),
)
def test_the_largest_context_is_the_brute_force_largest_on_small_fleets(
    vram: list[int], batch: int
) -> None:
    nodes = [
        NodeDescriptor(id=f"n{i}", gpu_name="RTX 4090", vram_bytes=v * GiB, link_mbps=1000)
        for i, v in enumerate(vram)
    ]
    c = Constraints(batch=batch)
    try:
        fit = fit_context(TINY, nodes, c, upper=200_000)
    except PlanError:
        assert not _fits(TINY, nodes, c, 0)
        return
    # Every context up to the one found fits (sampled), none above it up to the bound.
    step = max(1, fit.context_tokens // 7)
    assert all(_fits(TINY, nodes, c, x) for x in range(0, fit.context_tokens + 1, step))
    above = range(fit.context_tokens + 1, 200_001, max(1, (200_000 - fit.context_tokens) // 7))
    assert not any(_fits(TINY, nodes, c, x) for x in above)


def test_blocks_that_do_not_divide_between_the_nodes_are_refused_with_the_count() -> None:
    # Four nodes of 0.95 GiB hold 3.8 GiB in all, more than the model's 3.25 GiB, but one
    # 0.5 GiB block each: 4 of the 6.
    nodes = [
        NodeDescriptor(id=f"n{i}", gpu_name="RTX 4090", vram_bytes=int(0.95 * GiB), link_mbps=1000)
        for i in range(4)
    ]
    c = Constraints(vram_headroom_frac=0.0)
    with pytest.raises(InsufficientVram) as info:
        plan(TINY, nodes, c)
    assert info.value.needed == TINY.weight_bytes
    assert info.value.available == 4 * int(0.95 * GiB) > TINY.weight_bytes
    assert info.value.detail == (
        "blocks are not split between nodes, and the 4 largest nodes hold at most 4 of the 6 "
        "blocks whole (with their KV cache)"
    )


def test_the_memory_bound_counts_the_embed_and_the_head_beside_a_block() -> None:
    blocks = TINY.block_sizes()  # 6 of 0.5 GiB; the embed and the head 0.125 GiB each
    # Three nodes of exactly two blocks hold the 6, but not the embed or the head beside them.
    assert most_blocks(TINY, blocks, [GiB] * 3, 3, anchors=False) == 6
    assert most_blocks(TINY, blocks, [GiB] * 3, 3) == 5
    assert not _fits(
        TINY, [_node(i, GiB) for i in range(3)], Constraints(vram_headroom_frac=0.0), 0
    )
    # Two nodes with room for an anchor beside their two blocks: every block fits.
    room = [GiB + GiB // 8, GiB + GiB // 8, GiB]
    assert most_blocks(TINY, blocks, room, 3) == 6
    assert _fits(
        TINY, [_node(i, v) for i, v in enumerate(room)], Constraints(vram_headroom_frac=0.0), 0
    )
    # Nodes too small to hold an anchor beside a block cannot start or end a pipeline.
    assert most_blocks(TINY, blocks, [GiB // 2] * 6, 6) == 0


def _node(i: int, vram: int) -> NodeDescriptor:
    return NodeDescriptor(id=f"n{i}", gpu_name="RTX 4090", vram_bytes=vram, link_mbps=1000)


@pytest.mark.parametrize(
    ("model", "nodes", "batch"), [("llama3.1:405b", 6, 64), ("llama3.1:70b", 5, 256)]
)
def test_a_refusal_on_multi_gpu_nodes_names_the_limits_full_plans_hold(
    model: str, nodes: int, batch: int
) -> None:
    """The refusal's probes skip each plan's certificate; the context and the sequences it
    names are still the most that plans made in full hold."""
    fleet = h100_nodes(nodes)
    layout = _model(model)
    c = Constraints(batch=batch, context_tokens=131_072)
    with pytest.raises(Infeasible) as refused:
        plan_within_context(layout, fleet, c)
    reason = refused.value.reason
    context = re.search(r"the largest context that fits is ([\d,]+) tokens", reason)
    sequences = re.search(r"; ([\d,]+) sequences? fits? [\d,]+ tokens each", reason)
    assert context is not None and sequences is not None, reason
    most = int(context.group(1).replace(",", ""))
    assert _fits(layout, fleet, c, most)
    assert not _fits(layout, fleet, c, most + 1)
    fewer = int(sequences.group(1).replace(",", ""))
    assert _fits(layout, fleet, replace(c, batch=fewer), 131_072)
    assert not _fits(layout, fleet, replace(c, batch=fewer + 1), 131_072)


@settings(max_examples=60, deadline=None)
@example(sizes=[8, 17, 17], max_stages=1, context=0, batch=1, name="llama3.1:8b")
@given(
    sizes=st.lists(st.sampled_from([8, 12, 16, 17, 24, 48, 80]), min_size=1, max_size=40),
    max_stages=st.one_of(st.none(), st.integers(1, 12)),
    context=st.integers(0, 40_000),
    batch=st.integers(1, 64),
    name=st.sampled_from(["llama3.1:8b", "llama3.1:70b-q4_0", "qwen3:30b-a3b-q4_0"]),
)
def test_the_memory_bound_reads_each_node_size_as_every_node_of_it(
    sizes: list[int], max_stages: int | None, context: int, batch: int, name: str
) -> None:
    """The bisections' memory bound keeps the largest nodes and two of every other size:
    it holds as many blocks as the bound over every node, and says the same fit.  (The
    example needs both nodes of 17 GB: each carries one of the embed and the head.)"""
    from stowplan.model import usable_bytes
    from stowplan.models import resolve_model
    from stowplan.planner.context import _Memory
    from stowplan.planner.problem import block_bytes

    model = resolve_model(name)
    nodes = [
        NodeDescriptor(id=f"n{i}", gpu_name="RTX 4090", vram_bytes=gb * GiB)
        for i, gb in enumerate(sizes)
    ]
    c = Constraints(max_stages=max_stages)
    memory = _Memory(model, nodes, c)
    caps = [usable_bytes(n, c.headroom) for n in nodes]
    most = min(max_stages or len(nodes), len(nodes), model.num_blocks)
    assert memory.most == most
    assert memory.usable == sum(sorted(caps, reverse=True)[:most])
    _, mem = block_bytes(model, context, batch)
    assert most_blocks(model, mem, memory.caps, most) == most_blocks(model, mem, caps, most)
    kv = sum(model.kv_bytes(b, context, batch) for b in range(model.num_blocks))
    plain = model.weight_bytes + kv <= memory.usable and (
        model.experts is not None or most_blocks(model, mem, caps, most) >= model.num_blocks
    )
    assert memory.may_fit(context, batch) == plain
