"""The throughput strategy's greedy split, with its cost-model reads inlined and nodes
alike skipped once one took nothing, splits exactly as the node-by-node rule does; the
least bottleneck search ends on the rule's least passing stage time."""

from __future__ import annotations

import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from stowplan import Constraints
from stowplan.cost import CostModel
from stowplan.model import NodeDescriptor
from stowplan.models import resolve_model
from stowplan.planner.strategies.throughput import (
    Pipeline,
    greedy_split,
    min_bottleneck_split,
)
from tests.common.toy import toy_node

KINDS = (
    dict(vram_bytes=6 * 10**9, mem_bandwidth_gbps=100.0, link_mbps=8.0),
    dict(vram_bytes=24 * 10**9, mem_bandwidth_gbps=900.0, link_mbps=1000.0),
    dict(vram_bytes=48 * 10**9, mem_bandwidth_gbps=700.0, link_mbps=100.0),
    dict(vram_bytes=80 * 10**9, mem_bandwidth_gbps=2000.0, link_mbps=10_000.0),
    # The second's GPU with other rooms: nodes alike but for their memory.
    dict(vram_bytes=2 * 10**9, mem_bandwidth_gbps=900.0, link_mbps=1000.0),
    dict(vram_bytes=80 * 10**9, mem_bandwidth_gbps=900.0, link_mbps=1000.0),
)


def _reference(cm: CostModel, order: list[int], t_max: float, min_stages: int) -> Pipeline | None:
    """The rule node by node, through CostModel.fits and CostModel.stage_time."""

    def ok(d: int, lo: int, hi: int, first: bool, last: bool) -> bool:
        return cm.fits(d, lo, hi, first, last) and cm.stage_time(d, lo, hi, first, last) <= t_max

    nb, pos, used, bounds = cm.num_blocks, 0, [], [0]
    for d in order:
        first = not used
        if len(used) + 1 >= min_stages and ok(d, pos, nb, first, True):
            return [*used, d], [*bounds, nb]
        reach = pos
        while reach < nb and ok(d, pos, reach + 1, first, False):
            reach += 1
        reach = min(reach, nb - max(min_stages - len(used) - 1, 1))
        if reach > pos:
            used.append(d)
            bounds.append(reach)
            pos = reach
    return None


LINKS = (None, 8.0, 100.0, 1000.0)
"""A node's own link (Mbit/s; None: its kind's): nodes of one GPU whose transfers differ."""


def _nodes(kinds: list[int], links: list[int]) -> list[NodeDescriptor]:
    """Nodes of ``kinds``, each with the link ``LINKS`` gives it (its kind's where None)."""
    out = []
    for i, k in enumerate(kinds):
        figures: dict[str, object] = dict(KINDS[k])
        link = LINKS[links[i % len(links)]] if links else None
        if link is not None:
            figures["link_mbps"] = link
        out.append(toy_node(i, **figures))
    return out


