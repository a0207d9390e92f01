"""A lower bound on the slowest stage of every pipeline of at most ``S`` GPU groups, by
the blocks the groups could hold within it.

A stage of ``k`` blocks on group ``v`` (``t`` GPUs of a node) takes at least each of
``R_k · a + k · b + s`` and ``W_k · f + k · b + s`` (``R_k``, ``W_k`` the ``k``
smallest blocks' read and weight bytes, ``a``, ``f`` its seconds per byte read and per
weight byte, ``b`` its cost per block, ``s`` its fixed cost), plus its transfer out
unless it is the last stage: over the network, or inside its node (at least the
cheaper of the two).  It holds at most the ``k`` smallest blocks its memory fits, and
no more consecutive blocks than fit (:meth:`CostModel.max_window`).  So within a
slowest stage ``B`` the group holds at most ``cap(v, B − x)`` blocks, ``x`` its
transfer.

A pipeline of at most ``S`` stages with its slowest stage at most ``B`` covers every
block, so the blocks its groups hold reach ``nb``.  Its groups number at most ``S``;
a node's groups take at most its GPUs; on every node the pipeline uses, one group
sends over the network or is the last stage, the others send at least at the cheaper
link; and the last stage sends nothing.  The most blocks any such choice holds —
per node the best multiset of group sizes of ``j`` groups with one group charged the
network (the one that loses least), across nodes the ``S`` largest steps of each
node's concave majorant over ``j`` (a relaxation of choosing ``j`` per node), with the
last stage, which holds the head (read, computed and held) and sends nothing, counted
the lesser of two ways: in place of one group charged the network (the largest such
gain of any group), or as a group of its own beside the ``S − 1`` largest steps (its
node's other groups at most one network charge more than counted) — is therefore at
least ``nb`` at every ``B`` some pipeline reaches.  Where it falls short of ``nb``,
``B`` is below every such pipeline's slowest stage: the bound is the largest such
``B`` a bisection finds.

Blocks of unequal size (a model's dense blocks before its MoE blocks) make the ``k``
smallest generous: every stage counts the few small blocks as its own.  So the count is
also taken with the ``t`` smallest blocks (by weight, or by memory) set apart: a stage holding ``j``
of them holds at most ``cap_t + j`` blocks, ``cap_t`` its count over the others alone,
and the ``j`` of all stages add up to at most ``t``; the least of these counts bounds
the blocks held (:func:`excluded_counts` says which ``t`` are tried).  Where the ``t``
are the model's first blocks, stages of consecutive blocks hold them: one stage at most
holds some of them beside others, as many of the others as the least time of both
leaves, and any other stage holding some holds those alone
(:meth:`StageCapacity._first_held`).

The bisection runs to a relative :data:`COARSE` of 1e-6; where it ends near the
slowest stage of the plan in hand, the point :data:`PRECISION` (1e-13) below it is
tried: a plan whose slowest stage is the bound is then proven optimal (certificates
compare within 1e-12).

Each stage count's cycle is at least ``m`` times its slowest stage
(:func:`~stowplan.planner.tensor.joint.joint_cycle`); the joint solve's least slowest
stage is over every stage count, so a count of few stages (where ``m`` is small but
each stage is long) is bounded by this one instead.

The same figures also bound the time per token of a pipeline of at least ``S`` stages
(two or more) whose every stage is within ``B`` (:meth:`StageCapacity.trip_within`): a
stage of ``k`` blocks on group ``v`` takes at least the time of its ``k`` smallest
blocks, and holds at most as many as run within ``B`` with its transfer at the cheaper
link; the last stage holds the head (read, held and computed), sends nothing, and holds
at most as many as run within ``B`` so.  Each stage counted with its transfer and a hop
inside its node at the least, a node's stages of a multiset of groups (all sending, or
one of them the last stage) take at least their first blocks' times plus the least
further blocks' increments (each group's times are convex in ``k``, so the least
increments of all its groups are the best split); on a pipeline over several nodes each
node pays its network hop in place of one hop inside, and each but the last stage's
node sends once over its network link in place of the cheaper one.  Across nodes the
least over
every count of stages and of blocks per node, the last stage on one of them (a min-plus
product per node over the stages, counted up to ``S``, and the blocks; nodes alike
until one more lowers nothing), and the least of one node alone bound the time per
token; ``S`` is counted up to :data:`STAGES_COUNTED`, or :data:`STAGES_COUNTED_FAR`
where asked.  It never falls as ``B`` falls or ``S`` rises, and where no choice holds
every block it is infinite.

The ``k`` smallest blocks count a model's small blocks in every stage, so this bound is
also taken with the ``t`` smallest set apart (as above; the largest of the bounds
holds): a stage counts only the rest, and one holding none of the rest holds a block
set apart, so at most ``t`` do.  Those but the last stage are counted apart, each at
the least time a stage holding one block set apart takes with its send and its hop (its
node's network hop where no other group fits beside it); the last stage may hold the
head alone.  A pipeline of at least ``S`` stages, ``d`` of them counted apart, keeps
at least ``S − d``.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import pairwise, product
from typing import Any

from stowplan.cost import CostModel
from stowplan.planner.problem import Problem
from stowplan.planner.tensor.nodes import GroupCosts, block_byte_arrays, numpy_module

__all__ = [
    "APART_COUNTS",
    "APART_STEP",
    "BISECTION_STEPS",
    "COARSE",
    "PRECISION",
    "STAGES_COUNTED",
    "STAGES_COUNTED_FAR",
    "StageCapacity",
    "bisect_bound",
    "counted_stages",
    "excluded_counts",
    "fewest_holding",
]

BISECTION_STEPS = 96
"""Most halvings of the interval holding the bound."""

PRECISION = 1e-13
"""How far below a slowest stage in hand the bound is sought (certificates compare
within 1e-12)."""

COARSE = 1e-6
"""Its relative precision elsewhere (a bound that does not reach the plan in hand)."""

STAGES_COUNTED = 16
"""The most stages :meth:`StageCapacity.trip_within` counts unless asked for more: a
pipeline of more is bounded as one of this many (each count costs the square of the
counts more)."""

STAGES_COUNTED_FAR = 32
"""The most stages it counts when asked for more: where a count past
:data:`STAGES_COUNTED` still holds the least bound, far from the plan in hand."""


def _seconds(np: Any, gcm: CostModel, v: int, read: Any, weights: Any, blocks: Any) -> Any:
    """The least seconds of stages on group ``v`` reading ``read`` bytes, computing
    ``weights`` bytes and holding ``blocks`` blocks (arrays alike): the larger of its reads'
    and its FLOPs' time, each with its blocks' and its fixed costs."""
    fixed = blocks * gcm.block_s[v] + gcm.stage_s[v]
    return np.maximum(read * gcm.inv_bw[v] + fixed, weights * gcm.flop_s_per_byte[v] + fixed)


def counted_stages(stages: int, most: int | None = None) -> int:
    """The stages :meth:`StageCapacity.trip_within` counts for a pipeline of at least
    ``stages``: two at the least, ``most`` (:data:`STAGES_COUNTED` unless given) at the
    most."""
    return max(2, min(stages, STAGES_COUNTED if most is None else most))


SLACK = 1e-12
"""The relative slack :meth:`StageCapacity.trip_within` gives its limit: a stage time
summed in another order may round a little above it."""


class StageCapacity:
    """The blocks ``groups`` could hold within a slowest stage, and the bound it gives
    per stage count (:meth:`slowest`)."""

    def __init__(self, problem: Problem, groups: GroupCosts) -> None:
        np = numpy_module()
        gcm, nb = groups.cm, problem.model.num_blocks
        self.nb = nb
        weights, read = block_byte_arrays(np, gcm, nb)
        mem = np.diff(np.array(gcm.mem_prefix[: nb + 1], dtype=float))
        # Per set of smallest blocks set apart (none, and the smallest by weight or by
        # memory up to where those step up: the dense blocks before a model's MoE
        # blocks), the blocks left sorted by each figure.
        apart_sets: dict[tuple[int, ...], None] = {(): None}
        for figure in (weights, mem):
            order = np.argsort(figure, kind="stable")
            for t in excluded_counts(figure[order].tolist())[1:]:
                apart_sets.setdefault(tuple(sorted(order[:t].tolist())), None)
        self._apart = [len(apart) for apart in apart_sets]
        self._first = [len(apart) > 0 and apart == tuple(range(len(apart))) for apart in apart_sets]
        """Per set apart, whether it is the model's first blocks."""
        sorted_rest = []
        apart_bytes = []
        for apart in apart_sets:
            apart_bytes.append((read[list(apart)], weights[list(apart)], mem[list(apart)]))
            rest = np.ones(nb, dtype=bool)
            rest[list(apart)] = False
            sorted_rest.append(
                (
                    np.cumsum(np.sort(read[rest])),
                    np.cumsum(np.sort(weights[rest])),
                    np.cumsum(np.sort(mem[rest])),
                )
            )
        ks = np.arange(1, nb + 1)
        window = gcm.max_window()
        self._times: list[dict[tuple[object, ...], list[float]]] = [{} for _ in self._apart]
        """Per count set apart, per kind of group: the least time of k = 1, 2, … blocks of
        those left (before its transfer)."""
        self._last: list[dict[tuple[object, ...], list[float]]] = [{} for _ in self._apart]
        """The same as the last stage: with the head read, held and computed."""
        self._headed: list[dict[tuple[object, ...], float]] = [{} for _ in self._apart]
        """Per count set apart, per kind of group: the least time of the last stage holding
        none of the blocks left (the head alone; inf where it does not fit)."""
        self._adds: list[dict[tuple[object, ...], list[list[list[float]]]]] = [
            {} for _ in self._apart
        ]
        """Per count set apart, per kind of group, as a stage that sends and as the last:
        per j = 1, 2, … blocks set apart (up to :data:`APART_PARTS`), the least time of
        a stage holding them and k = 0, 1, … of the rest (before its transfer)."""
        spares: list[dict[tuple[object, ...], float]] = [{} for _ in self._apart]
        """Per count set apart, per kind of group: the least time of a stage holding one
        block set apart (before its transfer; inf where none fits)."""
        head = float(gcm.head)
        self._sends: dict[tuple[object, ...], tuple[float, float]] = {}
        """Per kind of group: its transfer over the network and over the cheaper link."""
        self._inside: dict[tuple[object, ...], float] = {}
        """Per kind of group: the least hop of a stage of it to another on its node."""
        nodes: dict[tuple[object, ...], _NodeKind] = {}
        latency = problem.cost_model().latency_s
        for d, per_node in enumerate(groups.kinds):
            kinds: list[tuple[int, tuple[object, ...]]] = []
            for t, v in sorted(per_node.items()):
                key = (gcm.stage_class[v], gcm.intra_xfer_s[v])
                if key not in self._sends:
                    for times, last, headed, spare, adds, (
                        least_read,
                        least_weights,
                        least_mem,
                    ), (apart_read, apart_weights, apart_mem) in zip(
                        self._times,
                        self._last,
                        self._headed,
                        spares,
                        self._adds,
                        sorted_rest,
                        apart_bytes,
                        strict=True,
                    ):
                        one = np.maximum(
                            apart_read * gcm.inv_bw[v], apart_weights * gcm.flop_s_per_byte[v]
                        )
                        one = np.where(apart_mem <= gcm.usable[v], one, np.inf)
                        spare[key] = float(one.min(initial=np.inf)) + (
                            gcm.block_s[v] + gcm.stage_s[v] if window[v] > 0 else np.inf
                        )
                        alone = head * max(gcm.inv_bw[v], gcm.flop_s_per_byte[v])
                        fits = gcm.usable[v] >= head
                        headed[key] = float(alone + gcm.stage_s[v]) if fits else math.inf
                        parts = min(len(apart_read), APART_PARTS)
                        apart_r = np.cumsum(np.sort(apart_read))[:parts]
                        apart_w = np.cumsum(np.sort(apart_weights))[:parts]
                        beside: list[list[list[float]]] = []
                        for out, extra in ((times, 0.0), (last, head)):
                            room = gcm.usable[v] - extra
                            fit = int(np.searchsorted(least_mem, room, side="right"))
                            held = min(fit, window[v], len(least_mem)) if room >= 0 else 0
                            out[key] = _seconds(
                                np,
                                gcm,
                                v,
                                least_read[:held] + extra,
                                least_weights[:held] + extra,
                                ks[:held],
                            ).tolist()
                            # With j = 1, 2, … of the blocks set apart beside k = 0, 1, … of
                            # the rest: the j least of them by reads and by weights.
                            r0 = np.concatenate(([0.0], least_read[:held])) + extra
                            w0 = np.concatenate(([0.0], least_weights[:held])) + extra
                            k0 = np.arange(held + 1)
                            beside.append(
                                [
                                    _seconds(
                                        np, gcm, v, r0 + apart_r[j], w0 + apart_w[j], k0 + j + 1
                                    ).tolist()
                                    for j in range(parts)
                                ]
                            )
                        adds[key] = beside
                    net = gcm.xfer_s[v]
                    self._sends[key] = (net, min(net, gcm.intra_xfer_s[v]))
                # The least hop a stage of this kind pays inside its node.
                inside = min(gcm.intra_latency_s[v], latency[d])
                self._inside[key] = min(self._inside.get(key, inside), inside)
                kinds.append((t, key))
            gpus = problem.nodes[d].num_gpus
            sig = (gpus, tuple(kinds), latency[d])
            if sig in nodes:
                nodes[sig].count += 1
            else:
                sizes = tuple(t for t, _ in kinds)
                nodes[sig] = _NodeKind(1, [key for _, key in kinds], sizes, gpus, nb, latency[d])
        self._nodes = list(nodes.values())
        self._left_out = [
            min(
                (
                    spare[key]
                    + self._sends[key][1]
                    # Its hop inside the node where another group fits beside it, else the
                    # node's network hop: no other stage is there.
                    + (self._inside[key] if size + min(node.sizes) <= node.gpus else node.latency)
                    for node in self._nodes
                    for key, size in zip(node.groups, node.sizes, strict=True)
                ),
                default=math.inf,
            )
            for spare in spares
        ]
        """Per count set apart, the least a stage holding only blocks set apart takes, with
        its send and its hop (:meth:`_trip_of` counts such stages apart)."""
        self._np = np
        self._least: dict[tuple[int, int | None], tuple[float, float]] = {}
        """Per stage count and node limit, the interval holding the bound so far."""
        self._steps: dict[
            tuple[tuple[tuple[int, int], ...], float], list[tuple[float, int, bool]]
        ] = {}
        """:meth:`_node_steps` per tuple of the groups' block counts and latency limit."""
        self._within: dict[tuple[int, tuple[tuple[int, int], ...], int], tuple[float, float]] = {}
        """:meth:`trip_within` per count set apart (by index), tuple of the blocks left each
        kind of group holds and count of stages, with the limit it was sought within."""
        self._tables: dict[
            tuple[int, int, tuple[tuple[int, int], ...]], tuple[Any, Any] | None
        ] = {}
        """:meth:`_node_table` per count set apart and node kind (by index) and its groups'
        blocks held (as a stage that sends, as the last)."""
        self._latencies = sorted({node.latency for node in self._nodes})
        """The nodes' distinct network latencies (seconds), ascending."""
        most = [
            times[-1] if times else 0.0
            for times in (*self._times[0].values(), *self._last[0].values())
        ]
        self._top = max(most, default=0.0) + max((n for n, _ in self._sends.values()), default=0.0)

    def held(
        self,
        bottleneck: float,
        stages: int,
        nodes: int | None = None,
        latest: float = math.inf,
    ) -> float:
        """The most blocks ``stages`` groups could hold with no stage above ``bottleneck``
        (the relaxation of the module), on at most ``nodes`` nodes when given, of those
        whose network latency is at most ``latest`` seconds."""
        if bottleneck <= 0 or stages < 1:
            return 0.0
        # Only the latencies present matter: a limit is keyed by the largest within it.
        limit = max((x for x in self._latencies if x <= latest), default=-1.0)
        least = math.inf
        for apart, first, times_of, last_of, adds in zip(
            self._apart, self._first, self._times, self._last, self._adds, strict=True
        ):
            # A stage of k blocks, j of them among those set apart, holds k − j of the
            # rest: it holds at most the rest's count plus j, and the j add up to
            # ``apart`` at most over the pipeline.  Where they are the model's first
            # blocks, the time they take is counted too (:meth:`_first_held`).
            caps: dict[tuple[object, ...], tuple[int, int]] = {}
            gain, last, loss = -math.inf, 0, 0
            for key, times in times_of.items():
                net, either = self._sends[key]
                at_net = bisect_right(times, bottleneck - net)
                inside = bisect_right(times, bottleneck - either)
                caps[key] = (inside, at_net)
                held_last = bisect_right(last_of[key], bottleneck)
                gain = max(gain, held_last - at_net)
                last, loss = max(last, held_last), max(loss, inside - at_net)
            if not caps:
                least = min(least, apart)
                continue
            known = (tuple(caps.values()), limit)
            steps = self._steps.get(known)
            if steps is None:
                steps = self._steps[known] = self._node_steps(caps, limit)
            total = _best_steps(steps, stages, nodes)
            before = _best_steps(steps, stages - 1, nodes)
            # The last stage holds the head and sends nothing.  Either it holds what it
            # holds in place of a count charged the network (the group that gains most),
            # or it is a group of its own beside one group fewer, its node's others
            # at the cheaper link at most one network charge (``loss``) more than counted.
            plain = min(total + gain, last + before + loss) + apart
            if first:
                # What the stages after the one holding the last of them hold of the
                # rest, the last stage among them: one stage fewer, or two.
                after = [
                    0.0
                    if c < 1
                    else min(
                        _best_steps(steps, c, nodes) + gain,
                        last + _best_steps(steps, c - 1, nodes) + loss,
                    )
                    for c in (stages - 1, stages - 2)
                ]
                plain = min(plain, self._first_held(apart, after, adds, bottleneck, stages))
            least = min(least, plain)
        return least

    def _first_held(
        self,
        apart: int,
        after: list[float],
        adds: dict[tuple[object, ...], list[list[list[float]]]],
        bottleneck: float,
        stages: int,
    ) -> float:
        """The most blocks ``stages`` stages hold within ``bottleneck`` where the
        ``apart`` blocks set apart are the model's first (its dense blocks before its MoE
        blocks): a stage holds consecutive blocks, so one stage at most holds some of them
        beside others (the stage holding the last of them), and any other stage holding
        some holds those alone.  That stage holds ``j`` of them and as many of the rest
        as their least time beside them allows (``adds``); the stages before it hold the
        others (one stage at least, if any); the stages after it hold at most ``after``
        (of the rest, with one stage fewer and two fewer than ``stages``; none where it is
        the last stage).  The most over ``j`` and those three ways."""

        def mixed(j: int, as_last: bool = False) -> float:
            """The most a stage holding ``j`` ≥ 1 blocks set apart and others holds: one
            that sends, or the last stage (past :data:`APART_PARTS` of them, counted with
            the time of that many)."""
            best = -math.inf
            for key, (sent, last) in adds.items():
                tables = last if as_last else sent
                if not tables:
                    continue
                budget = bottleneck if as_last else bottleneck - self._sends[key][1]
                fit = bisect_right(tables[min(j, len(tables)) - 1], budget)
                if fit:
                    best = max(best, fit - 1 + j)
            return best

        # The stage holding the last of them is the last stage: it holds every other block.
        found = max(mixed(j, as_last=True) + (apart - j) for j in range(1, apart + 1))
        if stages >= 2:
            one_fewer, two_fewer = after
            found = max(found, one_fewer + mixed(apart))  # it holds them all
            found = max(found, one_fewer + apart)  # a stage of them alone, then the rest
            for j in range(1, apart):  # some alone before it, the others beside the rest
                found = max(found, two_fewer + mixed(j) + (apart - j))
        return found

    def _node_steps(
        self, caps: dict[tuple[object, ...], tuple[int, int]], latest: float
    ) -> list[tuple[float, int, bool]]:
        """Every node kind's concave steps of blocks held per group added, largest first,
        with how many nodes share each and whether it is a node's first, of the nodes of
        network latency at most ``latest``: a function of the groups' block counts and
        the limit alone (kept per both: the bisection's later steps mostly ask the same)."""
        np = self._np
        steps: list[tuple[float, int, bool]] = []
        for node in self._nodes:
            if not node.groups or node.latency > latest:
                continue  # no group the rule allows, or too slow a link: no stage here
            inside = np.array([caps[key][0] for key in node.groups], dtype=float)
            if node.counts is None:
                # Too many multisets: j groups hold at most j of the most one holds, and
                # the node's GPUs at most their count at the most a GPU of a group holds.
                j = np.arange(node.most + 1)
                per_gpu = float((inside / np.array(node.sizes)).max(initial=0.0))
                best = np.minimum(j * float(inside.max(initial=0.0)), node.gpus * per_gpu)
            else:
                loss = np.array([caps[key][0] - caps[key][1] for key in node.groups])
                # Per multiset: its groups at the cheaper link, one charged the network.
                value = node.counts @ inside - np.where(node.used, loss, np.inf).min(axis=1)
                best = np.zeros(node.most + 1)
                np.maximum.at(best, node.multiset_sizes, value)
                best = np.maximum.accumulate(best)  # at most j groups
            concave = _concave_steps(best.tolist())
            steps += [(step, node.count, i == 0) for i, step in enumerate(concave)]
        steps.sort(reverse=True)
        return steps

    def trip_within(
        self,
        bottleneck: float,
        stages: int = 2,
        within: float = math.inf,
        most: int | None = None,
    ) -> float:
        """A lower bound on the time per token (stage times and hops) of every pipeline of
        at least ``stages`` stages (two or more, counted as :func:`counted_stages` counts
        them up to ``most``) on these groups
        with no stage above ``bottleneck`` (inf where none holds every block): the
        module's last paragraph.  Where it is above ``within``, inf (what lies beyond is
        not sought)."""
        if bottleneck <= 0:
            return math.inf
        bottleneck *= 1 + SLACK  # a stage at the limit, its sum rounded the other way
        least = counted_stages(stages, most)
        found = 0.0
        # Each count of blocks set apart bounds alone; the most set apart first (mostly
        # the tightest: inf there is inf for all).
        for i in reversed(range(len(self._apart))):
            # Per kind of group: the most blocks left a stage of it holds within the
            # bottleneck, sending at the cheaper link, and as the last stage (with the
            # head, sending nothing); the bound is a function of these, the count set
            # apart and the stages alone: kept per all three.
            caps = tuple(self._caps(i, key, bottleneck) for key in self._times[i])
            # Kept with the limit it was sought within: inf there is inf within any less.
            got, sought = self._within.get((i, caps, least), (math.inf, -math.inf))
            if math.isinf(got) and sought < within:
                got = self._trip_of(i, dict(zip(self._times[i], caps, strict=True)), least, within)
                self._within[(i, caps, least)] = got, within
            if got > within:
                return math.inf
            found = max(found, got)
        return found

    def _caps(self, i: int, key: tuple[object, ...], bottleneck: float) -> tuple[int, int]:
        """The most blocks left past the ``i``-th count set apart that a stage of kind
        ``key`` holds within ``bottleneck``, as a stage that sends at the cheaper link (0:
        none) and as the last (0: none; with blocks set apart, -1: none, 0: the head
        alone)."""
        send = self._sends[key][1]
        times, last = self._times[i][key], self._last[i][key]
        held = bisect_right(times, bottleneck - send), bisect_right(last, bottleneck)
        headed = self._headed[i][key] if self._apart[i] else 0.0
        if math.isinf(headed) or headed > bottleneck:  # the head alone does not fit
            return held[0], -1
        return held

    def _trip_of(
        self, i: int, caps: dict[tuple[object, ...], tuple[int, int]], least: int, within: float
    ) -> float:
        """:meth:`trip_within` of the blocks left past the ``i``-th count set apart that
        each kind of group holds (:meth:`_caps`), on at least ``least`` stages, sought
        within ``within`` (inf beyond: every partial time counted is at most the whole).

        With ``t`` blocks set apart, a stage holding none of the rest holds one of them:
        at most ``t`` stages do.  Those but the last stage (which may hold the head alone)
        are counted apart, ``d`` ≤ ``t`` of them each at the least time any stage holding
        one block set apart takes with its send and its hop (:attr:`_left_out`); the others
        hold a block of the rest each, at least ``least − d`` stages with the last.  A
        node's hops count as before over the stages kept (the node is entered over the
        network once at least, whichever stage it enters), its send over the network at
        the least any of its kinds of group pays."""
        np = self._np
        apart = self._apart[i]
        nb = self.nb - apart
        spare = self._left_out[i]
        # Per kind of group holding a block: its blocks, the least time of its first block
        # (of none, as the last stage with blocks set apart) with its hop inside the node
        # (and its send at the cheaper link, but for the last stage), and each further
        # block's; as a stage that sends and as the last.
        kinds: list[dict[tuple[object, ...], tuple[int, float, Any]]] = [{}, {}]
        for key, (cap, last) in caps.items():
            inside = self._inside[key]
            if cap > 0:
                series = self._times[i][key][:cap]
                kinds[0][key] = (cap, series[0] + self._sends[key][1] + inside, np.diff(series))
            if last > 0 or (apart and last == 0):
                series = self._last[i][key][:last]
                if apart:
                    series = [self._headed[i][key], *series]
                kinds[1][key] = (last, series[0] + inside, np.diff(series))
        alone = math.inf
        """The least time of a pipeline on one node."""
        # Per count of stages (the last counting all from ``counted`` on) and of blocks,
        # the least time on any nodes, each paying its network hop once; without the last
        # stage and with it.  Two stages are not counted (a pipeline on several nodes has
        # them; one node's stages alone are counted there), which halves the work.
        counted = least if least > 2 else 1
        # Per count of stages left out (each at ``spare``), the fewest kept.
        kept = [(least, 0.0)] + [
            (least - d, d * spare) for d in range(1, min(apart, least - 1) + 1)
        ]
        spread = np.full((2, counted + 1, nb + 1), np.inf)
        spread[0, 0, 0] = 0.0
        for index, node in enumerate(self._nodes):
            if node.counts is None:
                return 0.0  # too many multisets to count: no bound
            key = (i, index, tuple(caps[k] for k in node.groups))
            if key not in self._tables:
                self._tables[key] = self._node_table(node, kinds, nb, 0 if apart else 1)
            table = self._tables[key]
            if table is None:
                continue
            one, own = table
            for fewest, extra in kept:
                alone = min(alone, float(one[fewest:, nb].min(initial=np.inf)) + extra)
            # The node's counts of stages from ``counted`` on are one: that many or more.
            folded = np.full((2, counted + 1, nb + 1), np.inf)
            top = min(counted, own.shape[1] - 1)
            folded[:, :top] = own[:, :top]
            folded[:, top] = own[:, top:].min(axis=1)
            folded[folded > within] = np.inf
            if not np.isfinite(folded[:, 1:]).any():
                continue  # every stage of the node takes longer than the limit
            for _ in range(node.count):
                after = _staged_min_plus(np, spread, folded)
                if np.array_equal(after, spread):
                    break  # no further node of this kind lowers any count
                spread = after
        # The counts below ``counted`` are exact: ``counted - d`` kept of at least
        # ``least - d`` (where ``counted`` is 1, every count is at least 1).
        spread_kept = kept if counted == least else kept[:1]
        return min(
            alone,
            *(
                float(spread[1, counted - d, nb]) + extra
                for d, (_, extra) in enumerate(spread_kept)
            ),
        )

    def _node_table(
        self,
        node: _NodeKind,
        kinds: list[dict[tuple[object, ...], tuple[int, float, Any]]],
        nb: int,
        last_least: int,
    ) -> tuple[Any, Any] | None:
        """Per count of stages and of blocks, the least time of ``node``'s stages as the
        whole pipeline (the last stage among them) and as part of one over several nodes
        (one hop over the network; without the last stage and with it), each kind of
        group's blocks and times in ``kinds`` (as a stage that sends, as the last); None
        where no group of the node holds a block.

        One row per choice of groups (:meth:`_NodeKind.choices`): its blocks go to the
        least increments of all its groups (each group's times are convex in its blocks),
        found for every count at once from the increments sorted together."""
        np = self._np
        parts = [kinds[role].get(key) for role in (0, 1) for key in node.groups]
        if all(part is None for part in parts):
            return None  # no group the rule allows, or none holds a block
        present = np.array([part is not None for part in parts], dtype=bool)
        choices = node.choices()
        chosen = choices[~(choices[:, ~present] > 0).any(axis=1)]
        held = np.array([0 if part is None else part[0] for part in parts])
        firsts = np.array([0.0 if part is None else part[1] for part in parts])
        stages = chosen.sum(axis=1)
        top = np.minimum(chosen @ held, nb)
        # The fewest blocks each row holds: one per stage, but for the last where it may
        # hold none (``last_least``).
        fewest = stages - chosen[:, len(node.groups) :].sum(axis=1) * (1 - last_least)
        keep = (fewest <= top) & (stages <= node.most)
        if not keep.any():
            return None
        chosen, stages, top, fewest = chosen[keep], stages[keep], top[keep], fewest[keep]
        # Every group's increments sorted together; a row takes each as often as it has
        # groups of its kind.
        steps = [part[2] for part in parts if part is not None]
        values = np.concatenate([*steps, np.zeros(0)])
        owner = np.repeat(np.flatnonzero(present), [len(x) for x in steps])
        order = np.argsort(values, kind="stable")
        values, owner = values[order], owner[order]
        times = chosen[:, owner]
        taken = np.zeros((len(chosen), len(values) + 1))
        np.cumsum(times, axis=1, out=taken[:, 1:])
        summed = np.zeros_like(taken)
        np.cumsum(times * values, axis=1, out=summed[:, 1:])
        # Per row and count of further blocks e: the steps wholly taken before e, and e's
        # share of the next.
        extra = np.arange(nb + 1)
        rows = np.arange(len(chosen))[:, None]
        width = float(taken[:, -1].max()) + nb + 2
        at = np.searchsorted(
            (taken[:, 1:] + rows * width).ravel(), (extra + rows * width).ravel(), side="left"
        ).reshape(len(chosen), nb + 1) - rows * len(values)
        before = taken[rows, at]
        part_step = np.append(values, 0.0)[at]  # past the last step: no count there
        sums = summed[rows, at] + np.where(extra > before, (extra - before) * part_step, 0.0)
        table = np.full((len(chosen), nb + 1), np.inf)
        counts = fewest[:, None] + extra
        valid = counts <= top[:, None]
        base = chosen @ firsts
        table[np.nonzero(valid)[0], counts[valid]] = (base[:, None] + sums)[valid]
        last = chosen[:, len(node.groups) :].sum(axis=1)
        alone = np.full((node.most + 1, nb + 1), np.inf)
        ends = last > 0
        np.minimum.at(alone, stages[ends], table[ends])
        # One stage hops over the network in place of its hop inside the node; without
        # the last stage, one sends over the network too, in place of the cheaper link.
        inside = np.array([self._inside[key] for key in node.groups] * 2)
        used = chosen > 0
        network = np.maximum(0.0, node.latency - np.where(used, inside, -np.inf).max(axis=1))
        dearer = np.array([self._sends[key][0] - self._sends[key][1] for key in node.groups])
        sends = np.where(used[:, : len(node.groups)], dearer, np.inf).min(axis=1)
        if not last_least:  # the node's send may be a stage's left out: of any kind
            sends = np.minimum(sends, dearer.min())
        network += np.where(last > 0, 0.0, sends)
        own = np.full((2, node.most + 1, nb + 1), np.inf)
        np.minimum.at(own, (last, stages), table + network[:, None])
        own[0, 0, 0] = 0.0
        return alone, own

    def slowest(
        self,
        stages: int,
        enough: float = math.inf,
        nodes: int | None = None,
        sharp: float = math.inf,
    ) -> float:
        """A lower bound on the slowest stage of every pipeline of at most ``stages``
        stages on these groups (on at most ``nodes`` nodes when given; inf where none
        holds every block); ``enough`` where the bound reaches it (not sought further).
        Sought to :data:`COARSE`; where it ends near ``sharp`` (a slowest stage in hand),
        the point :data:`PRECISION` below that is tried, which may prove it the least."""
        key = (stages, nodes)
        found = self._least.get(key)
        if found is None:
            if enough < math.inf and self.held(enough, stages, nodes) < self.nb:
                return enough  # nothing within ``enough`` holds every block
            hi = min(enough, self._top * 2 + 1e-9)
            if self.held(hi, stages, nodes) < self.nb:
                self._least[key] = (math.inf, math.inf)
                return math.inf
            found = (0.0, hi)
        lo, hi = found
        if math.isinf(lo):
            return lo
        lo, hi = bisect_bound(
            lambda b: self.held(b, stages, nodes) >= self.nb, lo, hi, COARSE, sharp
        )
        self._least[key] = (lo, hi)
        return lo


