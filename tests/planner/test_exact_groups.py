"""The exact solves over GPU groups: a stage passing to another group of its host, or
the last stage hopping back to one, goes over the host's own link."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from stowplan import Constraints, NodeDescriptor
from stowplan.cost import CostModel
from stowplan.planner.exact.pipelines import least_cycle, solve_exact, solve_milp
from stowplan.planner.problem import Problem, prepare
from stowplan.planner.tensor.layouts import expand
from tests.common.toy import tiny_model

_NODE = st.tuples(
    st.sampled_from([1, 2, 3, 3]),  # GPUs
    st.sampled_from([1, 2, 4]),  # GiB per GPU
    st.sampled_from([300.0, 1000.0, 3000.0]),  # GB/s per GPU
    # The host's own link: NVLink, PCIe, and one slower than the network in both terms.
    st.sampled_from([(450.0, 3.0), (32.0, 12.0), (0.5, 20_000.0)]),
    st.sampled_from([0.0, 0.005, 0.05, 2.0]),  # network latency, ms
    st.sampled_from([1_000, 10_000]),  # network Mbit/s
    st.lists(st.sampled_from([1, 2]), min_size=1, max_size=3),  # group sizes wanted
)


def _groups(specs: list[Any], blocks: int, batch: int) -> tuple[Problem, CostModel] | None:
    nodes, layout = [], {}
    for i, (gpus, gib, bw, intra, lat, mbps, sizes) in enumerate(specs):
        nodes.append(
            NodeDescriptor(
                id=f"n{i}",
                gpu_name="custom",
                vram_bytes=gpus * gib * 2**30,
                flops_estimate=100.0 * gpus,
                link_mbps=mbps,
                mem_bandwidth_gbps=bw * gpus,
                link_latency_ms=lat,
                num_gpus=gpus,
                intra_link_gbps=intra[0],
                intra_link_latency_us=intra[1],
            )
        )
        split: list[int] = []
        for t in sizes:
            if sum(split) + t <= gpus:
                split.append(t)
        layout[f"n{i}"] = tuple(split) if split else (1,)
    c = Constraints(batch=batch, context_tokens=256)
    try:
        problem = expand(prepare(tiny_model(blocks), nodes, c), layout)
    except Exception:
        return None
    return problem, problem.cost_model()


def _drawn(specs: list[Any], blocks: int, batch: int) -> tuple[Problem, CostModel] | None:
    """:func:`_groups` of a drawn case, where it plans and has at most 6 planning nodes
    (few enough to try every order and split)."""
    made = _groups(specs, blocks, batch)
    if made is None or len(made[1].nodes) > 6:
        return None
    event("GPU groups" if not made[1].own_hosts else "whole nodes")
    return made


def _every_pipeline(cm: CostModel, stages: int | None = None):  # type: ignore[no-untyped-def]
    nb, n = cm.num_blocks, len(cm.nodes)
    counts = range(1, min(n, nb) + 1) if stages is None else [stages]
    for k in counts:
        for order in itertools.permutations(range(n), k):
            for cuts in itertools.combinations(range(1, nb), k - 1):
                bounds = [0, *cuts, nb]
                if cm.fits_pipeline(order, bounds):
                    yield order, bounds


def _slowest(cm: CostModel, order, bounds) -> float:  # type: ignore[no-untyped-def]
    k = len(order)
    return max(
        cm.stage_time(d, bounds[s], bounds[s + 1], s == 0, s == k - 1, order[(s + 1) % k])
        for s, d in enumerate(order)
    )


def _score(cm: CostModel, objective: str, order: list[int], bounds: list[int]) -> float:
    """What ``solve_exact`` minimises: the time per token, or the slowest stage."""
    if objective == "latency":
        return cm.evaluate_here(order, bounds).time_per_token_s
    return _slowest(cm, order, bounds)


def _least(cm: CostModel, objective: str) -> float:
    """:func:`_score`'s least over every pipeline of ``cm``'s planning nodes."""
    return min((_score(cm, objective, o, b) for o, b in _every_pipeline(cm)), default=math.inf)


_CASE = (st.lists(_NODE, min_size=1, max_size=2), st.integers(3, 5), st.sampled_from([1, 4]))
"""A drawn case: one or two hosts' specs, the blocks and the sequences."""


def _against_the_least(
    specs: list[Any], blocks: int, batch: int
) -> Iterator[tuple[Problem, CostModel, str, float]]:
    """The drawn case (none where it does not fit), for both objectives, with
    :func:`_least` of each."""
    made = _drawn(specs, blocks, batch)
    if made is None:
        return
    problem, cm = made
    for objective in ("latency", "throughput"):
        yield problem, cm, objective, _least(cm, objective)


@settings(max_examples=200, deadline=None)
@given(*_CASE)
def test_the_subset_programme_is_the_optimum_over_every_order_and_split(
    specs: list[Any], blocks: int, batch: int
) -> None:
    for problem, cm, objective, truth in _against_the_least(specs, blocks, batch):
        opt = solve_exact(problem, cm, objective)
        assert opt.exact
        assert opt.value == pytest.approx(truth, rel=1e-9) or opt.value == truth == math.inf
        if opt.pipeline is not None:
            assert _score(cm, objective, *opt.pipeline) == pytest.approx(opt.value, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.lists(_NODE, min_size=1, max_size=2), st.integers(3, 5), st.sampled_from([1, 4, 16]))
def test_the_least_cycle_per_stage_count_is_the_optimum_over_groups(
    specs: list[Any], blocks: int, batch: int
) -> None:
    made = _drawn(specs, blocks, batch)
    if made is None:
        return
    problem, cm = made
    n = len(cm.nodes)
    for stages in range(2, min(n, blocks) + 1):
        view = cm.for_stages(stages)
        got = least_cycle(problem, view, stages)
        truth = min(
            (cm.evaluate(o, b).cycle_s for o, b in _every_pipeline(cm, stages)), default=math.inf
        )
        assert got.value == pytest.approx(truth, rel=1e-9) or got.value == truth == math.inf
        if got.pipeline is not None:
            assert cm.evaluate(*got.pipeline).cycle_s == pytest.approx(got.value, rel=1e-9)


def test_the_pair_then_the_third_gpu_pass_over_the_hosts_own_link() -> None:
    """Three GPUs of one host as a pair and a single, and two more on another host: the
    least cycle passes from the pair to the single over the host's link."""
    specs = [
        (2, 4, 300.0, (450.0, 3.0), 0.0, 10_000, [1, 1]),
        (3, 2, 1000.0, (32.0, 12.0), 0.0, 10_000, [2, 1]),
    ]
    made = _groups(specs, 5, 4)
    assert made is not None
    problem, cm = made
    best = min(
        (cm.evaluate(o, b).cycle_s, o, b) for k in range(2, 5) for o, b in _every_pipeline(cm, k)
    )
    order = best[1]
    assert any(cm.same_node(a, b) for a, b in itertools.pairwise(order))
    got = least_cycle(problem, cm.for_stages(len(order)), len(order))
    assert got.value == pytest.approx(best[0], rel=1e-9)


@settings(max_examples=30, deadline=None)
@given(*_CASE)
def test_the_milp_on_groups_is_a_bound_and_says_so(
    specs: list[Any], blocks: int, batch: int
) -> None:
    for problem, cm, objective, truth in _against_the_least(specs, blocks, batch):
        got = solve_milp(problem, cm, objective, time_limit_s=10.0)
        assert got.value <= truth * (1 + 1e-7)
        if not cm.own_hosts and got.method.startswith("MILP"):
            assert not got.exact and "cheaper of its two links" in got.method
