"""A lower bound on the trip (time per token at one microbatch) of every pipeline of two
stages or more, by a knapsack over the nodes that ties each node's hop to the blocks it
holds.

A stage of ``k`` blocks on node ``d`` takes at least ``k · r_d`` (``r_d`` the smallest
block's seconds there, its block cost included) plus the node's fixed stage cost, its
hop out (the network's latency; the in-host one where another GPU group of the same node
may be next) and, unless it is the last stage, its transfer out. The last stage also
reads the head: it takes at least each of ``(k · read + head) / BW`` and ``(k · weights
+ head) · s/FLOP`` (each plus the block costs; ``read`` and ``weights`` the smallest
block's), the larger of the two where it is larger at every ``k`` it may hold; else the
knapsack takes the largest of their least costs and that of ``k · r_d + head · min(1/BW,
s/FLOP)`` (``max(a + c, b + d) ≥ max(a, b) + min(c, d)``). An interior stage holds at
most the most consecutive blocks the node's memory fits, the first at most the blocks
from 0 that fit beside the embed, the last at most those up to the end that fit beside
the head. So every pipeline's trip is at least the least cost of choosing nodes — one
first stage, one last, between the problem's fewest and most stages in all — and a whole
number of blocks on each, covering every block: a knapsack solved exactly over block
counts (and stage counts, up to :data:`COUNTED_STAGES` or the fewest stages the problem
allows, whichever is more; a pipeline of more stages counts as that many), node by node.
The fractional relaxation (:func:`~stowplan.planner.exact.pipelines.fluid_bound`)
instead pays the cheapest hops of any nodes beside the fastest nodes' blocks; this one
pays the hops of the nodes that hold the blocks, which is what the optimum pays on slow
links.

The knapsack runs over the nodes that can hold its optimum
(:func:`~stowplan.planner.exact.trip_nodes.useful`: of each kind of node, the few of least
hop that a solution in hand leaves room for), which gives its least cost over every node.

Held within a time ``T`` per stage (each node holding only the blocks that run within
``T`` in each role), the knapsack bounds the trip of the pipelines whose slowest stage
is at most ``T``; bisected on ``T`` against ``m × T`` it bounds their cycle
(:func:`coupled_cycle_bound`), and its solution, read back, is a pipeline to try.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

from stowplan.cost import CostModel
from stowplan.planner.exact.trip_nodes import Figures, heaviest, node_figures, useful
from stowplan.planner.problem import Problem
from stowplan.planner.strategies.memo import PerModel
from stowplan.planner.strategies.throughput import Pipeline

__all__ = [
    "COUNTED_STAGES",
    "TRIP_BOUND_NODES",
    "capped_trip_bound",
    "coupled_cycle_bound",
    "trip_bound",
]

TRIP_BOUND_NODES = 64
"""Up to this many nodes (``n · blocks²`` work) the knapsack is solved."""

COUNTED_STAGES = 12
"""The knapsack counts stages up to this many, or up to the fewest the problem allows
where those are more (more count as that many): where the problem's stage limits bind,
pipelines of too few or too many stages are left out.  Counting only up to this many, a
range of 16 stages or more would pay the hops of 12."""


Limits = tuple[bool, bool, int, bool, int]
"""What the knapsack reads of a problem's stage limits (:func:`_limits`)."""


def trip_bound(problem: Problem, cm: CostModel) -> float | None:
    """A lower bound on the trip (seconds) of every pipeline ``problem`` allows on
    ``cm``'s nodes at its microbatch: the least single stage's time, or the knapsack of
    the module for two stages or more, whichever is less (inf: no pipeline holds every
    block); None past :data:`TRIP_BOUND_NODES` nodes or without numpy."""
    # The bound depends on the problem only through its limits: the ranges of stage
    # counts a certificate refines (16–31, 16–23, 16–19, … at one microbatch) mostly
    # share them.
    key = _limits(problem, cm)
    if key is None:
        return None
    kept = _kept(cm)
    if key not in kept:
        kept[key] = _trip_bound(cm, key)
    return kept[key]


_kept: PerModel[dict[Limits, float | None]] = PerModel(lambda cm: {})
"""The bounds computed per cost model, by what they depend on."""

_figures: PerModel[list[Figures]] = PerModel(node_figures)
"""What the knapsack reads of each node, per cost model (every bound and cap reads it)."""


Roles = dict[int, tuple[bool, bool, bool]]
"""Per node, whether it may be an interior, first and last stage holding none of the
blocks a knapsack counts."""

