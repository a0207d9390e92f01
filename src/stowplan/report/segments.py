"""What fills each node's memory under a plan: the bars of the terminal and HTML views."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from stowplan.model import ModelLayout, NodeDescriptor
from stowplan.models import lookup
from stowplan.plan import Plan
from stowplan.stages.gpu_lists import gpu_range_text

__all__ = ["MemoryPart", "NodeMemory", "Segment", "node_memory"]


class MemoryPart(StrEnum):
    """The kinds of bytes a node's bar shows, in drawing order."""

    EMBED = "embed"
    BLOCKS = "blocks"
    EXPERTS = "experts"
    HEAD = "head"
    KV = "kv reserve"
    FREE = "free"
    HEADROOM = "headroom"


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    part: MemoryPart
    bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeMemory:
    """One stage's node: its capacity and the segments that fill it, in bytes."""

    stage: int
    node_id: str
    gpus: str
    """The GPUs of the node the stage runs on (``gpu0-3``; empty: the whole node)."""
    gpu_name: str | None
    block_range: tuple[int, int]
    capacity_bytes: int
    """The VRAM of the stage's GPUs when the node is known (all of the node's, or its
    listed GPUs' share), else the plan's usable bytes, else what the stage uses."""
    used_bytes: int
    usable_bytes: int | None
    num_experts: int
    segments: tuple[Segment, ...]


def node_memory(
    plan: Plan, nodes: Sequence[NodeDescriptor] = (), layout: ModelLayout | None = None
) -> list[NodeMemory]:
    """Split each stage's ``estimated_vram_bytes`` into embed, blocks, experts, head, KV.

    Weights are the stage's estimate minus its KV reserve; the layout (given, or the
    known model of the plan's name) splits them into embed/head/experts/blocks. Without
    a layout every weight byte is drawn as ``blocks``.
    """
    by_id = {n.id: n for n in nodes}
    if layout is None and plan.model_name:
        layout = lookup(plan.model_name)
    out = []
    for a in plan.assignments:
        node = by_id.get(a.node_id)
        kv = min(a.kv_reserve_bytes, a.estimated_vram_bytes)
        weights = a.estimated_vram_bytes - kv
        embed = head = experts = 0
        if layout is not None:
            embed = layout.embed_params_bytes if a.owns_embed else 0
            head = layout.head_params_bytes if a.owns_head else 0
            if layout.experts is not None:
                experts = len(a.owned_experts) * layout.experts.expert_params_bytes
        # Anchors and experts never exceed the weights the plan counted for the stage.
        embed = min(embed, weights)
        head = min(head, weights - embed)
        experts = min(experts, weights - embed - head)
        blocks = weights - embed - head - experts
        usable = a.usable_vram_bytes
        capacity = usable or a.estimated_vram_bytes
        if node is not None:
            listed = len(a.gpu_indices)
            share = listed < node.num_gpus and listed > 0
            capacity = node.vram_bytes * listed // node.num_gpus if share else node.vram_bytes
        capacity = max(capacity, a.estimated_vram_bytes)
        free = max((usable if usable is not None else capacity) - a.estimated_vram_bytes, 0)
        headroom = max(capacity - a.estimated_vram_bytes - free, 0)
        parts = [
            (MemoryPart.EMBED, embed),
            (MemoryPart.BLOCKS, blocks),
            (MemoryPart.EXPERTS, experts),
            (MemoryPart.HEAD, head),
            (MemoryPart.KV, kv),
            (MemoryPart.FREE, free),
            (MemoryPart.HEADROOM, headroom),
        ]
        out.append(
            NodeMemory(
                stage=a.stage,
                node_id=a.node_id,
                gpus=gpu_range_text(a.gpu_indices) if a.gpu_indices else "",
                gpu_name=node.gpu_name if node is not None else None,
                block_range=a.block_range,
                capacity_bytes=capacity,
                used_bytes=a.estimated_vram_bytes,
                usable_bytes=usable,
                num_experts=len(a.owned_experts),
                segments=tuple(Segment(part=p, bytes=b) for p, b in parts if b > 0),
            )
        )
    return out
