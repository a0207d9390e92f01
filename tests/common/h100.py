"""Nodes of 8 × H100 SXM5 on a 100 Gbit/s, 0.05 ms network: the multi-GPU fleet the
planner's tests and benchmarks size their cases by."""

from __future__ import annotations

from stowplan import NodeDescriptor


def h100_nodes(n: int, price_per_hour: float | None = None) -> list[NodeDescriptor]:
    """``n`` such nodes, ids ``h0``, ``h1``, …"""
    return [
        NodeDescriptor(
            id=f"h{i}",
            gpu_name="H100 SXM5",
            vram_bytes=8 * 80 * 10**9,
            num_gpus=8,
            link_mbps=100_000.0,
            link_latency_ms=0.05,
            price_per_hour=price_per_hour,
        )
        for i in range(n)
    ]
