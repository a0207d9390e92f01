"""Random heterogeneous clusters drawn from the GPU spec table (shared by the benchmarks)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from stowplan import NodeDescriptor
from stowplan.gpus import GPU_SPECS, GpuSpec

_KINDS = (
    "RTX 3090", "RTX 4090", "RTX 4080", "RTX 5090", "A10G", "L4", "L40S", "A100 40GB SXM4",
    "A100 80GB SXM4", "A100 80GB PCIe", "H100 SXM5", "H100 PCIe", "H200", "B200", "MI300X",
)  # fmt: skip
"""The GPU kinds the recorded benchmark results were drawn from (the table as it was)."""
SPECS = [next(s for s in GPU_SPECS if s.name == name) for name in _KINDS]
LAN = ([10_000.0, 100_000.0], [0.05, 0.5])
WAN = ([100.0, 1000.0], [10.0, 60.0])


def cluster(
    rng: random.Random, n: int, wan: bool, types: int = 4, specs: Sequence[GpuSpec] = SPECS
) -> list[NodeDescriptor]:
    """``n`` nodes of ``types`` kinds drawn from ``specs`` (the same draws as ever with
    the default)."""
    kinds = rng.sample(list(specs), k=min(types, len(specs)))
    links, lats = WAN if wan else LAN
    return [
        NodeDescriptor(
            id=f"n{i:04d}",
            gpu_name=(g := rng.choice(kinds)).name,
            vram_bytes=int(g.memory_gb * 1e9),
            flops_estimate=0.0,
            link_mbps=rng.uniform(*links),
            link_latency_ms=rng.uniform(*lats),
            price_per_hour=round(g.mem_bandwidth_gbps / 2000 * rng.uniform(0.7, 1.3), 2),
        )
        for i in range(n)
    ]
