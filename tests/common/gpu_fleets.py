"""Random fleets of multi-GPU nodes, for the tests and the benchmarks that draw them."""

from __future__ import annotations

import random
from collections.abc import Sequence

from stowplan import NodeDescriptor

MIXED_KINDS = (
    ("H100 SXM5", 80, 8, 100_000.0),
    ("A100 80GB SXM", 80, 4, 25_000.0),
    ("L40S", 48, 2, 10_000.0),
    ("RTX 4090", 24, 1, 1_000.0),
)
"""8 × H100, 4 × A100, 2 × L40S and one RTX 4090 (GPU name, GB per GPU, GPUs, link
Mbit/s): the kinds the certificate-validity checks draw."""

LATENCIES_MS = (0.05, 0.5, 5.0)
"""Network latencies :func:`gpu_nodes` draws from."""


def gpu_nodes(
    rng: random.Random,
    low: int,
    high: int,
    kinds: Sequence[tuple[str, int, int, float]],
) -> list[NodeDescriptor]:
    """``low`` to ``high`` multi-GPU nodes, each of one of ``kinds`` (GPU name, GB per
    GPU, GPUs, link Mbit/s), with a latency of :data:`LATENCIES_MS`."""
    specs = []
    for _ in range(rng.randint(low, high)):
        name, gb, gpus, link = rng.choice(kinds)
        specs.append((name, gb, gpus, link, rng.choice(LATENCIES_MS)))
    return nodes_of(specs)


def nodes_of(specs: Sequence[tuple[str, int, int, float, float]]) -> list[NodeDescriptor]:
    """A node per (GPU name, GB per GPU, GPUs, link Mbit/s, link latency ms), with ids
    ``n00``, ``n01``, … in order."""
    return [
        NodeDescriptor(
            id=f"n{i:02d}",
            gpu_name=name,
            vram_bytes=gpus * gb * 10**9,
            num_gpus=gpus,
            link_mbps=link,
            link_latency_ms=latency,
        )
        for i, (name, gb, gpus, link, latency) in enumerate(specs)
    ]


def slow_hop_fleet() -> list[NodeDescriptor]:
    """Nine nodes: one 8 × H100 (0.5 ms hop), two 8 × A100 (0.5 ms), five 4 × RTX 4090
    and one 2 × L40S (0.05–0.5 ms), where qwen3:30b-a3b at 16 sequences plans one stage
    on the H100 node (``n06``) and every pipeline over several nodes pays 0.5 ms hops."""
    rtx, l40s = ("RTX 4090", 24, 4, 10_000.0), ("L40S", 48, 2, 10_000.0)
    a100, h100 = ("A100 80GB SXM", 80, 8, 50_000.0), ("H100 SXM5", 80, 8, 100_000.0)
    return nodes_of(
        [
            (*rtx, 0.05),
            (*rtx, 0.05),
            (*a100, 0.5),
            (*rtx, 0.5),
            (*rtx, 0.05),
            (*rtx, 0.5),
            (*h100, 0.5),
            (*a100, 0.5),
            (*l40s, 0.05),
        ]
    )


def mixed_link_fleet() -> list[NodeDescriptor]:
    """Fifteen nodes of 8 × H100, 4 or 8 × A100, 4 × RTX 4090 and 2 × L40S behind links
    of 0.05, 0.5 or 5 ms, where qwen3:30b-a3b at 16 sequences is fastest on four stages
    of 8 × H100 and A100 GPUs behind 0.05 ms links."""
    rtx, l40s = ("RTX 4090", 24, 4, 10_000.0), ("L40S", 48, 2, 10_000.0)
    a4, a8 = ("A100 80GB SXM", 80, 4, 25_000.0), ("A100 80GB SXM", 80, 8, 50_000.0)
    h100 = ("H100 SXM5", 80, 8, 100_000.0)
    return nodes_of(
        [
            (*rtx, 0.05),
            (*a8, 0.5),
            (*a4, 0.5),
            (*a4, 0.05),
            (*a8, 0.05),
            (*a4, 0.05),
            (*rtx, 0.05),
            (*a4, 0.05),
            (*rtx, 0.5),
            (*rtx, 0.5),
            (*a8, 0.5),
            (*h100, 0.05),
            (*l40s, 5.0),
            (*h100, 5.0),
            (*h100, 0.05),
        ]
    )