Light = dict[int, tuple[float, float, float]]
"""Per node, the least seconds such a stage pays for each other block it holds (one at
the least) as an interior or first stage, and as the last stage with the head; and what
a first stage holding some of the blocks counted pays at the least for the others before
the first of them (it holds them all)."""


def _heavy_figures(cm: CostModel) -> tuple[int, list[Figures], Roles, Light] | None:
    kept = heaviest(cm)
    if kept is None:
        return None
    every, nb = _figures(cm), cm.num_blocks
    heavy = node_figures(cm, kept)
    # Sought where some node holds a smaller share of the heaviest blocks than of every
    # block (its widest window counts small blocks); elsewhere the small blocks are not
    # what loosens the knapsack of every block, and this one is not solved.
    if all(h.inner * nb >= f.inner * len(kept) for h, f in zip(heavy, every, strict=True)):
        return None
    roles = {f.node: (f.inner > 0, f.lead > 0, f.tail > 0) for f in every}
    # A stage holding none of the heaviest holds another block: one at the least, at the
    # least seconds of any block (the knapsack of every block charges as much).  A first
    # stage holding some holds the blocks before the first of them too (:func:`_added`).
    first = kept[0]
    read = cm.read_prefix[first] + cm.kv_prefix[first]
    weights = cm.read_prefix[first]
    light = {
        f.node: (f.rate, _stage_cost(cm, f, "last", 1), _added(f, read, weights, first))
        for f in every
    }
    return len(kept), heavy, roles, light


_heavy: PerModel[tuple[int, list[Figures], Roles, Light] | None] = PerModel(_heavy_figures)
"""Per cost model whose blocks differ in memory, the count of its heaviest blocks, what
the knapsack over them alone reads of each node, the roles each node may take
holding none of them and what it pays there for the others (None where blocks are
alike)."""


def capped_trip_bound(problem: Problem, cm: CostModel, cap: float) -> float | None:
    """:func:`trip_bound` of the pipelines whose every stage takes at most ``cap`` seconds
    (inf: none holds every block): a stage of ``k`` blocks on node ``d`` takes at least
    ``k · r_d`` plus the node's fixed stage cost, and but for the last its transfer out,
    the last the least its head adds, so each node holds at most the blocks that fit
    within ``cap`` in each role. It never falls as ``cap`` falls. None where
    :func:`trip_bound` is."""
    limits = _limits(problem, cm)
    return None if limits is None else _trip_bound(cm, limits, cap)


def _limits(problem: Problem, cm: CostModel) -> Limits | None:
    """What :func:`_trip_bound` reads of ``problem``'s stage limits (None past
    :data:`TRIP_BOUND_NODES`)."""
    n = len(cm.nodes)
    if n > TRIP_BOUND_NODES:
        return None
    fewest, most = max(2, problem.min_stages), min(problem.max_stages, n)
    # Stages are counted only where a limit binds: c = 0 .. top, top standing for ``top``
    # stages or more unless ``most`` is ``top``.
    top = min(most, max(COUNTED_STAGES, fewest)) if (fewest > 2 or most < n) else 0
    return (
        problem.min_stages <= 1,
        n < 2 or problem.max_stages < 2,
        top,
        top < most,
        min(fewest, top),
    )


COUPLED_STEPS = 12
"""Most knapsacks :func:`coupled_cycle_bound` solves (one at the ceiling, then a bisection)."""


