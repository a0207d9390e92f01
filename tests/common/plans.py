"""Plans built directly from block counts (for the export tests), and what tests read off plans."""

from __future__ import annotations

from collections.abc import Sequence

from stowplan import Constraints, NodeDescriptor, lookup
from stowplan.calibration import resolve_calibration
from stowplan.model import ExpertId
from stowplan.plan import Plan, PlanRationale, StageAssignment, Topology
from stowplan.planner import plan

GIB = 1 << 30

LLAMAS = (("llama3.1:8b", 32), ("llama3.1:70b", 80), ("llama3.1:405b", 126))


def llama_for(blocks: int) -> str:
    """The smallest known Llama with at least ``blocks`` blocks (a plan's ranges lie within
    its model), else a name no table knows (the engines that need no layout take it)."""
    return next((name for name, n in LLAMAS if blocks <= n), f"toy-{blocks}-blocks")


def make_plan(
    counts: Sequence[int],
    node_ids: Sequence[str] | None = None,
    *,
    context_tokens: int | None = 4096,
    model_name: str | None = None,
    experts: dict[int, Sequence[ExpertId]] | None = None,
    experts_per_block: int | None = None,
) -> Plan:
    """A plan whose stage ``i`` holds ``counts[i]`` blocks on ``node_ids[i]``."""
    ids = list(node_ids or [f"gpu{i}" for i in range(len(counts))])
    n = len(counts)
    lo = 0
    stages = []
    for i, c in enumerate(counts):
        stages.append(
            StageAssignment(
                stage=i,
                node_id=ids[i],
                block_range=(lo, lo + c),
                owns_embed=i == 0,
                owns_head=i == n - 1,
                estimated_vram_bytes=c * GIB // 4 + GIB,
                owned_experts=tuple((experts or {}).get(i, ())),
                kv_reserve_bytes=GIB // 2,
                usable_vram_bytes=20 * GIB,
            )
        )
        lo += c
    topology = (
        Topology.PipelineWithExperts(n, experts_per_block)
        if experts_per_block
        else Topology.PipelineChain(n)
    )
    return Plan(
        topology=topology,
        assignments=tuple(stages),
        rationale=PlanRationale(strategy="test"),
        model_name=model_name or llama_for(lo),
        num_blocks=lo,
        context_tokens=context_tokens,
    )


def make_tp_plan(
    stages: Sequence[tuple[str, Sequence[int], int]],
    *,
    context_tokens: int | None = 4096,
    model_name: str | None = None,
) -> Plan:
    """A plan whose stage ``i`` runs ``stages[i] = (node, gpu_indices, blocks)``, its
    tensor-parallel degree the number of GPUs listed."""
    n = len(stages)
    lo = 0
    out = []
    for i, (node_id, gpus, count) in enumerate(stages):
        out.append(
            StageAssignment(
                stage=i,
                node_id=node_id,
                block_range=(lo, lo + count),
                owns_embed=i == 0,
                owns_head=i == n - 1,
                estimated_vram_bytes=count * GIB // 4 + GIB,
                kv_reserve_bytes=GIB // 2,
                usable_vram_bytes=20 * GIB * max(len(gpus), 1),
                tensor_parallel=max(len(gpus), 1),
                gpu_indices=tuple(gpus),
            )
        )
        lo += count
    return Plan(
        topology=Topology.PipelineChain(n),
        assignments=tuple(out),
        rationale=PlanRationale(strategy="test"),
        model_name=model_name or llama_for(lo),
        num_blocks=lo,
        context_tokens=context_tokens,
    )


def plan_cycle(p: Plan) -> float:
    """A plan's predicted cycle: seconds per token of each sequence."""
    pred = p.rationale.prediction
    assert pred is not None
    return pred.time_per_token_s


def as_the_cli_plans(batch: int) -> Constraints:
    """``batch`` sequences as ``stowplan plan`` plans them by default: the generic
    calibration, each sequence's KV reserved for 8,192 tokens."""
    return Constraints(batch=batch, context_tokens=8192, calibration=resolve_calibration("generic"))


def proven_plan(
    model_name: str, nodes: Sequence[NodeDescriptor], c: Constraints, stages: int
) -> Plan:
    """The plan of ``model_name`` on ``nodes``, checked to run ``stages`` stages and to be
    proven optimal by its certificate (gap 0)."""
    model = lookup(model_name)
    assert model is not None
    got = plan(model, nodes, c)
    cert = got.rationale.certificate
    assert cert is not None
    assert got.num_stages == stages
    assert cert.exact and cert.gap == 0.0, cert
    return got