@settings(max_examples=150, deadline=None)
@given(
    kinds=st.lists(st.integers(0, len(KINDS) - 1), min_size=2, max_size=14),
    links=st.lists(st.integers(0, len(LINKS) - 1), max_size=14),
    model=st.sampled_from(["llama3.1:8b", "llama3.1:70b-q4_0", "qwen3:30b-a3b-q4_0"]),
    batch=st.sampled_from([1, 8]),
    scale=st.floats(0.05, 3.0),
    min_stages=st.integers(1, 4),
)
def test_greedy_split_is_the_node_by_node_rule(
    kinds: list[int], links: list[int], model: str, batch: int, scale: float, min_stages: int
) -> None:
    """Nodes of one GPU skipped once one of no larger transfer took nothing (its kind's
    link, or each its own) split as the rule does, node by node."""
    layout = resolve_model(model)
    nodes = _nodes(kinds, links)
    cm = CostModel(layout, nodes, Constraints(batch=batch, context_tokens=2048))
    order = list(range(len(nodes)))
    # A bottleneck around one node's time for an even share of the blocks.
    share = max(1, cm.num_blocks // len(nodes))
    t_max = scale * cm.stage_time(0, 0, share, False, False)
    expected = _reference(cm, order, t_max, min_stages)
    assert greedy_split(cm, order, t_max, min_stages) == expected
    assert greedy_split(cm, order[::-1], t_max, min_stages) == _reference(
        cm, order[::-1], t_max, min_stages
    )


def _stage_times(cm: CostModel) -> list[float]:
    """Every stage time a split can have: each node, block range and role that fits."""
    nb, found = cm.num_blocks, set()
    for d in range(len(cm.nodes)):
        for lo in range(nb):
            for hi in range(lo + 1, nb + 1):
                for first in (lo == 0, False) if lo == 0 else (False,):
                    for last in (False, True) if hi == nb else (False,):
                        if cm.fits(d, lo, hi, first, last):
                            found.add(cm.stage_time(d, lo, hi, first, last))
    return sorted(found)


@settings(max_examples=40, deadline=None)
@given(
    kinds=st.lists(st.integers(0, len(KINDS) - 1), min_size=2, max_size=7),
    links=st.lists(st.integers(0, len(LINKS) - 1), max_size=7),
    model=st.sampled_from(["llama3.2:1b", "llama3.1:8b", "qwen3:30b-a3b-q4_0"]),
    batch=st.sampled_from([1, 8]),
    min_stages=st.integers(1, 3),
    reverse=st.booleans(),
)
# Two stage times a float apart: the least passing one is where the bisection's last
# failure said the split would change next, within its rounding stop.
@example(
    kinds=[0, 1, 1], links=[1], model="qwen3:30b-a3b-q4_0", batch=1, min_stages=3, reverse=False
)
def test_min_bottleneck_split_is_the_least_passing_stage_time(
    kinds: list[int], links: list[int], model: str, batch: int, min_stages: int, reverse: bool
) -> None:
    """The bisection that jumps to the split's next change ends on the least stage time
    at which the node-by-node rule finds a split, with the rule's split at that time."""
    layout = resolve_model(model)
    nodes = _nodes(kinds, links)
    cm = CostModel(layout, nodes, Constraints(batch=batch, context_tokens=2048))
    order = list(range(len(nodes)))[:: -1 if reverse else 1]
    times = _stage_times(cm)
    passing = [t for t in times if _reference(cm, order, t, min_stages) is not None]
    got = min_bottleneck_split(cm, order, min_stages)
    if not passing:
        assert got is None
        return
    # The rule passes from its least passing time on (it is monotone in the bottleneck).
    least = passing[0]
    assert all(_reference(cm, order, t, min_stages) is not None for t in times if t >= least)
    assert got is not None
    assert cm.evaluate_here(*got).bottleneck_s == least
    assert got == _reference(cm, order, least, min_stages)
    # Bounded above by a time below the least, no split; at the least, the same one.
    below = max((t for t in times if t < least), default=least / 2)
    assert min_bottleneck_split(cm, order, min_stages, below) is None
    assert min_bottleneck_split(cm, order, min_stages, least) == got
    # Under any bound the rule passes at, the least split: where the split within the
    # bound fails just below its own bottleneck the search ends at once, with that split.
    for upper in (*[t for t in times if t > least][::7], math.inf):
        assert min_bottleneck_split(cm, order, min_stages, upper) == got


def test_a_node_of_a_smaller_transfer_is_not_passed_over() -> None:
    """A node whose GPU and room match one that took nothing, but whose transfer is
    smaller, may take blocks: at a bottleneck between their one-block times the first
    takes nothing and the second takes some, as the rule has it."""
    layout = resolve_model("llama3.1:8b")
    gpu = dict(vram_bytes=24 * 10**9, mem_bandwidth_gbps=900.0)
    nodes = [
        toy_node(0, **gpu, link_mbps=8.0),
        toy_node(1, **gpu, link_mbps=10_000.0),
        toy_node(2, vram_bytes=80 * 10**9, mem_bandwidth_gbps=2000.0, link_mbps=10_000.0),
    ]
    cm = CostModel(layout, nodes, Constraints(batch=1, context_tokens=2048))
    slow, fast = (cm.stage_time(d, 0, 1, True, False) for d in (0, 1))
    assert fast < slow
    taken = 0
    for share in (0.1, 0.5, 0.9):
        t_max = fast + share * (slow - fast)
        expected = _reference(cm, [0, 1, 2], t_max, 1)
        assert greedy_split(cm, [0, 1, 2], t_max) == expected
        taken += expected is not None and 1 in expected[0]
    assert taken
    got = min_bottleneck_split(cm, [0, 1, 2])
    assert got is not None
    assert got == _reference(cm, [0, 1, 2], cm.evaluate_here(*got).bottleneck_s, 1)
