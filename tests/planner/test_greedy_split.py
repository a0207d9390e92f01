"""The throughput strategy's greedy split, with its cost-model reads inlined and nodes
alike skipped once one took nothing, splits exactly as the node-by-node rule does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from stowplan import Constraints
from stowplan.cost import CostModel
from stowplan.models import resolve_model
from stowplan.planner.strategies.throughput import Pipeline, greedy_split
from tests.common.toy import toy_node

KINDS = (
    dict(vram_bytes=6 * 10**9, mem_bandwidth_gbps=100.0, link_mbps=8.0),
    dict(vram_bytes=24 * 10**9, mem_bandwidth_gbps=900.0, link_mbps=1000.0),
    dict(vram_bytes=48 * 10**9, mem_bandwidth_gbps=700.0, link_mbps=100.0),
    dict(vram_bytes=80 * 10**9, mem_bandwidth_gbps=2000.0, link_mbps=10_000.0),
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


@settings(max_examples=150, deadline=None)
@given(
    kinds=st.lists(st.integers(0, len(KINDS) - 1), min_size=2, max_size=14),
    model=st.sampled_from(["llama3.1:8b", "llama3.1:70b-q4_0", "qwen3:30b-a3b-q4_0"]),
    batch=st.sampled_from([1, 8]),
    scale=st.floats(0.05, 3.0),
    min_stages=st.integers(1, 4),
)
def test_greedy_split_is_the_node_by_node_rule(
    kinds: list[int], model: str, batch: int, scale: float, min_stages: int
) -> None:
    layout = resolve_model(model)
    nodes = [toy_node(i, **KINDS[k]) for i, k in enumerate(kinds)]  # type: ignore[arg-type]
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
