"""The latency split on arrays (models of ``SPLIT_ARRAY_BLOCKS`` blocks or more) gives the
Python programme's split: the same nodes, block bounds and time, on random fleets and
orders, ties among alike nodes included."""

from __future__ import annotations

import random

import pytest

from stowplan import Constraints, NodeDescriptor, lookup
from stowplan.planner.problem import prepare
from stowplan.planner.strategies import latency
from tests.common.identical_nodes import fleet_with_copies


def _fleet(seed: int, n: int) -> list[NodeDescriptor]:
    return fleet_with_copies(seed, n, 0.35)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("name", ["llama3.1:70b", "llama3.1:8b", "deepseek-v3"])
def test_array_split_is_the_plain_split(
    seed: int, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = lookup(name)
    assert model is not None
    assert model.num_blocks >= latency.SPLIT_ARRAY_BLOCKS
    nodes = _fleet(seed, 32)
    rng = random.Random(seed)
    batch = rng.choice((1, 4, 16))
    orders = [rng.sample(range(len(nodes)), rng.randint(2, len(nodes))) for _ in range(8)]
    arrays = prepare(model, nodes, Constraints(batch=batch)).cost_model()
    got = [latency.latency_split(arrays, o) for o in orders]
    monkeypatch.setattr(latency, "SPLIT_ARRAY_BLOCKS", 10**9)
    plain = prepare(model, nodes, Constraints(batch=batch)).cost_model()
    want = [latency.latency_split(plain, o) for o in orders]
    assert got == want
    assert any(p is not None for p in want)
    for p in got:
        if p is not None:
            assert all(type(d) is int for d in p[0]) and all(type(b) is int for b in p[1])
