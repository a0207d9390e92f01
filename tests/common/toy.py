"""A toy model and node with round numbers, for hand-computed cost-model figures."""

from __future__ import annotations

from stowplan import ModelLayout, NodeDescriptor

TOY_MODEL = ModelLayout(
    name="toy",
    num_blocks=4,
    hidden_dim=1000,
    bytes_per_activation_elem=2,
    block_params_bytes=10**9,
    head_params_bytes=10**9,
    embed_params_bytes=10**9,
    kv_bytes_per_token=(1000,) * 4,
    total_params=3 * 10**9,
    active_params=3 * 10**9,
)
"""4 blocks of 1 GB, a 1 GB head and embed, 1000 B of KV per token and block."""


def toy_node(i: int, **kw: object) -> NodeDescriptor:
    """Node ``n{i}``: 10 GB, 100 GB/s, no FLOPs figure, 1 MB/s link (8 Mbit/s), 10 ms."""
    base: dict[str, object] = dict(
        id=f"n{i}",
        gpu_name="RTX 4090",
        vram_bytes=10 * 10**9,
        flops_estimate=0.0,
        link_mbps=8.0,
        mem_bandwidth_gbps=100.0,
        link_latency_ms=10.0,
    )
    base.update(kw)
    return NodeDescriptor(**base)  # type: ignore[arg-type]


def tiny_model(blocks: int) -> ModelLayout:
    """``blocks`` blocks of 400 MiB, a 500 MiB head and embed, 128 KiB of KV per token
    and block, 8 attention heads (2 for KV): small enough for brute force over GPU
    groups of a few GiB."""
    return ModelLayout(
        name="tiny",
        num_blocks=blocks,
        hidden_dim=4096,
        bytes_per_activation_elem=2,
        block_params_bytes=400 * 2**20,
        head_params_bytes=500 * 2**20,
        embed_params_bytes=500 * 2**20,
        num_attention_heads=8,
        num_kv_heads=2,
        kv_bytes_per_token=(2**17,) * blocks,
    )
