"""Several sequences held to a stage count (stowplan.planner.strategies.throughput): the
capacity test's least bottleneck picks the nodes that hold every block within it, which
may be fewer than the count; the bottleneck then rises until as many nodes hold a
block."""

from __future__ import annotations

from stowplan import Constraints, plan
from stowplan.cost import CostModel
from stowplan.models import resolve_model
from stowplan.planner.strategies import throughput
from tests.common.gpu_fleets import FAST_AND_SLOW, nodes_of


def test_a_count_past_the_nodes_the_least_bottleneck_picks_raises_it():
    """deepseek-v3 at 64 sequences held to 22 stages: at the least bottleneck of 22 stages
    at most, only the 21 B200 and H100 nodes hold a block, so no split of that order has
    22 stages and the search fell back to orders by memory (2,099.5 tokens/s, stages of
    one block beside stages of nine).  The bottleneck now rises to a slow node's time of
    one block: 22 nodes, whose split of least slowest stage alone runs 3,186.6 tokens/s
    (3,481.1 split for the least cycle)."""
    model, c = resolve_model("deepseek-v3"), Constraints(batch=64, min_stages=22, max_stages=22)
    nodes = nodes_of(FAST_AND_SLOW)
    cm = CostModel(model, nodes, c).for_stages(22)
    tables = throughput._tables(cm)
    least, fewer = tables.least_feasible(cm.num_blocks, 22)
    assert len(fewer) == 21
    raised, order = tables.least_reaching(cm.num_blocks, 22, 22)
    assert raised > least and len(order) == 22
    held = plan(model, nodes, c)
    pred = held.rationale.prediction
    assert held.num_stages == 22 and pred is not None
    assert pred.tokens_per_s > 3180
