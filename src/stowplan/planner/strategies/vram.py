"""Seed 000 §6 (V1): balance-by-vram.

Fewest stages that fit, anchors at the ends, blocks split in proportion to the
VRAM each node has left.  Deliberately blind to speed: the ``latency`` and
``throughput`` strategies account for it.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from stowplan.errors import Infeasible
from stowplan.plan import Plan, PlanRationale, StageAssignment, Topology
from stowplan.planner.problem import Problem, build_assignments
from stowplan.quantities.units import format_bytes

__all__ = ["STRATEGY", "plan_balance_by_vram", "proportional_split"]

STRATEGY = "balance-by-vram"


def proportional_split(problem: Problem, caps: Sequence[int]) -> list[int] | None:
    """Contiguous block boundaries with stage bytes proportional to ``caps``.

    Every stage gets at least one block and at most ``caps[s]`` bytes.  Each
    boundary is the one closest to its proportional target among those that
    keep the stage within its capacity and leave the rest placeable.  Returns
    None when no such split exists.
    """
    n = len(caps)
    nb = problem.model.num_blocks
    prefix = problem.prefix
    total = prefix[-1]
    cap_total = sum(caps)
    if cap_total < total or n > nb or min(caps) < 0:
        return None
    suffix_cap = [0] * (n + 1)
    for s in range(n - 1, -1, -1):
        suffix_cap[s] = suffix_cap[s + 1] + caps[s]
    bounds = [0]
    target = 0.0
    for s in range(n - 1):
        target += total * caps[s] / cap_total if cap_total else 0.0  # no room: an empty model
        lo_b = bounds[-1] + 1
        hi_b = nb - (n - 1 - s)
        best: int | None = None
        for b in range(lo_b, hi_b + 1):
            if prefix[b] - prefix[bounds[-1]] > caps[s]:
                break
            if total - prefix[b] > suffix_cap[s + 1]:
                continue
            if best is None or abs(prefix[b] - target) < abs(prefix[best] - target):
                best = b
        if best is None:
            return None
        bounds.append(best)
    bounds.append(nb)
    if prefix[nb] - prefix[bounds[-2]] > caps[-1]:
        return None
    return bounds


def _chain_order(problem: Problem, chosen: Sequence[str]) -> list[str] | None:
    """Seed §6 steps 4–5: interior nodes ascending by VRAM, anchors at the two big ends."""
    if len(chosen) == 1:
        return list(chosen)
    asc = sorted(chosen, key=lambda i: (problem.usable[i], i))
    a, b = asc[-2], asc[-1]
    embed = problem.model.embed_params_bytes
    head = problem.model.head_params_bytes
    # Stage 0 on the smaller end node that can hold the embed; the head on the other end.
    first, last = (a, b) if problem.usable[a] >= embed else (b, a)
    if problem.usable[first] < embed or problem.usable[last] < head:
        first, last = last, first
        if problem.usable[first] < embed or problem.usable[last] < head:
            return None
    return [first, *asc[:-2], last]


def plan_balance_by_vram(problem: Problem) -> Plan:
    """Seed §6 steps 1–6 on a prepared problem."""
    # Only the first ``max_stages`` are ever chosen (``nsmallest`` is that prefix).
    ranked = heapq.nsmallest(
        max(problem.max_stages, 0), problem.nodes, key=lambda n: (-problem.usable[n.id], n.id)
    )
    total = problem.total_bytes
    notes: list[str] = []
    for n in range(problem.min_stages, problem.max_stages + 1):
        chosen = [node.id for node in ranked[:n]]
        available = sum(problem.usable[i] for i in chosen)
        if available < total:
            continue
        order = _chain_order(problem, chosen)
        if order is None:
            continue
        caps = [
            problem.stage_capacity(node_id, s == 0, s == n - 1) for s, node_id in enumerate(order)
        ]
        bounds = proportional_split(problem, caps)
        if bounds is None:
            notes.append(
                f"N={n}: usable VRAM {format_bytes(available)} >= model {format_bytes(total)} "
                "but no contiguous split at block granularity fits; trying N+1"
            )
            continue
        assignments = build_assignments(problem, order, bounds)
        notes.insert(
            0,
            f"N={n}: the smallest number of stages in [{problem.min_stages}, "
            f"{problem.max_stages}] whose usable VRAM ({format_bytes(available)}, headroom "
            f"{problem.constraints.headroom:.0%}) holds the model ({format_bytes(total)})",
        )
        notes.extend(_utilisation_notes(problem, assignments))
        return Plan(
            topology=Topology.PipelineChain(n),
            assignments=assignments,
            rationale=PlanRationale(strategy=STRATEGY, notes=tuple(notes)),
            model_name=problem.model.name,
            num_blocks=problem.model.num_blocks,
            context_tokens=problem.constraints.context_tokens,
        )
    raise Infeasible(
        f"no N in [{problem.min_stages}, {problem.max_stages}] gives a contiguous split that "
        f"fits: model needs {total} bytes"
    )


def _utilisation_notes(problem: Problem, assignments: Sequence[object]) -> list[str]:

    if problem.groups:
        names = {problem.parent(n.id): n.gpu_name for n in problem.nodes}
    else:  # every node is its own physical node
        names = {n.id: n.gpu_name for n in problem.nodes}
    out = []
    tight = None
    for a in assignments:
        assert isinstance(a, StageAssignment)
        usable = a.usable_vram_bytes or 0
        util = a.estimated_vram_bytes / usable if usable else 1.0
        anchors = "+".join(
            x for x, owned in (("embed", a.owns_embed), ("head", a.owns_head)) if owned
        )
        out.append(
            f"stage {a.stage} on {a.node_id} ({names[a.node_id]}): blocks "
            f"[{a.block_range[0]}, {a.block_range[1]}) = {a.num_blocks}"
            f"{' + ' + anchors if anchors else ''}, {format_bytes(a.estimated_vram_bytes)} of "
            f"{format_bytes(usable)} usable ({util:.1%}), slack {1 - util:.1%}"
        )
        if tight is None or util > tight[1]:
            tight = (a.stage, util)
    if tight is not None:
        out.append(f"tightest stage: {tight[0]} at {tight[1]:.1%} of usable VRAM")
    return out
