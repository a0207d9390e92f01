"""Claims every strategy keeps whatever the input: it finds a plan when one exists, is
never slower than an optimum it has computed, keeps VRAM in integers, ignores node order."""

from __future__ import annotations

import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from stowplan import Constraints, ModelLayout, NodeDescriptor, Strategy, load_nodes, lookup, plan
from stowplan.errors import InputError, PlanError
from stowplan.plan import plan_to_json
from stowplan.planner.tiebreak import TOLERANCE
from stowplan.quantities.limits import (
    MAX_BATCH,
    MAX_BYTE_COUNT,
    MAX_CONFIG_INT,
    MAX_GPUS_PER_NODE,
    MAX_RATE,
    MIN_RATE,
)
from tests.common.instances import instances
from tests.common.paths import FIXTURES
from tests.common.refusals import or_none, rejected_if_refused

HERE = FIXTURES / "planner"
STRATEGIES = [Strategy.BALANCE_BY_VRAM, Strategy.LATENCY, Strategy.THROUGHPUT, Strategy.EXACT]


def test_latency_finds_the_plan_its_own_search_missed() -> None:
    # The latency search finds no 7-stage split here; throughput and exact do.
    nodes = load_nodes(HERE / "latency_gave_up.yaml")
    model = lookup("llama3.1:70b")
    p = plan(model, nodes, Constraints(context_tokens=8192))
    exact = plan(model, nodes, Constraints(context_tokens=8192, strategy="exact"))
    assert p.num_stages == 7
    pred, best = p.rationale.prediction, exact.rationale.prediction
    assert pred is not None and best is not None
    assert pred.time_per_token_s == pytest.approx(best.time_per_token_s, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(instances(max_nodes=5, max_blocks=8), st.sampled_from([1, 4]))
def test_whenever_exact_finds_a_plan_latency_and_throughput_find_one_too(inst, batch):
    model, nodes = inst
    exact = or_none(plan, model, nodes, Constraints(batch=batch, strategy="exact"))
    for s in (Strategy.LATENCY, Strategy.THROUGHPUT):
        found = or_none(plan, model, nodes, Constraints(batch=batch, strategy=s))
        assert (found is None) == (exact is None), s


def test_the_plan_is_the_optimum_the_certificate_computed() -> None:
    nodes = load_nodes(HERE / "heuristic_behind_optimum.yaml")
    model = lookup("llama3.1:70b")
    p = plan(model, nodes, Constraints(context_tokens=2048))
    cert, pred = p.rationale.certificate, p.rationale.prediction
    assert cert is not None and pred is not None and cert.exact
    assert cert.gap == 0.0
    # KV read at half the 2,048-token reserve (a sequence's mean context).
    assert pred.time_per_token_s == pytest.approx(0.143317, rel=1e-5)
    assert any("found a better pipeline than the latency heuristic" in n for n in p.rationale.notes)


@settings(max_examples=60, deadline=None)
@given(instances(max_nodes=5, max_blocks=8), st.sampled_from([1, 4]))
def test_an_exact_certificate_shows_no_gap_beyond_the_tie_break(inst, batch):
    """An exact certificate's bound is the optimum; the plan is the optimum or, within
    the tie-break's 0.1 %, one with more KV room."""
    model, nodes = inst
    found = {
        s: p
        for s in (Strategy.LATENCY, Strategy.THROUGHPUT)
        if (p := or_none(plan, model, nodes, Constraints(batch=batch, strategy=s))) is not None
    }
    assume(found)
    for s, p in found.items():
        cert = p.rationale.certificate
        assert cert is not None
        if cert.exact:
            assert cert.gap <= TOLERANCE * (1 + 1e-9), (s, cert)


E = 2**62


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.sampled_from([0, 1, 7, 1000, E, E + 3]), min_size=2, max_size=6),
    st.lists(st.sampled_from([0, 1000, E, E + 1, 2 * E - 1]), min_size=2, max_size=4),
    st.sampled_from(STRATEGIES),
)
def test_extreme_sizes_never_break_the_vram_invariant(blocks, vrams, strategy):
    total = sum(blocks)
    mean, rest = divmod(total, len(blocks))
    if 2 * rest > len(blocks) or (2 * rest == len(blocks) and mean % 2):
        mean += 1
    model = ModelLayout(
        name="f",
        num_blocks=len(blocks),
        hidden_dim=1,
        bytes_per_activation_elem=1,
        block_params_bytes=mean,
        block_bytes=tuple(blocks),
        head_params_bytes=0,
        embed_params_bytes=0,
    )
    nodes = [
        NodeDescriptor(id=f"n{i}", gpu_name="H100", vram_bytes=v, flops_estimate=1, link_mbps=1)
        for i, v in enumerate(vrams)
    ]
    c = Constraints(min_stages=2, strategy=strategy, vram_headroom_frac=0.0)
    with _no_warnings(), rejected_if_refused(PlanError, InputError):
        p = plan(model, nodes, c)  # refused with a reason: no invariant to check
    for a in p.assignments:
        assert a.estimated_vram_bytes <= a.usable_vram_bytes, a


