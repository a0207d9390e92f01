"""One stream held to a stage count (stowplan.planner.strategies.latency): the search held
to the count cannot pass through other counts of nodes, so where the search of no limit
finds a pipeline of that count, the held plan is at least as fast."""

from __future__ import annotations

from stowplan import Constraints, plan
from stowplan.cost import CostModel
from stowplan.models import resolve_model
from stowplan.planner.strategies.latency import pipeline_of_least_latency
from tests.common.gpu_fleets import single_gpu_kinds

_KINDS = (("A100 80GB SXM4", 80), ("A100 40GB SXM4", 40), ("L40S", 48), ("RTX 4090", 24))
"""The kinds of the 32 WAN nodes below."""


def test_a_plan_held_to_the_free_plans_count_is_as_fast_as_it():
    """deepseek-v3 at one stream on 32 single-GPU nodes 10–60 ms apart: the free plan runs
    15 stages; held to 15, the search of that count alone is 16 % slower; the held plan
    takes the free search's pipeline and runs as fast."""
    model = resolve_model("deepseek-v3")
    nodes = single_gpu_kinds(32, 1, _KINDS, (200.0, 1000.0), (10.0, 60.0), digits=1)
    free = plan(model, nodes, Constraints())
    assert free.num_stages == 15
    fast = free.rationale.prediction.time_per_token_s
    cm = CostModel(model, nodes, Constraints())
    alone = pipeline_of_least_latency(cm, 15, 15)
    assert alone is not None
    assert cm.evaluate(*alone).time_per_token_s > 1.1 * fast
    held = plan(model, nodes, Constraints(min_stages=15, max_stages=15))
    assert held.num_stages == 15
    assert held.rationale.prediction.time_per_token_s <= fast * (1 + 1e-9)
