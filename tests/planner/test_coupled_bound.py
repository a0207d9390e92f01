"""The bound coupling a pipeline's slowest stage and its trip (time per token at one
microbatch): the trip knapsack with every stage held within a time, against every
pipeline of small random fleets (tests.common.brute_force), and the bisection over that
time that certifies plans of several sequences."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stowplan import Constraints, NodeDescriptor, PlanError, plan
from stowplan.cost import CostModel, microbatches
from stowplan.models import resolve_model
from stowplan.planner.exact import pipelines, trip
from stowplan.planner.exact.pipelines import CYCLE_EXACT_LIMIT
from stowplan.planner.problem import prepare
from stowplan.planner.strategies import cycle
from tests.common.bounded_apart import bounded_apart
from tests.common.brute_force import pipelines_of
from tests.common.gpu_fleets import nodes_of
from tests.common.instances import RANGED, instances, ranged


def _least_cycle(cm: CostModel, lo: int, hi: int) -> float:
    """The least cycle of every pipeline of ``lo`` to ``hi`` stages (each at the
    microbatch of its own stage count)."""
    return min(
        (cm.evaluate(*p).cycle_s for s in range(lo, hi + 1) for p in pipelines_of(cm, s)),
        default=math.inf,
    )


def _range_case(inst, batch, fewest, most):
    """A range of stage counts as the certificates bound it: the problem held to it, its
    cost model at the microbatch of its most stages, ``m`` of its fewest, and the least
    cycle of every pipeline in it (None where none has one)."""
    model, nodes = inst
    problem, c, lo, hi = ranged(inst, batch, fewest, most)
    cm = CostModel(model, nodes, c)
    truth = _least_cycle(cm, lo, hi)
    if not math.isfinite(truth):
        return None
    m, _ = microbatches(batch, lo)
    return replace(problem, min_stages=lo, max_stages=hi), cm.for_stages(hi), m, truth


@settings(max_examples=80, deadline=None)
@given(
    *RANGED,
    st.floats(0.0, 1.5),
)
def test_the_capped_knapsack_is_never_above_the_least_trip_within_the_cap(
    inst, batch, fewest, most, share
):
    model, nodes = inst
    problem, c, lo, hi = ranged(inst, batch, fewest, most)
    sub = replace(problem, min_stages=lo, max_stages=hi)
    cm = CostModel(model, nodes, c).for_stages(hi)
    everything = [
        (max(ev.stage_time_s), ev.time_per_token_s)
        for s in range(lo, hi + 1)
        for p in pipelines_of(cm, s)
        for ev in (cm.evaluate_here(*p),)
    ]
    if not everything:
        return
    cap = share * max(t for t, _ in everything)
    got = trip.capped_trip_bound(sub, cm, cap)
    assert got is not None
    within = [tpt for t, tpt in everything if t <= cap]
    assert got <= min(within, default=math.inf) * (1 + 1e-9)
    # A lower cap never lowers the bound; no cap is the trip knapsack itself.
    assert trip.capped_trip_bound(sub, cm, cap / 2) >= got
    assert trip.capped_trip_bound(sub, cm, math.inf) == trip.trip_bound(sub, cm)


_COUPLED_RANGES = (
    instances(max_nodes=4, max_blocks=6),
    st.sampled_from([2, 3, 8, 16]),
    st.integers(1, 4),
    st.integers(1, 4),
)
"""The draws :func:`_range_case` reads (instance, sequences, fewest, most stages)."""


@settings(max_examples=80, deadline=None)
@given(*_COUPLED_RANGES, st.floats(1.0, 2.0))
def test_the_coupled_bound_is_never_above_the_least_cycle(inst, batch, fewest, most, over):
    """Over a range of stage counts, at the microbatch of its most stages and ``m`` of its
    fewest (as the certificates bound a range), from no bound in hand and below a
    ceiling at or above the least cycle."""
    case = _range_case(inst, batch, fewest, most)
    if case is None:
        return
    sub, view, m, truth = case
    got = trip.coupled_cycle_bound(sub, view, m, 0.0, truth * over)
    assert got is not None
    bound, laid = got
    assert bound <= truth * (1 + 1e-9)
    if laid is not None:  # a pipeline: distinct nodes, every block once, in order
        order, bounds = laid
        assert len(set(order)) == len(order) == len(bounds) - 1 >= 2
        assert bounds[0] == 0 and bounds[-1] == inst[0].num_blocks
        assert all(a < b for a, b in itertools.pairwise(bounds))


def _plain_coupled(
    problem: object, cm: CostModel, m: int, floor: float, ceiling: float
) -> tuple[float, object] | None:
    """:func:`trip.coupled_cycle_bound`'s bisection with a knapsack of every block at every
    step (where the test fails at ``mid``, the upper end moves down to ``L(mid) / m``)."""
    limits = trip._limits(problem, cm)  # type: ignore[arg-type]
    if limits is None or m < 1 or not (0 <= floor < ceiling < math.inf):
        return None
    lo, hi = floor / m, ceiling / m
    top = trip._trip_bound(cm, limits, hi)
    if top is None:
        return None
    if top > ceiling:
        return ceiling, None
    for _ in range(trip.COUPLED_STEPS - 1):
        if (hi - lo) * m <= trip._COUPLED_PRECISION * ceiling:
            break
        mid = (lo + hi) / 2
        got = trip._trip_bound(cm, limits, mid)
        assert got is not None
        lo, hi = (mid, min(hi, got / m)) if m * mid < got else (lo, mid)
    laid = trip._solution(cm, *limits, hi, layout=True)
    return max(floor, m * lo), None if laid is None else laid[1]


@settings(max_examples=80, deadline=None)
@given(*_COUPLED_RANGES, st.floats(0.0, 1.0), st.floats(1.0, 1.5))
def test_the_bisection_from_a_floor_the_test_passes_near_is_the_plain_one(
    inst, batch, fewest, most, under, over
):
    """Where the test holds at the least upper end the bisection reaches from the floor,
    only that end's knapsack is solved, laid out as it is, not the ceiling's; from every floor (at, near and far below the
    coupled bound) the bound is never above the least cycle, and where blocks are alike
    the bound and the pipeline laid out are the plain bisection's (where they differ the
    heaviest blocks' knapsack may stand for every block's at a step and move the upper
    end further down: the layout there checks it)."""
    case = _range_case(inst, batch, fewest, most)
    if case is None:
        return
    sub, view, m, truth = case
    ceiling = truth * over
    plain = _plain_coupled(sub, view, m, 0.0, ceiling)
    assert plain is not None
    solved, solution = trip._trip_bound, trip._solution
    knapsacks: list[int] = []

    def counted(*args: object, **kwargs: object) -> object:
        knapsacks[-1] += 1
        return solution(*args, **kwargs)  # type: ignore[arg-type]

    limits = trip._limits(sub, view)
    assert limits is not None
    for floor in (0.0, plain[0] * under, plain[0], (plain[0] + ceiling) / 2):
        if not floor < ceiling:
            continue
        knapsacks.append(0)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(trip, "_solution", counted)
            got = trip.coupled_cycle_bound(sub, view, m, floor, ceiling)
        assert got is not None and floor <= got[0] <= max(floor, truth) * (1 + 1e-9)
        if trip._heavy(view) is None:
            assert got == _plain_coupled(sub, view, m, floor, ceiling)
        at_floor = solved(view, limits, floor / m)
        wide = (ceiling - floor) > trip._COUPLED_PRECISION * ceiling
        if floor > 0 and wide and at_floor is not None and at_floor <= floor:
            # The test holds from the floor on: only the least upper end's knapsack is
            # solved, laid out as it is (where blocks differ, every block's is solved
            # there: the heaviest blocks' is within it); the ceiling's is not (the trip
            # within it is at most the upper end's, below the ceiling).
            assert knapsacks[-1] == 1


@settings(max_examples=80, deadline=None)
@given(*_COUPLED_RANGES, st.floats(1.0, 1.5), st.floats(0.5, 1.5))
def test_a_bisection_cut_short_solves_no_more_and_bounds_no_higher(
    inst, batch, fewest, most, over, share
):
    """Given ``short``, the bisection stops once ``m`` times its upper end is below it: it
    solves no more knapsacks than the whole bisection and its bound is never above that
    one's (nor the least cycle); where blocks are alike the upper end bounds ``T*``, so a
    bound cut below the whole one means the whole one is below ``short`` as well (the
    range stays below the plan either way).  ``short`` 0 is the whole bisection."""
    case = _range_case(inst, batch, fewest, most)
    if case is None:
        return
    sub, view, m, truth = case
    ceiling = truth * over
    solution = trip._solution
    knapsacks: list[int] = []

    def counted(*args: object, **kwargs: object) -> object:
        knapsacks[-1] += 1
        return solution(*args, **kwargs)  # type: ignore[arg-type]

    got = {}
    for short in (0.0, ceiling * share):
        knapsacks.append(0)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(trip, "_solution", counted)
            got[short] = trip.coupled_cycle_bound(sub, view, m, 0.0, ceiling, short)
    whole, cut = got.values()
    assert whole == trip.coupled_cycle_bound(sub, view, m, 0.0, ceiling)
    assert whole is not None and cut is not None
    assert knapsacks[1] <= knapsacks[0]
    assert cut[0] <= whole[0] <= truth * (1 + 1e-9)
    if cut[0] < whole[0] and trip._heavy(view) is None:
        assert whole[0] < ceiling * share


def _fleet() -> list[NodeDescriptor]:
    """Ten single-GPU nodes of six kinds on links of 1-10 Gbit/s and 2-36 ms."""
    kinds = [
        ("A100 80GB PCIe", 80),
        ("RTX 4090", 24),
        ("L40S", 48),
        ("RTX 3090", 24),
        ("H100", 80),
        ("A10G", 24),
    ]
    return [
        NodeDescriptor(
            id=f"n{i:02d}",
            gpu_name=kinds[i % 6][0],
            vram_bytes=kinds[i % 6][1] * 10**9,
            link_mbps=[1_000.0, 2_500.0, 10_000.0][i % 3],
            link_latency_ms=2.0 + (i * 7) % 35,
        )
        for i in range(10)
    ]


def test_past_the_exact_cycle_the_coupled_bound_certifies_and_finds_the_least_cycle(
    monkeypatch,
):
    """llama3.1:70b at 256 sequences on ten nodes, more than the least cycle is solved
    for inline.  With the slowest stage and the trip bounded apart, the plan is 4.9 %
    below the least cycle (the exact strategy, its least cycle solved per stage count)
    and its certificate says up to 13 %; coupled, the knapsack's solution laid out as a
    pipeline is the least cycle's, and the certificate proves it within 0.01 %."""
    nodes = _fleet()
    assert len(nodes) > CYCLE_EXACT_LIMIT
    model, c = resolve_model("llama3.1:70b"), Constraints(batch=256)
    got = plan(model, nodes, c)
    with monkeypatch.context() as m:
        bounded_apart(m)
        before = plan(model, nodes, c)
    monkeypatch.setattr(pipelines, "CYCLE_EXACT_LIMIT", len(nodes))
    best = plan(model, nodes, replace(c, strategy="exact"))
    assert best.rationale.certificate is not None and best.rationale.certificate.exact
    rates = [p.rationale.prediction.tokens_per_s for p in (got, before, best)]
    assert rates[0] >= rates[2] * (1 - 1e-9)
    assert rates[1] < rates[2] * 0.96
    cert, old = got.rationale.certificate, before.rationale.certificate
    assert cert is not None and old is not None
    assert cycle.COUPLED in cert.method and cycle.COUPLED not in old.method
    assert old.gap > 0.10 and cert.gap < 1e-4
    assert any(
        "the coupled bound's knapsack found a better pipeline" in n for n in got.rationale.notes
    )


