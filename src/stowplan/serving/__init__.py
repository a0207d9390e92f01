"""Serving capacity: ``serve(model, nodes, workload, constraints=None) -> ServePlan``.

The fleet is split into disjoint replicas (nodes may stay unused), each a pipeline
as :func:`~stowplan.planner.plan_blocks` plans it, each serving U* requests under
the workload's TTFT/TPOT limits and memory (:mod:`stowplan.cost.serving`):

* Step 1: nodes alike but for their id form classes; the compositions (nodes per
  class) of a replica are enumerated — all of them on small fleets; on large ones
  every single-class count, the small ones and groups of nodes that together hold
  the weights a few times over (:mod:`~stowplan.serving.compositions`) — and each
  gets its replica (:mod:`~stowplan.serving.candidates`; node lists alike but for
  ids and prices are planned once, :mod:`~stowplan.serving.reuse`); a multi-GPU
  node may also hold several replicas side by side on its GPUs (data parallel
  inside the node).  With a target, a composition every packing through which costs
  at least the cheapest packing found so far is not planned
  (:mod:`~stowplan.serving.price_cut`).  On large fleets, replicas mixing node types
  besides: each kind (nodes per type) a linear programme picks planned once, then
  moved onto groups of real nodes ranked by link and scored on their own links
  (:mod:`~stowplan.serving.kind_replicas`);
* Step 2: copies of the candidates are packed onto the fleet by an integer program
  — the most Σ U*, or, with ``users``/``rate_per_s`` set, the least $/h reaching it
  (:mod:`~stowplan.serving.packing`);
* Step 3: the certificate bounds the optimum: the same program over every
  composition's relaxation bound (:func:`~stowplan.serving.bounds.users_bound`)
  when all were enumerated, a pooled bound of the whole fleet otherwise.

A MoE model's experts stay with their blocks (the cost model's expert-touch rule
prices them).  With an engine (``constraints.calibration.engine``) every replica is
one the engine runs; vLLM runs identical replicas as one instance with
``--data-parallel-size``, unlike ones as separate instances (the plan's notes say
which).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import product

from stowplan.cost.prefill_rates import prefill_notes
from stowplan.errors import Infeasible, InputError
from stowplan.model import (
    Constraints,
    ModelLayout,
    NodeDescriptor,
    check_unique_ids,
    gpu_group_id,
)
from stowplan.plan import Plan, with_inputs
from stowplan.quantities.limits import MAX_BATCH
from stowplan.serve_plan import ReplicaPlan, ServeCertificate, ServeObjective, ServePlan
from stowplan.serving.bounds import FleetRates, fleet_users_bound, rate_bound, users_bound
from stowplan.serving.candidates import (
    Candidate,
    Split,
    grouped_candidate,
    settle,
    split_of,
    splits,
)
from stowplan.serving.compositions import compositions, grouped_compositions, node_classes
from stowplan.serving.exhaustive import best_replica_value
from stowplan.serving.kind_replicas import kind_candidates
from stowplan.serving.kinds_bound import fleet_kinds_bound
from stowplan.serving.kinds_price import fleet_kinds_price_floor
from stowplan.serving.node_groups import NodeReplicas, best_node_replicas, one_node_and_singles
from stowplan.serving.packing import bound_price, bound_users, pack_price, pack_users
from stowplan.serving.pipeline_bound import pipeline_rate_bound, pipeline_users_bound
from stowplan.serving.price_cut import TIE, ClassMemory, Pair, PriceCut, holding_front
from stowplan.serving.price_floor import price_floor
from stowplan.serving.reuse import ReplicaMemo, renamed_plan, renamed_text, repriced
from stowplan.workload import Workload

__all__ = ["BOUND_LIMIT", "COMPOSITION_LIMIT", "serve"]

COMPOSITION_LIMIT = 127
"""Every composition is tried (and the bound is over all of them) up to this many; a
fleet of 7 unlike nodes has 127."""
BOUND_LIMIT = 4095
"""Up to this many compositions (12 unlike nodes) the certificate packs every
composition's bound, though only some are planned."""


@dataclass(frozen=True, slots=True)
class _Option:
    composition: tuple[int, ...]
    candidate: Candidate
    price: float


