"""A block's figures (node loads, reach, expert reads) against plain loops over copy_shares,
and the summary and prediction from shared holders against those read off the plan."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stowplan.cost.experts import _block_reads, expert_prediction
from stowplan.moe.numbering import ValueNumbers
from stowplan.moe.routing import (
    Holders,
    Pairs,
    copy_shares,
    holders_of,
    node_loads,
    node_reach,
)
from stowplan.planner.experts import expert_summary
from tests.common.moe import spread_mixtral


def _plain_loads(holders: Holders, w: Sequence[float], n: int) -> list[float]:
    loads = [0.0] * n
    for e, hs in enumerate(holders):
        for j, share in zip(hs, copy_shares(hs), strict=True):
            loads[j] += w[e] * share
    return loads


def _plain_reach(holders: Holders, p: Sequence[float], pairs: Pairs, k: int, n: int) -> list[float]:
    q_sum, q_sq, q_max = [0.0] * n, [0.0] * n, [0.0] * n
    share: dict[tuple[int, int], float] = {}
    for e, hs in enumerate(holders):
        for j, s in zip(hs, copy_shares(hs), strict=True):
            q = p[e] * s
            q_sum[j] += q
            q_sq[j] += q * q
            q_max[j] = max(q_max[j], q)
            share[(e, j)] = s
    chance = (k - 1) / k
    pair_sum = [(q_sum[j] ** 2 - q_sq[j]) / 2 * chance for j in range(n)]
    for e, f, c in pairs:
        excess = c - p[e] * p[f] * chance
        for j in holders[e]:
            s_f = share.get((f, j))
            if s_f is not None:
                pair_sum[j] += excess * share[(e, j)] * s_f
    return [min(1.0, max(q_max[j], q_sum[j] - pair_sum[j])) for j in range(n)]


def _plain_reads(
    holders: Holders, w: Sequence[float], batch: int, expert_bytes: int, bws: Sequence[float]
) -> float:
    hit = [0.0] * len(bws)
    for e, hs in enumerate(holders):
        for j, s in zip(hs, copy_shares(hs), strict=True):
            hit[j] += 1.0 - (1.0 - w[e] * s) ** batch
    return max(hit[j] * expert_bytes / (bws[j] * 1e9) for j in range(len(bws)))


@st.composite
def _blocks(draw: st.DrawFn) -> tuple[Holders, list[float], Pairs, int]:
    n = draw(st.integers(1, 6))
    experts = draw(st.integers(1, 10))
    holders = [
        sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n))) for _ in range(experts)
    ]
    p = draw(st.lists(st.floats(0.0, 1.0), min_size=experts, max_size=experts))
    pairs = [
        (e, f, draw(st.floats(0.0, 1.0)))
        for e, f in draw(
            st.lists(
                st.tuples(st.integers(0, experts - 1), st.integers(0, experts - 1)), max_size=6
            )
        )
        if e != f
    ]
    return holders, p, pairs, n


@settings(max_examples=300, deadline=None)
@given(block=_blocks(), k=st.integers(1, 8), batch=st.integers(1, 64))
def test_a_blocks_figures_match_the_plain_loops(
    block: tuple[Holders, list[float], Pairs, int], k: int, batch: int
) -> None:
    holders, p, pairs, n = block
    assert node_loads(holders, p, n) == _plain_loads(holders, p, n)
    assert node_reach(holders, p, pairs, k, n) == _plain_reach(holders, p, pairs, k, n)
    bws = [100.0 + 37.0 * j for j in range(n)]
    assert _block_reads(holders, p, batch, 10**8, bws) == _plain_reads(
        holders, p, batch, 10**8, bws
    )


def test_value_numbers_are_equal_for_equal_values_only() -> None:
    number = ValueNumbers()
    a, b = [[0], [1, 2]], [[0], [1, 2]]
    assert number.holders(a) == number.holders(b) == number.holders(a)
    assert number.holders([[0], [2, 1]]) != number.holders(a)
    assert number((1.0, 2.0)) == number([1.0, 2.0]) != number((2.0, 1.0))


@pytest.mark.parametrize("skewed", [False, True])
def test_summary_from_shared_holders_is_the_summary_read_off_the_plan(skewed: bool) -> None:
    model, nodes, c, load, got = spread_mixtral(skewed)
    holders = holders_of(got, model)
    # Blocks alike handed as one shared list, as the planner does.
    shared: list[Holders] = []
    for h in holders:
        shared.append(next((s for s in shared if s == h), h))
    assert expert_summary(got, model, nodes, load, holders_by_block=shared) == expert_summary(
        got, model, nodes, load
    )
    assert expert_prediction(
        model, nodes, c, got, load, holders_by_block=shared
    ) == expert_prediction(model, nodes, c, got, load)
