"""Probes: plans that only answer whether a plan exists (the contexts and batches a
refusal tries).  Each search stops at the first pipeline it finds, so a probe finds a
plan exactly when the full planner does, and that plan fits its nodes."""

from __future__ import annotations

import random
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stowplan import Constraints, ModelLayout, NodeDescriptor, lookup, plan
from stowplan.calibration import resolve_calibration
from stowplan.errors import InsufficientVram, PlanError
from stowplan.plan import Plan
from stowplan.planner.certify import SKETCHED, is_probing, is_sketching, probing, sketching
from stowplan.planner.strategies import cycle
from stowplan.planner.strategies.throughput import Pipeline
from tests.common.gpu_fleets import MIXED_KINDS, gpu_nodes
from tests.common.h100 import h100_nodes
from tests.common.seeded import seeded_cluster

MODELS = ["llama3.1:8b", "llama3.1:70b-q4_0", "llama3.1:70b", "qwen3:30b-a3b", "gpt-oss:20b"]


def _model(name: str) -> ModelLayout:
    m = lookup(name)
    assert m is not None
    return m


def _outcome(
    model: ModelLayout, nodes: list[NodeDescriptor], c: Constraints
) -> Plan | type[PlanError]:
    """The plan, or the type of the error that refused it."""
    try:
        return plan(model, nodes, c)
    except PlanError as e:
        return type(e)


def _probed(
    model: ModelLayout, nodes: list[NodeDescriptor], c: Constraints
) -> Plan | type[PlanError]:
    with probing():
        return _outcome(model, nodes, c)


def _check_same(model: ModelLayout, nodes: list[NodeDescriptor], c: Constraints) -> bool:
    """The probe refuses exactly when the planner does (with the same error type), and
    a probe's plan holds every block within its nodes' usable VRAM.  True: a plan."""
    full, probed = _outcome(model, nodes, c), _probed(model, nodes, c)
    if isinstance(full, type):
        assert probed is full, (model.name, c)
        return False
    assert isinstance(probed, Plan), (model.name, c, probed)
    # Not certified (an expert-parallel plan carries no certificate at all).
    cert = probed.rationale.certificate
    assert cert is None or cert.method == SKETCHED
    covered = sorted(a.block_range for a in probed.assignments)
    assert covered[0][0] == 0 and covered[-1][1] == model.num_blocks
    assert all(a[1] == b[0] for a, b in pairwise(covered))
    for a in probed.assignments:
        assert a.usable_vram_bytes is not None
        assert a.estimated_vram_bytes <= a.usable_vram_bytes
    return True


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(2, 12),
    name=st.sampled_from(MODELS),
    batch=st.sampled_from([1, 3, 16, 64, 256]),
    context=st.sampled_from([None, 2048, 32_768]),
    max_stages=st.one_of(st.none(), st.integers(1, 6)),
    min_stages=st.one_of(st.none(), st.integers(1, 4)),
)
def test_a_probe_finds_a_plan_exactly_when_the_planner_does_on_single_gpu_fleets(
    seed: int,
    n: int,
    name: str,
    batch: int,
    context: int | None,
    max_stages: int | None,
    min_stages: int | None,
) -> None:
    if max_stages is not None and min_stages is not None and min_stages > max_stages:
        min_stages = max_stages
    nodes = seeded_cluster(seed, n)
    c = Constraints(
        batch=batch, context_tokens=context, max_stages=max_stages, min_stages=min_stages
    )
    _check_same(_model(name), nodes, c)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    name=st.sampled_from(["llama3.1:70b", "llama3.1:405b", "qwen3:30b-a3b", "llama3.1:8b"]),
    batch=st.sampled_from([1, 16, 64]),
    context=st.sampled_from([None, 8192, 131_072]),
    tensor_parallel=st.sampled_from([None, 1, 2]),
    engine=st.sampled_from([None, "generic", "vllm", "sglang", "llamacpp"]),
)
def test_a_probe_finds_a_plan_exactly_when_the_planner_does_on_multi_gpu_fleets(
    seed: int,
    name: str,
    batch: int,
    context: int | None,
    tensor_parallel: int | None,
    engine: str | None,
) -> None:
    """Engines' rules included (one degree for every stage, one GPU per stage): a probe's
    first pipeline is fitted to the engine as a plan's is."""
    nodes = gpu_nodes(random.Random(seed), 2, 5, MIXED_KINDS)
    c = Constraints(
        batch=batch,
        context_tokens=context,
        tensor_parallel=tensor_parallel,
        calibration=None if engine is None else resolve_calibration(engine),
    )
    _check_same(_model(name), nodes, c)