def two_fast_nodes_fleet() -> list[NodeDescriptor]:
    """Fourteen nodes of which two, an 8 × A100 and an 8 × H100, sit behind 0.05 ms links
    besides two 2 × L40S; the others are behind 0.5 or 5 ms.  qwen3:30b-a3b at 16
    sequences is fastest on those two nodes, one stage each: a pipeline of more stages,
    each within its share of the cycle, needs more fast groups than they have."""
    l40s, a4 = ("L40S", 48, 2, 10_000.0), ("A100 80GB SXM", 80, 4, 25_000.0)
    a8, h100 = ("A100 80GB SXM", 80, 8, 50_000.0), ("H100 SXM5", 80, 8, 100_000.0)
    return nodes_of(
        [
            (*l40s, 5.0),
            (*a8, 0.05),
            (*h100, 0.5),
            (*h100, 5.0),
            (*h100, 0.05),
            (*a8, 5.0),
            (*l40s, 0.05),
            (*l40s, 0.5),
            (*l40s, 0.5),
            (*a4, 5.0),
            (*h100, 5.0),
            (*a8, 5.0),
            (*a8, 0.5),
            (*l40s, 0.05),
        ]
    )


def one_h100_fleet() -> list[NodeDescriptor]:
    """Eleven nodes: one 8 × H100 (0.5 ms) among 2 × L40S, 4 × RTX 4090 and one 4 × A100,
    where llama3.1:405b at 64 sequences takes four stages, the H100's of 80 blocks."""
    l40s, rtx = ("L40S", 48, 2, 10_000.0), ("RTX 4090", 24, 4, 10_000.0)
    a4, h100 = ("A100 80GB SXM", 80, 4, 25_000.0), ("H100 SXM5", 80, 8, 100_000.0)
    return nodes_of(
        [
            (*l40s, 0.05),
            (*l40s, 0.5),
            (*h100, 0.5),
            (*l40s, 0.05),
            (*rtx, 0.5),
            (*rtx, 5.0),
            (*l40s, 5.0),
            (*rtx, 0.05),
            (*rtx, 5.0),
            (*rtx, 0.05),
            (*a4, 5.0),
        ]
    )


FIVE_MIXED = (
    ("RTX 3090", 24, 1, 58_400.0, 0.24),
    ("A100 80GB SXM4", 80, 4, 35_700.0, 0.39),
    ("RTX 3090", 24, 4, 76_100.0, 0.063),
    ("A100 80GB SXM4", 80, 8, 98_900.0, 0.065),
    ("H200", 141, 1, 10_200.0, 0.45),
)
"""Five mixed nodes, no one of which holds llama3.1:405b: 1 and 4 × RTX 3090, 4 and 8 ×
A100 80GB, one H200 (the specs :func:`nodes_of` takes)."""


FAST_AND_SLOW = (
    [("B200", 180, 1, 50_000.0, 0.2)] * 9
    + [("H100 SXM5", 80, 1, 50_000.0, 0.2)] * 12
    + [("L4", 24, 1, 50_000.0, 0.2)] * 9
    + [("RTX 4090", 24, 1, 50_000.0, 0.2)] * 2
)
"""32 single-GPU LAN nodes (the specs :func:`nodes_of` takes): 9 × B200 and 12 × H100,
then 11 slow nodes whose one deepseek-v3 MoE block takes longer than the fast ones' least
slowest stage of 22 stages."""


FOUR_KINDS = (("H100 SXM5", 80), ("A100 80GB SXM4", 80), ("L40S", 48), ("RTX 4090", 24))
"""Single GPUs of four kinds (GPU name, GB): the kinds :func:`single_gpu_kinds` cycles
through by default."""


def single_gpu_kinds(
    n: int,
    seed: int,
    kinds: Sequence[tuple[str, int]] = FOUR_KINDS,
    mbps: tuple[float, float] = (10_000.0, 100_000.0),
    ms: tuple[float, float] = (0.05, 0.5),
    digits: int | None = None,
) -> list[NodeDescriptor]:
    """``n`` single-GPU nodes, the i-th of ``kinds[i % len(kinds)]``, ids ``n00``, ``n01``,
    …, each link's Mbit/s and latency drawn uniformly from ``mbps`` and ``ms`` (a LAN by
    default) by ``random.Random(seed)``; with ``digits``, the Mbit/s rounded to a whole
    number and the latency to that many digits."""
    rng = random.Random(seed)

    def drawn(bounds: tuple[float, float], places: int | None) -> float:
        value = rng.uniform(*bounds)
        return value if digits is None else round(value, places)

    return [
        NodeDescriptor(
            id=f"n{i:02d}",
            gpu_name=kinds[i % len(kinds)][0],
            vram_bytes=kinds[i % len(kinds)][1] * 10**9,
            flops_estimate=0.0,
            link_mbps=drawn(mbps, 0 if digits is not None else None),
            link_latency_ms=drawn(ms, digits),
        )
        for i in range(n)
    ]
