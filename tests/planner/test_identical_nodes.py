"""Identical nodes are interchangeable: a fleet listed kind by kind, shuffled or renamed
gets the same plan up to node ids, and the same prediction (issue 26)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stowplan import Constraints, PlanError, lookup, plan
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
