"""A toy MoE model and a heterogeneous five-node fleet for the expert-placement tests."""

from __future__ import annotations

from typing import NamedTuple

from stowplan import Constraints, ExpertLayout, ExpertLoad, ModelLayout, NodeDescriptor, Plan

MB = 10**6
GB = 10**9


def toy_moe(
    *, blocks: int = 6, dense: int = 1, experts: int = 16, k: int = 4, expert_mb: int = 100
) -> ModelLayout:
    """A small MoE: ``dense`` dense blocks, then MoE blocks of ``experts`` routed experts."""
    other = 200 * MB
    routed = experts * expert_mb * MB
    sizes = [other + (routed if b >= dense else 0) for b in range(blocks)]
    return ModelLayout(
        name="toy-moe",
        num_blocks=blocks,
        hidden_dim=1024,
        bytes_per_activation_elem=2,
        block_params_bytes=round(sum(sizes) / blocks),
        block_bytes=tuple(sizes),
        head_params_bytes=100 * MB,
        embed_params_bytes=100 * MB,
        experts=ExpertLayout(
            num_experts=experts,
            experts_per_token=k,
            expert_params_bytes=expert_mb * MB,
            moe_blocks=tuple(range(dense, blocks)),
        ),
    )


def node(
    i: int, vram_gb: float, bw: float, link: float = 10_000, lat: float = 0.0
) -> NodeDescriptor:
    return NodeDescriptor(
        id=f"n{i}",
        gpu_name="GPU",
        vram_bytes=int(vram_gb * GB),
        flops_estimate=100.0,
        link_mbps=link,
        mem_bandwidth_gbps=bw,
        link_latency_ms=lat,
    )


HETERO = [node(0, 4, 2000), node(1, 3, 1000), node(2, 3, 1000), node(3, 6, 3000), node(4, 2, 500)]


class SpreadPlan(NamedTuple):
    """A model, its fleet, constraints and load, and its expert-parallel plan."""

    model: ModelLayout
    nodes: list[NodeDescriptor]
    constraints: Constraints
    load: ExpertLoad | None
    plan: Plan


def spread_mixtral(skewed: bool, batch: int = 4) -> SpreadPlan:
    """mixtral:8x7b planned expert-parallel on twelve seeded nodes, ``batch`` sequences,
    under a Zipf load (``skewed``) or uniform routing."""
    from stowplan import ExpertInputs, ExpertPlacement, lookup, plan
    from stowplan.moe.stats import zipf_load
    from tests.common.seeded import seeded_cluster

    model = lookup("mixtral:8x7b")
    assert model is not None and model.experts is not None
    ex = model.experts
    load = zipf_load(len(ex.moe_blocks), ex.num_experts, exponent=1.1) if skewed else None
    nodes = seeded_cluster(7, 12)
    c = Constraints(batch=batch)
    placement = ExpertInputs(placement=ExpertPlacement.EXPERT_PARALLEL, load=load)
    return SpreadPlan(model, nodes, c, load, plan(model, nodes, c, experts=placement))