def coupled_cycle_bound(
    problem: Problem, cm: CostModel, m: int, floor: float, ceiling: float, short: float = 0.0
) -> tuple[float, Pipeline | None] | None:
    """A lower bound on the cycle ``max(m · slowest, trip)`` of every pipeline ``problem``
    allows (``cm`` at a microbatch no larger than theirs), between ``floor`` (a bound in
    hand) and ``ceiling`` (a cycle in hand: reaching it proves that cycle least), and a
    candidate pipeline: the knapsack solution at the least ``T`` found with ``m · T ≥
    L(T)``, laid out (:func:`_layout`; None where it does not read back or the bound
    reaches the ceiling).

    The least trip with every stage within ``T``, ``L(T)`` (:func:`capped_trip_bound`),
    never grows with ``T`` while ``m · T`` does, so the ``T`` at or above which ``m · T ≥
    L(T)`` holds form an interval from some ``T*``: a pipeline whose slowest stage is
    ``S`` has a cycle of at least ``m · S`` when ``S ≥ T*`` and at least ``L(S) > m · S``
    up to ``m · T*`` when ``S < T*``, so every cycle is at least ``m · T*``. A bisection
    keeps a ``T`` below ``T*`` (``m · T < L(T)``) and bounds by ``m`` times it (``floor``
    where none is found above it); where the test fails at ``T``, ``T*`` is at most
    ``L(T) / m`` and the upper end moves down to it.  With ``short``, the bisection stops
    once ``m`` times its upper end falls below it, with ``m`` times its lower end and no
    pipeline: where blocks are alike the upper end bounds ``T*``, so the bound cannot
    reach ``short`` (where they differ it is the heaviest blocks' ``T*``, and the whole
    bisection may end above it).  None where the knapsack is not solved."""
    limits = _limits(problem, cm)
    if limits is None or m < 1 or not (0 <= floor < ceiling < math.inf):
        return None
    lo, hi = floor / m, ceiling / m
    # Every knapsack of every block here is laid out as it is solved: the one at the upper
    # end is not solved again.  Where blocks are alike each is every block's; where they
    # differ, every block's is solved where the heaviest blocks' is within ``enough``.
    whole = _heavy(cm) is None
    laid_at: dict[float, tuple[float, Pipeline | None] | None] = {}

    def trip_within(cap: float, enough: float) -> float | None:
        got = _solution(cm, *limits, cap, layout=True, enough=enough)
        if whole or (got is not None and got[0] <= enough):
            laid_at[cap] = got
        return None if got is None else got[0]

    # The bisection keeps its lower end wherever the test holds: where it holds at the
    # least upper end the steps reach from the floor's share, it holds at every T above
    # (L never grows with T), every step keeps the lower end, and only that end's
    # knapsack need be solved (the floor was the bound: its pipeline is laid out there).
    end = hi
    for _ in range(COUPLED_STEPS - 1):
        if (end - lo) * m <= _COUPLED_PRECISION * ceiling:
            break
        end = (lo + end) / 2
    kept = end < hi and (at_end := trip_within(end, m * end)) is not None and m * end >= at_end
    if not kept:
        # (Where the test holds at ``end`` the trip within the ceiling's share is at most
        # m · end, below the ceiling: that knapsack need not be solved.)
        top = trip_within(hi, ceiling)
        if top is None:
            return None
        if top > ceiling:
            return ceiling, None  # every stage within the ceiling's share leaves the trip above it
    # Where the test fails at ``mid``, T* is at most ``L(mid) / m`` (L there is at most
    # L(mid), which is m times it), and the upper end moves down to it.  Where the
    # heaviest blocks' knapsack stood for L (above m · mid) that holds of theirs alone:
    # the layout at the upper end solves L whole, and where the test fails there after
    # all, that end becomes the lower one and the bisection goes on above it.
    ceiling_share, steps, laid = hi, 0, None
    if kept:
        hi = end  # the layout there passes the test: the first round ends at it
    for _ in range(_COUPLED_ROUNDS):
        while not kept and steps < COUPLED_STEPS - 1:
            if (hi - lo) * m <= _COUPLED_PRECISION * ceiling:
                break
            steps += 1
            mid = (lo + hi) / 2
            trip = trip_within(mid, m * mid)
            if trip is None:
                return None
            if m * mid < trip:
                lo, hi = mid, min(hi, trip / m)
            else:
                hi = mid
            if m * hi < short:
                return max(floor, m * lo), None
        laid = laid_at[hi] if hi in laid_at else _solution(cm, *limits, hi, layout=True)
        # (Within rounding of L(mid) / m the test holds: m times it is L(mid).)
        if laid is None or m * hi >= laid[0] * (1 - 1e-12) or hi >= ceiling_share:
            break
        lo, hi = hi, min(ceiling_share, laid[0] / m)
    return max(floor, m * lo), None if laid is None else laid[1]


_COUPLED_ROUNDS = 3
"""Most layouts :func:`coupled_cycle_bound` checks its upper end by (the bisection goes on
above an end the heaviest blocks alone passed but every block does not)."""

_COUPLED_PRECISION = 1e-4
"""The bisection stops once it pins ``m · T*`` within this share of the ceiling."""


def _capped(cm: CostModel, f: Figures, cap: float, nb: int, lead: float = 0.0) -> Figures:
    """``f`` with each role holding at most the blocks (of ``nb`` counted) a stage of at
    most ``cap`` seconds holds on its node (:func:`_within`), the first stage paying
    ``lead`` seconds besides."""
    fixed = cm.stage_s[f.node]
    inner = _within(f, cap - fixed - f.out, nb)
    return f._replace(
        inner=min(f.inner, inner),
        lead=min(f.lead, inner if lead == 0 else _within(f, cap - fixed - f.out - lead, nb)),
        tail=min(f.tail, _within(f, cap - fixed - f.least_head, nb)),
    )


