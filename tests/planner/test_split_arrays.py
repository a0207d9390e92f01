"""The latency split on arrays (models of ``SPLIT_ARRAY_BLOCKS`` blocks or more) gives the
Python programme's split: the same nodes, block bounds and time, on random fleets and
orders, ties among alike nodes included."""

from __future__ import annotations

import random
from itertools import pairwise

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


def test_byte_totals_beyond_int64_split_as_python_integers() -> None:
    """Twenty blocks of 2^61 bytes sum past int64: the split stays with Python's integers
    (numpy would overflow) and still finds a pipeline, at most three blocks a node."""
    from stowplan import ModelLayout
    from stowplan.cost import CostModel

    big = 2**61
    model = ModelLayout(
        name="huge",
        num_blocks=20,
        hidden_dim=1024,
        bytes_per_activation_elem=2,
        block_params_bytes=big,
        head_params_bytes=0,
        embed_params_bytes=10**9,
        block_bytes=(big,) * 20,
        total_params=10**12,
        active_params=10**9,
        dtype="bf16",
    )
    nodes = [
        NodeDescriptor(id=f"n{i}", gpu_name="H100 SXM5", vram_bytes=2**63 - 1, link_mbps=1e4)
        for i in range(10)
    ]
    cm = CostModel(model, nodes, Constraints())
    got = latency.latency_split(cm, list(range(10)))
    assert got is not None
    order, bounds = got
    assert bounds[0] == 0 and bounds[-1] == 20 and len(order) == 7
    assert all(0 < b - a <= 3 for a, b in pairwise(bounds))
