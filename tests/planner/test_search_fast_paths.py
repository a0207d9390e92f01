"""The searches' shortcuts give what the plain paths give: the fastest single node found
once per stage class, the swaps timed on arrays and the local search on them."""

from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from stowplan import Constraints, lookup
from stowplan.planner.problem import prepare
from stowplan.planner.strategies import latency, throughput
from stowplan.planner.strategies.evaluated import evaluated, evaluated_here
from stowplan.planner.strategies.throughput import fastest_single
from tests.common.identical_nodes import fleet_with_copies

_GPUS = (("RTX 4090", 24), ("L4", 24), ("A100 80GB SXM4", 80), ("MI300X", 192), ("RTX 3060", 12))


@pytest.mark.parametrize(
    ("seed", "n", "model", "batch"),
    [
        (1, 40, "llama3.1:8b", 1),
        (2, 200, "llama3.1:8b", 16),
        (3, 300, "llama3.1:70b", 4),
        (4, 90, "llama3.1:8b", 8),
    ],
)
def test_fastest_single_node_by_classes_is_the_node_by_node_one(
    seed: int, n: int, model: str, batch: int
) -> None:
    nodes = fleet_with_copies(seed, n, 0.6, gpus=_GPUS)
    cm = prepare(lookup(model), nodes, Constraints(batch=batch)).cost_model()
    found = 0
    for u in sorted({1, (batch + 1) // 2, batch}):
        view = cm.at_microbatch(u)
        expected = fastest_single(view, per_class=False)
        assert fastest_single(view) == expected
        nb = view.num_blocks
        need = view.stage_bytes(0, nb, True, True)
        times = [
            view.stage_time(d, 0, nb, True, True)
            for d, room in enumerate(view.usable)
            if need <= room
        ]
        assert [view.stage_time(d, 0, nb, True, True) for d in expected] == [min(times)] * bool(
            times
        )
        found += bool(expected)
    assert found or model == "llama3.1:70b"


def _nodes(rng: random.Random, n: int) -> list[latency._Node]:
    """Surrogate nodes of few distinct figures (ties in every key), some that cannot take
    a role at all."""
    slopes = [rng.uniform(1e-4, 1e-3) for _ in range(3)]
    heads = [rng.uniform(0, 1e-3) for _ in range(3)]
    xfers = [rng.uniform(0, 1e-3) for _ in range(3)]
    lats = [rng.uniform(0, 1e-3) for _ in range(4)]
    return [
        latency._Node(
            i,
            rng.choice(slopes),
            rng.choice(heads),
            rng.choice(xfers),
            rng.choice(lats),
            (rng.choice((0, 1, 2, 5, 9)), rng.choice((0, 1, 4, 8)), rng.choice((0, 1, 3, 7))),
        )
        for i in rng.sample(range(4 * n), n)
    ]


def test_swaps_of_long_member_lists_timed_on_arrays_are_the_arranged_times() -> None:
    rng = random.Random(11)
    checked = timed = 0
    for _ in range(60):
        nodes = _nodes(rng, rng.randrange(14, 70))
        k = rng.randrange(10, len(nodes) - 2)
        members, ys = nodes[:k], nodes[k:]
        nb = rng.randrange(k + 1, 4 * k + 10)
        got = latency._swap_times(members, ys, nb)
        families = [members[:i] + members[i + 1 :] for i in range(k)] + [members]
        assert len(got) == len(families)
        for rest, row in zip(families, got, strict=True):
            assert len(row) == len(ys)
            for y, t in zip(ys, row, strict=True):
                expected = latency._arrange([*rest, y], nb)
                assert t == (None if expected is None else expected[0])
                checked += 1
                timed += t is not None
    assert 0 < timed < checked


def test_family_ends_are_the_best_each_family_keeps() -> None:
    """Each family's last stage, stage 0 beside it and stage 0 of all are the best of its
    own members, where the best of the whole list is often the one left out (and the
    next, the family's last)."""
    rng = random.Random(29)
    third = 0
    for _ in range(400):
        members = _nodes(rng, rng.randrange(1, 8))
        m = len(members)
        families = [members[:i] + members[i + 1 :] for i in range(m)] + [members]
        lasts, rest_firsts, all_firsts = latency._family_ends(members)
        for family, last, rest_first, all_first in zip(
            families, lasts, rest_firsts, all_firsts, strict=True
        ):
            ends = [x for x in family if x.cap_last >= 1]
            firsts = [x for x in family if x.cap_first >= 1]
            assert last is (min(ends, key=lambda x: x.end_key) if ends else None)
            assert all_first is (max(firsts, key=lambda x: x.first_key) if firsts else None)
            beside = [x for x in firsts if x is not last]
            assert rest_first is (max(beside, key=lambda x: x.first_key) if beside else None)
            ranked = sorted(
                (x for x in members if x.cap_first >= 1), key=lambda x: x.first_key, reverse=True
            )
            third += rest_first is not None and ranked.index(rest_first) == 2
    assert third  # a family left out both of the list's first two


def test_drops_timed_on_arrays_are_the_arranged_times() -> None:
    rng = random.Random(17)
    checked = timed = 0
    for _ in range(80):
        nodes = _nodes(rng, rng.randrange(4, 40))
        k = rng.randrange(1, len(nodes) - 1)
        members, ys = nodes[:k], nodes[k:]
        nb = rng.randrange(max(k - 2, 1), 4 * k + 10)
        swaps, drops = latency._move_times(members, ys, nb)
        assert swaps == latency._swap_times(members, ys, nb)
        assert len(drops) == k
        for i, t in enumerate(drops):
            expected = latency._arrange(members[:i] + members[i + 1 :], nb)
            assert t == (None if expected is None else expected[0])
            checked += 1
            timed += t is not None
    assert 0 < timed < checked


def _scorer(batched: bool, nb: int, lo: int, hi: int) -> latency._Scorer:
    shared: Any = SimpleNamespace(batched=batched, arranged={}, timed={})
    return latency._Scorer(shared, nb, lo, hi)


def _scored(scorer: latency._Scorer) -> dict[frozenset[int], float | None]:
    """A scorer's kept sets by their nodes, with their times."""
    out: dict[frozenset[int], float | None] = {}
    for found in scorer.seen.values():
        if found is not None:
            t, listed, after = found
            nodes = [*listed] if after is None else [*listed, after]
            out[frozenset(x.index for x in nodes)] = t
    return out


def test_local_search_on_arrays_is_the_plain_one() -> None:
    """The search with swaps timed on arrays (and sets keyed by the search's own bits)
    ends where the plain one does, having scored the sets it keeps as the plain one did;
    the plain one keeps more only of sets a billionth slower than where both end (a swap
    timed so on arrays is neither looked up nor kept)."""
    rng = random.Random(23)
    searched = moved = passed = 0
    for _ in range(200):
        nodes = _nodes(rng, rng.randrange(20, 60))
        k = rng.randrange(3, 14)
        nb = rng.randrange(k + 2, 6 * k + 10)
        lo, hi = rng.choice(((2, 64), (2, k + 1), (k - 1, k + 3)))
        got = []
        for batched in (True, False):
            scorer = _scorer(batched, nb, lo, hi)
            start = scorer.time(nodes[:k])
            if start is None:
                break
            best = latency._improve((start, nodes[:k]), nodes[k:], scorer)
            got.append(
                (best[0], [x.index for x in best[1]], scorer.arrangement(best[1]), scorer.asked)
            )
            got.append(_scored(scorer))
        if got:
            searched += 1
            assert got[0] == got[2]
            on_arrays, plain = got[1], got[3]
            assert on_arrays.items() <= plain.items()
            left = [t for key, t in plain.items() if key not in on_arrays]
            assert all(t is not None and t >= got[0][0] * (1 + 1e-9) for t in left)
            passed += len(left)
            moved += got[0][1] != [x.index for x in nodes[:k]]
    assert searched > 20
    assert moved > 10
    assert passed > 0


def test_swaps_on_arrays_are_the_plain_ones_and_keep_the_same_sets() -> None:
    """Every swap of a round, timed on arrays and kept (a set scored before: its first
    time), is the plain scorer's, within the stage limits and out of them."""
    rng = random.Random(31)
    compared = 0
    for _ in range(60):
        nodes = _nodes(rng, rng.randrange(12, 40))
        k = rng.randrange(3, 10)
        nb = rng.randrange(k + 2, 5 * k + 10)
        lo, hi = rng.choice(((2, 64), (2, k), (k, k + 1)))
        members, ys = nodes[:k], nodes[k:]
        got = []
        for batched in (True, False):
            scorer = _scorer(batched, nb, lo, hi)
            scorer.time(members[1:] + ys[:1])  # a set kept before, in another order
            got.append((scorer.swaps(members, ys), _scored(scorer)))
        assert got[0] == got[1]
        compared += sum(t is not None for row in got[0][0] for t in row)
    assert compared > 100


def test_drops_are_the_times_of_the_sets() -> None:
    rng = random.Random(29)
    for _ in range(30):
        nodes = _nodes(rng, rng.randrange(6, 30))
        nb = rng.randrange(len(nodes), 4 * len(nodes))
        scorer, plain = _scorer(True, nb, 2, 40), _scorer(True, nb, 2, 40)
        scorer.time(nodes[1:])  # a set kept before: its first time again
        plain.time(nodes[1:])
        expected = [plain.time(nodes[:i] + nodes[i + 1 :]) for i in range(len(nodes))]
        assert scorer.drops(nodes) == expected


def test_kept_evaluations_are_the_cost_models() -> None:
    nodes = fleet_with_copies(7, 30, 0.5, gpus=_GPUS)
    cm = prepare(lookup("llama3.1:8b"), nodes, Constraints(batch=8)).cost_model()
    nb = cm.num_blocks
    rng = random.Random(3)
    for _ in range(3):  # each pipeline asked again: the kept evaluation must still be its own
        for stages in (2, 3, 5):
            for view in (cm, cm.for_stages(stages)):
                order = random.Random(stages).sample(range(len(nodes)), stages)
                for _ in range(4):
                    cuts = sorted(rng.sample(range(1, nb), stages - 1))
                    bounds = [0, *cuts, nb]
                    assert evaluated(view, order, bounds) == view.evaluate(order, bounds)
                    assert evaluated_here(view, order, bounds) == view.evaluate_here(order, bounds)


def test_kept_splits_are_the_splits_and_copies() -> None:
    nodes = fleet_with_copies(9, 40, 0.3, gpus=_GPUS)
    cm = prepare(lookup("llama3.1:70b"), nodes, Constraints(batch=4)).cost_model()
    rng = random.Random(2)
    orders = [rng.sample(range(len(nodes)), rng.randrange(2, 12)) for _ in range(6)]
    orders += [o[::-1] for o in orders]  # one node set in two orders: two splits
    for _ in range(2):  # asked again: the kept split
        for order in orders:
            expected = latency.latency_split(cm, order)
            got = latency.kept_split(cm, order)
            assert got == expected
            if got is not None:
                got[0].append(-1)  # a caller's change reaches no later answer
                got[1].append(-1)
    assert any(latency.latency_split(cm, o) is not None for o in orders)


def test_kept_bottleneck_splits_are_the_splits_and_copies() -> None:
    nodes = fleet_with_copies(10, 40, 0.3, gpus=_GPUS)
    cm = prepare(lookup("llama3.1:70b"), nodes, Constraints(batch=4)).cost_model()
    rng = random.Random(4)
    orders = [rng.sample(range(len(nodes)), rng.randrange(2, 14)) for _ in range(5)]
    orders += [o[::-1] for o in orders]  # one node set in two orders: two splits
    found = 0
    for _ in range(2):  # asked again: the kept split
        for order in orders:
            for min_stages, upper in ((1, None), (3, None), (1, 1e-9), (1, 0.05), (2, 1.0)):
                expected = throughput.min_bottleneck_split(cm, order, min_stages, upper)
                got = throughput.kept_bottleneck_split(cm, order, min_stages, upper)
                assert got == expected
                if got is not None:
                    found += 1
                    got[0].append(-1)  # a caller's change reaches no later answer
                    got[1].append(-1)
    assert found


def test_kept_searches_are_the_searches_and_copies() -> None:
    nodes = fleet_with_copies(12, 40, 0.3, gpus=_GPUS)
    problem = prepare(lookup("llama3.1:70b"), nodes, Constraints(batch=4))
    cm = problem.cost_model()
    found = 0
    for _ in range(2):  # asked again: the kept answer
        for lo, hi in ((1, 40), (2, 6), (3, 3), (1, 1), (5, 12)):
            sub = replace(problem, min_stages=lo, max_stages=hi)
            for view in (cm, cm.for_stages(hi)):
                expected = throughput.search_throughput(view, lo, hi)
                got = throughput.throughput_search(sub, view)
                assert got == expected
                plain = latency.pipeline_of_least_latency(view, lo, hi)
                kept = latency.latency_pipeline(sub, view)
                assert kept == plain
                for p in (got[0], kept):
                    if p is not None:
                        found += 1
                        p[0].append(-1)  # a caller's change reaches no later answer
                        p[1].append(-1)
    assert found


@pytest.mark.parametrize(
    ("seed", "n", "model", "batch"),
    [(13, 40, "llama3.1:70b", 4), (14, 160, "llama3.1:70b", 16), (15, 90, "llama3.1:405b-q4_0", 1)],
)
def test_a_search_no_ceiling_held_back_answers_for_higher_ceilings(
    seed: int, n: int, model: str, batch: int
) -> None:
    """The latency search's answer under a stage ceiling it never reached stands for every
    higher ceiling (and lower ones down to the most nodes it asked about): each is what a
    search of its own gives."""
    # Small GPUs: the ceilings bind (405b-q4_0 fits on no three of them).
    small = (("RTX 3060", 12), ("RTX 4090", 24), ("L4", 24), ("A100 80GB SXM4", 80))
    nodes = fleet_with_copies(seed, n, 0.4, gpus=small)
    problem = prepare(lookup(model), nodes, Constraints(batch=batch))
    cm = problem.cost_model()
    for lo in (1, 2, 5):
        for hi in (3, 6, 8, 12, 24, 48, n, 4):
            if hi < lo:
                continue
            sub = replace(problem, min_stages=lo, max_stages=hi)
            assert latency.latency_pipeline(sub, cm) == latency.pipeline_of_least_latency(
                cm, lo, hi
            )
    reused = latency._reached(cm)
    assert any(reused.values())


def test_orders_split_within_the_ceiling_stop_where_the_stages_run_out() -> None:
    """Blocks that differ (gemma2's alternate windows) make the search split every node
    by memory.  Under a stage ceiling that split keeps to the ceiling: it never has more
    stages, it is the greedy split within the ceiling at its own bottleneck, no faster
    than the least split of the order, and where that least split keeps to the ceiling,
    the same split.  Each search answers as one on a cost model of its own."""
    small = (("RTX 3060", 12), ("RTX 4090", 24), ("L4", 24), ("A100 80GB SXM4", 80))
    nodes = fleet_with_copies(21, 120, 0.4, gpus=small)
    problem = prepare(lookup("gemma2:27b"), nodes, Constraints(batch=4))
    cm = problem.cost_model()
    assert not cm.uniform
    for hi in (24, 2, 3, 5, 8, 12):
        fresh = prepare(lookup("gemma2:27b"), nodes, Constraints(batch=4)).cost_model()
        assert throughput.search_throughput(cm, 1, hi) == throughput.search_throughput(fresh, 1, hi)
    every = range(len(cm.nodes))
    by_room = sorted(every, key=lambda d: (cm.usable[d], d))
    kept, same, fewer = 0, 0, 0
    for order in (by_room, by_room[::-1]):
        free = throughput.min_bottleneck_split(cm, order)
        assert free is not None
        for ceiling in (2, 3, 4, 6, 8, 12, 24):
            split = throughput.min_bottleneck_split(cm, order, 1, None, ceiling)
            if len(free[0]) <= ceiling:
                assert split == free
                same += 1
            if split is None:
                continue
            kept += 1
            assert len(split[0]) <= ceiling
            fewer += len(free[0]) > ceiling
            bottleneck = evaluated_here(cm, *split).bottleneck_s
            assert throughput.greedy_split(cm, order, bottleneck, 1, ceiling) == split
            assert bottleneck >= evaluated_here(cm, *free).bottleneck_s
    # Both kinds of case occur: splits the ceiling left alone, and splits it cut short.
    assert same > 0 and fewer > 0 and kept > same