class _no_warnings:
    """Fail on any warning (numpy's overflow warnings included)."""

    def __enter__(self) -> None:
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)


def test_a_huge_stage_is_never_put_on_a_node_without_room() -> None:
    # Found with MIN_RATE/MAX_RATE rates and MAX_BYTE_COUNT bytes, now refused at construction: the
    # same case at the caps.
    big = 2**61
    blocks = (1, 0, 7, 1, big, 0, big, big, 1000)
    model = ModelLayout(
        name="f",
        num_blocks=9,
        hidden_dim=MAX_CONFIG_INT,
        bytes_per_activation_elem=1,
        block_params_bytes=(sum(blocks) + 4) // 9,
        head_params_bytes=0,
        embed_params_bytes=10**9,
        block_bytes=blocks,
        total_params=10**12,
        active_params=1,
        dtype="bf16",
    )
    nodes = [
        NodeDescriptor(
            id="n0",
            gpu_name="zz",
            vram_bytes=0,
            flops_estimate=MIN_RATE,
            link_mbps=MIN_RATE,
            mem_bandwidth_gbps=MAX_RATE,
        ),
        NodeDescriptor(
            id="n1",
            gpu_name="",
            vram_bytes=MAX_BYTE_COUNT,
            flops_estimate=MIN_RATE,
            link_mbps=MAX_RATE,
            mem_bandwidth_gbps=1.0,
        ),
        NodeDescriptor(
            id="n2",
            gpu_name="H100",
            vram_bytes=big,
            flops_estimate=0.0,
            link_mbps=MIN_RATE,
            mem_bandwidth_gbps=1.0,
            num_gpus=8,
        ),
        NodeDescriptor(
            id="n3",
            gpu_name="",
            vram_bytes=big,
            flops_estimate=MIN_RATE,
            link_mbps=1.0,
            num_gpus=MAX_GPUS_PER_NODE,
        ),
    ]
    c = Constraints(min_stages=2, vram_headroom_frac=0.0, strategy="exact", batch=MAX_BATCH)
    p = plan(model, nodes, c)
    assert [a.node_id for a in p.assignments] == ["n1", "n2"]
    for a in p.assignments:
        assert a.estimated_vram_bytes <= a.usable_vram_bytes


@settings(max_examples=40, deadline=None)
@given(
    instances(max_nodes=6, max_blocks=8),
    st.sampled_from([1, 4]),
    st.randoms(use_true_random=False),
)
def test_shuffling_the_nodes_gives_byte_identical_plans(inst, batch, rnd: random.Random):
    model, nodes = inst
    # Equal nodes under different ids make ties that only the ids can break.
    nodes = [*nodes, *(n.__class__(**{**_fields(n), "id": f"twin-{n.id}"}) for n in nodes[:2])]
    shuffled = list(nodes)
    rnd.shuffle(shuffled)
    for s in STRATEGIES:
        c = Constraints(batch=batch, strategy=s)
        a, b = or_none(plan, model, nodes, c), or_none(plan, model, shuffled, c)
        assert (a is None) == (b is None), s
        if a is not None and b is not None:
            assert plan_to_json(a) == plan_to_json(b), s


def _fields(n: NodeDescriptor) -> dict[str, object]:
    from dataclasses import fields

    return {f.name: getattr(n, f.name) for f in fields(n)}


def test_a_reversed_fleet_file_gives_the_same_plan() -> None:
    nodes = load_nodes(HERE / "heuristic_behind_optimum.yaml")
    model = lookup("llama3.1:70b")
    for s in STRATEGIES:
        c = Constraints(context_tokens=2048, strategy=s)
        assert plan_to_json(plan(model, nodes, c)) == plan_to_json(plan(model, nodes[::-1], c))
