"""Random small instances shared by the planner tests."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from stowplan.constraints import Constraints
from stowplan.model import ModelLayout, NodeDescriptor
from stowplan.models import resolve_model
from stowplan.planner.problem import Problem, prepare
from tests.common.gpu_fleets import nodes_of
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


@st.composite
def small_first(draw: st.DrawFn) -> tuple:
    """A model of 3–7 blocks whose first one to three are small (0.1–0.6 GB each) and
    the rest heavy (4–12 GB, all alike; MoE-like reads or not), on 2–5 single-GPU nodes
    of 24–80 GB."""
    nb = draw(st.integers(3, 7))
    small = draw(st.integers(1, min(3, nb - 2)))
    heavy = draw(st.integers(4, 12)) * 10**9
    sizes = [draw(st.integers(1, 6)) * 10**8 if b < small else heavy for b in range(nb)]
    ratio = draw(st.sampled_from([1, 4, 8]))
    reads = [s if b < small else s // ratio for b, s in enumerate(sizes)]
    model = sized_model(
        "small-first",
        sizes,
        reads,
        head=draw(st.integers(0, 2)) * 10**9,
        embed=draw(st.integers(0, 2)) * 10**9,
    )
    kinds = [("RTX 4090", 24), ("L40S", 48), ("H100 SXM5", 80), ("A100 40GB SXM4", 40)]
    nodes = nodes_of(
        [
            (*draw(st.sampled_from(kinds)), 1, draw(st.sampled_from([1000.0, 100000.0])), ms)
            for ms in draw(st.lists(st.sampled_from([0.05, 5.0, 40.0]), min_size=2, max_size=5))
        ]
    )
    return model, nodes


def sized_model(
    name: str, sizes: list[int], reads: list[int], head: int = 0, embed: int = 0
) -> ModelLayout:
    """llama3.1:8b's figures with blocks of ``sizes`` bytes (each read ``reads`` bytes a
    token) and a head and embedding of ``head`` and ``embed`` bytes."""
    nb = len(sizes)
    return replace(
        resolve_model("llama3.1:8b"),
        name=name,
        num_blocks=nb,
        block_bytes=tuple(sizes),
        block_read_bytes=tuple(reads),
        block_params_bytes=round(sum(sizes) / nb),
        kv_bytes_per_token=(4096,) * nb,
        head_params_bytes=head,
        embed_params_bytes=embed,
        total_params=sum(sizes) // 2,
        active_params=sum(reads) // 2,
    )