def bisect_bound(
    reached: Callable[[float], bool],
    lo: float,
    hi: float,
    precision: float,
    sharp: float = math.inf,
) -> tuple[float, float]:
    """``(lo, hi)`` narrowed by bisection until ``hi - lo`` is at most ``precision`` of
    ``hi`` (at most :data:`BISECTION_STEPS` halvings): ``reached`` false at ``lo``, true at
    ``hi``, as given.  Where ``hi`` ends near ``sharp`` (a value in hand), ``lo`` is then
    raised to just below it (:data:`PRECISION`) if ``reached`` is false there: a bound
    that the value in hand meets proves it the least."""
    for _ in range(BISECTION_STEPS):
        if hi - lo <= precision * hi:
            break
        mid = (lo + hi) / 2
        if reached(mid):
            hi = mid
        else:
            lo = mid
    near = sharp * (1 - PRECISION)
    if lo < near < hi * (1 + precision) and near < math.inf and not reached(near):
        lo = near
    return lo, max(hi, lo)


def _staged_min_plus(np: Any, a: Any, b: Any) -> Any:
    """``a`` ⊗ ``b`` over (holds the last stage, stages, blocks): ``out[h, j, k] = min of
    a[h1, j1, k1] + b[h2, j2, k2]`` over ``h1 + h2 = h`` (at most one last stage), ``j1 +
    j2 = j`` (the last count of either standing for that many or more: ``j1 + j2`` at or
    above it lands there; ``b`` has as many counts as ``a``) and ``k1 + k2 = k``.

    The product is symmetric: each finite entry of the sparser side is added to the
    other side shifted by it, all at once where that gathers at most
    :data:`GATHERED_ENTRIES` values, else one block count at a time."""
    held_a, held_b = np.isfinite(a), np.isfinite(b)
    if np.count_nonzero(held_a) < np.count_nonzero(held_b):
        a, b, held_b = b, a, held_a
    finite = np.nonzero(held_b)
    if len(finite[0]) * a.size <= GATHERED_ENTRIES:
        return _gathered_min_plus(np, a, b, finite)
    out = np.full_like(a, np.inf)
    least, n = a.shape[1] - 1, a.shape[2]
    for h2, j2 in np.argwhere(held_b.any(axis=2)).tolist():
        # The counts of ``a`` from ``least - j2`` on all reach the last count.
        split = least - j2
        src = a[: 2 - h2]
        if j2:
            src = np.concatenate(
                [src[:, :split], src[:, split:].min(axis=1, keepdims=True)], axis=1
            )
        target = out[h2:, j2:]
        row = b[h2, j2]
        for k2 in np.flatnonzero(np.isfinite(row)).tolist():
            np.minimum(target[:, :, k2:], src[:, :, : n - k2] + row[k2], out=target[:, :, k2:])
    return out


