"""Tensor parallel inside nodes: legal degrees, GPU groups, engine rules, the joint optimum."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stowplan import Constraints, NodeDescriptor, plan
from stowplan.calibration.profile import Engine
from stowplan.cost import CostModel, predict
from stowplan.errors import InputError
from stowplan.model import ModelLayout, gpu_group_node
from stowplan.models.known import lookup
from stowplan.plan import plan_from_json, plan_to_json
from stowplan.planner.problem import prepare
from stowplan.planner.tensor.exact import grouped_bound, solve_grouped
from stowplan.planner.tiebreak import TOLERANCE
from stowplan.rules.tensor_parallel import legal_tensor_parallel, tensor_parallel_violation
from tests.common.toy import tiny_model

GB = 10**9


def _h100(node_id: str, gpus: int = 8) -> NodeDescriptor:
    return NodeDescriptor(
        id=node_id,
        gpu_name="H100 SXM",
        vram_bytes=gpus * 80 * GB,
        flops_estimate=0,
        link_mbps=400_000,
        link_latency_ms=0.01,
        num_gpus=gpus,
    )


def _model(name: str) -> ModelLayout:
    model = lookup(name)
    assert model is not None
    return model


def _calibration(engine: Engine):  # type: ignore[no-untyped-def]
    from stowplan.calibration.store import resolve_calibration

    return resolve_calibration(engine.value, None)


# -- legal degrees ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("heads", "kv", "tp", "legal"),
    [
        (64, 8, 8, True),
        (64, 8, 4, True),
        (64, 8, 16, True),  # KV heads replicated twice
        (64, 8, 3, False),  # does not divide the heads
        (64, 8, 12, False),
        (40, 8, 8, True),
        (40, 8, 5, False),  # divides the heads but not the KV heads, nor a multiple of them
        (32, 32, 32, True),
        (128, 1, 64, True),  # one latent KV head (MLA): any divisor of the heads
        (28, 4, 8, False),
    ],
)
def test_legal_degrees_divide_the_heads_and_split_or_replicate_the_kv_heads(
    heads: int, kv: int, tp: int, legal: bool
) -> None:
    model = replace(_model("llama3.1:8b"), num_attention_heads=heads, num_kv_heads=kv)
    assert (tensor_parallel_violation(tp, model) is None) is legal
    assert (tp in legal_tensor_parallel(model, 128)) is legal


def test_the_planner_and_the_validator_share_one_rule() -> None:
    from stowplan.cluster.fleet import FleetRole, FleetSpec
    from stowplan.cluster.parallelism import ParallelismSpec, validate_parallelism

    model = _model("llama3.1:70b")
    fleet = FleetSpec(role=FleetRole.INFERENCE, num_nodes=2, gpus_per_node=16)
    for tp in range(1, 17):
        try:
            validate_parallelism(ParallelismSpec(tensor_parallel=tp), fleet, model)
            ok = True
        except InputError:
            ok = False
        assert ok == (tp in legal_tensor_parallel(model, 16)), tp


def test_a_node_with_a_million_gpus_is_planned_without_walking_them() -> None:
    model = _model("llama3.1:8b")
    assert legal_tensor_parallel(model, 10**6) == (1, 2, 4, 8, 16, 32)  # 32 heads, 8 KV
    no_heads = replace(model, num_attention_heads=None, num_kv_heads=None)
    assert legal_tensor_parallel(no_heads, 10**6)[-1] == 10**6
    assert len(legal_tensor_parallel(no_heads, 10**6)) == 21


# -- the cost model's terms ---------------------------------------------------------------


def test_a_tensor_parallel_stage_pays_two_all_reduces_per_block_by_the_formula() -> None:
    model = _model("llama3.1:8b")
    node = _h100("n", 8)
    cm = CostModel(model, [node], Constraints(batch=4))
    act = 4 * model.hidden_dim * model.bytes_per_activation_elem
    ar = 3e-6 + 2 * 7 / 8 * act / 450e9  # NVLink 4: 450 GB/s per direction, 3 µs a step
    read = sum(model.block_read_sizes()) + model.head_params_bytes
    expected = read / (8 * 3350e9) + 32 * 2 * ar
    assert cm.stage_time(0, 0, 32, True, True) == pytest.approx(expected, rel=1e-12)
    assert any("intra_link_gbps=450" in a for a in cm.assumed)


def test_given_intra_link_figures_replace_the_defaults_and_are_not_assumed() -> None:
    model = _model("llama3.1:8b")
    node = replace(_h100("n", 4), intra_link_gbps=100.0, intra_link_latency_us=10.0)
    cm = CostModel(model, [node], Constraints())
    act = model.hidden_dim * model.bytes_per_activation_elem
    assert cm.all_reduce_s[0] == pytest.approx(10e-6 + 2 * 3 / 4 * act / 100e9)
    assert not any("intra_link" in a for a in cm.assumed)


def test_stages_on_one_node_pass_on_over_its_gpu_link_and_pay_its_hop() -> None:
    model = _model("llama3.1:8b")
    node = _h100("n", 2)
    a, b = (gpu_group_node(node, i, 1) for i in (0, 1))
    far = replace(b, id="m")
    same = CostModel(model, [a, b], Constraints(), parents=["n", "n"])
    apart = CostModel(model, [a, far], Constraints())
    act = model.hidden_dim * model.bytes_per_activation_elem
    ev_same, ev_apart = same.evaluate([0, 1], [0, 16, 32]), apart.evaluate([0, 1], [0, 16, 32])
    base = same.stage_time(0, 0, 16, True, False, None) - same.xfer_s[0]
    assert ev_same.stage_time_s[0] == pytest.approx(base + act / 450e9)
    assert ev_apart.stage_time_s[0] == pytest.approx(base + act / (400_000e6 / 8))
    assert ev_same.hops_s == pytest.approx(2 * 3e-6)  # both hops inside the node
    assert ev_apart.hops_s == pytest.approx(2 * 0.01e-3)


def test_a_node_split_into_stages_is_rented_once() -> None:
    model = _model("llama3.1:8b")
    node = replace(_h100("n", 2), price_per_hour=10.0)
    a, b = (gpu_group_node(node, i, 1) for i in (0, 1))
    cm = CostModel(model, [a, b], Constraints(), parents=["n", "n"])
    assert cm.cost_per_hour([0, 1]) == 10.0


# -- plans ------------------------------------------------------------------------------


def test_405b_on_two_8_gpu_nodes_runs_tensor_parallel_8_on_each_for_one_stream() -> None:
    p = plan(_model("llama3.1:405b"), [_h100("n0"), _h100("n1")], Constraints())
    assert [(a.node_id, a.tensor_parallel, a.gpu_indices) for a in p.assignments] == [
        ("n0", 8, tuple(range(8))),
        ("n1", 8, tuple(range(8))),
    ]
    cert = p.rationale.certificate
    assert cert is not None and cert.exact and cert.gap == 0.0
    assert p.rationale.notes[0] == "GPU groups (generic rule): n0 tp8, n1 tp8"


def _slow_links(node: NodeDescriptor) -> NodeDescriptor:
    """GPUs of a node that reach each other at 1 GB/s and 200 µs: all-reduces are dear."""
    return replace(node, intra_link_gbps=1.0, intra_link_latency_us=200.0)


def test_a_node_is_split_into_stages_on_disjoint_gpus_when_that_is_faster() -> None:
    nodes = [_slow_links(_h100("n0")), _slow_links(_h100("n1"))]
    p = plan(_model("llama3.1:70b"), nodes, Constraints(batch=8))
    assert p.num_stages > 2
    by_node: dict[str, list[int]] = {}
    for a in p.assignments:
        assert len(a.gpu_indices) == a.tensor_parallel
        by_node.setdefault(a.node_id, []).extend(a.gpu_indices)
    assert any(len(set(g)) > 1 and len(g) == len(set(g)) for g in by_node.values())
    pred, cert = p.rationale.prediction, p.rationale.certificate
    assert pred is not None and cert is not None and cert.gap < 0.05
    # Better than one tensor-parallel stage per node: no all-reduces over the slow links.
    whole = plan(_model("llama3.1:70b"), nodes, Constraints(batch=8, tensor_parallel=8))
    assert whole.num_stages in (1, 2)
    assert whole.rationale.prediction is not None
    assert pred.tokens_per_s > whole.rationale.prediction.tokens_per_s
    again = plan_from_json(plan_to_json(p))
    assert again == p and '"schema_version": 2' in plan_to_json(p)


def test_vllm_plans_use_one_degree_for_every_stage_and_say_how_far_that_is() -> None:
    nodes = [_h100("n0"), _h100("n1", 4)]
    c = Constraints(batch=8, calibration=_calibration(Engine.VLLM))
    p = plan(_model("llama3.1:70b"), nodes, c)
    assert len({a.tensor_parallel for a in p.assignments}) == 1
    assert p.rationale.notes[0].startswith("GPU groups (vLLM rule): ")
    assert any(n.startswith("vLLM-expressible") for n in p.rationale.notes)


def test_layer_split_engines_plan_one_gpu_per_stage() -> None:
    c = Constraints(calibration=_calibration(Engine.LLAMACPP))
    p = plan(_model("llama3.1:70b"), [_h100("n0", 4)], c)
    assert {a.tensor_parallel for a in p.assignments} == {1}
    assert p.num_stages >= 2
    assert p.rationale.notes[0].startswith("GPU groups (llama.cpp (layer split) rule)")


def test_a_fixed_degree_is_obeyed_and_a_node_with_fewer_gpus_is_left_out() -> None:
    nodes = [_h100("n0"), _h100("n1", 2)]
    p = plan(_model("llama3.1:70b"), nodes, Constraints(tensor_parallel=4))
    assert {a.tensor_parallel for a in p.assignments} == {4}
    assert {a.node_id for a in p.assignments} == {"n0"}


def test_single_gpu_fleets_are_planned_exactly_as_before() -> None:
    model = _model("llama3.1:8b")
    nodes = [replace(_h100(f"n{i}", 1), gpu_name="RTX 4090", vram_bytes=24 * GB) for i in range(3)]
    p = plan(model, nodes, Constraints())
    assert all(a.tensor_parallel == 1 and a.gpu_indices == () for a in p.assignments)
    assert '"schema_version": 1' in plan_to_json(p)
    assert "tensor_parallel" not in plan_to_json(p)
    assert not any(n.startswith("GPU groups") for n in p.rationale.notes)


# -- the joint optimum against brute force ---------------------------------------------------


def _partitions(g: int, allowed: list[int]) -> list[tuple[int, ...]]:
    """Multisets of group sizes from ``allowed`` whose sum is at most ``g`` (none included)."""
    out: set[tuple[int, ...]] = {()}
    frontier = [()]
    while frontier:
        nxt = []
        for part in frontier:
            for t in allowed:
                if sum(part) + t <= g and (not part or t <= part[-1]):
                    q = (*part, t)
                    if q not in out:
                        out.add(q)
                        nxt.append(q)
        frontier = nxt
    return sorted(out)


def _brute_force(model: ModelLayout, nodes: list[NodeDescriptor], c: Constraints, objective: str):  # type: ignore[no-untyped-def]
    """Every grouping of every node, every order of the groups, every split."""
    nb = model.num_blocks
    best = math.inf
    options = [
        _partitions(n.num_gpus, list(legal_tensor_parallel(model, n.num_gpus))) for n in nodes
    ]
    for choice in itertools.product(*options):
        units, parents = [], []
        for node, sizes in zip(nodes, choice, strict=True):
            start = 0
            for t in sizes:
                units.append(gpu_group_node(node, start, t))
                parents.append(node.id)
                start += t
        if not units:
            continue
        cm = CostModel(model, units, c, parents=parents)
        for k in range(1, min(len(units), nb) + 1):
            for order in itertools.permutations(range(len(units)), k):
                for cuts in itertools.combinations(range(1, nb), k - 1):
                    bounds = [0, *cuts, nb]
                    if not cm.fits_pipeline(order, bounds):
                        continue
                    if objective == "latency":
                        v = cm.evaluate(order, bounds).time_per_token_s
                    elif objective == "cycle":
                        v = cm.evaluate(order, bounds).cycle_s
                    else:  # the slowest stage at the model's own microbatch, as the solve
                        v = max(
                            cm.stage_time(
                                d,
                                bounds[s],
                                bounds[s + 1],
                                s == 0,
                                s == k - 1,
                                order[s + 1] if s < k - 1 else None,
                            )
                            for s, d in enumerate(order)
                        )
                    best = min(best, v)
    return best


def test_groups_of_one_node_passing_activations_over_their_own_link() -> None:
    """Three GPUs of one node as groups of 2 and 1: blocks [0, 4) on the pair then [4, 5)
    on the third, activations over the node's own link, is the fastest pipeline (1,986.9
    tokens/s; the least cycle per stage count once charged every group its network
    transfer and claimed 1,967.2 as the optimum)."""
    test = test_the_joint_solve_equals_brute_force_over_groupings_orders_and_splits
    test.hypothesis.inner_test(  # type: ignore[attr-defined]
        specs=[(2, 4, 300.0, (450.0, 3.0), 0.0), (3, 2, 1000.0, (32.0, 12.0), 0.0)],
        blocks=5,
        batch=4,
    )


def _links_beat_network(nodes: list[NodeDescriptor]) -> bool:
    return all(
        (n.intra_link_latency_us or 0) / 1e3 <= n.link_latency_ms
        and (n.intra_link_gbps or 0) * 8e3 >= n.link_mbps
        for n in nodes
    )


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([1, 2, 3, 4]),
            st.sampled_from([1, 2, 4]),  # GiB per GPU
            st.sampled_from([300.0, 1000.0, 3000.0]),
            st.sampled_from([(450.0, 3.0), (32.0, 12.0)]),
            st.sampled_from([0.0, 0.005, 0.05, 2.0]),
        ),
        min_size=1,
        max_size=2,
    ),
    st.integers(min_value=3, max_value=5),
    st.sampled_from([1, 4]),
)
def test_the_joint_solve_equals_brute_force_over_groupings_orders_and_splits(
    specs: list[tuple[int, int, float, tuple[float, float], float]], blocks: int, batch: int
) -> None:
    nodes = [
        NodeDescriptor(
            id=f"n{i}",
            gpu_name="custom",
            vram_bytes=gpus * gib * 2**30,
            flops_estimate=100.0 * gpus,
            link_mbps=10_000,
            mem_bandwidth_gbps=bw * gpus,
            link_latency_ms=lat,
            num_gpus=gpus,
            intra_link_gbps=intra[0],
            intra_link_latency_us=intra[1],
        )
        for i, (gpus, gib, bw, intra, lat) in enumerate(specs)
    ]
    model = tiny_model(blocks)
    c = Constraints(batch=batch, context_tokens=256)
    objective = "latency" if batch == 1 else "throughput"
    truth = _brute_force(model, nodes, c, objective)
    try:
        problem = prepare(model, nodes, c)
    except Exception:
        assert truth == math.inf
        return
    got = solve_grouped(problem, objective)
    if truth == math.inf:
        assert got is None
        return
    assert got is not None
    assert grouped_bound(problem, objective) <= truth * (1 + 1e-9)
    p = plan(model, nodes, c)
    pred, cert = p.rationale.prediction, p.rationale.certificate
    assert pred is not None and cert is not None
    value = pred.time_per_token_s  # the cycle
    least = truth if batch == 1 else _brute_force(model, nodes, c, "cycle")
    # Its prediction is what the cost model says of the plan as written.
    again = predict(model, nodes, c, p)
    assert again.stage_time_s == pytest.approx(pred.stage_time_s, rel=1e-12)
    if _links_beat_network(nodes):
        # Blocks alike and GPU links no dearer than the network: keeping a node's stages
        # together loses nothing, so the joint solve is the optimum.
        assert got.value == pytest.approx(truth, rel=1e-9)
    else:
        assert got.value >= truth * (1 - 1e-9)
    assert value >= least * (1 - 1e-9)
    if objective == "latency":
        assert cert.bound <= least * (1 + 1e-9)
    else:
        assert cert.bound >= batch / least * (1 - 1e-9)  # tokens/s
    if cert.gap == 0.0:
        assert value == pytest.approx(least, rel=1e-9)
    if cert.exact:  # the bound is the optimum; the plan within the tie-break's margin
        assert value <= least * (1 + TOLERANCE) * (1 + 1e-9)
    if batch == 1 and (_links_beat_network(nodes) or len(nodes) == 1):
        # One node: every pipeline keeps its stages together, the joint solve is the optimum.
        assert cert.exact and cert.gap == 0.0


def test_balance_by_vram_obeys_a_fixed_degree() -> None:
    nodes = [_h100("n0", 4), _h100("n1", 4)]
    c = Constraints(tensor_parallel=2, strategy="balance-by-vram")
    p = plan(_model("llama3.1:70b"), nodes, c)
    assert {a.tensor_parallel for a in p.assignments} == {2}
    assert all(len(a.gpu_indices) == 2 for a in p.assignments)


def test_predict_scores_stages_on_their_own_gpu_groups() -> None:
    model, nodes = _model("llama3.1:70b"), [_slow_links(_h100("n0")), _slow_links(_h100("n1"))]
    c = Constraints(batch=8)
    p = plan(model, nodes, c)
    assert p.num_stages > 2
    pred = p.rationale.prediction
    assert pred is not None
    assert predict(model, nodes, c, p).stage_time_s == pytest.approx(pred.stage_time_s)


def _mixed() -> list[NodeDescriptor]:
    return [
        _h100("n0", 8),
        replace(_h100("n1", 4), gpu_name="A100 80GB SXM4"),
        replace(_h100("n2", 2), gpu_name="L40S", vram_bytes=96 * GB),
    ]


@pytest.mark.parametrize("batch", [1, 16])
def test_vllm_plans_keep_a_nodes_stages_together_and_rank_nodes_by_gpus(batch: int) -> None:
    from stowplan.exports import export_plan

    c = Constraints(batch=batch, calibration=_calibration(Engine.VLLM))
    p = plan(_model("llama3.1:405b"), _mixed(), c)
    runs: list[tuple[str, int]] = []
    for a in p.assignments:
        if runs and runs[-1][0] == a.node_id:
            runs[-1] = (a.node_id, runs[-1][1] + a.tensor_parallel)
        else:
            runs.append((a.node_id, a.tensor_parallel))
    assert len({n for n, _ in runs}) == len(runs)  # each node's stages together
    gpus = [g for _, g in runs[1:]]
    assert gpus == sorted(gpus)  # after the first node, fewest GPUs first
    assert export_plan(p, "vllm", nodes=_mixed()).commands  # vLLM runs it


def test_sglang_refuses_a_fleet_where_no_equal_split_of_stages_fits() -> None:
    from stowplan.errors import Infeasible

    c = Constraints(calibration=_calibration(Engine.SGLANG))
    with pytest.raises(Infeasible, match="every node with as many stages"):
        plan(_model("llama3.1:405b"), _mixed(), c)
    small = plan(_model("llama3.1:70b"), _mixed(), replace(c, batch=64))
    counts: dict[str, int] = {}
    for a in small.assignments:
        counts[a.node_id] = counts.get(a.node_id, 0) + 1
    assert len(set(counts.values())) == 1


def test_a_group_fleet_built_per_kind_equals_the_one_built_node_by_node() -> None:
    # expand keeps each node's split (by its fields, id and sizes): split again, or with
    # the sizes as lists, the problem is the one gpu_group_node gives node by node.
    from stowplan.planner.problem import GpuGroup
    from stowplan.planner.tensor.layouts import expand

    model = lookup("llama3.1:70b")
    assert model is not None
    nodes = [
        NodeDescriptor(
            id=f"h{i}",
            gpu_name="H100 SXM5",
            vram_bytes=8 * 80 * 10**9,
            num_gpus=8,
            link_mbps=100_000.0,
            labels={"rack": str(i % 2)},
        )
        for i in range(5)
    ] + [NodeDescriptor(id="one", gpu_name="RTX 4090", vram_bytes=24 * 10**9)]
    problem = prepare(model, nodes, Constraints(batch=4))
    layouts = [
        {"h0": (4, 4), "h1": (2, 4, 1), "h2": (8,), "h3": (), "one": (1,)},
        {n.id: (1,) * n.num_gpus for n in nodes},
        {n.id: (2,) * (n.num_gpus // 2) for n in nodes if n.num_gpus > 1},
    ]
    for layout in layouts:
        want_nodes = []
        want_groups = {}
        for node in problem.nodes:
            sizes = layout.get(node.id)
            if sizes is None:
                want_nodes.append(node)
                continue
            start = 0
            for size in sorted(sizes, reverse=True):
                group = gpu_group_node(node, start, size)
                want_nodes.append(group)
                if node.num_gpus > 1:
                    want_groups[group.id] = GpuGroup(
                        node_id=node.id,
                        tensor_parallel=size,
                        gpu_indices=tuple(range(start, start + size)),
                    )
                start += size
        want = prepare(model, want_nodes, problem.constraints, want_groups)
        as_lists = {k: list(v) for k, v in layout.items()}
        for got in (expand(problem, layout), expand(problem, layout), expand(problem, as_lists)):
            assert got == want
            assert dict(got.groups) == dict(want.groups)
            assert got.usable == want.usable
            assert [type(v) for v in got.usable.values()] == [int] * len(got.nodes)
