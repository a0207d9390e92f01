"""Plans of tensor-parallel stages built by hand: the layouts Ray must realise as written."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.plan import Plan, StageAssignment, Topology
from stowplan.planner import plan


def tp_plan(
    layout: ModelLayout, stages: Sequence[tuple[str, tuple[int, ...]]], *, tp: int | None = None
) -> Plan:
    """A plan of ``layout`` whose stage ``s`` runs on GPUs ``stages[s][1]`` of node
    ``stages[s][0]`` (empty: GPUs ``0 … tp-1``), blocks split evenly."""
    one = NodeDescriptor(
        id="template", gpu_name="RTX 4090", vram_bytes=1 << 40, flops_estimate=1, link_mbps=1
    )
    template = plan(layout, [one], Constraints())
    n, blocks = len(stages), layout.num_blocks
    assignments = tuple(
        StageAssignment(
            stage=s,
            node_id=node,
            block_range=(s * blocks // n, (s + 1) * blocks // n),
            owns_embed=s == 0,
            owns_head=s == n - 1,
            estimated_vram_bytes=0,
            tensor_parallel=len(gpus) or (tp or 1),
            gpu_indices=gpus,
        )
        for s, (node, gpus) in enumerate(stages)
    )
    return replace(template, topology=Topology.PipelineChain(n), assignments=assignments)
