"""Turning a pipeline into a Plan with its prediction and certificate."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace

from stowplan.cost import CostModel, microbatches
from stowplan.errors import DependencyError
from stowplan.model import Constraints, Metric, Strategy
from stowplan.plan import Certificate, Plan, PlanRationale, Prediction, Topology
from stowplan.planner.baselines.peers import BASELINES, RECENT
from stowplan.planner.exact.pipelines import Optimum, solve_exact, solve_milp
from stowplan.planner.exact.trip import TRIP_BOUND_NODES, coupled_cycle_bound, trip_bound
from stowplan.planner.problem import Problem, build_assignments
from stowplan.planner.strategies import cycle
from stowplan.planner.strategies.fractional import fractional_bound, heavy_fractional_bound
from stowplan.planner.strategies.latency import ends_split
from stowplan.planner.strategies.throughput import Pipeline, relaxed_bottleneck
from stowplan.planner.tiebreak import settle

__all__ = [
    "INLINE_EXACT_NODES",
    "INLINE_EXACT_WORK",
    "INLINE_MILP_NODES",
    "INLINE_MILP_SECONDS",
    "SKETCHED",
    "backbones",
    "certificate",
    "finish",
    "is_backbone",
    "is_probing",
    "is_sketching",
    "key_of",
    "kv_capacity_note",
    "objective_of",
    "pick_best",
    "prediction_note",
    "probing",
    "replaced_note",
    "searching_in_full",
    "sketching",
]

INLINE_EXACT_NODES = 5
"""Up to this many nodes every plan is certified by the exact subset DP."""
INLINE_EXACT_WORK = 1_000_000
"""Above :data:`INLINE_EXACT_NODES`, the DP still certifies inline while its work
``2**n · n · (blocks + 1)**2`` stays within this (about 5 ms: 8B up to 7 nodes,
3B up to 7); beyond, a bound does."""


def _inline_exact(n: int, num_blocks: int) -> bool:
    return n <= INLINE_EXACT_NODES or (2**n) * n * (num_blocks + 1) ** 2 <= INLINE_EXACT_WORK


def objective_of(constraints: Constraints, strategy: Strategy | None = None) -> Metric:
    """The :class:`Metric`: what the strategy optimises, else what the workload needs.

    Both rank pipelines by the cycle (:func:`stowplan.cost.cycle_seconds`); they differ in
    the unit the certificate is stated in and in the searches a strategy runs."""
    if strategy is Strategy.LATENCY:
        return Metric.LATENCY
    if strategy is Strategy.THROUGHPUT:
        return Metric.THROUGHPUT
    return Metric.LATENCY if constraints.batch == 1 else Metric.THROUGHPUT


def key_of(
    cm: CostModel, objective: Metric, p: Pipeline
) -> tuple[float, float, int, tuple[int, ...]]:
    """How pipelines rank: the cycle (per-sequence time per token; U / tokens/s), then the
    slowest stage, fewer stages, node ids (``objective`` says which search asks)."""
    return cycle.rank_key(cm, p)


def pick_best(
    problem: Problem, cm: CostModel, objective: Metric, found: Pipeline | None
) -> Pipeline | None:
    """The best of ``found`` and every peer rule's plan, by ``objective`` (never worse than
    one; ``found`` where they tie, then the rules in their order)."""
    best, best_key = found, None if found is None else key_of(cm, objective, found)
    for p, k in _peer_plans(problem, cm, objective):
        if best_key is None or k < best_key:
            best, best_key = (list(p[0]), list(p[1])), k
    return best


_Ranked = list[tuple[Pipeline, tuple[float, float, int, tuple[int, ...]]]]
"""Pipelines with their :func:`key_of`."""

_PEERS: list[tuple[Problem, CostModel, _Ranked]] = []
"""The last :data:`~stowplan.planner.baselines.peers.RECENT` problems' peer plans, with
their keys: the searches of one stage count ask twice (once per search), on the same
problem and cost model."""


def _peer_plans(problem: Problem, cm: CostModel, objective: Metric) -> _Ranked:
    """Every peer rule's plan within the stage limits, in the rules' order, with its key
    (kept for the last few problems and cost models, by identity)."""
    for held, view, plans in _PEERS:
        if held is problem and view is cm:
            return plans
    plans = []
    for rule in BASELINES.values():
        p = rule(problem, cm)
        if p is not None and problem.min_stages <= len(p[0]) <= problem.max_stages:
            plans.append((p, key_of(cm, objective, p)))
    _PEERS.insert(0, (problem, cm, plans))
    del _PEERS[RECENT:]
    return plans


def inline_optimum(
    problem: Problem,
    cm: CostModel,
    objective: Metric,
    value: float = math.inf,
    searched: cycle.Searched | None = None,
) -> Optimum:
    """The least cycle (seconds): exact on clusters of up to :data:`INLINE_EXACT_NODES`, else
    a bound.  ``value``: the cycle of the plan being certified (skips needless solves);
    ``searched``: :func:`~stowplan.planner.strategies.cycle.optimum`'s search of the stage
    count holding the least bound."""
    if cm.batch == 1:
        opt = replace(solver_optimum(problem, cm, Metric.LATENCY), objective=objective)
        if (
            searched is None
            or opt.exact
            or value <= opt.value * (1 + cycle.REFINED_GAP)
            or is_backbone()  # its experts are placed after: a faster backbone may not be
        ):
            return opt
        return _counts_searched(problem, cm, opt, value, searched)
    n, nb = len(cm.nodes), cm.num_blocks
    exact = n <= INLINE_EXACT_NODES and (2**n) * n * n * (nb + 1) ** 2 <= 5 * INLINE_EXACT_WORK
    return cycle.optimum(
        problem,
        cm,
        objective,
        solver_optimum,
        value,
        exact=exact,
        tighten=knapsack_optimum,
        whole=True,
        outright=trip_optimum,
        searched=searched,
        coupled=coupled_cycle_bound,
        reshaped=not is_backbone(),  # its experts are placed after, as above
    )


def _counts_searched(
    problem: Problem, cm: CostModel, opt: Optimum, value: float, searched: cycle.Searched
) -> Optimum:
    """``opt`` (one stream's bound) on up to
    :data:`~stowplan.planner.strategies.cycle.COUNT_SEARCH_NODES` nodes, raised to the
    least knapsack bound (:func:`~stowplan.planner.exact.trip.trip_bound`) of the ranges of
    stage counts between the ladder's counts (together they hold every count allowed),
    with a pipeline faster than the plan's ``value`` where a search held to one of those
    ranges finds one: the ranges bounded below the plan, least bound first, at most
    :data:`~stowplan.planner.strategies.cycle.SEARCHED_FURTHER` of them.

    The search of one stream chooses its nodes by local moves from the fewest stages that
    hold the model; where links differ by tens of milliseconds, more stages on nodes of
    shorter links can be faster, and a search held to that count finds them
    (deepseek-r1 on 24 WAN nodes: 6 stages at 4.68 tokens/s, 8 held at 5.26).  Where
    blocks are alike the MILP hands over its optimum and this is not needed; where they
    differ its pipeline is not the plan's (its blocks are sized as the smallest).  Where
    blocks differ and the best in hand is still more than 1 % above the bound, the exact
    split with each kind of node at either end
    (:func:`~stowplan.planner.strategies.latency.ends_split`) is a candidate too (on
    those nodes, 7 stages at 5.51)."""
    if len(cm.nodes) > cycle.COUNT_SEARCH_NODES:
        return opt
    held = {
        (first, last): replace(problem, min_stages=first, max_stages=last)
        for first, last in cycle.count_ranges(cycle.ladder(problem, 1))
    }
    bounds: dict[tuple[int, int], float] = {}
    for span, within in held.items():
        got = trip_bound(within, cm)
        if got is None:
            return opt  # no bound for some range: the least of the others bounds nothing
        bounds[span] = got
    best, least, held_to = opt.pipeline, value, ""
    for first, last in sorted(bounds, key=lambda r: (bounds[r], r))[: cycle.SEARCHED_FURTHER]:
        if bounds[(first, last)] >= least:
            break
        found = searched(held[(first, last)], cm)
        if found is not None and cm.fits_pipeline(*found):
            found = cycle.relocated(cm, found)  # as the plan's own search hands it on
            if (got := cm.evaluate(*found).cycle_s) < least * (1 - 1e-9):
                best, least = found, got
                counts = f"{first}" if first == last else f"{first}–{last}"
                held_to = f"a search held to {counts} stages (a range of counts bounded below it)"
    lower = max(opt.value, min(bounds.values()))
    if not cm.uniform and least > lower * (1 + cycle.REFINED_GAP):
        ends = ends_split(cm, problem.min_stages, problem.max_stages)
        if ends is not None and (ends_s := cm.evaluate(*ends).cycle_s) < least * (1 - 1e-9):
            best, least = ends, ends_s
            held_to = cycle.ENDS_FOUND_BY
    if lower > opt.value * (1 + 1e-12):
        opt = replace(opt, value=lower, method=f"bound: {KNAPSACK}, per range of stage counts")
    return opt if best is opt.pipeline else replace(opt, pipeline=best, found_by=held_to)


OUTRIGHT_MILP_NODES = 16
"""Most nodes on which :func:`trip_optimum` runs the MILP for one stage count: beyond,
its time limit is mostly spent without a proof, on every plan of several sequences."""


def trip_optimum(problem: Problem, cm: CostModel) -> Optimum | None:
    """The least time per token of ``problem``'s pipelines by the MILP, with its pipeline,
    on up to :data:`OUTRIGHT_MILP_NODES` nodes within :data:`INLINE_MILP_SECONDS`; None
    beyond, or without the solver."""
    if len(cm.nodes) > OUTRIGHT_MILP_NODES:
        return None
    try:
        return solve_milp(problem, cm, Metric.LATENCY, time_limit_s=INLINE_MILP_SECONDS)
    except DependencyError:
        return None


def knapsack_optimum(problem: Problem, cm: CostModel) -> Optimum | None:
    """The knapsack bound on time per token (:func:`~stowplan.planner.exact.trip.trip_bound`)
    as an :class:`Optimum`; None where it is not computed."""
    value = trip_bound(problem, cm)
    if value is None:
        return None
    return Optimum(objective=Metric.LATENCY, value=value, exact=False, method=f"bound: {KNAPSACK}")


def solver_optimum(problem: Problem, cm: CostModel, objective: Metric) -> Optimum:
    """The optimum of a solver objective at ``cm``'s microbatch (``latency``: time per
    token; ``throughput``: the slowest stage), exact on small clusters, else a bound.

    One stream's time per token on up to :data:`INLINE_MILP_NODES` nodes: the MILP within
    :data:`INLINE_MILP_SECONDS` — its optimum (with its pipeline) when it proves one,
    else the larger of its dual bound and the fractional relaxation."""

    def fluid() -> Optimum:
        # The relaxation's figures are kept per cost model: a certificate bounds many
        # stage counts on the few models of their microbatches.
        value = fractional_bound(problem, cm, objective)
        method = "bound: fractional relaxation (blocks flow to the fastest VRAM)"
        # The heaviest blocks' relaxation where the trip knapsack is solved as well:
        # beyond, its figures over every node added a tenth to deepseek-v3's plan of 16
        # sequences on 1,024 nodes, whose certificate is refined only to 1 %.
        heavy = (
            None
            if len(cm.nodes) > TRIP_BOUND_NODES
            else heavy_fractional_bound(problem, cm, objective)
        )
        if heavy is not None and heavy > value:
            value, method = heavy, f"bound: {HEAVIEST}"
        if objective is Metric.LATENCY and cm.batch == 1:  # several: cycle.optimum tightens
            knapsack = trip_bound(problem, cm)
            if knapsack is not None and knapsack > value:
                value, method = knapsack, f"bound: {KNAPSACK}"
        if objective is Metric.THROUGHPUT:
            relaxed = relaxed_bottleneck(problem, cm, value)
            if relaxed is not None and relaxed > value:
                value, method = relaxed, f"bound: {CAPACITIES}"
        return Optimum(objective=objective, value=value, exact=False, method=method)

    try:
        n = len(cm.nodes)
        if _inline_exact(n, cm.num_blocks):
            return solve_exact(problem, cm, objective)
        if objective is not Metric.LATENCY or cm.batch > 1 or n > INLINE_MILP_NODES:
            return fluid()  # the MILP certifies one stream only: per stage count it costs too much
        got = solve_milp(problem, cm, objective, time_limit_s=INLINE_MILP_SECONDS)
    except DependencyError:
        return fluid()
    if got.exact:
        return got  # the relaxation is needed only beside a dual bound
    relaxed = fluid()
    return got if got.value >= relaxed.value else relaxed


HEAVIEST = "fractional relaxation of the heaviest blocks alone (blocks differ in memory)"
"""How :func:`~stowplan.planner.strategies.fractional.heavy_fractional_bound` is named
where it is above the relaxation of every block."""

KNAPSACK = "a knapsack of the nodes' blocks and hops (each node pays the hop of its own stage)"
"""How the time-per-token bound of :func:`~stowplan.planner.exact.trip.trip_bound` is
named where it is above the fractional relaxation."""

CAPACITIES = "the nodes' whole-block capacities within a slowest stage (blocks alike)"
"""How the slowest-stage bound of
:func:`~stowplan.planner.strategies.throughput.relaxed_bottleneck` is named where it is
above the fractional relaxation."""

INLINE_MILP_NODES = 64
"""Up to this many nodes a one-stream plan is certified by the MILP (beyond the subset
DP's reach), which also hands over its pipeline when it is better."""
INLINE_MILP_SECONDS = 0.15
"""The MILP's time limit inline: past it, its dual bound is the certificate's."""


def certificate(
    problem: Problem,
    cm: CostModel,
    objective: Metric,
    p: Pipeline,
    optimum_s: float | None = None,
    exact: bool = False,
    method: str = "",
) -> Certificate:
    """How far ``p`` is from the optimum of ``objective`` (computed here unless given)."""
    ev = cm.evaluate(*p)
    if optimum_s is None:
        opt = inline_optimum(problem, cm, objective, ev.cycle_s)
        optimum_s, exact, method = opt.value, opt.exact, opt.method
    if objective == Metric.LATENCY:
        value = ev.time_per_token_s
        bound = min(optimum_s, value)
        ratio = bound / value if value > 0 else 1.0
    else:
        value = ev.tokens_per_s
        bound = cm.batch / optimum_s if optimum_s > 0 else math.inf
        bound = max(bound, value)
        ratio = value / bound if bound > 0 and math.isfinite(bound) else 1.0
    return Certificate(
        objective=objective,
        value=value,
        bound=bound,
        exact=exact,
        gap=_gap(ratio),
        method=method,
    )


def _notes(
    problem: Problem, cm: CostModel, p: Pipeline, pred: Prediction, cert: Certificate
) -> list[str]:
    order, bounds = p
    n = len(order)
    out = []
    for s, d in enumerate(order):
        used = cm.stage_bytes(bounds[s], bounds[s + 1], s == 0, s == n - 1)
        usable = cm.usable[d]
        out.append(
            f"stage {s} on {cm.nodes[d].id}: {pred.stage_time_s[s] * 1e3:.2f} ms/step, "
            f"VRAM {used / usable:.1%} of usable"
            if usable
            else f"stage {s}: no usable VRAM"
        )
    out.append(prediction_note(pred, n))
    out.append(kv_capacity_note(pred, problem.constraints.context_tokens))
    unit = "s/token" if cert.objective == Metric.LATENCY else "tokens/s"
    # A gap that rounds to 0.00 % without a proof reads as what it is.
    gap = "< 0.01%" if not cert.exact and 0 < cert.gap < 5e-5 else f"{cert.gap:.2%}"
    out.append(
        f"certificate ({cert.objective}): {cert.value:.6g} {unit} vs "
        f"{'optimum' if cert.exact else 'bound'} {cert.bound:.6g}, gap {gap} "
        f"[{cert.method}]"
    )
    if pred.assumed:
        out.append(f"{len(pred.assumed)} input(s) assumed from the spec table (see prediction)")
    return out


def kv_capacity_note(pred: Prediction, context_tokens: int | None, where: str = "") -> str:
    """The KV room of the tightest stage, and how much of it the reserve takes."""
    cap = pred.kv_capacity_tokens
    if cap is None:
        return "KV capacity unknown: the layout has no KV-cache figure"
    text = f"KV capacity {cap:,} tokens (tightest stage{where})"
    if not context_tokens:
        return text
    held = context_tokens * pred.batch
    seqs = f"{pred.batch} sequences" if pred.batch > 1 else "1 sequence"
    return text + f": the {context_tokens:,}-token reserve × {seqs} and {cap - held:,} more"


def prediction_note(pred: Prediction, num_stages: int) -> str:
    """What the prediction means for the user, in the workload's own terms."""
    slowest = pred.stage_time_s[pred.bottleneck_stage] * 1e3
    cycle_ms = pred.time_per_token_s * 1e3
    if pred.batch == 1:
        one = 1.0 / pred.time_per_token_s if pred.time_per_token_s > 0 else math.inf
        text = f"predicted: {one:.2f} tokens/s for one stream ({cycle_ms:.2f} ms/token)"
    else:
        m, b = microbatches(pred.batch, num_stages)
        each = 1.0 / pred.time_per_token_s if pred.time_per_token_s > 0 else math.inf
        text = (
            f"predicted: {pred.tokens_per_s:.2f} tokens/s for {pred.batch} concurrent "
            f"sequences, {each:.2f} tokens/s each ({cycle_ms:.2f} ms/token; "
            f"{m} microbatch{'es' if m > 1 else ''} of {b}, bottleneck stage "
            f"{pred.bottleneck_stage} at {slowest:.2f} ms/step)"
        )
    if pred.cost_per_hour is not None:
        text += f"; ${pred.cost_per_hour:.2f}/h"
        if pred.usd_per_million_tokens is not None:
            text += f", ${pred.usd_per_million_tokens:.2f} per million tokens"
    return text


@contextmanager
def _holding(*flags: tuple[ContextVar[bool], bool]) -> Iterator[None]:
    """Each ``(flag, value)`` set for the plans made inside, and put back after (in the
    reverse order)."""
    tokens = [(flag, flag.set(value)) for flag, value in flags]
    try:
        yield
    finally:
        for flag, token in reversed(tokens):
            flag.reset(token)


_BACKBONE: ContextVar[bool] = ContextVar("stowplan_planner_backbone", default=False)


@contextmanager
def backbones() -> Iterator[None]:
    """Plans made inside are a MoE model's backbone, whose experts are placed after: the
    plan with experts carries no certificate, so work spent only to certify the backbone
    (:mod:`stowplan.planner.tensor.every_layout`) is not done."""
    with _holding((_BACKBONE, True)):
        yield


def is_backbone() -> bool:
    """Whether plans made now are :func:`backbones`."""
    return _BACKBONE.get()


_SKETCH: ContextVar[bool] = ContextVar("stowplan_planner_sketch", default=False)

SKETCHED = "not computed: a candidate the wider search certifies"
"""The method of a :func:`sketching` plan's certificate."""


@contextmanager
def sketching() -> Iterator[None]:
    """Plans finished inside are candidates a wider search compares and then certifies
    itself: :func:`finish` skips their own optimum solve (their certificate says it is
    not computed)."""
    with _holding((_SKETCH, True)):
        yield


def is_sketching() -> bool:
    """Whether plans finished now are :func:`sketching` candidates."""
    return _SKETCH.get()


_FIGURE: ContextVar[bool] = ContextVar("stowplan_planner_figure", default=False)


@contextmanager
def figuring() -> Iterator[None]:
    """Plans made inside are only a figure in another plan's notes (the expert-parallel
    alternative beside a block-local plan): :func:`sketching` ones, whose search over GPU
    groups runs the exact joint solve only where its work, counted once per microbatch
    it may solve, is affordable (a figure of many sequences on eight nodes of small
    blocks took seconds)."""
    with _holding((_FIGURE, True), (_SKETCH, True)):
        yield


def is_figuring() -> bool:
    """Whether plans made now are :func:`figuring` ones."""
    return _FIGURE.get()


_PRICED: ContextVar[bool] = ContextVar("stowplan_planner_priced", default=False)


@contextmanager
def pricing() -> Iterator[None]:
    """Plans made inside are node sets of the cheapest-set search, whose plan is priced
    by the nodes it uses: their stages keep the nodes the search gave them (a node of
    better network, :func:`~stowplan.planner.strategies.upgrade.upgraded`, may cost
    more)."""
    with _holding((_PRICED, True)):
        yield


def is_pricing() -> bool:
    """Whether plans made now are :func:`pricing` ones."""
    return _PRICED.get()


_PROBE: ContextVar[bool] = ContextVar("stowplan_planner_probe", default=False)


@contextmanager
def probing() -> Iterator[None]:
    """Plans made inside answer only whether a plan exists (a context or a batch tried
    for a refusal): as in :func:`sketching`, and every search stops at the first
    pipeline it finds, which nothing refines or ranks (the peer rules, the stage counts
    beyond, the swaps and splits again, the ties).  A plan is found inside exactly when
    one is found outside: a search gives up inside only where it gives up outside.
    Not for a search that ranks what it finds against a target (the cost objective)."""
    with _holding((_PROBE, True), (_SKETCH, True)):
        yield


def is_probing() -> bool:
    """Whether plans made now are :func:`probing` ones."""
    return _PROBE.get()


@contextmanager
def searching_in_full() -> Iterator[None]:
    """Plans made inside search in full again (sketched, inside a probe): for a step of a
    probe whose outcome depends on which pipeline is found, not only on whether one is
    (the expert-parallel backbone, whose nodes must also hold the experts)."""
    with _holding((_PROBE, False)):
        yield


def finish(
    problem: Problem,
    cm: CostModel,
    strategy: Strategy,
    p: Pipeline,
    notes: Sequence[str] = (),
    optimum: object | None = None,
    adopt_optimum: bool = False,
    break_ties: bool = True,
    searched: cycle.Searched | None = None,
) -> Plan:
    """The Plan of pipeline ``p`` with its prediction, certificate and notes.

    With ``adopt_optimum``, when the optimum computed for the certificate
    comes with a pipeline better than ``p``, that pipeline is the plan (a
    note says so): a plan is never slower than an optimum already in hand.

    With ``break_ties`` (every strategy but balance-by-VRAM, which splits by
    memory, not by speed), the plan is the one :func:`~stowplan.planner.tiebreak.settle`
    chooses among ``p``, the optimum's pipeline and their rebalanced splits: within
    0.1 % of the best cycle known, the most KV room, then balanced memory (not inside
    :func:`probing`: a probe's pipeline is not ranked).

    ``searched``: the strategy's search of one stage count, which the optimum runs where
    a count it cannot solve holds the least bound (:func:`inline_optimum`).
    """

    before = after = 0.0
    objective = objective_of(problem.constraints, strategy)
    if isinstance(optimum, Optimum):
        opt = optimum
    elif _SKETCH.get():
        opt = Optimum(
            objective=objective,
            value=0.0,
            exact=False,
            method=SKETCHED,
        )
    else:
        opt = inline_optimum(problem, cm, objective, cm.evaluate(*p).cycle_s, searched)
    if (
        adopt_optimum
        and opt.pipeline is not None
        and key_of(cm, objective, opt.pipeline) < key_of(cm, objective, p)
    ):
        before = cm.evaluate(*p).cycle_s
        p = opt.pipeline
        after = cm.evaluate(*p).cycle_s
    if adopt_optimum and opt.pipeline is p and after < before * (1 - 1e-9):
        # Only a better value is news; an equal one won on a tie-break.
        by = opt.found_by or f"the exact solve ({opt.method})"
        notes = (*notes, replaced_note(by, f"{strategy.value} heuristic", after, before))
    if break_ties and strategy is not Strategy.BALANCE_BY_VRAM and not _PROBE.get():
        candidates = [p] if opt.pipeline is None or opt.pipeline == p else [p, opt.pipeline]
        p = settle(cm, candidates, opt.value if opt.exact else math.inf)
    order, bounds = p
    cert = certificate(problem, cm, objective, p, opt.value, opt.exact, opt.method)
    pred = cm.prediction(order, bounds)
    assignments = build_assignments(problem, [cm.nodes[d].id for d in order], bounds)
    return Plan(
        topology=Topology.PipelineChain(len(order)),
        assignments=assignments,
        rationale=PlanRationale(
            strategy=strategy.value,
            notes=(*notes, *_notes(problem, cm, p, pred, cert)),
            prediction=pred,
            certificate=cert,
        ),
        model_name=problem.model.name,
        num_blocks=problem.model.num_blocks,
        context_tokens=problem.constraints.context_tokens,
    )


def replaced_note(by: str, than: str, after: float, before: float) -> str:
    """The note of a plan whose pipeline ``by`` found, better than ``than``'s (their
    cycles ``after`` and ``before``, seconds)."""
    return (
        f"{by} found a better pipeline than the {than} ({after:.6g} vs {before:.6g} "
        "s per token per sequence): it is the plan"
    )


def _gap(ratio: float) -> float:
    """``1 − ratio``, with float noise (a few ulps, as when the plan is the optimum
    evaluated in another order) shown as the 0 it is."""
    gap = 1.0 - ratio
    return 0.0 if gap < 1e-12 else gap
