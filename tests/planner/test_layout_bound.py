"""The bound that lets the GPU-group search skip a layout: never above the least cycle of
any pipeline of that layout's groups, as the tensor-parallel referee (written from the
formulas, not the code) finds it; and the cost-model views it reads equal models built
afresh."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from stowplan import Constraints, PlanError
from stowplan.cost import CostModel
from stowplan.model import Metric
from stowplan.planner.problem import prepare
from stowplan.planner.tensor.exact import grouped_bound
from stowplan.planner.tensor.groups import least_cycle_bound
from stowplan.planner.tensor.layouts import engine_rule, expand, layout_options
from stowplan.planner.tensor.nodes import GroupCosts
from tests.common import tp_referee as tp


def _layouts(problem, rng: random.Random) -> list[dict[str, tuple[int, ...]]]:  # type: ignore[no-untyped-def]
    """Every node on its first option, each option of one node with the others on their
    first, and three random mixes."""
    rule = engine_rule(problem)
    options = {n.id: layout_options(problem, rule, n) for n in problem.nodes}
    options = {k: v for k, v in options.items() if v}
    base = {k: v[0] for k, v in options.items()}
    out = [base]
    for k, v in options.items():
        out += [{**base, k: o} for o in v[1:]]
    out += [{k: rng.choice(v) for k, v in options.items()} for _ in range(3)]
    return out


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("objective", ["latency", "throughput"])
def test_no_pipeline_of_a_layout_beats_its_bound(seed: int, objective: str) -> None:
    inst = tp.draw(seed, max_blocks=5)
    spec = inst.spec(objective)  # type: ignore[arg-type]
    c = Constraints(batch=spec.batch, context_tokens=inst.context_tokens)
    try:
        problem = prepare(inst.model, inst.nodes, c)
    except PlanError:  # the whole fleet cannot hold it
        assert tp.solve(spec, "free") is None
        return
    index = {n.id: d for d, n in enumerate(inst.nodes)}
    checked = 0
    for layout in _layouts(problem, random.Random(seed)):
        degrees = [sorted(set(layout.get(n.id, ()))) for n in inst.nodes]
        counts = {(index[k], t): sizes.count(t) for k, sizes in layout.items() for t in sizes}
        gpus = [sum(layout.get(n.id, ())) for n in inst.nodes]
        best = tp.search(spec, degrees, gpus=gpus, counts=counts)
        try:
            groups = expand(problem, layout)
        except PlanError:  # the groups cannot hold the model: neither can the referee's
            assert best is None, (inst.text(), layout, best)
            continue
        bound = least_cycle_bound(groups)
        if best is None:
            continue
        checked += 1
        assert bound <= best[0] * (1 + 1e-9), (inst.text(), layout, bound, best)
        assert bound > 0
    # Nothing checked only where no pipeline of any grouping fits.
    assert checked or tp.solve(spec, "free") is None


@pytest.mark.parametrize("seed", range(6))
def test_relaxed_and_grouped_views_equal_models_built_at_their_microbatch(seed: int) -> None:
    inst = tp.draw(seed)
    c = Constraints(batch=inst.batch, context_tokens=inst.context_tokens)
    problem = prepare(inst.model, inst.nodes, c)
    root = problem.cost_model()
    like = GroupCosts(problem, None)
    for u in range(1, inst.batch + 1):
        fresh = CostModel(inst.model, problem.nodes, c, microbatch=u).relax_groups()
        view = root.at_microbatch(u).relax_groups()
        assert view is not fresh
        for name in ("block_s", "stage_s", "xfer_s", "latency_s", "inv_bw", "kv_prefix"):
            assert getattr(view, name) == getattr(fresh, name), name
        pu = replace(problem, microbatch=u)
        shared, built = GroupCosts(pu, None, like), GroupCosts(pu, None)
        assert shared.kinds == built.kinds
        for name in ("inv_bw", "flop_s_per_byte", "xfer_s", "kv_prefix", "block_s"):
            assert getattr(shared.cm, name) == getattr(built.cm, name), name


@pytest.mark.parametrize("seed", range(40))
def test_the_grouped_time_per_token_bound_never_exceeds_the_optimum(seed: int) -> None:
    # Per-block least costs plus the network crossings memory forces (and the fractional
    # relaxation): never above the least time per token over every grouping and pipeline.
    inst = tp.draw(seed, max_blocks=6)
    spec = inst.spec("latency")
    try:
        problem = prepare(inst.model, inst.nodes, Constraints(context_tokens=inst.context_tokens))
    except PlanError:
        assert tp.solve(spec, "free") is None
        return
    best = tp.solve(spec, "free")
    bound = grouped_bound(problem, Metric.LATENCY)
    if best is None:
        return
    assert 0 < bound <= best[0] * (1 + 1e-9), (inst.text(), bound, best)


@pytest.mark.parametrize("seed", range(12))
def test_the_groups_of_each_class_stand_for_every_group(seed: int) -> None:
    """What the bounds read once per degree and class is what every group would give."""
    inst = tp.draw(seed)
    c = Constraints(batch=inst.batch, context_tokens=inst.context_tokens)
    # Each node three times over: copies share their classes.
    nodes = [replace(n, id=f"{n.id}-{k}") for k in range(3) for n in inst.nodes]
    problem = prepare(inst.model, nodes, c)
    groups = GroupCosts(problem, None)
    cm = groups.cm

    def figures(t: int, v: int) -> tuple[object, ...]:
        return (t, cm.inv_bw[v], cm.flop_s_per_byte[v], cm.block_s[v], cm.stage_s[v])

    every = {figures(t, v) for per_node in groups.kinds for t, v in per_node.items()}
    distinct = groups.distinct()
    assert {figures(t, v) for t, v in distinct} == every
    assert len(distinct) == len(set(distinct))
    assert 3 * len(distinct) <= sum(len(per_node) for per_node in groups.kinds)
