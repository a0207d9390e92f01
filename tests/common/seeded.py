"""Seeded random clusters (fixed forever) for the plan-quality regression test."""

from __future__ import annotations

import random

from stowplan.model import NodeDescriptor

GPUS = [
    ("RTX 3090", 24),
    ("RTX 4090", 24),
    ("RTX 5090", 32),
    ("L4", 24),
    ("A100 80GB SXM4", 80),
    ("H100 SXM5", 80),
]
SIZES = {
    "llama3.1:8b": [2, 3, 5, 8, 16, 64],
    "llama3.1:70b": [4, 6, 8, 16, 64],
    "llama3.1:405b-q4_0": [8, 12, 16, 64],
    "mixtral:8x7b": [4, 6, 8, 16, 64],
    "qwen3:30b-a3b": [2, 3, 5, 8, 64],
    "deepseek-v3": [24, 32, 64],
}


def seeded_cluster(seed: int, n: int) -> list[NodeDescriptor]:
    """``n`` nodes of 3 random GPU types, LAN or WAN links, from ``seed``."""
    rng = random.Random(seed)
    kinds = rng.sample(GPUS, k=3)
    wan = rng.random() < 0.5
    nodes = []
    for i in range(n):
        gpu, gb = rng.choice(kinds)
        nodes.append(
            NodeDescriptor(
                id=f"n{i:03d}",
                gpu_name=gpu,
                vram_bytes=gb * 10**9,
                flops_estimate=0.0,
                link_mbps=rng.uniform(100, 1000) if wan else rng.uniform(10_000, 100_000),
                link_latency_ms=rng.uniform(10, 60) if wan else rng.uniform(0.05, 0.5),
            )
        )
    return nodes


def cases() -> list[tuple[str, int, int]]:
    """(model, nodes, seed) triples."""
    return [(m, n, 1000 * n + k) for m, sizes in SIZES.items() for n in sizes for k in range(3)]
