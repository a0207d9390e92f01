"""The capacity tests on arrays (fleets of ``ARRAY_NODES`` nodes or more) give the pure
path's numbers: capacities, pass or fail, the least bottleneck and its order, the fluid
bound, and the plan itself, on random fleets on both sides of the threshold."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import replace
from itertools import pairwise

import pytest

from stowplan import Constraints, NodeDescriptor, PlanError, lookup, plan
from stowplan.model import Metric
from stowplan.plan import plan_to_json
from stowplan.planner.exact import pipelines
from stowplan.planner.problem import prepare
from stowplan.planner.strategies import capacity_arrays, fractional, latency, throughput
from stowplan.planner.strategies.capacity_arrays import ARRAY_NODES, CapacityArrays, RoleRows
from stowplan.planner.strategies.memo import PerModel
from stowplan.planner.strategies.throughput import (
    _capacity_order,
    _least_feasible,
    _passes,
    _RoleTimes,
)
from tests.common.fluid_reference import reference_fluid_bound
from tests.common.identical_nodes import fleet_with_copies

_GPUS = (
    ("RTX 4090", 24),
    ("RTX 3090", 24),
    ("L4", 24),
    ("A100 80GB SXM4", 80),
    ("H100 SXM5", 80),
    ("MI300X", 192),
)


def _fleet(seed: int, n: int, *, kinds: int = 4, twins: float = 0.3) -> list[NodeDescriptor]:
    """``n`` single-GPU nodes of a few kinds, with links of their own, a share of them
    copies of an earlier node (classes of several members)."""
    return fleet_with_copies(seed, n, twins, gpus=_GPUS, kinds=kinds, digits=4)


def _tables(model: str, nodes: list[NodeDescriptor], batch: int) -> tuple[object, _RoleTimes]:
    problem = prepare(lookup(model), nodes, Constraints(batch=batch))
    cm = problem.cost_model()
    return cm, _RoleTimes(cm, range(len(nodes)))


def _with_arrays(times: _RoleTimes) -> CapacityArrays:
    return CapacityArrays(
        RoleRows(
            [times.base[i] for i in times.rep],
            range(len(times.rep)),
            [times.tail[i] for i in times.rep],
            range(len(times.rep)),
        ),
        [times.xfer[i] for i in times.rep],
        [times.k_first[i] for i in times.rep],
        times.members,
        times.nodes,
        times.cls,
    )


def _pure(times: _RoleTimes) -> _RoleTimes:
    """``times`` counting on lists (the arrays set aside)."""
    times.arrays = None
    return times


def _probes(times: _RoleTimes, rng: random.Random) -> list[float]:
    """Bottlenecks to test at: stage times themselves (where capacities step), points
    between them, and the ends."""
    values = sorted(
        {v for row in times.stage for v in row} | {v for row in times.tail for v in row}
    )
    picked = rng.sample(values, min(60, len(values)))
    between = [(a + b) / 2 for a, b in pairwise(picked)]
    return [0.0, *picked, *between, values[-1] * 2, float("inf")]


@pytest.mark.parametrize(
    ("seed", "n", "model"),
    [
        (1, 24, "llama3.1:70b"),
        (2, ARRAY_NODES - 1, "llama3.1:70b"),
        (3, ARRAY_NODES, "llama3.1:405b-q4_0"),
        (4, ARRAY_NODES + 1, "llama3.1:8b"),
        (5, 300, "llama3.1:70b"),
    ],
)
def test_capacities_and_the_test_agree_with_the_pure_path(seed: int, n: int, model: str) -> None:
    rng = random.Random(seed)
    times = _pure(_tables(model, _fleet(seed, n), batch=8)[1])
    arrays = _with_arrays(times)
    nb = lookup(model).num_blocks
    tried = passed = 0
    for t in _probes(times, rng):
        for strict in (False, True):
            expected = times.class_caps(t, strict)
            got = arrays.class_caps(t, strict)
            assert [part.tolist() for part in got] == [list(part) for part in expected]
            if strict:
                continue
            for stages in (2, 3, 5, 9, n):
                ok = arrays.passes(got, nb, stages)
                tried, passed = tried + 1, passed + ok
                if n > 16:  # the counting test; up to 16 nodes it runs node by node
                    assert ok == _passes(times, expected, nb, stages)
                cls = times.cls
                per_node = tuple([part[c] for c in cls] for part in expected)
                order = _capacity_order(times.nodes, per_node, nb, stages)  # type: ignore[arg-type]
                assert ok == (order is not None)
                assert arrays.order(got, nb, stages) == order
    assert 0 < passed < tried  # both answers were exercised


@pytest.mark.parametrize("n", [ARRAY_NODES - 1, ARRAY_NODES, ARRAY_NODES + 1, 257])
@pytest.mark.parametrize("model", ["llama3.1:8b", "llama3.1:70b", "llama3.1:405b-q4_0"])
def test_least_feasible_bottleneck_and_order_agree_around_the_threshold(n: int, model: str) -> None:
    nodes = _fleet(n * 7 + len(model), n)
    _, times = _tables(model, nodes, batch=16)
    assert (times.arrays is not None) == (len(times.members) >= ARRAY_NODES)
    arrays = _with_arrays(times)
    pure = _pure(_tables(model, nodes, batch=16)[1])
    nb = lookup(model).num_blocks
    for stages in (2, 4, 8, 16, n):
        expected = _least_feasible(pure, nb, stages)
        got = arrays.least_feasible(nb, stages)
        assert got == expected
        if expected is not None:
            t, order = expected
            assert isinstance(got, tuple) and got[0] == t and 2 <= len(order) <= stages


@pytest.mark.parametrize("n", [ARRAY_NODES - 1, ARRAY_NODES, 400])
def test_fluid_bound_on_arrays_is_the_pure_bound(n: int) -> None:
    nodes = _fleet(n, n, twins=0.0)
    for model, batch in (("llama3.1:70b", 8), ("llama3.1:405b-q4_0", 16)):
        problem = prepare(lookup(model), nodes, Constraints(batch=batch))
        cm = problem.cost_model()
        for stages in (4, 16, n):
            sub = replace(problem, max_stages=min(stages, n))
            got = pipelines.fluid_bound(sub, cm, Metric.THROUGHPUT)
            assert got == reference_fluid_bound(sub, cm, Metric.THROUGHPUT)


def test_the_capacity_count_on_arrays_is_the_pure_count() -> None:
    rng = random.Random(11)
    for _ in range(20):
        n = rng.randrange(1, 300)
        xfer = [rng.uniform(0, 1e-3) for _ in range(n)]
        stage = [rng.choice((0.0, rng.uniform(0, 1e-4))) for _ in range(n)]
        inv = [rng.choice((float("inf"), rng.uniform(1, 500))) for _ in range(n)]
        limit = [float(rng.randrange(0, 90)) + rng.random() for _ in range(n)]
        top = rng.randrange(2, n + 3)
        capacity = capacity_arrays.fluid_capacity(xfer, stage, inv, limit, top)
        for tm in [0.0, *(rng.uniform(0, 0.2) for _ in range(30))]:
            mid = [
                min(max(tm - x - s, 0.0) * v, c) if v != float("inf") else c
                for x, s, v, c in zip(xfer, stage, inv, limit, strict=True)
            ]
            end = [
                min(max(tm - s, 0.0) * v, c) if v != float("inf") else c
                for s, v, c in zip(stage, inv, limit, strict=True)
            ]
            expected = (
                sum(math.floor(x + 1e-9) for x in sorted(mid, reverse=True)[:top])
                + math.floor(max(e - m for e, m in zip(end, mid, strict=True)) + 1e-9)
                + 1
            )
            assert capacity(tm) == expected


def test_the_capacity_count_over_kinds_is_the_pure_count() -> None:
    """Nodes listed once per kind with their counts count as the nodes one by one."""
    rng = random.Random(17)
    for _ in range(40):
        kinds = rng.randrange(1, 6)
        rows = [
            (
                rng.uniform(0, 1e-3),
                rng.choice((0.0, rng.uniform(0, 1e-4))),
                rng.choice((float("inf"), rng.uniform(1, 500))),
                float(rng.randrange(0, 90)) + rng.random(),
            )
            for _ in range(kinds)
        ]
        nodes = [row for row in rows for _ in range(rng.randrange(1, 40))]
        rng.shuffle(nodes)
        top = rng.randrange(2, len(nodes) + 3)
        xfer, stage, inv, limit = (list(v) for v in zip(*nodes, strict=True))
        counted = fractional._kinds_capacity(Counter(nodes), top)
        pure = fractional._pure_capacity(xfer, stage, inv, limit, top)
        for tm in [0.0, *(rng.uniform(0, 0.2) for _ in range(30))]:
            assert counted(tm) == pure(tm)


@pytest.mark.parametrize("n", [ARRAY_NODES, 300])
def test_a_plan_is_the_same_without_numpy(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = _fleet(n + 1, n, twins=0.2)
    for model, batch in (("llama3.1:70b", 16), ("llama3.1:8b", 4)):
        c = Constraints(batch=batch)
        with_arrays = plan_to_json(plan(lookup(model), nodes, c))
        with monkeypatch.context() as m:
            m.setattr(throughput, "numpy_module", lambda: None)
            m.setattr(fractional, "numpy_module", lambda: None)
            m.setattr(fractional, "_figures_of", PerModel(fractional._Figures))
            assert plan_to_json(plan(lookup(model), nodes, c)) == with_arrays


def _surrogate_nodes(rng: random.Random, n: int) -> list[latency._Node]:
    """Surrogate nodes with few distinct figures (ties in every key) and some that cannot
    take a role at all."""
    slopes = [rng.uniform(1e-4, 1e-3) for _ in range(3)]
    heads = [rng.uniform(0, 1e-3) for _ in range(3)]
    xfers = [rng.uniform(0, 1e-3) for _ in range(3)]
    return [
        latency._Node(
            i,
            rng.choice(slopes),
            rng.choice(heads),
            rng.choice(xfers),
            rng.uniform(0, 1e-3),
            (rng.choice((0, 1, 5, 20, 40)), rng.choice((0, 1, 4, 18)), rng.choice((0, 1, 3, 19))),
        )
        for i in rng.sample(range(4 * n), n)
    ]


def test_swaps_timed_on_arrays_are_the_arranged_times() -> None:
    rng = random.Random(5)
    checked = timed = 0
    for _ in range(200):
        nodes = _surrogate_nodes(rng, rng.randrange(3, 40))
        k = rng.randrange(1, min(12, len(nodes) - 1))
        members, ys = nodes[:k], nodes[k:]
        nb = rng.randrange(k + 1, 120)
        got = latency._swap_times(members, ys, nb)
        families = [members[:i] + members[i + 1 :] for i in range(k)] + [members]
        assert len(got) == len(families)
        for rest, row in zip(families, got, strict=True):
            for y, t in zip(ys, row, strict=True):
                expected = latency._arrange([*rest, y], nb)
                assert t == (None if expected is None else expected[0])
                checked += 1
                timed += t is not None
    assert 0 < timed < checked


def test_rankings_on_arrays_are_the_sorted_rankings() -> None:
    rng = random.Random(8)
    for _ in range(20):
        nodes = _surrogate_nodes(rng, rng.randrange(2, 200))
        nodes.sort(key=lambda x: x.index)
        expected = [[x.index for x in sorted(nodes, key=k)] for k in latency._KEYS]
        np = capacity_arrays.numpy_module()
        orders = latency._rank_orders(
            np,
            np.array([x.index for x in nodes]),
            np.array([x.slope for x in nodes]),
            np.array([x.lat for x in nodes]) + np.array([x.xfer for x in nodes]),
            np.array([x.cap_mid for x in nodes]),
        )
        assert [order.tolist() for order in orders] == expected


@pytest.mark.parametrize("n", [40, ARRAY_NODES, 300])
def test_the_relaxed_test_on_arrays_is_the_pure_one(n: int) -> None:
    rng = random.Random(n)
    cm, times = _tables("llama3.1:70b", _fleet(n + 3, n), batch=8)
    times = _pure(times)
    arrays = _with_arrays(times)
    answers = set()
    for t in _probes(times, rng):
        for stages in (2, 3, 6, 20, n):
            expected = throughput.proves_optimal(cm, times, t, stages)  # type: ignore[arg-type]
            assert arrays.relaxation_fails(t, cm.num_blocks, stages) == expected
            answers.add(expected)
    assert answers == {True, False}


@pytest.mark.parametrize("n", [ARRAY_NODES - 1, ARRAY_NODES, ARRAY_NODES + 1, 300])
@pytest.mark.parametrize("twins", [0.0, 0.4])
def test_node_classes_on_arrays_are_the_pure_classes(n: int, twins: float) -> None:
    nodes = _fleet(n + int(twins * 10), n, twins=twins)
    for model, batch in (("llama3.1:70b", 16), ("llama3.1:405b-q4_0", 4)):
        cm = prepare(lookup(model), nodes, Constraints(batch=batch)).cost_model()
        for view in (cm, cm.for_stages(4)):
            positions = list(range(n))
            some = sorted(random.Random(n).sample(positions, n // 2))
            for chosen in (positions, some):
                found = throughput._classes_on_arrays(view, chosen)
                assert throughput._as_lists(found, chosen) == throughput._classes(view, chosen)


def test_first_seen_groups_number_groups_as_a_dict_would() -> None:
    np = capacity_arrays.numpy_module()
    rng = random.Random(5)
    for _ in range(30):
        rows, n = rng.randrange(1, 5), rng.randrange(0, 60)
        pool = [0.0, -0.0, 1.5, 2.0, 1e-300, float("inf")]
        columns = [[rng.choice(pool) for _ in range(n)] for _ in range(rows)]
        index: dict[tuple[float, ...], int] = {}
        expected_group = [index.setdefault(key, len(index)) for key in zip(*columns, strict=True)]
        expected_first = [expected_group.index(g) for g in range(len(index))]
        group, first = capacity_arrays.first_seen_groups(
            np.array(columns, dtype=np.float64).reshape(rows, n)
        )
        assert group.tolist() == expected_group
        assert first.tolist() == expected_first


@pytest.mark.parametrize(("seed", "n"), [(21, ARRAY_NODES), (22, 200)])
def test_the_test_on_one_node_classes_agrees_with_the_pure_path(seed: int, n: int) -> None:
    """Every class one node (no twins): the end candidates are the picked classes."""
    rng = random.Random(seed)
    for model in ("llama3.1:70b", "llama3.1:405b-q4_0"):
        built = _tables(model, _fleet(seed, n, twins=0.0), batch=16)[1]
        arrays = built.arrays  # built without member lists: every class is one node
        assert arrays is not None and arrays.singletons
        times = _pure(built)
        listed = _with_arrays(times)
        nb = lookup(model).num_blocks
        tried = passed = 0
        for t in _probes(times, rng):
            expected = times.class_caps(t, strict=False)
            got = arrays.class_caps(t, strict=False)
            for stages in (2, 4, 7, n):
                ok = arrays.passes(got, nb, stages)
                tried, passed = tried + 1, passed + ok
                assert ok == _passes(times, expected, nb, stages)
                if stages == 4:
                    assert arrays.order(got, nb, stages) == listed.order(got, nb, stages)
        assert 0 < passed < tried
        for stages in (2, 4, 7, n):
            assert arrays.least_feasible(nb, stages) == _least_feasible(times, nb, stages)


@pytest.mark.parametrize("twins", [0.2, 0.97])
@pytest.mark.parametrize("n", [2, ARRAY_NODES - 1, ARRAY_NODES, ARRAY_NODES + 1, 300])
def test_the_fractional_bound_is_the_fluid_bound(
    n: int, twins: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept per cost model and stage limit, asked in any order, on arrays, lists or kinds
    of node (most nodes copies of a few): the same floats as the node-by-node reference."""
    rng = random.Random(n * 13)
    nodes = _fleet(n + 29, n, twins=twins)
    for model, batch in (("llama3.1:70b", 16), ("llama3.1:405b-q4_0", 8), ("llama3.1:8b", 1)):
        try:
            problem = prepare(lookup(model), nodes, Constraints(batch=batch))
        except PlanError:
            continue  # too few nodes to hold the model
        cm = problem.cost_model()
        asks = [
            (replace(problem, min_stages=lo, max_stages=hi), view, objective)
            for lo in {1, 2, min(4, problem.max_stages)}
            for hi in {1, 2, min(9, problem.max_stages), problem.max_stages}
            if lo <= hi
            for view in (cm, cm.for_stages(hi))
            for objective in (Metric.THROUGHPUT, Metric.LATENCY)
        ]
        rng.shuffle(asks)
        for ask in asks + asks[::2]:
            expected = reference_fluid_bound(*ask)
            assert fractional.fractional_bound(*ask) == expected
            assert pipelines.fluid_bound(*ask) == expected
        with monkeypatch.context() as m:
            m.setattr(fractional, "numpy_module", lambda: None)
            m.setattr(fractional, "_figures_of", PerModel(fractional._Figures))
            for ask in asks:
                assert fractional.fractional_bound(*ask) == reference_fluid_bound(*ask)