GATHERED_ENTRIES = 100_000
"""Most values :func:`_staged_min_plus` gathers at once (one gather of many values costs
about what a few whole-array operations per finite entry do)."""


def _gathered_min_plus(np: Any, a: Any, b: Any, finite: tuple[Any, Any, Any]) -> Any:
    """:func:`_staged_min_plus` of ``a`` and ``b`` with ``finite`` the indices of ``b``'s
    finite entries, as one gather: ``a`` laid out padded with inf (a shift below zero
    reads it), its counts below the last, then the least of its counts from each on (a
    count that reaches the last reads the least of all that do)."""
    h2, j2, k2 = finite
    hs, js, n = a.shape
    least = js - 1
    width, height = 2 * n, (3 * least + 1) * 2 * n
    laid = np.full((hs + 1, 3 * least + 1, width), np.inf)
    laid[1:, least : 2 * least, n:] = a[:, :least]
    laid[1:, 2 * least :, n:] = np.minimum.accumulate(a[:, ::-1], axis=1)[:, ::-1]
    counts = np.arange(js)
    row_of = np.where(counts < least, least + counts, 3 * least)
    at = (
        (np.arange(1, hs + 1) * height)[:, None, None]
        + (row_of * width)[None, :, None]
        + np.arange(n, width)[None, None, :]
    ).ravel()
    got = laid.ravel().take(at[None, :] - (h2 * height + j2 * width + k2)[:, None])
    got += b[h2, j2, k2][:, None]
    return got.min(axis=0, initial=np.inf).reshape(a.shape)


