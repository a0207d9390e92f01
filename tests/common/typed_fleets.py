"""A hypothesis strategy drawing fleets of few node types whose nodes differ only in
their links and prices (the fleets the programmes over replica kinds group)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from stowplan import NodeDescriptor
from tests.common.serving_models import fleets


@st.composite
def typed_fleets(draw: st.DrawFn) -> list[NodeDescriptor]:
    """2–5 single-GPU nodes of one or two types: copies of drawn nodes with links,
    hop latencies and prices of their own."""
    bases = draw(fleets(1, 2))
    return [
        replace(
            draw(st.sampled_from(bases)),
            id=f"m{i}",
            link_mbps=draw(st.floats(1000, 100_000)),
            link_latency_ms=draw(st.floats(0, 20)),
            price_per_hour=round(draw(st.floats(0.1, 3.0)), 2),
        )
        for i in range(draw(st.integers(2, 5)))
    ]


def three_card_fleet() -> list[NodeDescriptor]:
    """Twenty single-GPU nodes of three types (RTX 3090, 4090, 4080), links and prices
    all unlike: more compositions than are bounded one by one, none holding Llama 3.1
    70B (4-bit) alone."""
    return [
        NodeDescriptor(
            id=f"n{i:02d}",
            gpu_name=("RTX 3090", "RTX 4090", "RTX 4080")[i % 3],
            vram_bytes=(24, 24, 16)[i % 3] * 10**9,
            link_mbps=500.0 + 37 * i,
            price_per_hour=(0.2, 0.35, 0.18)[i % 3] + 0.01 * i,
        )
        for i in range(20)
    ]