def _within(f: Figures, spare: float, nb: int) -> int:
    """The most blocks (of ``nb`` counted) at ``f``'s block seconds within ``spare``
    seconds: a whole number, rounded up past float error (never fewer)."""
    if spare < 0:
        return 0
    if f.rate <= 0:
        return nb
    return math.floor(spare / f.rate * (1 + 1e-9) + 1e-9)


def _trip_bound(
    cm: CostModel, limits: Limits, cap: float = math.inf, enough: float = math.inf
) -> float | None:
    """:func:`trip_bound` of pipelines within ``limits``, every stage within ``cap``
    seconds (:func:`_solution`'s bound; a bound above ``enough`` may stand for a larger
    one)."""
    got = _solution(cm, *limits, cap, enough=enough)
    return None if got is None else got[0]


def _solution(
    cm: CostModel,
    alone: bool,
    one_stage: bool,
    top: int,
    open_top: bool,
    lowest: int,
    cap: float,
    layout: bool = False,
    enough: float = math.inf,
) -> tuple[float, Pipeline | None] | None:
    """The bound of pipelines of one stage where ``alone``, of two or more unless
    ``one_stage``, counted up to ``top`` (``open_top``: that many or more) from
    ``lowest``, every stage within ``cap`` seconds; with ``layout`` also the pipeline its
    least knapsack solution stands for (:func:`_layout`; None where a single stage or
    nothing gives the bound).  Where blocks differ in memory, the knapsack over the
    heaviest blocks alone bounds too (a stage's room holds fewer of them than its widest
    window of blocks): the larger of the two is the bound, the heaviest blocks' first;
    where that one is above ``enough`` (a caller asking only whether the bound passes
    it), it stands for both, and nothing is laid out."""
    n, nb = len(cm.nodes), cm.num_blocks
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with the exact extra
        return None
    single = math.inf
    if alone:
        for d in range(n):
            if cm.fits(d, 0, nb, True, True):
                alone_s = cm.stage_time(d, 0, nb, True, True)
                if alone_s <= cap:
                    single = min(single, alone_s)
    if one_stage:
        return single, None
    args = (top, open_top, lowest, cap)
    heavy, value, layers = _heavy(cm), 0.0, None
    if heavy is not None:
        count, figures, roles, light = heavy
        # Where the others all lie before the heaviest (dense blocks, then MoE ones), the
        # stages holding none of the heaviest hold only some of those: they are the first
        # ones, at most as many as those blocks.
        ahead = nb - count if _suffix(cm) else 0
        value = _least_knapsack(
            np, cm, figures, count, single, *args, empty=roles, light=light, ahead=ahead
        )[0]
    if value <= enough:
        every, layers = _least_knapsack(np, cm, _figures(cm), nb, single, *args, layout=layout)
        value = max(value, every)
    if value >= single or not math.isfinite(value):
        return single, None
    if not layout or layers is None:
        return value, None
    of, tables = layers
    return value, _layout(cm, of, tables, _counts(top, lowest), top, open_top)


def _counts(top: int, lowest: int) -> list[int]:
    """The stage counts the knapsack's least is read at (0: not counted)."""
    return list(range(lowest, top + 1)) if top else [0]