def test_both_outcomes_occur_in_the_checks() -> None:
    """The equivalence is checked on plans and on refusals alike: at the edge of memory,
    a context of 8,192 tokens for 1,038 sequences fits six 8 × H100 nodes, 1,039 do not."""
    model, nodes = _model("llama3.1:70b"), h100_nodes(6)
    assert _check_same(model, nodes, Constraints(batch=1038, context_tokens=8192))
    assert not _check_same(model, nodes, Constraints(batch=1039, context_tokens=8192))


def test_a_probe_stops_at_the_first_pipeline_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full plan of 70b on 64 single-GPU nodes solves several stage counts with both
    searches; a probe solves one count with one search and hands its pipeline on as it
    is (not swapped or split again)."""
    model, nodes = _model("llama3.1:70b"), seeded_cluster(3, 64)
    c = Constraints(batch=16)
    calls: list[int] = []
    handed: list[int] = []
    at_count, handed_on = cycle._at_count, cycle._handed_on

    def counted(*args: object, **kwargs: object) -> list[Pipeline]:
        found = at_count(*args, **kwargs)  # type: ignore[arg-type]
        calls.append(len(found))
        return found

    def handed_counted(*args: object) -> Pipeline:
        handed.append(1)
        return handed_on(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(cycle, "_at_count", counted)
    monkeypatch.setattr(cycle, "_handed_on", handed_counted)
    full = plan(model, nodes, c)
    assert len(calls) > 2 and max(calls) == 2 and handed
    calls.clear()
    handed.clear()
    with probing():
        probed = plan(model, nodes, c)
    assert calls == [1] and not handed
    # Found by a search the full plan also ran, and no faster than the full plan.
    pred, best = probed.rationale.prediction, full.rationale.prediction
    assert pred is not None and best is not None
    assert pred.tokens_per_s <= best.tokens_per_s * (1 + 1e-9)


def test_probing_is_sketching_and_ends_with_its_block() -> None:
    assert not is_probing() and not is_sketching()
    with probing():
        assert is_probing() and is_sketching()
        with sketching():
            assert is_probing()  # a sketch inside a probe is still a probe
    assert not is_probing() and not is_sketching()


def test_a_moe_model_whose_expert_parallel_plan_does_not_fit_plans_block_local() -> None:
    """With one stage allowed, the expert-parallel backbone goes to the faster node,
    whose 40 GB cannot hold qwen3:30b-a3b's experts beside it; block-local puts the
    whole model on the 80 GB node.  The plan is block-local and says why there is no
    expert-parallel figure; a probe finds it too."""
    nodes = [
        NodeDescriptor(id="fast", gpu_name="H100 SXM5", vram_bytes=40 * 10**9, link_mbps=10_000),
        NodeDescriptor(id="big", gpu_name="A100 80GB SXM", vram_bytes=80 * 10**9, link_mbps=10_000),
    ]
    model, c = _model("qwen3:30b-a3b"), Constraints(max_stages=1)
    p = plan(model, nodes, c)
    assert [a.node_id for a in p.assignments] == ["big"]
    assert p.rationale.notes[-1].startswith("experts: no expert-parallel plan fits (")
    assert _check_same(model, nodes, c)
    # With the 80 GB node gone neither placement fits, and the plan is refused.
    with pytest.raises(InsufficientVram):
        plan(model, nodes[:1], c)
