"""One plan per kind of node list: replicas reused under other node ids, repriced.

Nodes that differ only in their ids and prices (and, for a replica on one node, its
network link, which no stage crosses) get the same replica plan:
:class:`ReplicaMemo` plans each kind once and renames the plan for the next;
:func:`repriced` gives a reused plan its own rent.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from stowplan.cost.serving import serving_constraints
from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.plan import Plan
from stowplan.serving.candidates import Candidate, replica_of, scored
from stowplan.serving.compositions import class_key
from stowplan.workload import Workload

__all__ = ["ReplicaMemo", "moved", "renamed_plan", "renamed_text", "repriced"]


def _plan_key(n: NodeDescriptor, alone: bool) -> tuple[object, ...]:
    """What a replica's plan reads of a node: every figure but its id and price (and,
    for a replica on this node ``alone``, its network link, which no stage crosses)."""
    if alone:
        return class_key(replace(n, price_per_hour=None, link_mbps=1.0, link_latency_ms=0.0))
    return class_key(replace(n, price_per_hour=None))


class ReplicaMemo:
    """:func:`replica_of` once per kind of node list: nodes that differ only in their
    ids, prices (and, alone, their network link) get the same plan, renamed.  A plan
    reused on nodes of other prices carries the first nodes' $/h in its prediction
    until :func:`repriced`."""

    def __init__(self, model: ModelLayout, w: Workload, c: Constraints) -> None:
        self._model, self._w, self._c = model, w, c
        self._seen: dict[tuple[object, ...], tuple[Candidate | None, tuple[str, ...]]] = {}

    def replica(self, nodes: Sequence[NodeDescriptor], start_users: int) -> Candidate | None:
        alone = len(nodes) == 1
        key = (start_users, *(_plan_key(n, alone) for n in nodes))
        ids = tuple(n.id for n in nodes)
        hit = self._seen.get(key)
        if hit is None:
            got = replica_of(self._model, nodes, self._w, self._c, start_users)
            self._seen[key] = (got, ids)
            return got
        cand, first = hit
        if cand is None or first == ids:
            return cand
        return _renamed_candidate(cand, dict(zip(first, ids, strict=True)), nodes)


def renamed_text(text: str, mapping: dict[str, str]) -> str:
    """``text`` with every node id of ``mapping`` (a whole id, not part of a longer one)
    replaced at once by its new id."""
    changed = {k: v for k, v in mapping.items() if k != v}
    if not changed:
        return text
    alternatives = "|".join(re.escape(k) for k in sorted(changed, key=len, reverse=True))
    pattern = rf"(?<![\w./-])(?:{alternatives})(?![\w./-])"
    return re.sub(pattern, lambda m: changed[m.group(0)], text)


def renamed_plan(plan: Plan, mapping: dict[str, str]) -> Plan:
    """``plan`` with node ``k`` of it now ``mapping[k]``, in its stages and notes."""
    if all(k == v for k, v in mapping.items()):
        return plan
    stages = tuple(replace(a, node_id=mapping[a.node_id]) for a in plan.assignments)
    notes = tuple(renamed_text(text, mapping) for text in plan.rationale.notes)
    return replace(plan, assignments=stages, rationale=replace(plan.rationale, notes=notes))


def _renamed_candidate(
    cand: Candidate, mapping: dict[str, str], nodes: Sequence[NodeDescriptor]
) -> Candidate:
    """``cand`` on ``nodes``, node ``k`` of it now ``mapping[k]``."""
    plan = renamed_plan(cand.plan, mapping)
    by_id = {n.id: n for n in nodes}
    ids = tuple(mapping[i] for i in cand.node_ids)
    return replace(cand, plan=plan, node_ids=ids, nodes=tuple(by_id[i] for i in ids))


def moved(
    model: ModelLayout,
    cand: Candidate,
    nodes: Sequence[NodeDescriptor],
    w: Workload,
    c: Constraints,
) -> Candidate:
    """``cand``'s plan on ``nodes`` (``cand.node_ids[k]`` now ``nodes[k]``, a node of the
    same type: alike but for its id, price and network link), what it serves scored
    again on them — their own links, so the replica's TTFT/TPOT are those of the nodes
    it runs on — and marked :attr:`~stowplan.serving.candidates.Candidate.reused`."""
    ids = tuple(n.id for n in nodes)
    if ids == cand.node_ids:
        return cand
    plan = renamed_plan(cand.plan, dict(zip(cand.node_ids, ids, strict=True)))
    return replace(
        cand,
        plan=plan,
        serving=scored(model, plan, nodes, w, c),
        node_ids=ids,
        nodes=tuple(nodes),
        settled=False,
        reused=True,
    )


def repriced(
    model: ModelLayout,
    plan: Plan,
    nodes: Sequence[NodeDescriptor],
    rent: float | None,
    w: Workload,
    c: Constraints,
) -> Plan:
    """``plan`` with its prediction's rent ($/h, $ per million tokens) ``rent``: the
    replica's share of its nodes (a plan :class:`ReplicaMemo` reused was predicted on
    nodes of other prices; replicas side by side on one node share its rent)."""
    from stowplan.cost.predict import predict
    from stowplan.planner.certify import prediction_note

    pred = plan.rationale.prediction
    if pred is None or rent == pred.cost_per_hour:
        return plan
    fresh = predict(model, nodes, replace(serving_constraints(w, c), batch=pred.batch), plan)
    usd = fresh.usd_per_million_tokens
    if rent is not None and fresh.cost_per_hour and usd is not None:
        usd = usd * rent / fresh.cost_per_hour
    fresh = replace(
        fresh, cost_per_hour=rent, usd_per_million_tokens=usd, calibration=pred.calibration
    )
    old_note = prediction_note(pred, len(plan.assignments))
    new_note = prediction_note(fresh, len(plan.assignments))
    notes = tuple(new_note if n == old_note else n for n in plan.rationale.notes)
    return replace(plan, rationale=replace(plan.rationale, prediction=fresh, notes=notes))