def _least_knapsack(
    np: Any,
    cm: CostModel,
    figures: list[Figures],
    nb: int,
    single: float,
    top: int,
    open_top: bool,
    lowest: int,
    cap: float,
    layout: bool = False,
    empty: Roles | None = None,
    light: Light | None = None,
    ahead: int = 0,
) -> tuple[float, tuple[list[Figures], list[Any]] | None]:
    """The least knapsack of ``nb`` blocks over ``figures``' nodes (inf: none holds them
    all), and with ``layout`` the nodes and tables of that solution; ``single`` (the
    least one-stage pipeline's seconds) where it is less.  With ``empty``, a node may
    also take each role it allows there holding none of the blocks counted, paying
    ``light`` for the others it holds where given; with ``ahead`` (``ahead`` blocks not
    counted lie before those counted, and no others) only as one of the first ``k``
    stages, k at most ``ahead``, each on a node of its own, and each of those blocks on
    a node: on those stages, or beside the blocks counted on the stage after them
    (:func:`_knapsack`, :func:`_dense`)."""
    if math.isfinite(cap):
        capped = (
            _capped(cm, f, cap, nb, 0.0 if light is None else light[f.node][2]) for f in figures
        )
        figures = [
            f
            for f in capped
            if max(f.inner, f.lead, f.tail) > 0 or (empty is not None and any(empty[f.node]))
        ]
        if not figures:
            return single, None
    if _most_held(figures, top if top and not open_top else len(figures)) < nb:
        return single, None  # no pipeline of two stages or more holds every block
    counts = _counts(top, lowest)
    hollow = ahead if empty is not None and light is not None else 0
    dense = _dense(cm, figures, hollow, cap) if hollow > 1 else None

    solved: dict[tuple[int, ...], tuple[float, list[Figures], list[Any]]] = {}
    """Per set of nodes: its least, the nodes, and (with ``layout``) its tables."""

    def least(of: list[Figures]) -> float:
        nodes = tuple(f.node for f in of)
        if nodes not in solved:
            layers: list[Any] = []
            kept = layers if layout else None
            g = _knapsack(np, cm, of, nb, top, open_top, kept, empty, light, hollow, dense)
            solved[nodes] = (float(g[-1, 1, counts, nb].min()), of, layers)
        return min(single, solved[nodes][0])

    least(useful(figures, nb, max(2, lowest), least, empty))
    # The least of the knapsacks solved: where the nodes kept hold an optimum, theirs;
    # where the one in hand was below every solution, it is a bound itself.
    value, of, layers = min(solved.values(), key=lambda got: got[0])
    if value >= single or not math.isfinite(value):
        return single, None
    return value, (of, layers) if layout else None


Dense = dict[int, tuple[tuple[float, int, int], ...]]
"""Per node, for x = 1, 2, … up to one fewer than the blocks before those counted: the
least seconds x of them add to a stage there beside blocks counted, and the most blocks
counted such a stage holds beside them (within the cap) as an interior and as the last
stage."""


def _dense(cm: CostModel, figures: list[Figures], ahead: int, cap: float) -> Dense:
    """:data:`Dense` of ``figures``' nodes, the first ``ahead`` blocks not counted: x of
    them add at least :func:`_added` of x times their least reads and weights, and a
    stage within ``cap`` holding them holds as many blocks counted as the time left
    allows (:func:`_within`; its figures' interior and last counts at most)."""
    rp, kp, nb = cm.read_prefix, cm.kv_prefix, cm.num_blocks
    read = min(rp[i + 1] - rp[i] + kp[i + 1] - kp[i] for i in range(ahead))
    weights = min(rp[i + 1] - rp[i] for i in range(ahead))
    out: Dense = {}
    for f in figures:
        fixed, row = cm.stage_s[f.node], []
        for x in range(1, ahead):
            added = _added(f, x * read, x * weights, x)
            inner, tail = f.inner, f.tail
            if math.isfinite(cap):
                inner = min(inner, _within(f, cap - fixed - f.out - added, nb))
                tail = min(tail, _within(f, cap - fixed - f.least_head - added, nb))
            row.append((added, inner, tail))
        out[f.node] = tuple(row)
    return out


def _added(f: Figures, read: float, weights: float, blocks: int) -> float:
    """The least seconds ``blocks`` blocks reading ``read`` bytes (``weights`` of them
    weights) add to a stage on ``f``'s node beside others.  A stage takes the larger of
    its reads and its FLOPs: their reads where no block's FLOPs there take longer than
    its reads (the reads then decide every stage there, and add up), else the lesser of
    their reads and their FLOPs (the larger of two sums grows by at least the lesser of
    what each gains); their block costs besides."""
    added = read * f.inv_bw
    if f.flop_s > f.inv_bw:
        added = min(added, weights * f.flop_s)
    return added + blocks * f.block_s


def _heaviest_last(cm: CostModel) -> bool:
    """Whether the heaviest blocks are the last ones, every other before them."""
    kept = heaviest(cm)
    return kept is not None and kept == tuple(range(cm.num_blocks - len(kept), cm.num_blocks))


_suffix: PerModel[bool] = PerModel(_heaviest_last)
"""Per cost model, :func:`_heaviest_last`."""


