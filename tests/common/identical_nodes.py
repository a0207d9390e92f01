"""Two kinds of node and a plan's shape with node ids left out: for the tests that
identical nodes plan alike however they are listed or named."""

from __future__ import annotations

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
