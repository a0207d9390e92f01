"""The context a plan reserves KV cache for: the default, the largest that fits
(``--context max``), and the refusal of one that does not fit, with its numbers."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
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