def _most_held(figures: list[Figures], most: int) -> int:
    """At least the most blocks a pipeline of two to ``most`` stages on ``figures``'
    nodes holds: the most a first stage holds, the most a last one does and the most of
    the ``most − 2`` interior stages that hold the most."""
    if not figures or most < 2:
        return 0
    inner = sorted((f.inner for f in figures), reverse=True)[: most - 2]
    return max(f.lead for f in figures) + max(f.tail for f in figures) + sum(inner)


def _layout(
    cm: CostModel,
    figures: list[Figures],
    layers: list[Any],
    counts: list[int],
    top: int,
    open_top: bool,
) -> Pipeline | None:
    """The pipeline of a least knapsack solution: its table after each node
    (``layers``) read backwards for the node's role and blocks where the node changed
    the entry, the first stage first, the interior stages in node order, the last last
    (None where the solution does not read back: a last stage costed as the largest of
    three least costs may match no one block count)."""
    nb = cm.num_blocks
    end = layers[-1]
    c = counts[min(range(len(counts)), key=lambda i: float(end[1, 1, counts[i], nb]))]
    first, last = 1, 1
    left = nb
    taken: list[tuple[str, int, int]] = []
    for i in range(len(figures) - 1, -1, -1):
        before, now = layers[i], layers[i + 1]
        value = float(now[first, last, c, left])
        if float(before[first, last, c, left]) == value:
            continue  # the node not taken
        f = figures[i]
        prior = [0] if top == 0 else [c - 1] * (c >= 1) + [top] * (c == top and open_top)
        roles = [("inner", first, last, f.inner, f.hop + f.out)]
        if first:
            roles.append(("first", 0, last, f.lead, f.hop + f.out))
        if last:
            roles.append(("last", first, 0, f.tail, f.hop))
        best: tuple[float, str, int, int, int, int] | None = None
        for role, pf, pl, most, paid in roles:
            for pc in prior:
                for k in range(1, min(most, left) + 1):
                    base = float(before[pf, pl, pc, left - k])
                    if not math.isfinite(base):
                        continue
                    miss = abs(base + _stage_cost(cm, f, role, k) + paid - value)
                    if best is None or miss < best[0]:
                        best = (miss, role, pf, pl, pc, k)
        if best is None or best[0] > 1e-9 * max(value, 1e-12):
            return None
        _, role, first, last, c, k = best
        left -= k
        taken.append((role, f.node, k))
    if left or first or last:
        return None
    taken.reverse()
    ordered = sorted(taken, key=lambda t: {"first": 0, "inner": 1, "last": 2}[t[0]])
    order, bounds = [d for _, d, _ in ordered], [0]
    for _, _, k in ordered:
        bounds.append(bounds[-1] + k)
    return order, bounds


def _stage_cost(cm: CostModel, f: Figures, role: str, k: int) -> float:
    """What the knapsack charges ``k`` blocks in ``role`` on ``f``'s node, its hop and
    transfer apart."""
    if role != "last":
        return k * f.rate
    leading = _leading_piece(f)
    if leading is not None:
        r, c = leading
        return r * k + c
    return max(k * f.rate + cm.head * min(f.inv_bw, f.flop_s), *(r * k + c for r, c in f.pieces))


def _leading_piece(f: Figures) -> tuple[float, float] | None:
    """The last stage's cost on ``f``'s node by its reads or by its FLOPs, whichever is
    the larger at one block and at ``f.tail`` (both linear: then at every count between,
    and it is the cost); None where neither is."""
    ends = [[r * k + c for r, c in f.pieces] for k in (1, f.tail)]
    lead = [i for i in (0, 1) if all(e[i] >= e[1 - i] for e in ends)]
    return f.pieces[lead[0]] if lead else None