def _best_steps(
    steps: list[tuple[float, int, bool]], groups: int, nodes: int | None = None
) -> float:
    """The sum of the ``groups`` largest positive steps (each ``count`` times); with
    ``nodes``, of steps of at most that many nodes: each step at most ``nodes`` times, and
    at most ``nodes`` nodes' first steps (a node's groups take its steps from its first,
    so the nodes a pipeline uses take one first step each).  Taking the largest that the
    two limits allow is the most such steps sum to (they form a matroid)."""
    total, left = 0.0, groups
    firsts = groups if nodes is None else nodes
    for step, count, first in steps:
        if left <= 0 or step <= 0:
            break
        take = min(count, left) if nodes is None else min(count, left, nodes)
        if first:
            take = min(take, firsts)
            firsts -= take
        total += take * step
        left -= take
    return total


APART_STEP = 0.1
"""Blocks are set apart up to where the sorted weights step up by more than this share."""

APART_COUNTS = 2
"""Most counts of smallest blocks set apart (besides none)."""

APART_PARTS = 8
"""Most blocks set apart whose least added time is tabled (:attr:`StageCapacity._adds`): a
stage holding more is counted at that many's."""


def excluded_counts(weights: list[float]) -> list[int]:
    """0, and the counts ``t`` (at most half the blocks, at most :data:`APART_COUNTS`) at
    which the ascending ``weights`` step up by more than :data:`APART_STEP`."""
    out = [0]
    for t in range(1, len(weights) // 2 + 1):
        if len(out) > APART_COUNTS:
            break
        if weights[t] > weights[t - 1] * (1 + APART_STEP):
            out.append(t)
    return out


MULTISETS = 4096
"""Most multisets of group sizes a node's GPUs are split into, counted one by one;
beyond, the node's blocks are bounded by its largest group's and its GPUs' counts."""


@dataclass(slots=True)
class _NodeKind:
    """Nodes alike in their GPUs, groups and network latency: how many, each group size's
    kind (``sizes`` ascending), and the multisets of group counts their GPUs allow (one
    row each; None past :data:`MULTISETS`)."""

    count: int
    groups: list[tuple[object, ...]]
    sizes: tuple[int, ...]
    gpus: int
    blocks: int
    latency: float
    """Seconds of its network hop."""
    counts: Any = field(init=False)
    used: Any = field(init=False)
    multiset_sizes: Any = field(init=False)
    most: int = field(init=False)
    """The most groups counted (no more than the node's GPUs or the blocks)."""
    _choices: Any = field(init=False, default=None)

    def choices(self) -> Any:
        """Per choice of the node's groups (:attr:`counts`, all sending or one of a kind
        the last stage): how many of each kind send, then how many of each are the last
        (one row each; kept)."""
        if self._choices is None:
            import numpy as np

            rows = self.counts.astype(int)
            out = [np.concatenate([rows, np.zeros_like(rows)], axis=1)]
            for g in range(len(self.groups)):
                some = rows[rows[:, g] > 0]
                last = np.zeros_like(some)
                last[:, g] = 1
                out.append(np.concatenate([some - last, last], axis=1))
            self._choices = np.concatenate(out)
        return self._choices

    def __post_init__(self) -> None:
        import numpy as np

        self.most = min(self.gpus // min(self.sizes), self.blocks) if self.sizes else 0
        if math.prod(self.gpus // t + 1 for t in self.sizes) > MULTISETS:
            self.counts = self.used = self.multiset_sizes = None
            return
        rows = _multisets(self.sizes, self.gpus)
        self.counts = np.array(rows, dtype=float).reshape(len(rows), len(self.sizes))
        self.used = self.counts > 0
        self.multiset_sizes = np.minimum(self.counts.sum(axis=1).astype(int), self.most)


@lru_cache(maxsize=256)
def _multisets(sizes: tuple[int, ...], gpus: int) -> list[tuple[int, ...]]:
    """Counts of groups of each size (in ``sizes``' order) taking at most ``gpus`` GPUs,
    at least one group."""
    ranges = [range(gpus // t + 1) for t in sizes]
    return [
        m
        for m in product(*ranges)
        if any(m) and sum(c * t for c, t in zip(m, sizes, strict=True)) <= gpus
    ]


def _concave_steps(values: list[float]) -> list[float]:
    """The increments of the least concave majorant of ``values`` (at 0, 1, 2, …): each
    at least the next, summing over the first ``j`` to at least ``values[j]``."""
    hull: list[tuple[int, float]] = []
    for x, y in enumerate(values):
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (y2 - y1) * (x - x1) <= (y - y1) * (x2 - x1):
                hull.pop()
            else:
                break
        hull.append((x, y))
    steps: list[float] = []
    for (x1, y1), (x2, y2) in pairwise(hull):
        steps += [(y2 - y1) / (x2 - x1)] * (x2 - x1)
    return steps


def fewest_holding(problem: Problem, groups: GroupCosts, most: int) -> int:
    """The fewest of ``groups`` (GPU groups of ``problem``'s nodes, of their allowed
    degrees) whose memory could hold every block, the embed and the head: a stage count
    below it has no pipeline, whatever its times.  ``most + 1`` where not even ``most``
    could.

    A group holds at most the whole blocks its room fits of the smallest blocks by
    memory (weights and KV), and no more consecutive blocks than fit
    (:meth:`CostModel.max_window`); the first stage's room is less the embed and the
    last's less the head, each on a group of its own (one group holds both only as the
    one stage).  Per node, the most blocks any multiset of its degrees within its GPUs
    holds as ``j`` groups, with the embed or the head or neither; across nodes the most
    of any ``j`` groups, by a knapsack over the nodes (nodes alike folded: no more of
    them than groups count); the fewest ``j`` that holds every block is the answer.
    """
    np = numpy_module()
    gcm, nb = groups.cm, problem.model.num_blocks
    if nb == 0:
        return 1
    least_mem = np.cumsum(np.sort(np.diff(np.array(gcm.mem_prefix[: nb + 1], dtype=float))))
    window = gcm.max_window()
    embed, head = float(gcm.embed), float(gcm.head)

    held: dict[tuple[float, int], int] = {}
    """Per room and window, the blocks held (groups alike share them)."""

    def cap(v: int, extra: float) -> int:
        room = gcm.usable[v] - extra
        if room < 0:
            return -1  # holds not even the embed or head: no such stage
        key = (room, window[v])
        if key not in held:
            held[key] = min(int(np.searchsorted(least_mem, room, side="right")), window[v])
        return held[key]

    if any(cap(v, embed + head) >= nb for kinds in groups.kinds for v in kinds.values()):
        return 1
    # Per node kind: per (groups, embed?, head?) the most blocks, -1 where impossible.
    tables: dict[tuple[object, ...], tuple[list[list[int]], int]] = {}
    for d, kinds in enumerate(groups.kinds):
        gpus = problem.nodes[d].num_gpus
        options = tuple(
            (t, cap(v, 0.0), cap(v, embed), cap(v, head)) for t, v in sorted(kinds.items())
        )
        key = (gpus, options)
        if key in tables:
            table, count = tables[key]
            tables[key] = (table, count + 1)
            continue
        tables[key] = (_node_holding(gpus, options), 1)
    # The knapsack counts up to ``top`` groups: from 8, doubled while none holds.
    top = min(8, max(2, most))
    while True:
        found = _fleet_holding(list(tables.values()), top, nb)
        if found is not None:
            return found
        if top >= most:
            return most + 1
        top = min(2 * top, most)


def _fleet_holding(tables: list[tuple[list[list[int]], int]], top: int, nb: int) -> int | None:
    """The fewest groups, two to ``top``, of nodes of ``tables`` (per node kind its
    :func:`_node_holding` and count) that hold ``nb`` blocks with the embed and head
    placed; None where no count up to ``top`` does."""
    # Per (groups, flags) the most blocks, flags = embed placed | head << 1.
    fleet = [[-1] * 4 for _ in range(top + 1)]
    fleet[0][0] = 0
    for table, count in tables:
        for _ in range(min(count, top)):
            out = [row[:] for row in fleet]
            for j, row in enumerate(fleet):
                for f, have in enumerate(row):
                    if have < 0:
                        continue
                    for k in range(1, min(len(table), top + 1 - j)):
                        for g, adds in enumerate(table[k]):
                            if adds >= 0 and not f & g and have + adds > out[j + k][f | g]:
                                out[j + k][f | g] = have + adds
            fleet = out
    best = -1
    for j in range(2, top + 1):
        best = max(best, fleet[j][3])
        if best >= nb:
            return j
    return None


def _node_holding(gpus: int, options: tuple[tuple[int, int, int, int], ...]) -> list[list[int]]:
    """Per count of groups ``j`` and flags (embed placed | head << 1), the most blocks
    groups of ``options`` (degree, blocks held, with the embed, with the head) taking at
    most ``gpus`` GPUs hold; -1 where no such groups are."""
    # State: GPUs used, groups, flags.
    most = gpus // min((t for t, *_ in options), default=gpus + 1) if options else 0
    best = [[[-1] * 4 for _ in range(most + 1)] for _ in range(gpus + 1)]
    best[0][0][0] = 0
    for used in range(gpus + 1):
        for j in range(most + 1):
            for f in range(4):
                have = best[used][j][f]
                if have < 0:
                    continue
                for t, plain, with_embed, with_head in options:
                    if used + t > gpus or j + 1 > most:
                        continue
                    for flag, adds in ((0, plain), (1, with_embed), (2, with_head)):
                        if adds < 0 or f & flag:
                            continue
                        cell = best[used + t][j + 1]
                        if have + adds > cell[f | flag]:
                            cell[f | flag] = have + adds
    table = [[-1] * 4 for _ in range(most + 1)]
    for per_used in best:
        for j, row in enumerate(per_used):
            for f in range(4):
                table[j][f] = max(table[j][f], row[f])
    return table
