"""A large expert-parallel plan: DeepSeek-V3 on 16 datacenter GPUs."""

from __future__ import annotations

from functools import cache

from stowplan import (
    Constraints,
    ExpertInputs,
    ExpertPlacement,
    NodeDescriptor,
    Plan,
    lookup,
    plan,
)

GIB = 1 << 30
ENV_VALUE_LIMIT = 128 * 1024
"""Linux's limit on one environment string (MAX_ARG_STRLEN), in bytes."""


@cache
def deepseek_v3_on_16_nodes() -> Plan:
    nodes = [
        NodeDescriptor(
            id=f"h100-{i:02d}",
            gpu_name="H100 80GB",
            vram_bytes=80 * GIB,
            flops_estimate=989.0,
            link_mbps=400_000.0,
            mem_bandwidth_gbps=3350.0,
        )
        for i in range(16)
    ]
    model = lookup("deepseek-v3")
    assert model is not None
    return plan(
        model, nodes, Constraints(), experts=ExpertInputs(placement=ExpertPlacement.EXPERT_PARALLEL)
    )