def _knapsack(
    np: Any,
    cm: CostModel,
    figures: list[Figures],
    nb: int,
    top: int,
    open_top: bool,
    layers: list[Any] | None = None,
    empty: Roles | None = None,
    light: Light | None = None,
    hollow: int = 0,
    dense: Dense | None = None,
) -> Any:
    """g[f, l, c, j]: the least cost of j of the ``nb`` blocks counted on the c nodes of
    ``figures`` taken, f: the first stage among them (blocks [0, k) beside the embed), l:
    the last (blocks [nb - k, nb) beside the head); every other node an interior stage.
    ``layers``, where given, gets the table before the first node and after each;
    ``empty``, where given, the roles each node may take holding none of them, and
    ``light`` what such a stage pays for the other blocks it holds.  With ``hollow`` (h),
    such stages are the first ``k`` of the pipeline (1 ≤ k ≤ h: the h blocks not counted
    lie before the others), each on a node of its own, and f also counts how many of
    those h blocks stand on nodes taken, d: row d with none first yet (d < h), row h − 1 +
    d with the first taken (d ≥ 1; its last row, every one of them placed, is the whole
    pipeline's).  z ≥ 1 of them on each such stage (at ``light``'s least seconds of a
    block each), the rest beside the blocks counted on the stage after them (an interior
    or last stage, x of them at ``dense``'s seconds, holding as many counted as ``dense``
    says); a stage holding some beside the first of those counted as stage 0 holds them
    all."""
    inf = math.inf
    idx = np.arange(nb + 1)
    size = hollow if empty is not None and hollow else 1
    """Rows of f per first stage taken or not."""
    g = np.full((2 * size, 2, top + 1, nb + 1), inf)
    g[0, 0, 0, 0] = 0.0
    if layers is not None:
        layers.append(g)
    # A node adds one stage counted: past the counts the nodes so far reach every entry is
    # inf, and each node's step is figured on the counts up to those it reaches (the rest
    # stay as they were, the same floats).
    reach = 0
    """The most stages counted any entry of ``g`` is finite at (``top``: that many or more)."""
    for f in figures:
        inner, lead, tail, rate = f.inner, f.lead, f.tail, f.rate
        hop, out = f.hop, f.out
        fresh = g.copy()
        reach = min(top, reach + 1)
        now = fresh[..., : reach + 1, :]
        """The counts this node's stage reaches, in ``fresh``."""
        # A stage taken: one more stage counted (the top count keeps what passes it).
        step = _counted(np, g[..., : reach + 1, :], reach, open_top and reach == top)
        # The sliding minima of every stage at the node's block seconds, from one table.
        most = max(inner, lead, tail)
        ramp = idx * rate
        own = _levels(np, step, ramp, most)

        take = partial(_take_at, np, step, own, most, rate, ramp, idx)

        inners: dict[int, Any] = {}
        """An interior stage's least cost here by its most blocks, every row."""
        if inner > 0:  # an interior stage
            inners[inner] = take(..., inner, rate)
            np.minimum(now, inners[inner] + (hop + out), out=now)
        other, other_last, ahead = (0.0, 0.0, 0.0) if light is None else light[f.node]
        if lead > 0:  # the first stage, and the blocks not counted ahead of its first
            cand = take(0, lead, rate) + (hop + out + ahead)
            np.minimum(now[-1], cand, out=now[-1])
        ending = partial(_last_stage, np, cm, f, take, (slice(None), 0))
        lasts: dict[int, Any] = {}
        """The last stage's least cost here by its most blocks, every row (l: 0 before)."""
        if tail > 0:  # the last stage
            lasts[tail] = ending(tail)
            np.minimum(now[:, 1], lasts[tail] + hop, out=now[:, 1])
        if empty is not None and hollow:  # the first k stages holding none counted
            mid, first = empty[f.node][:2]
            for z in range(1, size + 1):  # such a stage holding z of the blocks not counted
                paid = hop + out + z * other
                if first:  # stage 0: to the first taken
                    into = now[size - 1 + z :]
                    np.minimum(into, step[: size + 1 - z] + paid, out=into)
                if mid:  # one after it, the first taken or not yet
                    for was, into in _placed(now, step, size, z):
                        np.minimum(into, was + paid, out=into)
            for x, (added, held, ends) in enumerate(() if dense is None else dense[f.node], 1):
                # The stage after them holding x of them beside blocks counted: an interior
                # one (``held`` blocks counted at most) or the last (``ends``).
                if inner > 0 and held > 0:
                    if held not in inners:
                        inners[held] = take(..., held, rate)
                    for was, into in _placed(now, inners[held], size, x):
                        np.minimum(into, was + (hop + out + added), out=into)
                if tail > 0 and ends > 0:
                    if ends not in lasts:
                        lasts[ends] = ending(ends)
                    for was, into in _placed(now[:, 1], lasts[ends], size, x):
                        np.minimum(into, was + (hop + added), out=into)
        elif empty is not None:  # a stage holding none of the blocks counted
            mid, first, last = empty[f.node]
            if mid:
                np.minimum(now, step + (hop + out + other), out=now)
            if first:
                np.minimum(now[1], step[0] + (hop + out + other), out=now[1])
            if last:  # the head and the others it holds, and its hop
                headed = max(_stage_cost(cm, f, "last", 0), other_last) + hop
                np.minimum(now[:, 1], step[:, 0] + headed, out=now[:, 1])
        g = fresh
        if layers is not None:
            layers.append(g)
    return g


