"""Hypothesis strategies for models, nodes and constraints shared by the property tests."""

from __future__ import annotations

from hypothesis import strategies as st

from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.quantities.limits import MIN_RATE

GiB = 2**30

models = st.builds(
    lambda nb, block, embed, head, hidden: ModelLayout(
        name="m",
        num_blocks=nb,
        hidden_dim=hidden,
        bytes_per_activation_elem=2,
        block_params_bytes=block,
        head_params_bytes=head,
        embed_params_bytes=embed,
    ),
    st.integers(1, 130),
    st.integers(0, 4 * GiB),
    st.integers(0, 3 * GiB),
    st.integers(0, 3 * GiB),
    st.integers(1, 16384),
)


def rates(upper: float) -> st.SearchStrategy[float]:
    """A node's rate: 0 (unknown) or a number in [MIN_RATE, upper]."""
    return st.one_of(st.just(0.0), st.floats(MIN_RATE, upper))


@st.composite
def node_lists(draw: st.DrawFn, max_size: int = 8) -> list[NodeDescriptor]:
    n = draw(st.integers(1, max_size))
    return [
        NodeDescriptor(
            id=f"n{i}",
            gpu_name=draw(st.sampled_from(["RTX 3090", "RTX 4090", "RTX 5090", "A100", "L4"])),
            vram_bytes=draw(st.integers(0, 96 * GiB)),
            flops_estimate=draw(rates(1000)),
            link_mbps=draw(rates(100_000)),
        )
        for i in range(n)
    ]


constraints = st.builds(
    lambda lo, span, h: Constraints(
        min_stages=lo,
        max_stages=None if span is None or lo is None else lo + span,
        vram_headroom_frac=h,
        strategy="balance-by-vram",
    ),
    st.one_of(st.none(), st.integers(1, 5)),
    st.one_of(st.none(), st.integers(0, 5)),
    st.one_of(st.none(), st.floats(0, 0.95)),
)
