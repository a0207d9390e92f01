"""Where a MoE model's tokens go: the figures both the expert planner and the cost model read.

Below the cost model and the planner, so that both can use them:

* :func:`backbone_layout` — a MoE layout without its routed experts (what the
  block planner places before the experts);
* :func:`token_routing` — per MoE block, the probability that a token selects each
  routed expert (from load statistics, else uniform) and the co-selection
  probability of listed pairs;
* :func:`holders_of` — per MoE block and expert, the stages of a plan that
  hold a copy (:data:`Holders`);
* per node of one block: :func:`node_loads`, :func:`node_reach` (the
  probability that a token selects at least one expert there; :func:`block_reaches`
  for every block of a plan),
  :func:`remote_transfers`, :func:`imbalance`.

A replicated expert's tokens are split evenly over its copies
(:func:`copy_shares`, EPLB's convention).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from stowplan.errors import InputError
from stowplan.model import ModelLayout, NodeDescriptor, stage_node
from stowplan.moe.numbering import ValueNumbers
from stowplan.moe.stats import CoActivation, ExpertLoad
from stowplan.plan import Plan

__all__ = [
    "Holders",
    "Pairs",
    "Routing",
    "backbone_layout",
    "block_reaches",
    "copy_shares",
    "holders_of",
    "imbalance",
    "node_loads",
    "node_reach",
    "nodes_in_order",
    "remote_transfers",
    "slowest_finish",
    "stage_of_block",
    "token_routing",
]

Holders = list[list[int]]
"""Per expert of one MoE block, the indices (stage order) of the nodes holding a copy."""

Pairs = Sequence[tuple[int, int, float]]
"""Co-selection of one MoE block: ``(e, f, p_ef)``, the probability per token that both
``e`` and ``f`` are selected, for the pairs listed (others are taken at chance level)."""


def backbone_layout(model: ModelLayout) -> ModelLayout:
    """``model`` with every MoE block's routed experts removed from its bytes and reads.

    The result is a dense layout (``experts=None``) the block planner places;
    a dense ``model`` is returned unchanged.
    """
    ex = model.experts
    if ex is None:
        return model
    sizes = list(model.block_sizes())
    reads = list(model.block_read_sizes())
    for b in ex.moe_blocks:
        sizes[b] -= ex.routed_bytes_per_block
        reads[b] -= ex.experts_per_token * ex.expert_params_bytes
        if sizes[b] < 0:
            raise InputError(
                f"block_bytes[{b}]",
                sizes[b] + ex.routed_bytes_per_block,
                f"must include the block's routed experts ({ex.routed_bytes_per_block} bytes)",
            )
        reads[b] = max(reads[b], 0)
    return replace(
        model,
        block_bytes=tuple(sizes),
        block_read_bytes=tuple(reads),
        block_params_bytes=round(sum(sizes) / model.num_blocks),
        experts=None,
    )


@dataclass(frozen=True, slots=True)
class Routing:
    """Per MoE block: selection probability per token of every expert (sums to k), pairs."""

    p: tuple[tuple[float, ...], ...]
    pairs: tuple[tuple[tuple[int, int, float], ...], ...] | None
    k: int


def token_routing(model: ModelLayout, load: ExpertLoad | None, co: CoActivation | None) -> Routing:
    """How tokens select the routed experts of ``model``'s MoE blocks (uniform without
    ``load``; co-selection counts turned into probabilities per token with ``co``)."""
    ex = model.experts
    assert ex is not None
    k, n = ex.experts_per_token, ex.num_experts
    rows = load.per_block(ex) if load is not None else ((1.0,) * n,) * len(ex.moe_blocks)
    selected: dict[tuple[float, ...], tuple[float, ...]] = {}  # blocks loaded alike share it
    p = tuple(
        selected[r] if r in selected else selected.setdefault(r, _selection(r, k)) for r in rows
    )
    pairs = None
    if co is not None:
        co_rows = co.per_block(ex)
        norm = []
        for r, prow in zip(co_rows, rows, strict=True):
            total_pairs = sum(c for _, _, c in r)
            if load is not None:
                tokens = sum(prow) / k
            else:
                tokens = total_pairs / (k * (k - 1) / 2) if k > 1 else 0.0
            scale = 1.0 / tokens if tokens > 0 else 0.0
            norm.append(tuple((e, f, min(1.0, c * scale)) for e, f, c in r))
        pairs = tuple(norm)
    return Routing(p=p, pairs=pairs, k=k)


def _selection(row: Sequence[float], k: int) -> tuple[float, ...]:
    """Per expert, the probability a token selects it: ``k`` selections shared by load."""
    total = sum(row)
    return tuple(min(1.0, k * w / total) for w in row)


# -- one MoE block ------------------------------------------------------------------------


def copy_shares(holders: list[int]) -> list[float]:
    """A replicated expert's tokens are split evenly over its copies (EPLB's convention)."""
    return [1.0 / len(holders)] * len(holders)


def node_loads(holders: Holders, w: Sequence[float], n: int) -> list[float]:
    """Per node of ``n``: the expert load (sum of ``w`` over the copies it holds)."""
    loads = [0.0] * n
    for e, hs in enumerate(holders):
        if hs:
            x = w[e] * (1.0 / len(hs))  # every copy's share of the load (copy_shares)
            for j in hs:
                loads[j] += x
    return loads


def experts_on_nodes(holders: Holders, n: int) -> list[list[int]]:
    """Per node of ``n``: the experts of one block it holds a copy of, ascending."""
    on: list[list[int]] = [[] for _ in range(n)]
    for e, hs in enumerate(holders):
        for j in hs:
            on[j].append(e)
    return on


def experts_per_node(
    blocks: Sequence[int], holders_by_block: Sequence[Holders], n: int
) -> list[list[tuple[int, tuple[int, ...]]]]:
    """Per node of ``n``: ``(block, its experts there, ascending)`` for every block of
    ``blocks`` it holds one of, in the order of ``blocks``.  Blocks sharing one list of
    holders (the same object) are read off it once."""
    per: list[list[tuple[int, tuple[int, ...]]]] = [[] for _ in range(n)]
    read: dict[int, list[tuple[int, ...]]] = {}
    for block, holders in zip(blocks, holders_by_block, strict=True):
        on = read.get(id(holders))
        if on is None:
            on = read[id(holders)] = list(map(tuple, experts_on_nodes(holders, n)))
        for mine, es in zip(per, on, strict=True):
            if es:
                mine.append((block, es))
    return per


def slowest_finish(loads: Sequence[float], speeds: Sequence[float]) -> float:
    """The largest ``load / speed`` over the nodes."""
    return max(load / s for load, s in zip(loads, speeds, strict=True))


def imbalance(holders: Holders, w: Sequence[float], speeds: Sequence[float]) -> float:
    """``max_j(load_j / speed_j) / (sum(load) / sum(speed))`` of one block (1.0: perfect)."""
    return loads_imbalance(node_loads(holders, w, len(speeds)), speeds)


def loads_imbalance(loads: Sequence[float], speeds: Sequence[float]) -> float:
    """:func:`imbalance` of a block whose :func:`node_loads` are ``loads``."""
    mean = sum(loads) / sum(speeds)
    return slowest_finish(loads, speeds) / mean if mean > 0 else 1.0


def node_reach(
    holders: Holders,
    p: Sequence[float],
    pairs: Pairs | None,
    k: int,
    n: int,
) -> list[float]:
    """Per node: the estimated probability that a token selects at least one expert there."""
    q_sum = [0.0] * n
    q_sq = [0.0] * n
    q_max = [0.0] * n
    share: dict[tuple[int, int], float] = {}
    for e, hs in enumerate(holders):
        if not hs:
            continue
        s = 1.0 / len(hs)  # every copy's share (copy_shares)
        q = p[e] * s
        for j in hs:
            q_sum[j] += q
            q_sq[j] += q * q
            if q > q_max[j]:
                q_max[j] = q
            share[(e, j)] = s
    chance = (k - 1) / k
    pair_sum = [(q_sum[j] ** 2 - q_sq[j]) / 2 * chance for j in range(n)]
    for e, f, c in pairs or ():
        excess = c - p[e] * p[f] * chance  # a listed pair's departure from chance
        for j in holders[e]:
            s_f = share.get((f, j))
            if s_f is not None:
                pair_sum[j] += excess * share[(e, j)] * s_f
    return [min(1.0, max(q_max[j], q_sum[j] - pair_sum[j])) for j in range(n)]


def block_reaches(
    all_holders: Sequence[Holders], routing: Routing, n: int
) -> tuple[list[float], ...]:
    """Per MoE block, :func:`node_reach` of its copies on ``n`` nodes: once per plan for
    the expert summary and the prediction that both read it, and once for blocks alike
    (same copies, load and pairs)."""
    seen: dict[tuple[int, int, int], list[float]] = {}
    number = ValueNumbers()
    out = []
    for li, holders in enumerate(all_holders):
        w = routing.p[li]
        pairs = routing.pairs[li] if routing.pairs is not None else None
        key = (number.holders(holders), number(w), -1 if pairs is None else number(pairs))
        if key not in seen:
            seen[key] = node_reach(holders, w, pairs, routing.k, n)
        out.append(seen[key])
    return tuple(out)


def remote_transfers(
    holders: Holders,
    p: Sequence[float],
    pairs: Pairs | None,
    k: int,
    n: int,
    home: int,
) -> float:
    """Expected distinct nodes other than ``home`` that hold the experts a token selects."""
    reach = node_reach(holders, p, pairs, k, n)
    return sum(r for j, r in enumerate(reach) if j != home)


# -- a plan's experts ---------------------------------------------------------------------


def stage_of_block(plan: Plan) -> dict[int, int]:
    """Block index -> the stage that runs it."""
    out = {}
    for a in plan.assignments:
        for b in range(*a.block_range):
            out[b] = a.stage
    return out


def nodes_in_order(plan: Plan, nodes: Sequence[NodeDescriptor]) -> list[NodeDescriptor]:
    """The planning node of every stage, in stage order: its node, or the GPU group of it
    the stage runs on (:func:`~stowplan.model.stage_node`: the group's share of the node's
    VRAM, bandwidth and FLOPs, its id ``node/gpuA-B``)."""
    by_id = {n.id: n for n in nodes}
    missing = [a.node_id for a in plan.assignments if a.node_id not in by_id]
    if missing:
        raise InputError("plan.assignments[].node_id", missing[0], "is not among the given nodes")
    return [
        stage_node(by_id[a.node_id], a.gpu_indices, a.tensor_parallel) for a in plan.assignments
    ]


def holders_of(plan: Plan, model: ModelLayout) -> tuple[Holders, ...]:
    """Per MoE block (in ``moe_blocks`` order), the stages holding each routed expert."""
    ex = model.experts
    assert ex is not None
    row = {b: i for i, b in enumerate(ex.moe_blocks)}
    n = ex.num_experts
    out: list[Holders] = [[[] for _ in range(n)] for _ in ex.moe_blocks]
    for j, a in enumerate(plan.assignments):
        for x in a.owned_experts:
            li = row.get(x.block)
            if li is None or x.expert >= n:
                raise InputError(
                    f"assignments[{a.stage}].owned_experts",
                    (x.block, x.expert),
                    "is not a routed expert of the model",
                )
            out[li][x.expert].append(j)
    for li, holders in enumerate(out):
        if all(holders):
            continue
        e = next(e for e, hs in enumerate(holders) if not hs)
        raise InputError(
            "assignments[].owned_experts",
            (ex.moe_blocks[li], e),
            "every routed expert must be owned by some stage",
        )
    return tuple(out)
