"""``latency``: minimum single-stream time per token (one sequence in flight).

Time per token is the sum of every stage's time plus every hop's latency, so
fewer, faster, better-connected nodes win.  With blocks alike, a stage's time
is affine in its block count; for a chosen node set the best split fills the
fastest nodes first (each keeps at least one block), the head goes where it
costs least (its read time minus the outbound transfer the last stage saves)
and the embed goes to the slowest node that can hold it.  The node set is
chosen by seeding from several rankings (fastest per block, best connected,
cheapest per block when full) and improving by dropping and swapping nodes
until no move helps.
"""

from __future__ import annotations

import functools
import heapq
import math
import operator
from collections.abc import Sequence
from dataclasses import replace
from operator import attrgetter
from typing import Any, overload

from stowplan.cost import CostModel
from stowplan.planner.problem import Problem
from stowplan.planner.strategies.capacity_arrays import (
    ARRAY_NODES,
    first_seen_groups,
    numpy_module,
)
from stowplan.planner.strategies.evaluated import evaluated_here
from stowplan.planner.strategies.memo import PerModel
from stowplan.planner.strategies.split_arrays import (
    SPLIT_ARRAY_BLOCKS,
    StageArrays,
    node_stage_arrays,
    split_steps,
)
from stowplan.planner.strategies.throughput import Pipeline

__all__ = [
    "alike_by_hop",
    "ends_split",
    "kept_split",
    "latency_pipeline",
    "latency_split",
    "pipeline_of_least_latency",
]

_POOL_PER_KEY = 16
_MAX_ROUNDS = 30


class _Node:
    """A node's surrogate figures: blocks all as the average one."""

    __slots__ = (
        "cap_first",
        "cap_last",
        "cap_mid",
        "end_key",
        "first_key",
        "head",
        "index",
        "lat",
        "slope",
        "slope_key",
        "xfer",
    )

    def __init__(
        self,
        index: int,
        slope: float,
        head: float,
        xfer: float,
        lat: float,
        caps: tuple[int, int, int],
    ) -> None:
        self.index = index
        self.slope = slope
        """Seconds per (average) block."""
        self.head = head
        """Seconds the head adds on this node."""
        self.xfer = xfer
        self.lat = lat
        self.cap_mid, self.cap_first, self.cap_last = caps
        self.end_key = (head - xfer, index)
        """The last stage goes to the least of these (the head's cost less the transfer)."""
        self.first_key = (slope, -index)
        """Stage 0 (the embed) goes to the greatest of these: the slowest node."""
        self.slope_key = (slope, index)
        """Blocks fill the nodes in this order: fastest first."""


def _per_block(cm: CostModel) -> tuple[float, float, float]:
    """The average block's read bytes (weights and KV), weight bytes and memory."""
    nb = cm.num_blocks
    read = (cm.read_prefix[nb] + cm.kv_prefix[nb]) / nb
    return read, cm.read_prefix[nb] / nb, cm.mem_prefix[nb] / nb