def _placed(now: Any, was: Any, size: int, k: int) -> list[tuple[Any, Any]]:
    """The rows of ``was`` and of ``now`` k more blocks before those counted placed, the
    first stage taken or not (:func:`_knapsack`'s rows of f, ``size`` per half; none
    where k is ``size`` or more)."""
    if k >= size:
        return []
    return [
        (was[: size - k], now[k:size]),
        (was[size : 2 * size - k], now[size + k :]),
    ]


def _last_stage(np: Any, cm: CostModel, f: Figures, take: Any, part: Any, most: int) -> Any:
    """The least cost of a last stage on ``f``'s node, its hop apart, holding 1 to
    ``most`` blocks counted after each entry of the table's ``part`` (``take``: the
    node's sliding minima).  By its reads and by its FLOPs: where one is the larger at
    one block and at the node's most it is at every count between (both are linear), and
    it is the cost; else the largest of the three least costs."""
    leading = _leading_piece(f)
    if leading is not None:
        r, c = leading
        return take(part, most, r) + c
    last = take(part, most, f.rate) + cm.head * min(f.inv_bw, f.flop_s)
    for r, c in f.pieces:
        last = np.maximum(last, take(part, most, r) + c)
    return last


def _counted(np: Any, g: Any, top: int, open_top: bool) -> Any:
    """``g`` one stage on: count c + 1 from c (the count is the axis before the blocks');
    the top count also from itself where it stands for that many stages or more
    (nothing counted: ``g``)."""
    if top == 0:
        return g
    out = np.empty_like(g)
    out[..., 0, :] = math.inf
    out[..., 1:, :] = g[..., :-1, :]
    if open_top:
        np.minimum(out[..., top, :], g[..., top, :], out=out[..., top, :])
    return out


def _take(np: Any, x: Any, cap: int, rate: float, idx: Any) -> Any:
    """y[..., j] = min over 1 ≤ k ≤ cap of x[..., j − k] + k · rate (inf where none): a
    sliding minimum of ``x[i] − i · rate`` over the window ``[j − cap, j − 1]``, by
    doubling, along the last axis."""
    ramp = idx * rate
    return _window(np, _levels(np, x, ramp, cap), ..., cap, cap, ramp)


def _take_at(
    np: Any,
    x: Any,
    levels: Any,
    most: int,
    rate: float,
    ramp: Any,
    idx: Any,
    part: Any,
    cap: int,
    r: float,
) -> Any:
    """:func:`_take` of ``x[part]`` with ``cap`` at ``r`` seconds a block: from ``levels``
    (:func:`_levels` of ``x`` at ``rate``, ``ramp`` its ``i · rate``) where ``r`` is
    ``rate``."""
    if r == rate:
        return _window(np, levels, part, most, cap, ramp)
    return _take(np, x[part], cap, r, idx)


def _levels(np: Any, x: Any, ramp: Any, most: int) -> Any:
    """``x[..., i] − ramp[i]`` (``i · rate``) behind ``most`` infs (z), and its minima over
    runs of 1, 2, 4, … up to ``most`` entries: ``levels[k][..., i]`` the least of
    z[..., i : i + 2**k] wherever that run lies within its row, as every window of
    :func:`_window` does (each level is figured over the rows laid end to end, one pass
    over contiguous memory: an entry whose run passes a row's end mixes in the next row's
    first entries, and none is read)."""
    shape = (*x.shape[:-1], most + x.shape[-1])
    z = np.empty(shape)
    z[..., :most] = math.inf
    np.subtract(x, ramp, out=z[..., most:])
    levels = [z]
    flat, width = z.reshape(-1), 1
    while 2 * width <= most:
        run = np.empty_like(flat)
        np.minimum(flat[:-width], flat[width:], out=run[:-width])
        run[-width:] = math.inf
        levels.append(run.reshape(shape))
        flat, width = run, 2 * width
    return levels


def _window(np: Any, levels: Any, part: Any, most: int, cap: int, ramp: Any) -> Any:
    """:func:`_take` of ``x[part]`` with ``cap`` (at most ``most``) from :func:`_levels` of
    ``x``: the same entries' least, two runs covering the window, so the same figures."""
    width = 1 << (cap.bit_length() - 1)
    z = levels[width.bit_length() - 1][part]
    n = len(ramp)
    window = np.minimum(
        z[..., most - cap : most - cap + n], z[..., most - width : most - width + n]
    )
    window += ramp
    return window
