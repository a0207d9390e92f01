"""Small fleets of multi-GPU nodes solved over every split of their GPUs: the least cycle
is the tensor-parallel referee's optimum (written from the formulas, not the code), and
a plan it proves says so."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from stowplan import Constraints, NodeDescriptor, PlanError, lookup, plan
from stowplan.planner.problem import prepare
from stowplan.planner.strategies.evaluated import evaluated
from stowplan.planner.tensor import every_layout as every
from stowplan.planner.tensor.layouts import engine_rule
from tests.common import tp_referee as tp


def _cycle_of(problem, pipeline) -> float:  # type: ignore[no-untyped-def]
    """The cycle of ``pipeline`` on ``problem``'s planning nodes, as the planner scores it."""
    return evaluated(problem.cost_model(), *pipeline).cycle_s


@pytest.mark.parametrize("seed", range(40))
def test_the_least_cycle_over_every_split_is_the_referees_optimum(seed: int) -> None:
    inst = tp.draw(seed, max_blocks=6)
    spec = inst.spec("throughput")
    c = Constraints(batch=spec.batch, context_tokens=inst.context_tokens)
    best = tp.solve(spec, "free")
    try:
        problem = prepare(inst.model, inst.nodes, c)
    except PlanError:  # the whole fleet cannot hold it
        assert best is None
        return
    found = every.every_layout(problem, engine_rule(problem), math.inf)
    if found is None:  # too many layouts: nothing is claimed
        return
    if best is None:
        assert found.pipeline is None and math.isinf(found.value)
        return
    # A bound, never above the optimum; where every layout was solved, the optimum.
    assert found.value <= best[0] * (1 + 1e-9), (inst.text(), found.value, best)
    if found.exact:
        assert found.value == pytest.approx(best[0], rel=1e-9), (inst.text(), found, best)
        assert found.problem is not None and found.pipeline is not None
        assert _cycle_of(found.problem, found.pipeline) == pytest.approx(found.value, rel=1e-12)


def test_full_splits_leave_no_gpu_a_group_could_use() -> None:
    """Eight GPUs of a model that takes degrees 1, 2, 4 and 8: the ten partitions of 8
    into powers of two, largest groups first; three GPUs: 2 + 1 and 1 + 1 + 1."""
    model = lookup("llama3.1:8b")  # 32 heads, 8 KV heads: degrees 1, 2, 4, 8
    eight = NodeDescriptor(id="a", vram_bytes=8 * 80 * 2**30, num_gpus=8, gpu_name="H100")
    three = replace(eight, id="b", vram_bytes=3 * 80 * 2**30, num_gpus=3)
    problem = prepare(model, [eight, three], Constraints())
    rule = engine_rule(problem)
    splits = every.full_splits(problem, rule, eight)
    assert len(splits) == len(set(splits)) == 10
    assert all(sum(s) == 8 and list(s) == sorted(s, reverse=True) for s in splits)
    assert {(8,), (4, 4), (4, 2, 1, 1), (1,) * 8} <= set(splits)
    assert every.full_splits(problem, rule, three) == [(2, 1), (1, 1, 1)]


def test_a_plan_of_three_mixed_nodes_is_proven_over_every_split() -> None:
    """llama3.1:405b-q4_0 at 64 sequences on one A10G, eight A10G and four RTX 4090 (a
    random fleet of ``benchmarks/mixed_fleets.py``): the bounds leave it 4.15 % from the
    plan; every split of the nodes' GPUs solved proves the plan optimal."""
    nodes = [
        NodeDescriptor(
            id="a1", gpu_name="A10G", vram_bytes=24 * 10**9, link_mbps=277.09, link_latency_ms=43.66
        ),
        NodeDescriptor(
            id="a8",
            gpu_name="A10G",
            vram_bytes=192 * 10**9,
            num_gpus=8,
            link_mbps=909.29,
            link_latency_ms=37.97,
        ),
        NodeDescriptor(
            id="r",
            gpu_name="RTX 4090",
            vram_bytes=96 * 10**9,
            num_gpus=4,
            link_mbps=306.73,
            link_latency_ms=50.48,
        ),
    ]
    model = lookup("llama3.1:405b-q4_0")
    got = plan(model, nodes, Constraints(batch=64))
    cert = got.rationale.certificate
    assert cert is not None and cert.exact and cert.gap == 0.0
    assert every.EVERY_LAYOUT in cert.method
    # The same plan as the bounds left unproven: the GPU groups the search found.
    assert [(a.node_id, a.tensor_parallel) for a in got.assignments] == [("r", 4), ("a8", 8)]


def test_most_fleets_of_the_referee_are_solved_outright() -> None:
    """The test above is no vacuous pass: of its 40 fleets, most are solved over every
    layout (the others have a layout of more groups than the exact solve takes whose
    bound lies below the optimum, or too many layouts)."""
    solved = 0
    for seed in range(40):
        inst = tp.draw(seed, max_blocks=6)
        c = Constraints(batch=inst.spec("throughput").batch, context_tokens=inst.context_tokens)
        try:
            problem = prepare(inst.model, inst.nodes, c)
        except PlanError:
            continue
        found = every.every_layout(problem, engine_rule(problem), math.inf)
        solved += found is not None and found.exact and found.pipeline is not None
    assert solved >= 16