def _figures(x: latency._Node) -> tuple[object, ...]:
    return (x.index, x.slope, x.head, x.xfer, x.lat, x.cap_mid, x.cap_first, x.cap_last)


@pytest.mark.parametrize("n", [ARRAY_NODES, ARRAY_NODES + 1, 300])
@pytest.mark.parametrize("twins", [0.0, 0.4])
def test_surrogates_on_arrays_are_the_pure_surrogates(n: int, twins: float) -> None:
    nodes = _fleet(n * 3 + int(twins * 10), n, twins=twins)
    for model, batch in (("llama3.1:70b", 16), ("llama3.1:405b-q4_0", 4)):
        cm = prepare(lookup(model), nodes, Constraints(batch=batch)).cost_model()
        for view in (cm, cm.for_stages(3)):
            pure = latency._surrogates(view)
            table = latency._NodeTable(view)
            assert len(table) == len(pure)
            assert [_figures(x) for x in table[:]] == [_figures(x) for x in pure]
            expected = [[x.index for x in sorted(pure, key=k)] for k in latency._KEYS]
            assert [order.tolist() for order in table.orders] == expected
            ranking = latency._Ranking(table.orders[2], table)
            assert [x.index for x in ranking[:7]] == expected[2][:7]
            assert ranking[3] is table[expected[2][3]]


@pytest.mark.parametrize("model", ["llama3.1:70b", "llama3.1:405b-q4_0", "deepseek-v3"])
def test_least_feasible_read_off_other_stage_limits_is_the_search(model: str) -> None:
    """Stage limits asked in any order on one instance (each answer then bounds the next,
    and may settle it with no search) give what a fresh instance's search gives."""
    n = 200
    nb = lookup(model).num_blocks
    settled = 0
    for seed in (3, 11, 29):
        _, times = _tables(model, _fleet(seed, n), batch=16)
        limits = [2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, n - 1, n]
        random.Random(seed).shuffle(limits)
        shared = _with_arrays(times)
        for stages in limits:
            settled += shared._settled(nb, stages) is not None
            fresh = _with_arrays(times)
            assert shared.least_feasible(nb, stages) == fresh.least_feasible(nb, stages)
            assert fresh.least_feasible(nb, stages) == _least_feasible(times, nb, stages)
    assert settled > 0  # some answers were read off the others
