"""Peer rules follow their documented splits."""

from __future__ import annotations

import heapq
import random
from dataclasses import replace

from stowplan import Constraints, ModelLayout, NodeDescriptor, PlanError
from stowplan.cost import CostModel
from stowplan.planner.baselines import peers
from stowplan.planner.baselines.peers import BASELINES, compare
from stowplan.planner.problem import prepare
from stowplan.planner.strategies.vram import plan_balance_by_vram

MODEL = ModelLayout(
    name="toy",
    num_blocks=10,
    hidden_dim=64,
    bytes_per_activation_elem=2,
    block_params_bytes=10**9,
    head_params_bytes=0,
    embed_params_bytes=0,
)


def _nodes(*gbs):
    return [
        NodeDescriptor(
            id=f"n{i}",
            gpu_name="RTX 4090",
            vram_bytes=gb * 10**9,
            flops_estimate=0.0,
            link_mbps=1000,
        )
        for i, gb in enumerate(gbs)
    ]


def _run(name, nodes):
    c = Constraints(vram_headroom_frac=0.0)
    return BASELINES[name](prepare(MODEL, nodes, c), CostModel(MODEL, nodes, c))


def test_vllm_gives_extra_layers_to_the_stages_before_the_last():
    # get_pp_indices: 10 layers over 4 → [2, 3, 3, 2]
    assert _run("vllm", _nodes(10, 10, 10, 10)) == ([0, 1, 2, 3], [0, 2, 5, 8, 10])


def test_exo_splits_in_proportion_to_memory_largest_first():
    assert _run("exo", _nodes(5, 20)) == ([1, 0], [0, 8, 10])


def test_accelerate_fills_each_node_in_turn():
    assert _run("accelerate", _nodes(6, 6, 6)) == ([0, 1], [0, 6, 10])


def test_a_rule_that_does_not_fit_says_so():
    results = compare(
        prepare(MODEL, _nodes(1, 19), Constraints(vram_headroom_frac=0.0)),
        CostModel(MODEL, _nodes(1, 19), Constraints(vram_headroom_frac=0.0)),
    )
    vllm = next(r for r in results if r.name == "vllm")
    assert vllm.pipeline is None and vllm.tokens_per_s is None


def _direct_v1(problem, cm):
    """The ``v1`` rule asked afresh: balance-by-vram's plan as a pipeline."""
    try:
        plan = plan_balance_by_vram(problem)
    except PlanError:
        return None
    return cm.plan_order_bounds(plan)


def _direct_exo_order(cm, stages):
    return heapq.nsmallest(
        max(stages, 0),
        range(len(cm.nodes)),
        key=lambda d: (-cm.nodes[d].vram_bytes, cm.nodes[d].id),
    )


def test_the_rules_asked_at_many_stage_limits_answer_as_asked_afresh():
    """The ``v1`` answers kept across stage limits and the VRAM order kept per node tuple
    give what each limit gives alone, whatever order the limits come in."""
    rng = random.Random(3)
    for _ in range(25):
        gbs = [rng.choice((1, 2, 3, 5, 8, 13)) for _ in range(rng.randrange(2, 12))]
        nodes = _nodes(*gbs)
        c = Constraints(vram_headroom_frac=0.0)
        try:
            base = prepare(MODEL, nodes, c)
        except PlanError:
            continue  # the nodes cannot hold the model
        cm = CostModel(MODEL, nodes, c)
        limits = [(lo, hi) for lo in (1, 2, 3) for hi in range(1, len(nodes) + 1) if lo <= hi]
        rng.shuffle(limits)
        for lo, hi in limits:
            problem = replace(base, min_stages=lo, max_stages=hi)
            assert BASELINES["v1"](problem, cm) == _direct_v1(problem, cm)
            assert peers._largest_first(cm.nodes)[:hi] == _direct_exo_order(cm, hi)


def test_the_best_of_a_search_and_the_rules_is_asked_again_alike() -> None:
    """The rules' plans are kept per problem and cost model: asked again (as the second
    search of a stage count asks), the best is the same, and a caller changing the
    pipeline it got changes nothing kept; a tie goes to the search's pipeline, and a
    slower one loses to the rules'."""
    from stowplan.model import Metric
    from stowplan.models import resolve_model
    from stowplan.planner.certify import _peer_plans, key_of, pick_best

    problem = prepare(
        resolve_model("llama3.1:8b"),
        _nodes(8, 12, 16, 24),
        Constraints(batch=8, context_tokens=4096),
    )
    cm = problem.cost_model()
    rules = [p for rule in BASELINES.values() if (p := rule(problem, cm)) is not None]
    assert rules
    least = min(rules, key=lambda p: key_of(cm, Metric.THROUGHPUT, p))
    first = pick_best(problem, cm, Metric.THROUGHPUT, None)
    assert first == least
    assert first is not None
    first[0].reverse()
    first[1].append(-1)
    assert pick_best(problem, cm, Metric.THROUGHPUT, None) == least
    # The search's own pipeline: the rules' best itself ties and is kept as given.
    mine = (list(least[0]), list(least[1]))
    assert pick_best(problem, cm, Metric.THROUGHPUT, mine) is mine
    # Another cost model (16 sequences): its own plans and ranks, not the first one's.
    other = prepare(problem.model, problem.nodes, replace(problem.constraints, batch=16))
    view = other.cost_model()
    expected = [
        (p, key_of(view, Metric.THROUGHPUT, p))
        for rule in BASELINES.values()
        if (p := rule(problem, view)) is not None
    ]
    assert _peer_plans(problem, view, Metric.THROUGHPUT) == expected
    assert [k for _, k in expected] != [key_of(cm, Metric.THROUGHPUT, p) for p, _ in expected]
    # The rules' slowest plan as the search's: the best rule's beats it.
    slowest = max(rules, key=lambda p: key_of(cm, Metric.THROUGHPUT, p))
    assert key_of(cm, Metric.THROUGHPUT, slowest) > key_of(cm, Metric.THROUGHPUT, least)
    assert pick_best(problem, cm, Metric.THROUGHPUT, slowest) == least
