"""The nodes the trip knapsack (:mod:`~stowplan.planner.exact.trip`) needs: the figures it
reads per node, and the few nodes of each kind that can hold part of its optimum.

Nodes of one kind — alike in every figure the knapsack reads but their hop (``b``: the
hop a last stage pays, its fixed stage cost included) and their hop and transfer out
(``a``: what a first or interior stage pays) — hold blocks at the same costs. Where an
optimum takes ``s`` of them besides the last stage, the ``s`` of least ``a`` do as well,
and where it also takes one for the last stage, either the ``s + 1`` of least ``a`` (the
one of least ``b − a`` among them last) or the ``s`` of least ``a`` and, last, the one of
least ``b`` among the others, which is among the ``s + 1`` of least ``b``. So where no
pipeline of more than ``m`` nodes can cost less than a knapsack solution in hand, the
``m`` of least ``a`` and the ``m`` of least ``b`` of each kind hold an optimum: the
others are left out, which leaves the knapsack's least cost as it was. (Where the
last stage's cost is the largest of three least costs, the knapsack is a relaxation
whose least may lie below every solution; where the one in hand does, it is itself a
bound, and the caller takes the least of the two.)

A knapsack solution of ``m`` nodes costs at least every block at the least seconds any
node gives one, plus the ``m − 1`` least ``a`` (its first and interior stages) and the
least ``b`` (its last): past the ``m`` where that passes a solution in hand (the
knapsack over the few nodes of least ``a`` and ``b`` of each kind), none is needed.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from stowplan.cost import CostModel
from stowplan.cost.model import most_within

__all__ = ["Figures", "heaviest", "kept_figures", "node_figures", "useful"]


class Figures(NamedTuple):
    """What the knapsack reads of node ``node``: the most blocks of an interior, first
    and last stage, a block's seconds, the hop (its stage cost included) and transfer
    out, the last stage's seconds per byte read and per weight byte, its block cost, and
    the last stage's two linear costs (per block, fixed) by reads and by FLOPs; with the
    least seconds a block adds to any stage on the node, and those the head adds at
    least to a last stage beside them (it takes each piece's cost at least)."""

    node: int
    inner: int
    lead: int
    tail: int
    rate: float
    hop: float
    out: float
    inv_bw: float
    flop_s: float
    block_s: float
    pieces: tuple[tuple[float, float], tuple[float, float]]
    least_block: float
    least_head: float

    @property
    def kind(self) -> tuple[object, ...]:
        """All but the hop and the transfer: nodes of one kind hold blocks alike."""
        return (self.inner, self.lead, self.tail, self.rate, self.inv_bw, self.flop_s, self.block_s)


def node_figures(cm: CostModel, kept: Sequence[int] | None = None) -> list[Figures]:
    """Per node that may hold a block, in node order, what the knapsack reads of it;
    with ``kept`` (block indices, ascending), counting only those blocks: the most of
    them a stage of each role holds (none, where it holds only others), a block's seconds
    and its reads the least of theirs (every pipeline holds them all and pays at least
    that for each, the other blocks besides: a knapsack over them alone, its stages
    free to hold none of them, is a bound as well)."""
    nb = cm.num_blocks
    mp = cm.mem_prefix
    window = cm.max_window()
    if kept is None:
        rd, kvr, _ = cm.smallest_block()
        counted = list(range(nb + 1))
        widest = window
    else:
        counted, rd, kvr, _ = kept_figures(cm, kept)
        widest = most_within(mp, counted, cm.usable)
    siblings = Counter(cm.parent)
    rd_read, rd_weights = rd + kvr, rd
    got = []
    for d in range(len(cm.nodes)):
        room = cm.usable[d]
        lead = bisect_right(mp, room - cm.embed) - 1 if room >= cm.embed else 0
        tail = nb - bisect_left(mp, mp[nb] - (room - cm.head)) if room >= cm.head else 0
        if max(window[d], lead, tail) <= 0:
            continue
        inner = min(widest[d], counted[nb])
        lead, tail = counted[lead], counted[nb] - counted[nb - tail]
        rate = cm.block_seconds(d, rd + kvr, rd)
        hop, out = cm.latency_s[d], cm.xfer_s[d]
        if siblings[cm.parent[d]] > 1:  # the next stage may be a GPU group of the same node
            hop, out = min(hop, cm.intra_latency_s[d]), min(out, cm.intra_xfer_s[d])
        hop += cm.stage_s[d]
        ib, fl, bs = cm.inv_bw[d], cm.flop_s_per_byte[d], cm.block_s[d]
        pieces = ((rd_read * ib + bs, cm.head * ib), (rd_weights * fl + bs, cm.head * fl))
        least_block = min(rate, max(r for r, _ in pieces))
        least_head = max(c for r, c in pieces if r >= least_block)
        got.append(
            Figures(
                d, inner, lead, tail, rate, hop, out, ib, fl, bs, pieces, least_block, least_head
            )
        )
    return got


def kept_figures(cm: CostModel, kept: Sequence[int]) -> tuple[list[int], int, float, int]:
    """How many of the blocks ``kept`` lie before each block (a prefix count over all of
    them), and their least weight read, KV read and memory (bytes; each its own least)."""
    rp, kp, mp = cm.read_prefix, cm.kv_prefix, cm.mem_prefix
    counted = [0] * (cm.num_blocks + 1)
    for i in kept:
        counted[i + 1] = 1
    for i in range(cm.num_blocks):
        counted[i + 1] += counted[i]
    return (
        counted,
        min(rp[i + 1] - rp[i] for i in kept),
        min(kp[i + 1] - kp[i] for i in kept),
        min(mp[i + 1] - mp[i] for i in kept),
    )


def heaviest(cm: CostModel) -> tuple[int, ...] | None:
    """The blocks of the most memory (weights and KV; within rounding), where some block
    takes less: a stage's room holds fewer of them than its widest window of blocks."""
    mp, nb = cm.mem_prefix, cm.num_blocks
    sizes = [mp[i + 1] - mp[i] for i in range(nb)]
    most = max(sizes, default=0)
    kept = tuple(i for i, size in enumerate(sizes) if size >= most * (1 - 1e-9))
    return None if len(kept) == nb else kept


def useful(
    figures: list[Figures],
    num_blocks: int,
    fewest: int,
    least: Callable[[list[Figures]], float],
    empty: Mapping[int, tuple[bool, bool, bool]] | None = None,
) -> list[Figures]:
    """Nodes of ``figures`` (in their order) that hold an optimum of the knapsack of
    pipelines of ``fewest`` stages or more, whose least cost (or a smaller figure: its
    pipeline of one stage) ``least`` gives of a list of them — unless the least of the
    few nodes asked first is below every solution: the bound is the least of every
    ``least`` asked, that one and the nodes returned.  ``empty``, where given, says per
    node which roles (interior, first, last) it may take holding none of the blocks
    counted: such a node is counted as holding none and, last, as adding its hop alone.
    Where the few nodes are half of them or more (pipelines of many stages), every node
    is returned unasked: solving the few first would cost more than it could leave out."""
    if any(f.hop < 0 or f.out < 0 or f.least_block < 0 for f in figures):
        return figures  # the bounds below need costs of no sign

    def roles(f: Figures) -> tuple[bool, bool, bool]:
        return (False, False, False) if empty is None else empty[f.node]

    kinds: dict[tuple[object, ...], list[Figures]] = defaultdict(list)
    for f in figures:
        kinds[(f.kind, roles(f))].append(f)
    if all(len(fs) <= 1 for fs in kinds.values()):
        return figures
    fewest = max(2, fewest)
    quick = _quick_pick(figures, num_blocks, fewest)
    if 2 * len(quick) >= len(figures):
        return figures  # every node costs no more than the few and the nodes kept after
    upper = least(quick)
    if not math.isfinite(upper):
        return figures
    upper *= 1 + 1e-9  # past rounding
    # fill[x]: the least seconds of x blocks on the nodes, each within its room.
    slots = sorted((f.least_block, max(f.inner, f.lead, f.tail)) for f in figures)
    fill = [0.0]
    for r, room in slots:
        for _ in range(min(room, num_blocks + 1 - len(fill))):
            fill.append(fill[-1] + r)
    fill += [math.inf] * (num_blocks + 1 - len(fill))
    # Every solution has ``fewest`` nodes or more, one of them its last stage: each
    # pays its hop (and transfer, but the last), the last also its head at least (a
    # last stage holding no block counted, its hop at least).
    hops = sorted(f.hop + f.out for f in figures)
    least_b = min(f.hop for f in figures)
    ends = [
        f.hop + (0.0 if roles(f)[2] else f.least_head) for f in figures if f.tail > 0 or roles(f)[2]
    ]
    if not ends:
        return figures
    least_end = min(ends)
    floor = sum(hops[: fewest - 1]) + least_end
    chosen: set[int] = set()
    for fs in kinds.values():
        by_a = sorted(fs, key=lambda f: (f.hop + f.out, f.node))
        by_b = sorted(fs, key=lambda f: (f.hop, f.node))
        hollow = any(roles(fs[0]))
        """Whether a node of the kind may hold no block counted."""
        r = fs[0].least_block
        end = by_b[0].hop + (0.0 if roles(fs[0])[2] else fs[0].least_head)
        # t nodes of the kind: t blocks at its rate at least (none where it may hold
        # none), the rest filled anyhow; the hops of its nodes, of the last (of the kind
        # or not) and of the other nodes up to ``fewest``.
        most, firsts = 0, [0.0]
        for f in by_a:
            firsts.append(firsts[-1] + f.hop + f.out)
        for t in range(1, (len(fs) if hollow else min(len(fs), num_blocks)) + 1):
            paid = min(
                firsts[t] + least_end + max(0, fewest - t - 1) * least_b,
                firsts[t - 1] + end + max(0, fewest - t) * least_b,
            )
            blocks = fill[num_blocks] if hollow else t * r + fill[num_blocks - t]
            if blocks + max(floor, paid) > upper:
                break
            most = t
        chosen.update(f.node for f in (*by_a[:most], *by_b[:most]))
    if chosen <= {f.node for f in quick}:
        return quick  # more nodes than needed, already solved
    return [f for f in figures if f.node in chosen]


def _quick_pick(figures: list[Figures], num_blocks: int, fewest: int) -> list[Figures]:
    """A few nodes likely to hold a good pipeline: of the fastest blocks first, of least
    hop among them, until they hold every block twice over and number ``fewest`` + 2."""
    picked, room = [], 0
    for f in sorted(figures, key=lambda f: (f.least_block, f.hop + f.out, f.node)):
        picked.append(f)
        room += max(f.inner, f.lead, f.tail)
        if room >= 2 * num_blocks and len(picked) >= fewest + 2:
            break
    kept = {f.node for f in picked}
    return [f for f in figures if f.node in kept]
