"""The latency split on arrays (models of ``SPLIT_ARRAY_BLOCKS`` blocks or more) gives the
Python programme's split: the same nodes, block bounds and time, on random fleets and
orders, ties among alike nodes included."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from stowplan import Constraints, NodeDescriptor, lookup
from stowplan.planner.problem import prepare
from stowplan.planner.strategies import latency

_GPUS = (("RTX 4090", 24), ("L4", 24), ("A100 80GB SXM4", 80), ("MI300X", 192))


def _fleet(seed: int, n: int) -> list[NodeDescriptor]:
    """``n`` single-GPU nodes, a third of them copies of an earlier one (equal stage times)."""
    rng = random.Random(seed)
    out: list[NodeDescriptor] = []
    for i in range(n):
        if out and rng.random() < 0.35:
            out.append(replace(rng.choice(out), id=f"n{i:03d}"))
            continue
        name, gb = rng.choice(_GPUS)
        out.append(
            NodeDescriptor(
                id=f"n{i:03d}",
                gpu_name=name,
                vram_bytes=gb * 10**9,
                link_mbps=rng.uniform(10_000.0, 100_000.0),
                link_latency_ms=rng.uniform(0.05, 0.5),
            )
        )
    return out


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