_SINGLE_GPU = (
    ("A100 80GB PCIe", 80),
    ("RTX 4090", 24),
    ("L40S", 48),
    ("RTX 3090", 24),
    ("A10G", 24),
)


def _drawn(seed: int) -> tuple[str, list[NodeDescriptor], int]:
    """A model, 9-14 single-GPU nodes of links of 1-10 Gbit/s and 1-40 ms, and a count of
    sequences, drawn from ``seed``."""
    rng = random.Random(seed)
    specs = []
    for _ in range(rng.randint(9, 14)):
        name, gb = rng.choice(_SINGLE_GPU)
        specs.append((name, gb, 1, rng.choice([1_000.0, 2_500.0, 10_000.0]), rng.uniform(1, 40)))
    model = rng.choice(["llama3.1:8b", "llama3.1:70b-q4_0", "llama3.1:70b", "llama3.1:405b-q4_0"])
    return model, nodes_of(specs), rng.choice([2, 4, 16, 64, 256])


def test_coupled_plans_and_certificates_on_drawn_fleets(monkeypatch):
    """On drawn fleets past the exact cycle's reach, a plan is never slower than with
    the two parts bounded apart, its certificate never promises more than a bound (an
    exact one is the least cycle, which the plan meets within the tie-break's
    0.1 %), and some plans are faster (six of these, up to 15 %)."""
    faster = 0
    for seed in range(16, 40):
        name, nodes, batch = _drawn(seed)
        model, c = resolve_model(name), Constraints(batch=batch)
        try:
            got = plan(model, nodes, c)
        except PlanError:
            continue
        with monkeypatch.context() as m:
            bounded_apart(m)
            before = plan(model, nodes, c)
        cert = got.rationale.certificate
        assert cert is not None and got.rationale.prediction is not None
        assert before.rationale.prediction is not None
        rate, old_rate = cert.value, before.rationale.prediction.tokens_per_s
        assert rate >= old_rate * (1 - 1e-9)
        assert cert.bound >= rate * (1 - 1e-12)
        assert not cert.exact or cert.gap <= 1e-3  # ties within 0.1 % go to KV room
        faster += rate > old_rate * (1 + 1e-6)
    assert faster >= 5


