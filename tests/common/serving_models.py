"""Small dense and MoE layouts for serving tests, a hypothesis strategy drawing them,
the :class:`~stowplan.Workload` of a referee :class:`Load`, and strategies drawing referee
workloads and fleets."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from stowplan import ExpertLayout, ModelLayout, NodeDescriptor, Workload
from tests.common.serving_referee import Load

MB = 10**6


def dense(blocks: int, block_mb: int, kv: int, hidden: int, heads: int = 0) -> ModelLayout:
    """``heads`` > 0: that many attention heads, twice as wide together as the hidden
    width (the attention width is then 2 × hidden)."""
    return ModelLayout(
        name="dense",
        num_blocks=blocks,
        hidden_dim=hidden,
        bytes_per_activation_elem=2,
        block_params_bytes=block_mb * MB,
        head_params_bytes=block_mb * MB // 2,
        embed_params_bytes=block_mb * MB // 2,
        kv_bytes_per_token=(kv,) * blocks,
        total_params=(blocks + 1) * block_mb * MB // 2,
        active_params=(blocks + 1) * block_mb * MB // 2,
        num_attention_heads=heads or None,
        head_dim=2 * hidden // heads if heads else None,
    )


def moe(blocks: int, expert_mb: int, kv: int, hidden: int) -> ModelLayout:
    """Block 0 dense; the others 200 MB of attention plus 16 experts, top-2."""
    other, e, k = 200 * MB, 16, 2
    sizes = [other] + [other + e * expert_mb * MB] * (blocks - 1)
    reads = [other] + [other + k * expert_mb * MB] * (blocks - 1)
    return ModelLayout(
        name="moe",
        num_blocks=blocks,
        hidden_dim=hidden,
        bytes_per_activation_elem=2,
        block_params_bytes=round(sum(sizes) / blocks),
        block_bytes=tuple(sizes),
        block_read_bytes=tuple(reads),
        head_params_bytes=100 * MB,
        embed_params_bytes=100 * MB,
        kv_bytes_per_token=(kv,) * blocks,
        experts=ExpertLayout(
            num_experts=e,
            experts_per_token=k,
            expert_params_bytes=expert_mb * MB,
            moe_blocks=tuple(range(1, blocks)),
        ),
    )


models = st.one_of(
    st.builds(
        dense,
        st.integers(2, 5),
        st.integers(200, 3000),
        st.integers(1, 200_000),
        st.sampled_from([1024, 4096, 8192]),
        st.sampled_from([0, 8]),
    ),
    st.builds(
        moe,
        st.integers(2, 4),
        st.integers(20, 300),
        st.integers(1, 100_000),
        st.sampled_from([1024, 2048]),
    ),
)


def workload(load: Load, users: int | None = None) -> Workload:
    return Workload(
        prompt_tokens=load.prompt_tokens,
        output_tokens=load.output_tokens,
        ttft_s=load.ttft_s,
        tpot_s=load.tpot_s,
        users=users,
    )


GB = 10**9

loads = st.builds(
    Load,
    prompt_tokens=st.integers(64, 4096),
    output_tokens=st.integers(16, 512),
    ttft_s=st.floats(0.2, 5.0),
    tpot_s=st.floats(0.02, 0.3),
)
"""Referee workloads: 64-4,096-token prompts, 16-512-token answers, TTFT 0.2-5 s,
TPOT 20-300 ms."""


@st.composite
def fleets(
    draw: st.DrawFn,
    least: int = 2,
    most: int = 6,
    most_gb: int = 48,
    *,
    priced: bool = True,
) -> list[NodeDescriptor]:
    """``least`` to ``most`` single-GPU nodes of 2 to ``most_gb`` GB, each with rates of
    its own (so the referee needs no spec table), priced or not."""
    return [
        NodeDescriptor(
            id=f"n{i}",
            gpu_name=draw(st.sampled_from(["RTX 3090", "RTX 4090", "A100", "L4"])),
            vram_bytes=draw(st.integers(2, most_gb)) * GB,
            mem_bandwidth_gbps=draw(st.floats(200, 3000)),
            flops_estimate=draw(st.floats(20, 400)),
            link_mbps=draw(st.floats(1000, 100_000)),
            link_latency_ms=draw(st.floats(0, 20)),
            price_per_hour=round(draw(st.floats(0.1, 3.0)), 2) if priced else None,
        )
        for i in range(draw(st.integers(least, most)))
    ]


@st.composite
def mixed_fleets(draw: st.DrawFn) -> list[NodeDescriptor]:
    """2 to 8 priced nodes of 1, 2 or 4 GPUs, 8 GPUs at most (up to 8 unlike nodes: the
    compositions are then too many to try them all)."""
    out: list[NodeDescriptor] = []
    for i in range(draw(st.integers(2, 8))):
        gpus = draw(st.sampled_from([1, 1, 1, 2, 4]))
        if sum(n.num_gpus for n in out) + gpus > 8:
            break
        out.append(
            NodeDescriptor(
                id=f"n{i}",
                gpu_name="RTX 4090",
                num_gpus=gpus,
                vram_bytes=gpus * draw(st.integers(2, 24)) * GB,
                mem_bandwidth_gbps=gpus * draw(st.floats(200, 2000)),
                flops_estimate=gpus * draw(st.floats(20, 300)),
                link_mbps=draw(st.floats(1000, 100_000)),
                link_latency_ms=draw(st.floats(0, 10)),
                intra_link_gbps=draw(st.sampled_from([16.0, 300.0])),
                price_per_hour=round(gpus * draw(st.floats(0.1, 3.0)), 2),
            )
        )
    return out


def serve_settings(examples: int) -> settings:
    """Hypothesis settings of the serving property tests: ``examples`` examples (the
    ``SERVE_EXAMPLES`` environment variable overrides), derandomized, no deadline."""
    return settings(
        max_examples=int(os.environ.get("SERVE_EXAMPLES", str(examples))),
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