def serve(
    model: ModelLayout | str,
    nodes: Sequence[NodeDescriptor],
    workload: Workload,
    constraints: Constraints | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> ServePlan:
    """Split ``nodes`` into replicas of ``model`` serving ``workload`` (see the module).

    ``model`` is a layout or a name :func:`~stowplan.resolve_model` knows.  Without a
    target in ``workload`` the replicas serve the most users (Σ U*); with ``users`` or
    ``rate_per_s`` they are the cheapest ($/h = Σ node ``price_per_hour``) that serve
    it.  ``constraints`` gives the headroom, the calibration (engine) and the stage
    limits; its batch and context are the workload's.  The same input always gives
    the same plan.  ``progress`` (when given) is called with (compositions tried, all
    to try) as the search goes.

    Raises:
        Infeasible: no replica serves one request within the limits, or no subset of
            the nodes serves the target (the reason gives the most it could).
        InputError: malformed arguments; a target with a node without a price.
    """
    model_spec = model
    if isinstance(model, str):
        from stowplan.models import resolve_model

        model = resolve_model(model)
    if not isinstance(model, ModelLayout):
        raise InputError("model", type(model).__name__, "must be a ModelLayout or a model name")
    if not isinstance(workload, Workload):
        raise InputError("workload", type(workload).__name__, "must be a Workload")
    nodes = list(nodes)
    if not nodes:
        raise InputError("nodes", "[]", "must hold at least one node")
    check_unique_ids(nodes)
    base = Constraints() if constraints is None else constraints
    if workload.has_target:
        unpriced = [n.id for n in nodes if n.price_per_hour is None]
        if unpriced:
            raise InputError(
                f"{unpriced[0]}.price_per_hour",
                None,
                "is needed to find the cheapest nodes for --users/--rate; give every node "
                "a price, or drop the target to serve the most users",
            )
    # Step 1: classes, compositions and the replica of each.
    classes = node_classes(nodes)
    sizes = [len(c) for c in classes]
    index = {n.id: i for i, n in enumerate(nodes)}
    rates = FleetRates.of(model, nodes, replace(base, batch=1), workload)
    combos, complete = compositions(sizes, COMPOSITION_LIMIT)
    enumerated = complete
    if not complete:
        known = set(combos)
        combos += [
            c for c in grouped_compositions(rates, classes, index, workload) if c not in known
        ]
    by_rate = workload.rate_per_s is not None
    options: dict[tuple[int, ...], _Option] = {}

    def members_of(combo: tuple[int, ...]) -> list[int]:
        return [index[n.id] for k, c in enumerate(combo) for n in classes[k][:c]]

    bounder = _Bounds(model, nodes, rates, workload, base, by_rate)
    bounds: dict[tuple[int, ...], float] = {}
    """Each composition's relaxation bound in the objective's unit (users, or requests/s
    for a rate target), its side-by-side splits included: every composition's when
    there are at most :data:`BOUND_LIMIT`, else those planned."""
    if not complete and math.prod(s + 1 for s in sizes) - 1 <= BOUND_LIMIT:
        for combo in product(*(range(s + 1) for s in sizes)):
            if any(combo):
                bounds[combo] = bounder.of(members_of(combo))[0]
        complete = True
    class_of = {n.id: k for k, cls in enumerate(classes) for n in cls}
    inside = _Inside(options, by_rate)
    memo = ReplicaMemo(model, workload, base)
    cut = _Cut.of(workload, combos, classes, index, rates, options, bounder, members_of)

    def offer(cand: Candidate) -> None:
        """``cand`` as the option of the classes it uses, unless one serves more there."""
        used = [0] * len(classes)
        for nid in cand.node_ids:
            used[class_of[nid]] += 1
        key = tuple(used)
        price = sum(nodes[index[nid]].price_per_hour or 0.0 for nid in cand.node_ids)
        old = options.get(key)
        if old is None or _value(cand, by_rate) > _value(old.candidate, by_rate):
            options[key] = _Option(composition=key, candidate=cand, price=price)
            inside.clear()

    grouped = _Grouped(model, nodes, workload, base, by_rate)
    if cut is not None:
        combos = cut.ordered(combos)
    for done, combo in enumerate(combos):
        if progress is not None:
            progress(done, len(combos))
        members = members_of(combo)
        top, ub, one, halves = bounder.of(members)
        bounds[combo] = top
        if ub < 1 and not halves:
            continue
        split_top = max((sp.bound for sp in halves), default=0.0)
        # A composition whose bound smaller replicas inside it already reach can improve
        # no answer: those replicas serve as much on a subset of its nodes.
        best_inside = inside.value(combo)
        if best_inside is not None and best_inside >= top:
            continue
        if cut is not None and cut.cuts(combo):
            continue
        if cut is not None:
            cut.planned(combo)
        cand = memo.replica([nodes[i] for i in members], ub) if ub >= 1 else None
        if one is not None and split_top > (0.0 if cand is None else _value(cand, by_rate)):
            split = split_of(
                memo.replica,
                one,
                halves,
                by_rate=by_rate,
                beat=0.0 if cand is None else _value(cand, by_rate),
            )
            cand = split or cand
        have = 0.0 if cand is None else _value(cand, by_rate)
        on = [nodes[i] for i in members]
        if one_node_and_singles(on) and top > have:
            # One multi-GPU node (with a few single-GPU nodes): every grouping of its GPUs
            # tried, offered when it serves more than the planner's replicas.
            found = grouped.of(combo, members)
            if found is not None and found.value > have:
                better = grouped_candidate(model, on, workload, base, found, by_rate=by_rate)
                if better is not None and _value(better, by_rate) > have:
                    cand = better
        if cand is not None:
            offer(cand)
    if not enumerated and options:
        # Replicas mixing node types, each kind planned once and placed on many groups.
        alone: dict[str, float] = {}
        for o in options.values():
            if len(o.candidate.node_ids) == 1:
                nid = o.candidate.node_ids[0]
                alone[nid] = max(alone.get(nid, 0.0), _value(o.candidate, by_rate))
        for cand in kind_candidates(
            model, nodes, rates, workload, base, memo.replica, alone, by_rate=by_rate
        ):
            offer(cand)
    if progress is not None:
        progress(len(combos), len(combos))
    if not options:
        raise Infeasible(
            "no replica of the nodes serves one request within "
            f"TTFT {workload.ttft_s:g} s, TPOT {workload.tpot_s:g} s and memory "
            f"({workload.context_tokens} tokens of KV per request)"
            + _why_none(rates, list(index.values()), workload)
        )
    ranked = sorted(options.values(), key=lambda o: (sum(o.composition), o.composition))
    counts = [o.composition for o in ranked]
    # Step 2: pack copies onto the fleet.
    notes: list[str] = []
    if workload.has_target:
        target = _target(workload)
        # A split option holds ``split`` copies on its node: all of them count.
        values = [_value(o.candidate, by_rate) for o in ranked]
        x, method = pack_price(counts, sizes, values, [o.price for o in ranked], target)
        if cut is not None and x is not None:
            x = cut.no_dearer(x, ranked)
        if x is None:
            most, _ = pack_users(counts, sizes, values)
            reach = sum(v * c for v, c in zip(values, most, strict=True))
            unit = "requests/s" if by_rate else "users"
            raise Infeasible(
                f"the nodes serve at most {reach:.4g} {unit} within the limits; {target:.4g} asked"
            )
        objective = ServeObjective.PRICE
    else:
        x, method = pack_users(counts, sizes, [_value(o.candidate, False) for o in ranked])
        objective = ServeObjective.USERS
    # The chosen replicas planned for their own U* (the plan's KV reserve and prediction
    # then are those of U* requests), kept when that plan serves as many.
    ranked = [
        replace(o, candidate=settle(model, o.candidate, workload, base)) if n > 0 else o
        for o, n in zip(ranked, x, strict=True)
    ]
    source = model_spec if isinstance(model_spec, str) else None
    replicas = [
        replace(
            r,
            plan=with_inputs(
                repriced(model, r.plan, nodes, r.price_per_hour, workload, base),
                model_source=source,
                nodes=nodes,
            ),
        )
        for r in _assign(ranked, x, classes, nodes)
    ]
    users = sum(r.users for r in replicas)
    rate = sum(r.requests_per_s for r in replicas)
    tokens = sum(r.tokens_per_s for r in replicas)
    price = sum(r.price_per_hour or 0.0 for r in replicas)
    used_ids = {nid for r in replicas for nid in r.node_ids}
    unused = tuple(n.id for n in nodes if n.id not in used_ids)

    # Step 3: the certificate.
    def refined_value(combo: tuple[int, ...]) -> tuple[float, str] | None:
        members = [nodes[i] for i in members_of(combo)]
        got = best_replica_value(model, members, workload, base, by_rate=by_rate)
        if got is not None:
            return got, TRIED
        found = grouped.of(combo, members_of(combo))
        if found is not None:
            return found.value, GROUPED
        top = bounds[combo]
        if by_rate:
            rate = pipeline_rate_bound(model, members, workload, base, top)
            return None if rate is None else (rate, PROGRAMMED)
        most = math.floor(top) if math.isfinite(top) else MAX_BATCH
        ub = pipeline_users_bound(model, members, workload, base, most)
        return None if ub is None else (float(ub), PROGRAMMED)

    cert = _certificate(
        objective,
        workload,
        rates,
        classes,
        index,
        bounds,
        complete,
        users,
        price,
        method,
        refined_value,
        lambda: fleet_kinds_bound(model, nodes, workload, base),
        lambda: fleet_kinds_price_floor(
            model, nodes, workload, base, _target(workload), by_rate=by_rate
        ),
    )
    notes += _engine_notes(base, ranked, x)
    notes += prefill_notes(base.calibration, [n for n in nodes if n.id in used_ids])
    usd = None
    if price > 0 and 0 < tokens < math.inf:
        usd = price / (tokens * 3600) * 1e6
    return ServePlan(
        replicas=tuple(replicas),
        users=users,
        rate_per_s=rate,
        tokens_per_s=tokens,
        price_per_hour=price,
        usd_per_million_output_tokens=usd,
        unused_nodes=unused,
        certificate=cert,
        workload=workload,
        model_name=model.name,
        notes=tuple(notes),
    )


class _Grouped:
    """Each composition's :func:`~stowplan.serving.node_groups.best_node_replicas`
    (memoised): the replicas and the certificate ask for the same ones."""

    def __init__(
        self,
        model: ModelLayout,
        nodes: Sequence[NodeDescriptor],
        w: Workload,
        c: Constraints,
        by_rate: bool,
    ) -> None:
        self._model, self._nodes, self._w, self._c = model, nodes, w, c
        self._by_rate = by_rate
        self._memo: dict[tuple[int, ...], NodeReplicas | None] = {}

    def of(self, combo: tuple[int, ...], members: Sequence[int]) -> NodeReplicas | None:
        if combo not in self._memo:
            self._memo[combo] = best_node_replicas(
                self._model,
                [self._nodes[i] for i in members],
                self._w,
                self._c,
                by_rate=self._by_rate,
            )
        return self._memo[combo]


class _Bounds:
    """Each node set's relaxation bounds (memoised): what a replica on it serves at most,
    as one pipeline and, for one multi-GPU node, as replicas side by side."""

    def __init__(
        self,
        model: ModelLayout,
        nodes: Sequence[NodeDescriptor],
        rates: FleetRates,
        w: Workload,
        c: Constraints,
        by_rate: bool,
    ) -> None:
        self._model, self._nodes, self._rates = model, nodes, rates
        self._w, self._c, self._by_rate = w, c, by_rate
        self._memo: dict[
            tuple[int, ...], tuple[float, int, NodeDescriptor | None, list[Split]]
        ] = {}

    def of(self, members: Sequence[int]) -> tuple[float, int, NodeDescriptor | None, list[Split]]:
        """(the bound in the objective's unit, the users bound of one pipeline, the node
        when ``members`` is one multi-GPU node, its splits)."""
        key = tuple(members)
        got = self._memo.get(key)
        if got is not None:
            return got
        w, rates = self._w, self._rates
        ub = users_bound(rates, members, w)
        whole = 0.0 if ub < 1 else rate_bound(rates, members, w) if self._by_rate else float(ub)
        node = self._nodes[members[0]]
        one = node if len(members) == 1 and node.num_gpus > 1 else None
        halves = (
            []
            if one is None
            else [
                sp
                for sp in splits(self._model, one, w, self._c, by_rate=self._by_rate)
                if sp.users_bound >= 1
            ]
        )
        top = max([whole, *(sp.bound for sp in halves)])
        got = (top, ub, one, halves)
        self._memo[key] = got
        return got


class _Cut:
    """For a target, the compositions :class:`~stowplan.serving.price_cut.PriceCut` rules
    out, and the cheapest packing found along the way: the pairs the rest of a packing
    may take are every option planned and the :func:`~stowplan.serving.price_cut.
    holding_front` of every composition not planned, each at most as many times as the
    fleet holds disjoint copies of its nodes."""

    def __init__(
        self,
        target: float,
        by_rate: bool,
        sizes: list[int],
        options: dict[tuple[int, ...], _Option],
        pending: dict[tuple[int, ...], list[Pair]],
        refined: Callable[[tuple[int, ...]], list[Pair]],
    ) -> None:
        self._cut = PriceCut(target, integral=not by_rate)
        self._target, self._by_rate, self._sizes = target, by_rate, sizes
        self._options = options
        self._pending = pending
        self._fronts = dict(pending)
        self._refined = refined
        self._seen: tuple[tuple[tuple[int, ...], float], ...] | None = None
        """The options when they were last packed."""
        self._covered: tuple[tuple[tuple[int, ...], float], ...] | None = None
        """The options when the covering was last built."""
        self._best: dict[tuple[int, ...], int] = {}
        self._stale = True

    @classmethod
    def of(
        cls,
        w: Workload,
        combos: Sequence[tuple[int, ...]],
        classes: Sequence[Sequence[NodeDescriptor]],
        index: dict[str, int],
        rates: FleetRates,
        options: dict[tuple[int, ...], _Option],
        bounder: _Bounds,
        members_of: Callable[[tuple[int, ...]], list[int]],
    ) -> _Cut | None:
        """The cut for ``w``'s target over ``combos``; None without a target."""
        if not w.has_target:
            return None
        memory = ClassMemory(
            prices=tuple(c[0].price_per_hour or 0.0 for c in classes),
            usable=tuple(float(rates.usable[index[c[0].id]]) for c in classes),
            weight_bytes=float(rates.weight_bytes),
            kv_per_request=float(rates.kv_per_request),
        )
        by_rate = w.rate_per_s is not None
        pending = {}
        for combo in combos:
            top = bounder.of(members_of(combo))[0]
            pairs = holding_front(combo, memory, top, users=not by_rate) if top > 0 else []
            if pairs:
                pending[combo] = pairs

        def refined(combo: tuple[int, ...]) -> list[Pair]:
            def cap(sub: tuple[int, ...]) -> float:
                members = members_of(sub)
                if by_rate:
                    return rate_bound(rates, members, w)
                return float(users_bound(rates, members, w))

            top = bounder.of(members_of(combo))[0]
            return holding_front(combo, memory, top, users=not by_rate, cap=cap)

        sizes = [len(c) for c in classes]
        return cls(_target(w), by_rate, sizes, options, pending, refined)

    def ordered(self, combos: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """``combos``: the single-class ones first, each part by its cheapest price per
        bound (a cheap incumbent early cuts more; any order is safe)."""

        def key(combo: tuple[int, ...]) -> tuple[bool, float]:
            pairs = self._fronts.get(combo)
            ratio = min((p / v for p, v in pairs), default=math.inf) if pairs else math.inf
            return (sum(1 for n in combo if n) > 1, ratio)

        return sorted(combos, key=key)

    def planned(self, combo: tuple[int, ...]) -> None:
        """``combo`` is planned: its option (if any) stands for it from now on."""
        if self._pending.pop(combo, None) is not None:
            self._stale = True

    def cuts(self, combo: tuple[int, ...]) -> bool:
        """Whether no packing through ``combo`` can cost less than the incumbent."""
        self._refresh()
        if self._beaten(self._cut.floor(self._fronts.get(combo, []))):
            return True
        # Each sub-multiset's own bound as well (dearer to find: only when needed).
        return sum(combo) > 1 and self._beaten(self._cut.floor(self._refined(combo)))

    def _beaten(self, floor: float) -> bool:
        """Whether packings costing ``floor`` are no cheaper than the incumbent — packing
        the options planned again (a programme: dear) only when it could say so: when
        ``floor`` is not below what covering the target with them costs at least."""
        if self._cut.beats(floor):
            return True
        seen = tuple((k, _value(o.candidate, self._by_rate)) for k, o in self._options.items())
        if seen == self._seen:
            return False
        pairs = [(o.price, _value(o.candidate, self._by_rate)) for o in self._options.values()]
        copies = [self._copies(k) for k in self._options]
        if floor < self._cut.least_cover(pairs, copies) * (1 - TIE):
            return False
        self._seen = seen
        self._pack()
        return self._cut.beats(floor)

    def _refresh(self) -> None:
        """The covering again when the options or the compositions not planned changed."""
        seen = tuple((k, _value(o.candidate, self._by_rate)) for k, o in self._options.items())
        if seen == self._covered and not self._stale:
            return
        self._covered = seen
        pairs = [(o.price, _value(o.candidate, self._by_rate)) for o in self._options.values()]
        copies = [self._copies(k) for k in self._options]
        for combo, ps in self._pending.items():
            pairs += ps
            copies += [self._most(combo)] * len(ps)
        self._cut.update(pairs, copies)
        self._stale = False

    def _copies(self, key: tuple[int, ...]) -> int:
        """The most copies of an option on ``key``'s nodes a packing takes: the fleet's
        disjoint sets of them."""
        return min(s // k for s, k in zip(self._sizes, key, strict=True) if k)

    def _most(self, combo: tuple[int, ...]) -> int:
        """The most copies a packing takes of the option of ``combo`` (not planned yet):
        it is on a sub-multiset of ``combo``, at least one node of one of its classes, so
        at most that class's size of them."""
        return max(s for s, k in zip(self._sizes, combo, strict=True) if k)

    def _pack(self) -> None:
        """The cheapest packing of the options planned so far: the incumbent."""
        ranked = list(self._options.values())
        values = [_value(o.candidate, self._by_rate) for o in ranked]
        prices = [o.price for o in ranked]
        counts = [o.composition for o in ranked]
        x, _ = pack_price(counts, self._sizes, values, prices, self._target)
        if x is None:
            return
        price = sum(p * n for p, n in zip(prices, x, strict=True))
        if price < self._cut.incumbent:
            self._best = {o.composition: n for o, n in zip(ranked, x, strict=True) if n}
            self._cut.found(price)

    def no_dearer(self, x: list[int], ranked: Sequence[_Option]) -> list[int]:
        """``x``, or the incumbent's packing when ``x`` costs more (the programme stops
        within its gap tolerance; the incumbent's options are still there, as good)."""
        price = sum(o.price * n for o, n in zip(ranked, x, strict=True))
        if price <= self._cut.incumbent or not self._best:
            return x
        return [self._best.get(o.composition, 0) for o in ranked]


def _why_none(rates: FleetRates, members: list[int], w: Workload) -> str:
    """What rules out every replica, by the bounds: memory, or the least one prompt's
    prefill and one decode step take on the fastest nodes."""
    if rates.memory_users(members) < 1:
        held = sum(rates.usable[i] for i in members)
        need = rates.weight_bytes + rates.kv_per_request
        return (
            f": the weights and one request's KV need {need / 1e9:.1f} GB, all nodes hold "
            f"{held / 1e9:.1f} GB usable"
        )
    t0 = min(rates.ttft0_floor([i]) for i in members)
    cyc = min(rates.cycle_floor([i]) for i in members)
    if t0 + cyc > w.ttft_s:
        return (
            f": one prompt's prefill and a decode step take at least {t0 + cyc:.3g} s on "
            f"the fastest node (TTFT {w.ttft_s:g} s)"
        )
    if cyc >= w.tpot_s:
        return f": a decode step takes at least {cyc:.3g} s on the fastest node"
    return ""


def _value(c: Candidate, by_rate: bool) -> float:
    return c.value_rate if by_rate else float(c.value_users)


class _Inside:
    """The most a packing of the candidates found so far serves within a composition
    (memoised; None when the search would visit more than :attr:`LIMIT` compositions)."""

    LIMIT = 20000

    def __init__(self, options: dict[tuple[int, ...], _Option], by_rate: bool) -> None:
        self._options = options
        self._by_rate = by_rate
        self._memo: dict[tuple[int, ...], float] = {}

    def clear(self) -> None:
        self._memo.clear()

    def value(self, v: tuple[int, ...]) -> float | None:
        got = self._best(v)
        if got is None:
            self._memo.clear()
        return got

    def _best(self, v: tuple[int, ...]) -> float | None:
        got = self._memo.get(v)
        if got is not None:
            return got
        if len(self._memo) > self.LIMIT:
            return None
        best = 0.0
        for key, opt in self._options.items():
            if all(a <= b for a, b in zip(key, v, strict=True)):
                rest = self._best(tuple(b - a for a, b in zip(key, v, strict=True)))
                if rest is None:
                    return None
                best = max(best, _value(opt.candidate, self._by_rate) + rest)
        self._memo[v] = best
        return best


def _assign(
    ranked: Sequence[_Option],
    x: Sequence[int],
    classes: Sequence[Sequence[NodeDescriptor]],
    nodes: Sequence[NodeDescriptor],
) -> list[ReplicaPlan]:
    """Each chosen copy on nodes of its own: the candidate's nodes for the first copy,
    the next free nodes of the same classes for the others (its plan renamed); a split
    candidate's copies as its replicas side by side on each node's GPU ranges."""
    free = [list(c) for c in classes]
    by_id = {n.id: n for n in nodes}
    class_of = {n.id: k for k, cls in enumerate(classes) for n in cls}
    taken: set[str] = set()
    out: list[ReplicaPlan] = []
    for opt, copies in zip(ranked, x, strict=True):
        cand = opt.candidate
        for _ in range(copies):
            # The candidate's own free nodes first, so that no other of its nodes moves
            # onto one of them.
            mapping = {
                nid: nid
                for nid in cand.node_ids
                if nid not in taken and by_id[nid] in free[class_of[nid]]
            }
            for nid in cand.node_ids:
                if nid not in mapping:
                    k = class_of[nid]
                    mapping[nid] = next(n.id for n in free[k] if n.id not in mapping.values())
            for old, new in mapping.items():
                taken.add(new)
                free[class_of[old]].remove(by_id[new])
            if cand.split > 1:
                node = by_id[mapping[cand.node_ids[0]]]
                group = node.num_gpus // cand.split
                for j in range(cand.split):
                    plan = _on_gpus(cand.plan, node.id, j * group, group)
                    out.append(_replica(plan, cand, by_id, mapping))
                continue
            out.append(_replica(renamed_plan(cand.plan, mapping), cand, by_id, mapping))
    return out


def _on_gpus(plan: Plan, node_id: str, first: int, group: int) -> Plan:
    """``plan`` (on a group of ``group`` GPUs of one node) moved to node ``node_id``'s
    GPUs from ``first`` on."""
    renames: dict[str, str] = {}
    stages = []
    for a in plan.assignments:
        start = first + (a.gpu_indices[0] if a.gpu_indices else 0)
        size = len(a.gpu_indices) or group
        renames[a.node_id] = gpu_group_id(node_id, start, size)
        # A stage on all of the group's GPUs names none: it takes them all.
        gpus = a.gpu_indices or tuple(range(size))
        stages.append(replace(a, node_id=node_id, gpu_indices=tuple(first + g for g in gpus)))
    notes = [renamed_text(n, renames) for n in plan.rationale.notes]
    return replace(
        plan, assignments=tuple(stages), rationale=replace(plan.rationale, notes=tuple(notes))
    )


def _replica(
    plan: Plan, cand: Candidate, by_id: dict[str, NodeDescriptor], mapping: dict[str, str]
) -> ReplicaPlan:
    s = cand.serving
    prices = [by_id[mapping[nid]].price_per_hour for nid in cand.node_ids]
    price = (
        None
        if any(p is None for p in prices)
        else float(sum(p or 0.0 for p in prices)) / cand.split
    )
    return ReplicaPlan(
        plan=plan,
        users=s.users,
        ttft_s=s.ttft_s,
        tpot_s=s.tpot_s,
        prefill_s=s.prefill_s,
        tokens_per_s=s.tokens_per_s,
        requests_per_s=s.requests_per_s,
        binding=s.binding,
        price_per_hour=price,
    )


def _certificate(
    objective: ServeObjective,
    w: Workload,
    rates: FleetRates,
    classes: Sequence[Sequence[NodeDescriptor]],
    index: dict[str, int],
    bounds: dict[tuple[int, ...], float],
    complete: bool,
    users: int,
    price: float,
    method: str,
    refined_value: Callable[[tuple[int, ...]], tuple[float, str] | None],
    kinds: Callable[[], float | None],
    kinds_price: Callable[[], float | None],
) -> ServeCertificate:
    """The certificate: the packing of every composition's bound (when all are known),
    the compositions it packs refined where they are a few single-GPU nodes or one
    multi-GPU node (``refined_value``: every pipeline tried, every grouping of the
    node's GPUs tried, or the bound of a subset programme over
    their pipelines, :mod:`~stowplan.serving.pipeline_bound`) and packed again, until
    it packs only those it cannot refine or already did; else the least of the pooled
    bound of the whole fleet and the programme over replica kinds (``kinds``,
    :func:`~stowplan.serving.kinds_bound.fleet_kinds_bound`); for a price, the larger of
    the pooled floor (:func:`~stowplan.serving.price_floor.price_floor`) and the
    programme over replica kinds (``kinds_price``,
    :func:`~stowplan.serving.kinds_price.fleet_kinds_price_floor`), both lower bounds."""
    sizes = [len(c) for c in classes]
    bounds = dict(bounds)
    refined: set[tuple[int, ...]] = set()
    ways: set[str] = set()
    """How the bounds of the compositions packed were refined (:data:`TRIED`,
    :data:`PROGRAMMED`)."""
    how = "every composition's relaxation bound, packed"

    def packed() -> tuple[float, Sequence[float]] | None:
        combos = [c for c, b in bounds.items() if b > 0]
        if objective is ServeObjective.USERS:
            got = bound_users(combos, sizes, [bounds[c] for c in combos])
        else:
            prices = [
                sum(classes[k][0].price_per_hour or 0.0 for k, m in enumerate(c) for _ in range(m))
                for c in combos
            ]
            got = bound_price(combos, sizes, [bounds[c] for c in combos], prices, _target(w))
        if got is None:
            return None
        used = [c for c, v in zip(combos, got[1], strict=False) if v > 1e-9]
        fresh = False
        for c in used:
            if c in refined:
                continue
            refined.add(c)
            refinement = refined_value(c)
            if refinement is None:
                continue
            value, way = refinement
            ways.add(way)
            if value < bounds[c]:
                bounds[c], fresh = value, True
        return packed() if fresh and len(refined) < REFINE_LIMIT else got

    found = packed() if complete else None
    if found is not None and ways:
        how = (
            "every composition's relaxation bound, packed (those of few nodes "
            f"it packs: {' or '.join(sorted(ways, key=(TRIED, GROUPED, PROGRAMMED).index))})"
        )
    if objective is ServeObjective.USERS:
        bound = None if found is None else found[0]
        if bound is None:
            gpus = sum(n.num_gpus for cls in classes for n in cls)
            bound = fleet_users_bound(rates, list(index.values()), w, gpus)
            how = "pooled memory and prefill/decode floors of the whole fleet"
            by_kind = kinds()
            if by_kind is not None and by_kind < bound:
                bound = by_kind
                how = "a linear programme over replica kinds (nodes per type)"
        bound = max(bound, float(users))
        gap = (bound - users) / bound if bound > 0 else 0.0
        return ServeCertificate(
            objective=objective,
            value=float(users),
            bound=bound,
            gap=gap,
            exact=gap == 0.0,
            method=f"{method}; bound: {how}",
        )
    low = None if found is None else found[0]
    if found is None:
        prices = [0.0] * len(index)
        for n in (n for cls in classes for n in cls):
            prices[index[n.id]] = n.price_per_hour or 0.0
        low = price_floor(rates, prices, w, _target(w), by_rate=w.rate_per_s is not None)
        how = (
            "none (the fleet is too large to enumerate)"
            if low is None
            else "a linear programme over the nodes' pooled bandwidth, prefill speed and "
            "memory, and each replica's leading GPU group"
        )
        by_kind = kinds_price()
        if by_kind is not None and math.isfinite(by_kind) and (low is None or by_kind > low):
            low = by_kind
            how = "a linear programme over replica kinds (nodes per type) and the nodes rented"
    if low is None or not math.isfinite(low):
        low = 0.0 if low is None else price
    low = min(low, price)
    gap = (price - low) / price if price > 0 else 0.0
    return ServeCertificate(
        objective=objective,
        value=price,
        bound=low,
        gap=gap,
        exact=gap == 0.0,
        method=f"{method}; bound: {how}",
    )


REFINE_LIMIT = 64
"""Most compositions the certificate refines."""

TRIED = "every pipeline tried"
"""A composition's value found by trying every pipeline on it (exact)."""

GROUPED = "every GPU grouping and pipeline of its groups tried"
"""A multi-GPU node's value found by trying every grouping of its GPUs, every pipeline
of the groups and every split into replicas side by side
(:func:`~stowplan.serving.node_groups.best_node_replicas`; exact)."""

PROGRAMMED = "TPOT and TTFT bounded by a subset programme"
"""A composition's users or requests/s bounded by
:func:`~stowplan.serving.pipeline_bound.pipeline_users_bound` or
:func:`~stowplan.serving.pipeline_bound.pipeline_rate_bound`."""


def _target(w: Workload) -> float:
    """The workload's target: its requests/s when set, else its users."""
    if w.rate_per_s is not None:
        return w.rate_per_s
    return float(w.users or 0)


def _engine_notes(c: Constraints, ranked: Sequence[_Option], x: Sequence[int]) -> list[str]:
    """How an engine runs the replicas: identical ones as one data-parallel instance
    (vLLM, SGLang), unlike ones as separate instances."""
    copies = sum(n * o.candidate.split for o, n in zip(ranked, x, strict=True))
    if copies <= 1:
        return []
    engine = c.calibration.engine.value if c.calibration is not None else None
    alike = sum(1 for n in x if n > 0) == 1
    if engine == "vllm" and alike:
        return [
            f"vLLM: the {copies} identical replicas run as one instance with "
            f"--data-parallel-size {copies}"
        ]
    if engine == "sglang" and alike:
        return [
            f"SGLang: the {copies} identical replicas run as one instance with --dp-size {copies}"
        ]
    if alike:
        return [f"the {copies} replicas are identical: an engine's data parallelism runs them"]
    return [f"the {copies} replicas are unlike: each runs as an engine instance of its own"]