def test_a_bound_the_coupled_knapsack_cannot_raise_leaves_the_certificate_as_it_was():
    """Nine nodes on 0.06-0.41 ms links, 405B at 8 sequences on all nine: the coupled
    bound of the range it is asked for stays at the bound in hand and its pipeline is
    slower than the plan, so the certificate proves the plan optimal as it did without
    it (the bound must not stand in for the plan's cycle)."""
    specs = [
        ("RTX 4080", 16, 1, 93_100.0, 0.254),
        ("RTX 4080", 16, 1, 95_700.0, 0.127),
        ("RTX 4080", 16, 1, 64_800.0, 0.213),
        ("RTX 3090", 24, 1, 25_800.0, 0.0744),
        ("RTX 4080", 16, 1, 14_200.0, 0.113),
        ("RTX 4080", 16, 1, 93_900.0, 0.0643),
        ("RTX 4080", 16, 1, 17_200.0, 0.403),
        ("MI300X", 192, 1, 80_500.0, 0.385),
        ("RTX 3090", 24, 1, 91_200.0, 0.406),
    ]
    got = plan(resolve_model("llama3.1:405b-q4_0"), nodes_of(specs), Constraints(batch=8))
    cert = got.rationale.certificate
    assert cert is not None and got.num_stages == 9
    assert cert.exact and cert.gap == 0.0 and cert.bound == cert.value


def test_the_knapsack_counts_the_hops_of_ten_stages():
    """Twelve nodes alike on 20 ms links, a range of ten stages: every stage pays its hop,
    so the trip is at least ten of them (counting only up to eight stages, the knapsack
    would let the two others go free)."""
    nodes = nodes_of([("RTX 4090", 24, 1, 10_000.0, 20.0)] * 12)
    model, c = resolve_model("llama3.1:8b"), Constraints(batch=16)
    problem = prepare(model, nodes, c)
    sub = replace(problem, min_stages=10, max_stages=10)
    cm = CostModel(model, nodes, c).for_stages(10)
    assert trip.COUNTED_STAGES >= 10
    got = trip.trip_bound(sub, cm)
    assert got is not None and got >= 10 * 0.020
