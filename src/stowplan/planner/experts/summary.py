"""Reading an expert plan back: the experts every stage node owns, balance and traffic."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stowplan.errors import InputError
from stowplan.model import ModelLayout, NodeDescriptor
from stowplan.moe.numbering import ValueNumbers
from stowplan.moe.routing import (
    Holders,
    experts_per_node,
    holders_of,
    loads_imbalance,
    node_loads,
    nodes_in_order,
    remote_transfers,
    stage_of_block,
    token_routing,
)
from stowplan.moe.stats import CoActivation, ExpertLoad
from stowplan.plan import Plan
from stowplan.planner.experts.inputs import expert_speeds

__all__ = ["ExpertSummary", "NodeExperts", "expert_summary"]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeExperts:
    """The experts one stage node owns and the share of expert work it carries."""

    stage: int
    node_id: str
    per_block: tuple[tuple[int, tuple[int, ...]], ...]
    """``(block, expert indices)`` for every MoE block the node holds experts of."""
    num_experts: int
    """Expert copies held (replicas included)."""
    load_share: float
    """Fraction of all expected expert work (tokens × experts) served here."""
    speed_share: float
    """This node's fraction of the stage nodes' total expert speed (the ideal load share)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertSummary:
    """Balance and traffic of an expert placement (see :mod:`stowplan.planner.experts`)."""

    nodes: tuple[NodeExperts, ...]
    num_placed: int
    num_replicas: int
    imbalance_mean: float
    """Mean over MoE blocks of ``max_j(load_j/speed_j) / (sum load / sum speed)``."""
    imbalance_max: float
    transfers_per_token: float
    """Expected distinct remote nodes a token's experts live on, summed over MoE blocks."""
    speed_source: str
    block_local: bool = False
    """Every expert lives only on the node of its block: no expert parallelism, so the
    imbalance figures (which compare nodes) do not apply; the stage split balances work."""


def expert_summary(
    plan: Plan,
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    load: ExpertLoad | None = None,
    coactivation: CoActivation | None = None,
    *,
    holders_by_block: Sequence[Holders] | None = None,
    reach_by_block: Sequence[Sequence[float]] | None = None,
) -> ExpertSummary:
    """Balance and traffic of the experts ``plan`` places, under ``load``/``coactivation``.

    ``holders_by_block`` is :func:`~stowplan.moe.routing.holders_of` of ``plan`` when the caller
    has it (the planner, from its packing), so it is not rebuilt from the plan's lists;
    ``reach_by_block`` is :func:`~stowplan.moe.routing.block_reaches` of those holders when
    the caller has it (the planner shares it with the prediction)."""
    ex = model.experts
    if ex is None:
        raise InputError("model", model.name, "has no routed experts")
    ordered = nodes_in_order(plan, nodes)
    speeds, source = expert_speeds(ordered)
    routing = token_routing(model, load, coactivation)
    all_holders = holders_of(plan, model) if holders_by_block is None else holders_by_block
    home_stage = stage_of_block(plan)
    n = len(ordered)
    work = [0.0] * n
    imbalances = []
    transfers = 0.0
    # Blocks alike (same copies and load; same pairs and home stage for the traffic) have
    # the same figures.
    number = ValueNumbers()
    balance: dict[tuple[int, int], tuple[list[float], float]] = {}
    traffic: dict[tuple[int, int, int, int], float] = {}
    for li, holders in enumerate(all_holders):
        w = routing.p[li]
        pairs = routing.pairs[li] if routing.pairs is not None else None
        home = home_stage[ex.moe_blocks[li]]
        alike = (number.holders(holders), number(w))
        if alike not in balance:
            loads = node_loads(holders, w, n)
            balance[alike] = (loads, loads_imbalance(loads, speeds))
        key = (*alike, -1 if pairs is None else number(pairs), home)
        if key not in traffic:
            traffic[key] = (
                remote_transfers(holders, w, pairs, routing.k, n, home)
                if reach_by_block is None
                else sum(r for j, r in enumerate(reach_by_block[li]) if j != home)
            )
        loads, block_imbalance = balance[alike]
        for j, node_load in enumerate(loads):
            work[j] += node_load
        imbalances.append(block_imbalance)
        transfers += traffic[key]
    total_work = sum(work) or 1.0
    # Every node's experts per block, read off the holders (the plan's own, by identity
    # once per list of holders that blocks share): blocks ascending (moe_blocks is),
    # each block's experts ascending.
    per = experts_per_node(ex.moe_blocks, all_holders, n)
    rows = []
    for j, a in enumerate(plan.assignments):
        rows.append(
            NodeExperts(
                stage=a.stage,
                node_id=a.node_id,
                per_block=tuple(per[j]),
                num_experts=len(a.owned_experts),
                load_share=work[j] / total_work,
                speed_share=speeds[j] / (sum(speeds) or 1.0),
            )
        )
    placed = sum(r.num_experts for r in rows)
    return ExpertSummary(
        nodes=tuple(rows),
        num_placed=placed,
        num_replicas=placed - len(ex.moe_blocks) * ex.num_experts,
        # No MoE block: nothing to balance, every node even (1.0), as block-local is.
        imbalance_mean=sum(imbalances) / len(imbalances) if imbalances else 1.0,
        imbalance_max=max(imbalances, default=1.0),
        transfers_per_token=transfers,
        speed_source=source,
        block_local=all(
            hs == [home_stage[b]]
            for b, holders in zip(ex.moe_blocks, all_holders, strict=True)
            for hs in holders
        ),
    )