def _capacities(cm: CostModel, u: int, mem: float) -> tuple[int, int, int]:
    """Average blocks a node of ``u`` usable bytes holds: alone, beside the embed and
    beside the head."""
    nb = cm.num_blocks

    def cap(anchor: int) -> int:
        room = u - anchor
        if room < 0:
            return 0
        return nb if mem <= 0 else min(nb, int(room // mem))

    return cap(0), cap(cm.embed), cap(cm.head)


def _rates(cm: CostModel, d: int, read: float, weights: float) -> tuple[float, float]:
    """Node ``d``'s seconds per average block and the seconds the head adds on it."""
    ib, fl = cm.inv_bw[d], cm.flop_s_per_byte[d]
    return cm.block_seconds(d, read, weights), max(cm.head * ib, cm.head * fl)


def _surrogates(cm: CostModel) -> list[_Node]:
    read, weights, mem = _per_block(cm)
    # Nodes alike in bandwidth, compute and block cost share a slope; in memory, capacities.
    rates: dict[tuple[float, float, float], tuple[float, float]] = {}
    capacities: dict[int, tuple[int, int, int]] = {}
    out = []
    for d in range(len(cm.nodes)):
        key = (cm.inv_bw[d], cm.flop_s_per_byte[d], cm.block_s[d])
        rate = rates.get(key)
        if rate is None:
            rate = rates[key] = _rates(cm, d, read, weights)
        u = cm.usable[d]
        caps = capacities.get(u)
        if caps is None:
            caps = capacities[u] = _capacities(cm, u, mem)
        out.append(_Node(d, rate[0], rate[1], cm.xfer_s[d], cm.latency_s[d] + cm.stage_s[d], caps))
    return out


class _NodeTable(Sequence[_Node]):
    """:func:`_surrogates` on arrays, each node made when first read: the same figures
    (nodes alike in rates share the rates of the first of them, as there), and the
    rankings of :data:`_KEYS` sorted on the arrays."""

    def __init__(self, cm: CostModel) -> None:
        np = numpy_module()
        read, weights, mem = _per_block(cm)
        group, firsts = first_seen_groups(
            np.array([cm.inv_bw, cm.flop_s_per_byte, cm.block_s], dtype=np.float64)
        )
        rates = np.array([_rates(cm, d, read, weights) for d in firsts.tolist()])
        slope, head = rates[group, 0], rates[group, 1]
        rooms: dict[int, int] = {}
        self._room_of = [rooms.setdefault(u, len(rooms)) for u in cm.usable]
        self._room_caps = [_capacities(cm, u, mem) for u in rooms]
        """Per usable VRAM (as they first come), the capacities of its nodes."""
        lat = np.asarray(cm.latency_s, dtype=np.float64) + np.asarray(cm.stage_s, dtype=np.float64)
        self._figures = (slope, head, cm.xfer_s, lat)
        self._made: dict[int, _Node] = {}
        index = np.arange(len(cm.nodes), dtype=np.int64)
        hop = lat + np.asarray(cm.xfer_s, dtype=np.float64)
        mid = np.array([c[0] for c in self._room_caps], dtype=np.int64)
        self.orders = _rank_orders(np, index, slope, hop, mid[self._room_of])
        """The node indices sorted by each of :data:`_KEYS` (int arrays)."""

    def __len__(self) -> int:
        return len(self._room_of)

    @overload
    def __getitem__(self, d: int) -> _Node: ...

    @overload
    def __getitem__(self, d: slice) -> list[_Node]: ...

    def __getitem__(self, d: int | slice) -> _Node | list[_Node]:
        if isinstance(d, slice):
            return [self[i] for i in range(len(self))[d]]
        made = self._made.get(d)
        if made is None:
            slope, head, xfer, lat = self._figures
            caps = self._room_caps[self._room_of[d]]
            made = _Node(d, float(slope[d]), float(head[d]), xfer[d], float(lat[d]), caps)
            self._made[d] = made
        return made


class _Ranking(Sequence[_Node]):
    """Nodes in one ranking's order, made as they are read."""

    def __init__(self, order: Any, nodes: _NodeTable) -> None:
        self.order, self.nodes = order, nodes
        """The node indices in ranking order (an int array)."""

    def __len__(self) -> int:
        return len(self.order)

    @overload
    def __getitem__(self, i: int) -> _Node: ...

    @overload
    def __getitem__(self, i: slice) -> list[_Node]: ...

    def __getitem__(self, i: int | slice) -> _Node | list[_Node]:
        if isinstance(i, slice):
            nodes = self.nodes
            return [nodes[d] for d in self.order[i].tolist()]
        return self.nodes[int(self.order[i])]


_Arranged = tuple[float, list[int], list[int]]


def _in_order(values: list[float]) -> float:
    """``values`` added one by one, in order (from 3.12 Python's ``sum`` compensates its
    floats; the arrays' sums, :func:`_summed_in_order`, add in order)."""
    return functools.reduce(operator.add, values, 0)


def _arrange(nodes: Sequence[_Node], nb: int) -> _Arranged | None:
    """Surrogate time per token, stage order and block counts of a node set (≥ 2 nodes)."""
    lasts = [x for x in nodes if x.cap_last >= 1]
    if not lasts:
        return None
    last = min(lasts, key=_END)
    firsts = [x for x in nodes if x is not last and x.cap_first >= 1]
    if not firsts:
        return None
    first = max(firsts, key=_FIRST)
    caps = {x.index: x.cap_mid for x in nodes}
    caps[first.index] = first.cap_first
    caps[last.index] = last.cap_last
    if min(caps.values()) < 1 or sum(caps.values()) < nb:
        return None
    counts = dict.fromkeys(caps, 1)
    left = nb - len(nodes)
    if left < 0:
        return None
    for x in sorted(nodes, key=_SLOPE):
        if not left:
            break  # every later node keeps its one block
        take = min(left, caps[x.index] - 1)
        counts[x.index] += take
        left -= take
    time = last.head + _in_order([x.slope * counts[x.index] + x.lat for x in nodes])
    time += _in_order([x.xfer for x in nodes if x is not last])
    middle = sorted(x.index for x in nodes if x is not first and x is not last)
    order = [first.index, *middle, last.index]
    return time, order, [counts[d] for d in order]


_END = attrgetter("end_key")
_FIRST = attrgetter("first_key")
_SLOPE = attrgetter("slope_key")


_UNTIMED: Any = object()
"""A time not given (:meth:`_Scorer.time` arranges the list itself)."""


class _Scorer:
    """Surrogate times of node lists for one search: a node set is scored once, in the
    order it first comes in (the time is summed in it), and only within the stage limits.
    The arrangements themselves come from the model's shared tables."""

    def __init__(self, shared: _Surrogates, nb: int, min_n: int, max_n: int) -> None:
        self.shared = shared
        self.nb = nb
        self.min_n, self.max_n = min_n, max_n
        self.seen: dict[int, tuple[float, Sequence[_Node], _Node | None] | None] = {}
        """Per node set (:meth:`set_of`): its time and the list it was scored as
        (a list, and a node after it or None)."""
        self.asked = 0
        """The most nodes of a set this search asked the time of."""
        self.bits: dict[int, int] = {}
        """Per node index, the node's bit in this search's sets: one per node, as the nodes
        first come in (the few nodes one search sees make small integers)."""

    def bits_of(self, nodes: Sequence[_Node]) -> list[int]:
        """The bits of ``nodes`` in this search's sets."""
        bits = self.bits
        out = []
        for x in nodes:
            bit = bits.get(x.index)
            if bit is None:
                bit = bits[x.index] = 1 << len(bits)
            out.append(bit)
        return out

    def set_of(self, members: Sequence[_Node]) -> int:
        """The set ``members`` as a key of :attr:`seen`: the sum of their bits."""
        key = 0
        for bit in self.bits_of(members):
            key |= bit
        return key

    def _timed(self, members: Sequence[_Node], given: Any = _UNTIMED) -> float | None:
        """The time of the list ``members``: ``given``, where given, is its :func:`_arrange`
        time."""
        ordered = tuple([x.index for x in members])
        timed = self.shared.timed
        if ordered not in timed:
            if given is _UNTIMED:
                got = self._arranged(members)
                given = None if got is None else got[0]
            timed[ordered] = given
        return timed[ordered]

    def _arranged(self, members: Sequence[_Node]) -> _Arranged | None:
        ordered = tuple([x.index for x in members])
        arranged = self.shared.arranged
        if ordered not in arranged:
            arranged[ordered] = _arrange(members, self.nb)
        return arranged[ordered]

    def time(
        self, members: Sequence[_Node], key: int | None = None, given: Any = _UNTIMED
    ) -> float | None:
        """The surrogate time of the set ``members`` (None: no arrangement, or outside the
        stage limits); ``key``, where given, is its :meth:`set_of`, and ``given`` the
        list's :func:`_arrange` time."""
        if key is None:
            key = self.set_of(members)
        seen = self.seen
        self.asked = max(self.asked, len(members))
        if key not in seen:
            got = None
            if self.min_n <= len(members) <= self.max_n:
                t = self._timed(members, given)
                if t is not None:
                    got = (t, tuple(members), None)
            seen[key] = got
        found = seen[key]
        return None if found is None else found[0]

    def arrangement(self, members: Sequence[_Node]) -> _Arranged | None:
        """The arrangement of the set ``members`` as it was scored."""
        self.time(members)
        found = self.seen[self.set_of(members)]
        if found is None:
            return None
        _, listed, after = found
        return self._arranged(listed if after is None else [*listed, after])

    def drops(
        self, members: list[_Node], given: list[float | None] | None = None
    ) -> list[float | None]:
        """:meth:`time` of ``members`` less its i-th, for each i in turn (``given``: their
        :func:`_arrange` times)."""
        own = self.bits_of(members)
        mask = 0
        for bit in own:
            mask |= bit
        time = self.time
        if given is None:
            return [time(members[:i] + members[i + 1 :], mask & ~b) for i, b in enumerate(own)]
        return [
            time(members[:i] + members[i + 1 :], mask & ~b, t)
            for i, (b, t) in enumerate(zip(own, given, strict=True))
        ]

    def moves(
        self, members: list[_Node], ys: Sequence[_Node], above: float = math.inf
    ) -> tuple[list[float | None], list[list[float | None]], list[list[int]] | None]:
        """:meth:`drops` of ``members``, then :meth:`swaps` of ``members`` and ``ys``, and
        where those are timed on arrays with ``above`` finite, per family the ys whose
        sets were timed below it (the others' times are that or more: :meth:`swaps`)."""
        if not self._batched(members, ys):
            return self.drops(members), self.swaps(members, ys), None
        times, dropped, near = _moves_timed(members, ys, self.nb, above)
        drops = self.drops(members, dropped)  # scored first, as the plain path scores them
        table = self.swaps(members, ys, times, near)
        if near is None:
            return drops, table, None
        per: list[list[int]] = [[] for _ in table]
        for i, j, _ in near:
            per[i].append(j)
        return drops, table, per

    def _batched(self, members: list[_Node], ys: Sequence[_Node]) -> bool:
        """Whether the swaps of ``members`` and ``ys`` are timed on arrays."""
        return self.shared.batched and (len(members) + 1) * len(ys) >= _BATCH

    def swaps(
        self,
        members: list[_Node],
        ys: Sequence[_Node],
        times: list[list[float | None]] | None = None,
        near: list[tuple[int, int, float]] | None = None,
    ) -> list[list[float | None]]:
        """:meth:`time` of ``[*rest, y]`` for every ``rest`` (``members`` less its i-th, for
        each i; then ``members`` whole) and every ``y`` (none of them in ``members``), in
        that order (``times``: their :func:`_swap_times`, where timed on arrays).  With
        ``near`` (family, y and time of the sets :func:`_moves_timed` timed below its
        ``above``) in place of ``times``, only those sets are timed, looked up and kept,
        the others None: another's time as scored differs from its time on arrays only by
        rounding, and the caller passes over both."""
        m = len(members)
        families = [members[:i] + members[i + 1 :] for i in range(m)] + [members]
        if ys:
            self.asked = max(self.asked, m + 1)
        if not self._batched(members, ys):
            out: list[list[float | None]] = []
            for rest in families:
                out.append([self.time([*rest, y]) for y in ys])
            return out
        own = self.bits_of(members)
        mask = 0
        for bit in own:
            mask |= bit
        bits = self.bits_of(ys)
        within = [self.min_n <= len(rest) + 1 <= self.max_n for rest in families]
        if near is None:
            if times is None:
                times = _swap_times(members, ys, self.nb)
            near = [
                (i, j, t) for i, row in enumerate(times) for j, t in enumerate(row) if t is not None
            ]
        return self._kept(families, own, mask, ys, bits, within, near)

    def _kept(
        self,
        families: list[list[_Node]],
        own: list[int],
        mask: int,
        ys: Sequence[_Node],
        bits: list[int],
        within: list[bool],
        near: list[tuple[int, int, float]],
    ) -> list[list[float | None]]:
        """:meth:`swaps` of the sets ``near`` names (family, y and time on arrays), each
        as scored (its first time, in the order it first came in), the new ones kept;
        None elsewhere.  A set with no time is not kept: any order of it has none (the
        ends, capacities and fill do not depend on the order), and it is None again."""
        m, seen = len(own), self.seen
        table: list[list[float | None]] = [[None] * len(ys) for _ in families]
        for i, j, t in near:
            if within[i]:
                key = (mask & ~own[i] if i < m else mask) | bits[j]
                found = seen.get(key, _UNTIMED)
                if found is _UNTIMED:
                    seen[key] = (t, families[i], ys[j])
                    table[i][j] = t
                else:
                    table[i][j] = None if found is None else found[0]
        return table


_BATCH = 8
"""Swaps timed on arrays from this many at once."""


def _swap_times(members: list[_Node], ys: Sequence[_Node], nb: int) -> list[list[float | None]]:
    """:func:`_move_times`' swaps."""
    return _move_times(members, ys, nb)[0]


def _move_times(
    members: list[_Node], ys: Sequence[_Node], nb: int
) -> tuple[list[list[float | None]], list[float | None]]:
    """:func:`_moves_timed`'s swaps and drops."""
    swaps, drops, _ = _moves_timed(members, ys, nb)
    assert swaps is not None
    return swaps, drops


def _moves_timed(
    members: list[_Node], ys: Sequence[_Node], nb: int, above: float = math.inf
) -> tuple[
    list[list[float | None]] | None, list[float | None], list[tuple[int, int, float]] | None
]:
    """:func:`_arrange`'s time of ``[*rest, y]`` for every ``rest`` (``members`` less its
    i-th, for each i; then ``members`` whole) and ``y``, on arrays, the same floats: the
    ends, capacities and greedy fill as :func:`_arrange` chooses them, and the time summed
    in the list's order (``rest`` first, then ``y``; a member left out adds 0.0).

    A member's role in a family (and so its capacity) depends on ``y`` only through y's
    own role (last, stage 0 or neither): the members' capacities and their prefix sums in
    fill order are figured per family and y's role, then read per ``y``.

    With ``above`` finite, in place of the swaps' table, the family, y and time of each
    swap timed below it (None where ``above`` is infinite).

    Also :func:`_arrange`'s time of each ``members`` less its i-th alone (a drop): the
    family with y in neither end's role, less y."""
    np = numpy_module()
    m = len(members)
    families = [members[:i] + members[i + 1 :] for i in range(m)] + [members]
    figures = np.array(
        [(y.slope, y.head, y.xfer, y.lat, y.end_key[0]) for y in ys], dtype=np.float64
    ).reshape(-1, 5)
    counts_y = np.array(
        [(y.index, y.cap_mid, y.cap_first, y.cap_last) for y in ys], dtype=np.int64
    ).reshape(-1, 4)
    y_slope, y_head, y_xfer, y_lat, y_end = (figures[None, :, k] for k in range(5))
    y_index, y_mid, y_first, y_last = (counts_y[None, :, k] for k in range(4))

    # Per family (a row): its own last stage, stage 0 beside it, stage 0 of all.
    lasts, rest_firsts, all_firsts = _family_ends(members)

    def column_of(values: list[Any], dtype: Any = np.float64) -> Any:
        return np.array(values, dtype=dtype)[:, None]

    has_last = column_of([x is not None for x in lasts], bool)
    end = column_of([x.end_key[0] if x else 0.0 for x in lasts])
    end_at = column_of([x.index if x else 0 for x in lasts], np.int64)
    y_is_last = (y_last >= 1) & (~has_last | (y_end < end) | ((y_end == end) & (y_index < end_at)))
    has_rest_first = column_of([x is not None for x in rest_firsts], bool)
    first_slope = column_of([x.slope if x else 0.0 for x in rest_firsts])
    first_at = column_of([x.index if x else 0 for x in rest_firsts], np.int64)
    y_is_first = (
        ~y_is_last
        & (y_first >= 1)
        & (
            ~has_rest_first
            | (y_slope > first_slope)
            | ((y_slope == first_slope) & (y_index < first_at))
        )
    )
    has_all_first = column_of([x is not None for x in all_firsts], bool)
    ok = (y_is_last | has_last) & np.where(y_is_last, has_all_first, y_is_first | has_rest_first)
    # y's role per family and y: 0 last, 1 stage 0, 2 neither.
    role = np.where(y_is_last, 0, np.where(y_is_first, 1, 2))
    # Per family, member and y's role (axes 0, 1, 2): the member's capacity in the role it
    # takes there (0 where it is not in the family).
    position = {x.index: j for j, x in enumerate(members)}

    def at(chosen: list[_Node | None]) -> Any:
        return column_of([-1 if x is None else position[x.index] for x in chosen], np.int64)

    member = np.arange(m)[None, :]
    is_last, is_rest_first, is_all_first = (
        at(chosen) == member for chosen in (lasts, rest_firsts, all_firsts)
    )
    mid, first, last = (
        np.array([getattr(x, f) for x in members], dtype=np.int64)[None, :]
        for f in ("cap_mid", "cap_first", "cap_last")
    )
    present = np.arange(m + 1)[:, None] != member
    # Axes: family, y's role, member.
    caps = np.stack(
        (
            np.where(is_all_first, first, mid),
            np.where(is_last, last, mid),
            np.where(is_rest_first, first, np.where(is_last, last, mid)),
        ),
        axis=1,
    )
    caps = np.where(present[:, None, :], caps, 0)
    spare = np.where(present[:, None, :], caps - 1, 0)
    fits = (~present[:, None, :] | (caps >= 1)).all(axis=2)
    rows = np.arange(m + 1)[:, None]
    y_cap = np.where(y_is_last, y_last, np.where(y_is_first, y_first, y_mid))
    ok &= (y_cap >= 1) & fits[rows, role]
    total = y_cap + caps.sum(axis=2)[rows, role]
    sizes = column_of([len(f) + 1 for f in families], np.int64)
    left = nb - sizes
    ok &= (total >= nb) & (left >= 0)
    # The greedy fill, fastest first: every node keeps one block and takes what the ones
    # before it left, up to its room.  The spare blocks ahead of each member in fill order
    # (y aside), and of all members ahead of y.
    rank = sorted(range(m), key=lambda j: members[j].slope_key)
    order = np.empty(m, dtype=np.int64)
    order[rank] = np.arange(m)
    ranked = spare[:, :, rank]
    held = np.cumsum(ranked, axis=2)
    ahead = (held - ranked)[:, :, order]
    slope = np.array([x.slope for x in members])[None, :]
    lat = np.array([x.lat for x in members])[None, :]
    heads = column_of([x.head if x else 0.0 for x in lasts])
    # Per family, its members' transfers but its last stage's, and all of them: summed
    # in the list's order, each left out adding 0.0 (the same floats as a sum of those
    # kept).
    xfer = np.array([x.xfer for x in members])[None, :]
    xfer_kept = _summed_in_order(np.where(present & ~is_last, xfer, 0.0))
    drops = _drop_times(m, nb, caps, spare, ahead, fits, present, slope, lat, heads, xfer_kept)
    drop_ok = has_last & has_rest_first
    drops = [t if good else None for t, good in zip(drops, drop_ok[:m, 0].tolist(), strict=True)]
    if not ok.any():
        if above < math.inf:
            return None, drops, []
        return [[None] * len(ys) for _ in families], drops, None
    index = np.array([x.index for x in members])[None, :]
    # Per y (axis 0) and member, whether y comes before the member in fill order (its
    # slope key is less).
    y_slope_c, y_index_c = y_slope.reshape(-1, 1), y_index.reshape(-1, 1)
    y_ahead = (y_slope_c < slope) | ((y_slope_c == slope) & (y_index_c < index))
    passed = (~y_ahead).sum(axis=1)[None, :]
    """Per y, how many members come before it in fill order."""
    held = np.concatenate((np.zeros_like(held[:, :, :1]), held), axis=2)
    y_spare = y_cap - 1
    y_count = 1 + np.minimum(np.maximum(left - held[rows, role, passed], 0), y_spare)
    pick = (rows * 3 + role).ravel()
    # Axes: member, then family and y together (member-major: each member's terms are one
    # contiguous row, added row by row).  The block counts and sums here are at most m + 2
    # times the greatest of nb and the capacities: int32 holds them when that is small.
    top = max(nb, int(caps.max(initial=0)), int(y_cap.max(initial=0)))
    small = np.int32 if (m + 2) * top < 2**31 else np.int64
    before = np.ascontiguousarray(ahead.reshape(-1, m).T, dtype=small).take(pick, axis=1)
    counts = before.reshape(m, m + 1, len(ys))
    counts += y_ahead.T.astype(small)[:, None, :] * y_spare.astype(small)[None, :, :]
    np.subtract(np.repeat(left.astype(small), len(ys)), before, out=before)
    np.maximum(before, 0, out=before)
    room = np.ascontiguousarray(spare.reshape(-1, m).T, dtype=small)
    np.minimum(before, room.take(pick, axis=1), out=before)
    before += 1
    # The time, summed in the list's order (a member left out adds 0.0: its slope and
    # latency are 0.0 there).
    terms = np.multiply(counts, np.where(present, slope, 0.0).T[:, :, None])
    terms += np.where(present, lat, 0.0).T[:, :, None]
    # Added member by member, in order (one term at a time).
    acc = terms[0].copy() if m else np.zeros(y_spare.shape)
    for term in terms[1:]:
        acc += term
    acc = acc + (y_slope * y_count + y_lat)
    head = np.where(y_is_last, y_head, heads)
    time = head + acc
    xfer_all = _summed_in_order(np.where(present, xfer, 0.0))
    time = np.where(y_is_last, time + xfer_all, time + (xfer_kept + y_xfer))
    if above < math.inf:
        below = ok & (time < above)
        rows, columns = np.nonzero(below)
        near = zip(rows.tolist(), columns.tolist(), time[below].tolist(), strict=True)
        return None, drops, list(near)
    out: list[list[float | None]] = np.where(ok, time, None).tolist()
    return out, drops, None


def _summed_in_order(terms: Any) -> Any:
    """Each row of ``terms`` (a float array of rows by columns) summed column by column,
    in order, as a column: the floats of :func:`_in_order` of the row (a running sum adds
    in order; a sum of an array may add in pairs)."""
    np = numpy_module()
    if not terms.shape[1]:
        return np.zeros((terms.shape[0], 1))
    return np.cumsum(terms, axis=1)[:, -1:]


def _drop_times(
    m: int,
    nb: int,
    caps: Any,
    spare: Any,
    ahead: Any,
    fits: Any,
    present: Any,
    slope: Any,
    lat: Any,
    heads: Any,
    xfer_kept: Any,
) -> list[float | None]:
    """:func:`_arrange`'s time of each family of :func:`_move_times` but the whole (a
    member dropped) without y, from its figures there with y in neither end's role (axis 1
    index 2): the same ends, capacities and fill; None where they do not fit (either end
    missing aside)."""
    np = numpy_module()
    if not m:
        return []
    caps, spare, ahead, present = caps[:m, 2, :], spare[:m, 2, :], ahead[:m, 2, :], present[:m]
    left = nb - (m - 1)
    ok = fits[:m, 2] & (caps.sum(axis=1) >= nb) & (left >= 0)
    counts = 1 + np.minimum(np.maximum(left - ahead, 0), spare)
    terms = np.where(present, slope, 0.0) * counts + np.where(present, lat, 0.0)
    # Added member by member, in order; then the head before, the transfers after.
    acc = _summed_in_order(terms)[:, 0]
    time = (heads[:m, 0] + acc) + xfer_kept[:m, 0]
    return [t if good else None for t, good in zip(time.tolist(), ok.tolist(), strict=True)]


def _family_ends(
    members: list[_Node],
) -> tuple[list[_Node | None], list[_Node | None], list[_Node | None]]:
    """Per family (``members`` less its i-th, for each i; then ``members`` whole): its last
    stage (least :data:`_END` of those that hold one block beside the head), stage 0
    beside that last (greatest :data:`_FIRST` of the others that hold one beside the embed)
    and stage 0 of all.  Keys are unique (they end in the node's index), so each is the
    best of a list sorted once that is not left out of the family (of its first three: a
    family leaves out at most two)."""
    m = len(members)
    lasts_by = heapq.nsmallest(3, (x for x in members if x.cap_last >= 1), key=_END)
    firsts_by = heapq.nlargest(3, (x for x in members if x.cap_first >= 1), key=_FIRST)

    def best(ranked: list[_Node], out: _Node | None, out2: _Node | None = None) -> _Node | None:
        for x in ranked:
            if x is not out and x is not out2:
                return x
        return None

    dropped: list[_Node | None] = [*members, None]
    lasts = [best(lasts_by, members[i] if i < m else None) for i in range(m + 1)]
    rest_firsts = [best(firsts_by, x, last) for x, last in zip(dropped, lasts, strict=True)]
    all_firsts = [best(firsts_by, x) for x in dropped]
    return lasts, rest_firsts, all_firsts


def _to_pipeline(order: list[int], counts: list[int]) -> Pipeline:
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    return order, bounds


_KEYS = (
    lambda x: (x.slope, x.index),
    lambda x: (x.lat + x.xfer, x.slope, x.index),
    lambda x: ((x.lat + x.xfer) / max(x.cap_mid, 1) + x.slope, x.index),
    lambda x: (-x.cap_mid, x.slope, x.index),
)
"""The rankings the node sets are seeded from: fastest per block, best connected,
cheapest per block when full, largest."""


def _rank_orders(np: Any, at: Any, slope: Any, hop: Any, cap: Any, index: Any = None) -> list[Any]:
    """Positions ``at`` sorted by each of :data:`_KEYS` from the nodes' slopes, hops
    (latency and transfer), capacities and indices (``at`` itself when not given), as
    int arrays."""
    index = at if index is None else index
    orders = (
        np.lexsort((index, slope)),
        np.lexsort((index, slope, hop)),
        np.lexsort((index, hop / np.maximum(cap, 1) + slope)),
        np.lexsort((index, slope, -cap)),
    )
    return [at[order] for order in orders]


class _Surrogates:
    """A cost model's surrogate nodes, their rankings and every node list arranged so far
    (by its order: the time is summed in it).  The searches on one model share them: the
    stage counts that step at one microbatch plan on one model."""

    def __init__(self, cm: CostModel) -> None:
        self.batched = len(cm.nodes) >= ARRAY_NODES and numpy_module() is not None
        """Whether the nodes are figured and ranked, and a member list's swaps timed, on
        arrays."""
        self.nodes: Sequence[_Node]
        self.rankings: list[Sequence[_Node]]
        if self.batched:
            table = _NodeTable(cm)
            self.nodes = table
            self.rankings = [_Ranking(order, table) for order in table.orders]
        else:
            self.nodes = _surrogates(cm)
            self.rankings = [sorted(self.nodes, key=k) for k in _KEYS]
        self.arranged: dict[tuple[int, ...], _Arranged | None] = {}
        self.timed: dict[tuple[int, ...], float | None] = {}
        """The surrogate time of every node list scored so far, by its order."""


_surrogates_of = PerModel(_Surrogates)


def _one_stage_nodes(cm: CostModel) -> list[int]:
    """The nodes a one-stage pipeline is tried on: its time depends only on the node's
    rates, so of nodes alike only the first (the one ``min`` would keep among equal keys)
    that holds the model."""
    alike: set[tuple[float, float, float, float]] = set()
    out = []
    need = cm.stage_bytes(0, cm.num_blocks, True, True)  # what :meth:`CostModel.fits` compares
    for d, room in enumerate(cm.usable):
        if need <= room:
            key = (cm.inv_bw[d], cm.flop_s_per_byte[d], cm.block_s[d], cm.stage_s[d])
            if key not in alike:
                alike.add(key)
                out.append(d)
    return out


_single_stages = PerModel(_one_stage_nodes)
"""Per cost model, :func:`_one_stage_nodes`."""


def _no_pipelines(cm: CostModel) -> dict[tuple[int, int], Pipeline | None]:
    return {}


_pipelines = PerModel(_no_pipelines)
"""Per cost model, :func:`latency_pipeline`'s answer per stage limits."""


def latency_pipeline(problem: Problem, cm: CostModel) -> Pipeline | None:
    """The pipeline with the least time per token this strategy finds; None if none fits.
    Kept per cost model and stage limits (all the search reads of the problem), a copy
    each time."""
    kept = _pipelines(cm)
    key = (problem.min_stages, problem.max_stages)
    if key not in kept:
        # A search whose node sets all stayed within a stage count runs alike under any
        # limit from that count up: its answer stands for them.
        reached = _reached(cm).setdefault(problem.min_stages, [])
        for reach, answer in reached:
            if reach <= problem.max_stages:
                kept[key] = answer
                break
        else:
            answer, got = _least_latency(cm, *key)
            if got is not None:
                reached.append((got, answer))
            if problem.min_stages > 1:
                # Held, the search's moves cannot pass through other counts of nodes: the
                # search of no limit, where it keeps within them, may do better.
                free = latency_pipeline(
                    replace(problem, min_stages=1, max_stages=len(cm.nodes)), cm
                )
                if (
                    free is not None
                    and problem.min_stages <= len(free[0]) <= problem.max_stages
                    and (answer is None or _latency_key(cm, free) < _latency_key(cm, answer))
                ):
                    answer = free
            kept[key] = answer
    found = kept[key]
    return None if found is None else (list(found[0]), list(found[1]))


def _nothing_reached(cm: CostModel) -> dict[int, list[tuple[int, Pipeline | None]]]:
    return {}


_reached = PerModel(_nothing_reached)
"""Per cost model and least stage count, the answers of the searches that no stage
ceiling held back, with the most nodes they asked the time of."""


def pipeline_of_least_latency(cm: CostModel, min_stages: int, max_stages: int) -> Pipeline | None:
    """:func:`latency_pipeline` itself, for stage limits ``[min_stages, max_stages]``."""
    return _least_latency(cm, min_stages, max_stages)[0]


def _least_latency(
    cm: CostModel, min_stages: int, max_stages: int
) -> tuple[Pipeline | None, int | None]:
    """:func:`pipeline_of_least_latency`, and the most nodes of a set it asked about when
    ``max_stages`` held nothing back (every such count up to ``max_stages`` searches
    alike), None when it did."""
    nb = cm.num_blocks
    held_back = max_stages < 2
    min_n, max_n = max(min_stages, 2), max_stages
    candidates: list[Pipeline] = []
    if min_stages <= 1:
        candidates += [([d], [0, nb]) for d in _single_stages(cm)]
    if max_n >= 2:
        shared = _surrogates_of(cm)
        nodes, rankings = shared.nodes, shared.rankings
        scorer = _Scorer(shared, nb, min_n, max_n)
        score = scorer.time

        best: tuple[float, list[_Node]] | None = None
        for ranking in rankings:
            total = 0
            for size in range(1, min(len(ranking), max_n) + 1):
                total += ranking[size - 1].cap_mid
                if size < min_n or total < nb:
                    continue
                for extra in range(3):
                    members = ranking[: size + extra]
                    got = score(members)
                    if got is not None and (best is None or got < best[0]):
                        best = (got, list(members))
                break
            else:
                # The ranking ran out at the ceiling: a higher one would read further.
                held_back = held_back or len(ranking) > max_n
        if best is not None:
            pool_ids = {x.index for r in rankings for x in r[:_POOL_PER_KEY]}
            pool = [nodes[i] for i in sorted(pool_ids)]
            best = _improve(best, pool, scorer)
            chosen = scorer.arrangement(best[1])
            assert chosen is not None
            candidates.append(_to_pipeline(chosen[1], chosen[2]))
            if not cm.uniform:
                # Blocks differ: the surrogate's counts are averages.  Split the chosen
                # nodes exactly, in its order and in the orders of their VRAM.
                order = chosen[1]
                by_room = sorted(order, key=lambda d: (cm.usable[d], d))
                tried: set[tuple[int, ...]] = set()
                for o in (order, by_room, by_room[::-1]):
                    if tuple(o) in tried:
                        continue  # the same split again: the first of equal candidates wins
                    tried.add(tuple(o))
                    split = kept_split(cm, o)
                    if split is not None and min_n <= len(split[0]) <= max_n:
                        candidates.append(split)
        held_back = held_back or scorer.asked > max_n
        reach = scorer.asked
    else:
        reach = 1
    candidates = [c for c in candidates if cm.fits_pipeline(*c)]
    found = min(candidates, key=lambda c: _latency_key(cm, c)) if candidates else None
    return found, None if held_back else reach


def latency_split(cm: CostModel, order: Sequence[int]) -> Pipeline | None:
    """The least time per token over subsequences (≥ 2 stages) of ``order``, any block sizes.

    A dynamic programme over (node position, blocks placed): each node in turn
    is skipped, or takes the next contiguous run of blocks that fits its VRAM.  Models of
    :data:`~stowplan.planner.strategies.split_arrays.SPLIT_ARRAY_BLOCKS` blocks or more
    run it on numpy arrays (the same split), fewer in Python.
    """
    nb = cm.num_blocks
    # Byte counts are int64 on arrays: totals near its range stay with Python's integers.
    small = max(cm.read_prefix[nb], cm.mem_prefix[nb]) + cm.head + cm.embed < 2**62
    np = numpy_module() if nb >= SPLIT_ARRAY_BLOCKS and small else None
    if np is not None:
        arrays, parts = _split_arrays(cm), _split_parts(cm)
        steps = []
        for d in order:
            key = _table_key(cm, d)
            if key not in arrays:
                arrays[key] = node_stage_arrays(np, cm, d, parts)
            steps.append((cm.latency_s[d], arrays[key]))
        best, at, choices = split_steps(np, nb, steps)
    else:
        best, at, choices = _split_plain(cm, order)
    if best == math.inf:
        return None
    p, j = at
    stages = [(order[p], j)]
    q = p - 1
    while j > 0:
        while choices[q][j] < 0:
            q -= 1
        lo = int(choices[q][j])
        stages.append((order[q], lo))
        j = lo
        q -= 1
    stages.reverse()
    return [d for d, _ in stages], [lo for _, lo in stages] + [nb]


def _no_splits(cm: CostModel) -> dict[tuple[int, ...], Pipeline | None]:
    return {}


_splits = PerModel(_no_splits)
"""Per cost model, :func:`latency_split` of each order split so far."""


def kept_split(cm: CostModel, order: Sequence[int]) -> Pipeline | None:
    """:func:`latency_split`, kept per cost model and order (the stage counts that step at
    one microbatch plan on one model, and often choose the same nodes): a copy each time."""
    kept = _splits(cm)
    key = tuple(order)
    if key not in kept:
        kept[key] = latency_split(cm, order)
    found = kept[key]
    return None if found is None else (list(found[0]), list(found[1]))


def ends_split(cm: CostModel, min_stages: int, max_stages: int) -> Pipeline | None:
    """The least time per token of :func:`latency_split` over the orders that put a node
    of each kind first and one of each kind last, the others between by their hop and
    transfer (None where none is within the stage limits and fits).

    Nodes of a kind are alike in every figure of a stage but the hop and the transfer. A
    first stage pays its hop and transfer, as the stages between do, so the first node
    of a kind is the one of least hop and transfer, and the last the one of least hop
    among the others; or, the kind's node of least hop last, the first the one of least
    hop and transfer among the others.  Where the blocks between the first and the last
    stage are alike (a MoE model's past its dense blocks), the nodes between may come in
    any order: the split of each order chooses them as well.  The search of node sets by
    average blocks may miss such pipelines (deepseek-r1 on 24 WAN nodes: an RTX 3090
    holding one MoE block behind a hop of 19 ms)."""
    hop = [cm.latency_s[d] + cm.stage_s[d] for d in range(len(cm.nodes))]
    sent = _hop_and_transfer(cm)
    between = sorted(range(len(cm.nodes)), key=lambda d: (sent[d], d))
    kinds = alike_by_hop(cm)
    by_a = [ds[:2] for ds in kinds]
    by_b = [sorted(ds, key=lambda d: (hop[d], d))[:2] for ds in kinds]
    ends: list[tuple[int, int]] = []
    for firsts in by_a:
        for lasts in by_b:
            for first, last in (
                (firsts[0], next((d for d in lasts if d != firsts[0]), None)),
                (next((d for d in firsts if d != lasts[0]), None), lasts[0]),
            ):
                if first is not None and last is not None and (first, last) not in ends:
                    ends.append((first, last))
    best: Pipeline | None = None
    for first, last in ends:
        order = [first, *(d for d in between if d != first and d != last), last]
        got = latency_split(cm, order)
        if (
            got is not None
            and min_stages <= len(got[0]) <= max_stages
            and cm.fits_pipeline(*got)
            and (best is None or _latency_key(cm, got) < _latency_key(cm, best))
        ):
            best = got
    return best


def alike_by_hop(cm: CostModel) -> list[list[int]]:
    """``cm``'s nodes by kind (kinds in the order of their first node): alike in every
    figure of a stage but the hop and the transfer out (:func:`_table_key`'s but the
    transfer, and the room: :attr:`CostModel.gpu_class`), each kind's nodes by their hop
    and transfer, least first."""
    kinds: dict[int, list[int]] = {}
    for d, c in enumerate(cm.gpu_class):
        kinds.setdefault(c, []).append(d)
    sent = _hop_and_transfer(cm)
    return [sorted(ds, key=lambda d: (sent[d], d)) for ds in kinds.values()]


def _hop_and_transfer(cm: CostModel) -> list[float]:
    """Each node's hop (with its fixed stage seconds) and transfer out, as a stage between
    others pays them."""
    return [cm.latency_s[d] + cm.stage_s[d] + cm.xfer_s[d] for d in range(len(cm.nodes))]


def _table_key(cm: CostModel, d: int) -> tuple[float | int, ...]:
    """The figures node ``d``'s stage tables depend on: nodes alike in them share tables."""
    return (
        cm.inv_bw[d],
        cm.flop_s_per_byte[d],
        cm.block_s[d],
        cm.stage_s[d],
        cm.xfer_s[d],
        cm.usable[d],
    )


def _tables_of(
    cm: CostModel, d: int, key: tuple[float | int, ...]
) -> tuple[list[float], list[list[float]]]:
    """Node ``d``'s :func:`_stage_tables`, kept per cost model under ``key``."""
    tables = _split_tables(cm)
    if key not in tables:
        tables[key] = _stage_tables(cm, d)
    return tables[key]


def _split_plain(
    cm: CostModel, order: Sequence[int]
) -> tuple[float, tuple[int, int], list[list[int]]]:
    """:func:`latency_split`'s programme in Python: the least time, where it ends and the
    choices (as :func:`~stowplan.planner.strategies.split_arrays.split_steps`)."""
    nb = cm.num_blocks
    inf = math.inf
    g = [inf] * (nb + 1)
    """g[j]: least time with blocks [0, j) placed as stages before the last."""
    best, at = inf, (-1, -1)
    choices: list[list[int]] = []
    # Nodes alike in every figure the stage times use share their tables, as do the
    # splits of one cost model (its stage counts, and the orders of one node set).
    for p, d in enumerate(order):
        lat = cm.latency_s[d]
        last_s, stage_s = _tables_of(cm, d, _table_key(cm, d))
        for j in range(1, nb):
            if g[j] < inf and last_s[j] < inf:
                v = g[j] + last_s[j] + lat
                if v < best:
                    best, at = v, (p, j)
        new = g[:]
        choice = [-1] * (nb + 1)
        for j in range(nb - 1):
            base = lat if j == 0 else g[j] + lat
            if base == inf:
                continue
            for k, s in enumerate(stage_s[j], start=j + 1):
                v = base + s
                if v < new[k]:
                    new[k], choice[k] = v, j
        choices.append(choice)
        g = new
    return best, at, choices


def _no_tables(
    cm: CostModel,
) -> dict[tuple[float | int, ...], tuple[list[float], list[list[float]]]]:
    return {}


_split_tables = PerModel(_no_tables)
"""Per cost model, :func:`latency_split`'s stage tables by the figures they depend on."""


def _no_arrays(cm: CostModel) -> dict[tuple[float | int, ...], StageArrays]:
    return {}


_split_arrays = PerModel(_no_arrays)
"""Per cost model, the stage tables as arrays, by the figures they depend on."""


def _no_parts(cm: CostModel) -> dict[tuple[Any, ...], Any]:
    return {}


_split_parts = PerModel(_no_parts)
"""Per cost model, the stage arrays' parts nodes share (:func:`node_stage_arrays`)."""


def _stage_tables(cm: CostModel, d: int) -> tuple[list[float], list[list[float]]]:
    """Node ``d``'s stage times for :func:`latency_split`, as :meth:`CostModel.stage_time`
    computes them: as the last stage from each block ``j`` (inf where it does not fit),
    and as an earlier stage from each ``j`` to every ``k`` while it fits."""
    nb = cm.num_blocks
    rp, kp, mp = cm.read_prefix, cm.kv_prefix, cm.mem_prefix
    head, embed = cm.head, cm.embed
    ib, fl, bs, ss = cm.inv_bw[d], cm.flop_s_per_byte[d], cm.block_s[d], cm.stage_s[d]
    xfer, room = cm.xfer_s[d], cm.usable[d]
    last = [math.inf] * nb
    for j in range(1, nb):
        if mp[nb] - mp[j] + head <= room:
            weights = rp[nb] - rp[j] + head
            t = max((weights + kp[nb] - kp[j]) * ib, weights * fl)
            last[j] = t + ((nb - j) * bs + ss)
    runs: list[list[float]] = []
    for j in range(nb - 1):
        extra = embed if j == 0 else 0
        run = []
        for k in range(j + 1, nb):
            if mp[k] - mp[j] + extra > room:
                break
            weights = rp[k] - rp[j]
            t = max((weights + kp[k] - kp[j]) * ib, weights * fl)
            run.append(t + ((k - j) * bs + ss) + xfer)
        runs.append(run)
    return last, runs


def _improve(
    best: tuple[float, list[_Node]],
    pool: Sequence[_Node],
    scorer: _Scorer,
) -> tuple[float, list[_Node]]:
    """Drop and swap moves while one lowers the surrogate time (best improvement)."""
    for _ in range(_MAX_ROUNDS):
        _, members = best
        inside = {x.index for x in members}
        outside = [x for x in pool if x.index not in inside]
        improved = best
        # The trials in turn: each member dropped, then swapped for each outside node;
        # then each outside node added.
        # A trial timed a billionth above the best or more cannot improve on it, in any
        # order its time is summed: its set needs no lookup, and where swaps are timed on
        # arrays only the others (``near``, per family) are read.
        drops, swaps, near = scorer.moves(members, outside, best[0] * (1 + 1e-9))
        below = improved[0] - 1e-15
        """A trial improves on the best so far when its time is below this."""
        every = range(len(outside))
        for i, row in enumerate(swaps):
            if i < len(members):
                got = drops[i]
                if got is not None and got < below:
                    improved = (got, members[:i] + members[i + 1 :])
                    below = got - 1e-15
            for j in every if near is None else near[i]:
                got = row[j]
                if got is not None and got < below:
                    rest = members[:i] + members[i + 1 :] if i < len(members) else members
                    improved = (got, [*rest, outside[j]])
                    below = got - 1e-15
        if improved is best:
            return best
        best = improved
    return best


def _latency_key(cm: CostModel, c: Pipeline) -> tuple[float, float, int]:
    ev = evaluated_here(cm, *c)
    return (ev.time_per_token_s, ev.bottleneck_s, len(c[0]))
