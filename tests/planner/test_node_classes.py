"""Nodes alike are one class in the throughput search's capacity test (issue 26): the
test by classes passes exactly where the node-by-node test finds an order, and a large
fleet of a few kinds gets the same plan however its nodes are listed and named."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stowplan import Constraints, NodeDescriptor, lookup, plan
from stowplan.planner.strategies.throughput import (
    _capacity_order,
    _class_ends,
    _passes,
    _top_ends,
)
from tests.common.identical_nodes import KINDS
from tests.common.identical_nodes import plan_shape as _shape


class _Classes:
    """The part of ``_RoleTimes`` the capacity test reads: node ids and their classes."""

    def __init__(self, cls: list[int]) -> None:
        self.nodes = list(range(len(cls)))
        self.cls = cls
        self.members = [[i for i, c in enumerate(cls) if c == k] for k in range(max(cls) + 1)]
        self.first_ids = [m[0] for m in self.members]
        self.sizes = [len(m) for m in self.members]


@st.composite
def _class_caps(draw: st.DrawFn) -> tuple[list[int], list[list[int]], int, int]:
    kinds = draw(st.integers(min_value=1, max_value=6))
    n = draw(st.integers(min_value=kinds, max_value=48))
    cls = list(range(kinds)) + draw(
        st.lists(st.integers(0, kinds - 1), min_size=n - kinds, max_size=n - kinds)
    )
    cls = draw(st.permutations(cls))
    mid = draw(st.lists(st.integers(0, 8), min_size=kinds, max_size=kinds))
    first = [min(m, draw(st.integers(0, 8))) for m in mid]
    last = draw(st.lists(st.integers(0, 8), min_size=kinds, max_size=kinds))
    nb = draw(st.integers(1, 120))
    stages = draw(st.integers(2, 40))
    return list(cls), [mid, first, last], nb, stages


@settings(max_examples=400, deadline=None)
@given(_class_caps())
def test_capacity_test_by_classes_agrees_with_node_by_node(
    case: tuple[list[int], list[list[int]], int, int],
) -> None:
    cls, (mid, first, last), nb, stages = case
    times = _Classes(cls)
    per_node = tuple([part[c] for c in cls] for part in (mid, first, last))
    expected = _capacity_order(times.nodes, per_node, nb, stages) is not None  # type: ignore[arg-type]
    assert _passes(times, (mid, first, last), nb, stages) is expected  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "batch"), [("llama3.1:70b-q4_0", 1), ("llama3.1:70b", 16)])
def test_forty_nodes_of_two_kinds_plan_alike_in_any_order(name: str, batch: int) -> None:
    model = lookup(name)
    assert model is not None
    listed: list[NodeDescriptor] = [replace(KINDS["a"], id=f"a{i:02d}") for i in range(28)]
    listed += [replace(KINDS["b"], id=f"b{i:02d}") for i in range(12)]
    rng = random.Random(26)
    shuffled = [replace(n, id=f"x{rng.randrange(10**9)}-{i}") for i, n in enumerate(listed)]
    rng.shuffle(shuffled)
    c = Constraints(batch=batch)
    first, second = plan(model, listed, c), plan(model, shuffled, c)
    ids = {n.id: n for n in [*listed, *shuffled]}
    assert _shape(first, ids) == _shape(second, ids)
    p1, p2 = first.rationale.prediction, second.rationale.prediction
    assert p1 is not None and p2 is not None
    assert p2.tokens_per_s == pytest.approx(p1.tokens_per_s, rel=1e-12)


@settings(max_examples=300, deadline=None)
@given(_class_caps())
def test_end_candidates_by_classes_are_the_node_by_node_ones(
    case: tuple[list[int], list[list[int]], int, int],
) -> None:
    cls, (mid, first, _), _, _ = case
    times = _Classes(cls)
    per_mid = [mid[c] for c in cls]
    per_first = [first[c] for c in cls]
    got = _class_ends(times, first, mid)  # type: ignore[arg-type]
    assert [i for i, _ in got] == _top_ends(times.nodes, per_first, per_mid)
    assert all(cls[i] == c for i, c in got)
