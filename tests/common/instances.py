"""Random small instances shared by the planner tests."""

from __future__ import annotations

from hypothesis import strategies as st

from stowplan.constraints import Constraints
from stowplan.model import ModelLayout, NodeDescriptor
from stowplan.planner.problem import Problem, prepare
from tests.common.refusals import rejected_if_refused

GPUS = [("RTX 3090", 24), ("RTX 4090", 24), ("RTX 5090", 32), ("L4", 24), ("H100", 80)]


@st.composite
def instances(draw: st.DrawFn, max_nodes: int = 4, max_blocks: int = 6) -> tuple:
    nb = draw(st.integers(1, max_blocks))
    uniform = draw(st.booleans())
    sizes = (
        [draw(st.integers(1, 6)) * 10**9] * nb
        if uniform
        else [draw(st.integers(1, 6)) * 10**9 for _ in range(nb)]
    )
    # MoE-like blocks: a token reads only part of what a block stores (router + top-k).
    moe = draw(st.booleans())
    ratio = st.sampled_from([1, 4, 8])
    shared = draw(ratio)
    reads = [s // (shared if uniform else draw(ratio)) if moe else s for s in sizes]
    model = ModelLayout(
        name="m",
        num_blocks=nb,
        hidden_dim=8192,
        bytes_per_activation_elem=2,
        block_params_bytes=round(sum(sizes) / nb),
        block_bytes=tuple(sizes),
        block_read_bytes=tuple(reads) if moe else None,
        head_params_bytes=draw(st.integers(0, 3)) * 10**9,
        embed_params_bytes=draw(st.integers(0, 3)) * 10**9,
        kv_bytes_per_token=(4096,) * nb,
        total_params=sum(sizes) // 2,
        active_params=sum(reads) // 2,
    )
    n = draw(st.integers(1, max_nodes))
    nodes = []
    for i in range(n):
        gpu, gb = draw(st.sampled_from(GPUS))
        nodes.append(
            NodeDescriptor(
                id=f"n{i}",
                gpu_name=gpu,
                vram_bytes=draw(st.integers(gb // 2, gb)) * 10**9,
                flops_estimate=0.0,
                link_mbps=draw(st.sampled_from([100.0, 1000.0, 100000.0])),
                link_latency_ms=draw(st.sampled_from([0.05, 10.0, 60.0])),
                price_per_hour=draw(st.sampled_from([0.2, 0.4, 2.0])),
            )
        )
    return model, nodes


RANGED = (
    instances(max_nodes=4, max_blocks=6),
    st.sampled_from([1, 3, 8]),
    st.integers(1, 4),
    st.integers(1, 4),
)
"""The draws :func:`ranged` reads, in its order (instance, batch, fewest, most): a
test's ``@given(*RANGED, …)``."""


def ranged(
    inst: tuple, batch: int, fewest: int, most: int
) -> tuple[Problem, Constraints, int, int]:
    """An instance's problem at ``batch`` sequences (the example rejected where the planner
    refuses it), its constraints, and a range of stage counts ``lo`` to ``hi`` from the
    drawn ``fewest`` and ``most`` within the problem's limits."""
    model, nodes = inst
    c = Constraints(batch=batch)
    with rejected_if_refused():
        problem = prepare(model, nodes, c)
    lo = min(fewest, problem.max_stages)
    return problem, c, lo, max(lo, min(most, problem.max_stages))
