"""Identical nodes are interchangeable: a fleet listed kind by kind, shuffled or renamed
gets the same plan up to node ids, and the same prediction (issue 26)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stowplan import Constraints, NodeDescriptor, PlanError, lookup, plan
from tests.common.identical_nodes import KINDS
from tests.common.identical_nodes import plan_shape as _shape


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=0, max_value=3),
    st.sampled_from(["llama3.1:8b", "llama3.1:70b-q4_0"]),
    st.sampled_from([1, 8]),
    st.integers(min_value=0, max_value=2**32 - 1),
)
def test_identical_nodes_plan_alike_in_any_order(
    many: int, few: int, name: str, batch: int, seed: int
) -> None:
    model = lookup(name)
    assert model is not None
    listed = [replace(KINDS["a"], id=f"a{i}") for i in range(many)]
    listed += [replace(KINDS["b"], id=f"b{i}") for i in range(few)]
    rng = random.Random(seed)
    shuffled = [replace(n, id=f"x{rng.randrange(10**9)}-{i}") for i, n in enumerate(listed)]
    rng.shuffle(shuffled)
    c = Constraints(batch=batch)
    try:
        first = plan(model, listed, c)
    except PlanError as e:
        with pytest.raises(type(e)):
            plan(model, shuffled, c)
        return
    second = plan(model, shuffled, c)
    ids = {n.id: n for n in [*listed, *shuffled]}
    assert _shape(first, ids) == _shape(second, ids)
    p1, p2 = first.rationale.prediction, second.rationale.prediction
    assert p1 is not None and p2 is not None
    assert p2.time_per_token_s == pytest.approx(p1.time_per_token_s, rel=1e-12)
    assert p2.tokens_per_s == pytest.approx(p1.tokens_per_s, rel=1e-12)
    assert p2.stage_time_s == pytest.approx(p1.stage_time_s, rel=1e-12)


@pytest.mark.parametrize("batch", [1, 8])
def test_a_plan_on_identical_multi_gpu_nodes_takes_the_first_by_id(
    batch: int,
) -> None:
    # Nodes of 8 H100s, each holding llama3.1:8b as one tp8 stage: whichever nodes
    # the plan uses, the others are the same, so the ties go to the lowest ids (the
    # GPU-group search moves to another node's layout only when that is strictly faster).
    model = lookup("llama3.1:8b")
    assert model is not None
    h100 = NodeDescriptor(
        id="n", gpu_name="H100 SXM", vram_bytes=640 * 10**9, num_gpus=8, link_mbps=400_000
    )
    nodes = [replace(h100, id=f"n{i}") for i in (2, 0, 3, 1)]
    got = plan(model, nodes, Constraints(batch=batch, strategy="throughput"))
    used = sorted({a.node_id for a in got.assignments})
    assert used == [f"n{i}" for i in range(len(used))]
    assert {a.tensor_parallel for a in got.assignments} == {8}
