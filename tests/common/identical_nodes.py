"""Two kinds of node and a plan's shape with node ids left out: for the tests that
identical nodes plan alike however they are listed or named."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from stowplan import NodeDescriptor, Plan

KINDS = {
    "a": NodeDescriptor(
        id="a", gpu_name="RTX 4090", vram_bytes=24 * 10**9, link_mbps=10_000.0,
        link_latency_ms=0.2,
    ),
    "b": NodeDescriptor(
        id="b", gpu_name="A100 80GB SXM4", vram_bytes=80 * 10**9, link_mbps=25_000.0,
        link_latency_ms=0.1,
    ),
}  # fmt: skip


def plan_shape(p: Plan, by_id: dict[str, NodeDescriptor]) -> list[tuple[object, ...]]:
    """The plan with each node id replaced by its descriptor less the id."""
    return [
        (
            replace(by_id[a.node_id], id="any"),
            a.block_range,
            a.owns_embed,
            a.owns_head,
            a.tensor_parallel,
            a.estimated_vram_bytes,
        )
        for a in p.assignments
    ]


SINGLE_GPUS = (("RTX 4090", 24), ("L4", 24), ("A100 80GB SXM4", 80), ("MI300X", 192))
"""GPU kinds (name, GB) of :func:`fleet_with_copies`."""


def fleet_with_copies(
    seed: int,
    n: int,
    copies: float,
    *,
    gpus: Sequence[tuple[str, int]] = SINGLE_GPUS,
    kinds: int | None = None,
    digits: int = 3,
) -> list[NodeDescriptor]:
    """``n`` random single-GPU nodes of ``gpus`` (``kinds`` of them drawn first, when
    given), each with chance ``copies`` a copy of an earlier one but for its id (one
    stage class, equal stage times); ids ``n`` and ``digits`` digits."""
    import random

    rng = random.Random(seed)
    pool = rng.sample(list(gpus), kinds) if kinds is not None else gpus
    out: list[NodeDescriptor] = []
    for i in range(n):
        if out and rng.random() < copies:
            out.append(replace(rng.choice(out), id=f"n{i:0{digits}d}"))
            continue
        name, gb = rng.choice(pool)
        out.append(
            NodeDescriptor(
                id=f"n{i:0{digits}d}",
                gpu_name=name,
                vram_bytes=gb * 10**9,
                link_mbps=rng.uniform(10_000.0, 100_000.0),
                link_latency_ms=rng.uniform(0.05, 0.5),
            )
        )
    return out
