"""Expert placement: conservation, memory, dense regression, balance, locality, the cost term."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stowplan import (
    Constraints,
    ExpertId,
    ExpertLayout,
    InsufficientVram,
    ModelLayout,
    NodeDescriptor,
    Plan,
    PlanRationale,
    StageAssignment,
    Topology,
    load_nodes,
    lookup,
    plan_to_json,
)
from stowplan.model import usable_bytes
from stowplan.moe.stats import CoActivation, ExpertLoad, zipf_load
from stowplan.plan import plan_to_dict
from stowplan.planner import plan
from stowplan.planner.baselines.eplb import eplb_place
from stowplan.planner.experts import (
    ExpertInputs,
    ExpertPlacement,
    backbone_layout,
    expert_stage_times,
    expert_summary,
    place_experts,
)
from tests.common.gpu_fleets import nodes_of
from tests.common.h100 import h100_nodes
from tests.common.moe import HETERO, MB, node, toy_moe
from tests.common.paths import EXAMPLES, FIXTURES

V1 = Constraints(strategy="balance-by-vram")


def holders(p: Plan, model: ModelLayout) -> dict[tuple[int, int], list[int]]:
    out: dict[tuple[int, int], list[int]] = {}
    for a in p.assignments:
        for x in a.owned_experts:
            out.setdefault((x.block, x.expert), []).append(a.stage)
    return out


# -- conservation and memory ------------------------------------------------------------


@given(
    vram=st.lists(st.floats(1.0, 8.0), min_size=2, max_size=6),
    bw=st.lists(st.sampled_from([500.0, 1000.0, 3000.0]), min_size=6, max_size=6),
    seed=st.integers(0, 5),
    redundant=st.integers(0, 4),
)
def test_every_expert_is_placed_once_or_more_and_every_stage_fits(
    vram: list[float], bw: list[float], seed: int, redundant: int
) -> None:
    model = toy_moe()
    nodes = [node(i, v, bw[i]) for i, v in enumerate(vram)]
    load = zipf_load(5, 16, seed=seed)
    try:
        p = plan(model, nodes, V1, experts=ExpertInputs(load=load, redundant_per_block=redundant))
    except InsufficientVram as exc:
        assert exc.needed > exc.available
        assert exc.needed >= model.weight_bytes
        return
    assert p.topology == Topology.PipelineWithExperts(p.num_stages, 16)
    placed = holders(p, model)
    assert set(placed) == {(b, e) for b in range(1, 6) for e in range(16)}
    for stages in placed.values():
        assert len(stages) == len(set(stages))  # copies on distinct nodes
    assert sum(len(s) - 1 for s in placed.values()) <= redundant * 5
    by_id = {n.id: n for n in nodes}
    backbone = backbone_layout(model)
    for a in p.assignments:
        assert a.estimated_vram_bytes <= usable_bytes(by_id[a.node_id], V1.headroom)
        blocks = sum(backbone.block_sizes()[a.block_range[0] : a.block_range[1]])
        anchors = 100 * MB * (a.owns_embed + a.owns_head)
        assert a.estimated_vram_bytes == blocks + anchors + len(a.owned_experts) * 100 * MB


def test_stages_sharing_a_node_hold_their_experts_within_their_own_share() -> None:
    """Three nodes of 2 × L40S split into one-GPU stages beside two RTX 4090 nodes:
    qwen3:30b-a3b with 16 sequences of 131,072 tokens fits no block-local plan, and the
    expert-parallel one puts two stages on each L40S node.  Each stage's experts fit the
    room of its own GPU (its usable VRAM), not the whole node's, which both would
    otherwise count as theirs."""
    l40s, rtx = ("L40S", 48, 2, 10_000.0, 0.5), ("RTX 4090", 24, 1, 10_000.0, 0.5)
    nodes = nodes_of([rtx, l40s, rtx, l40s, l40s])
    c = Constraints(batch=16, context_tokens=131_072, tensor_parallel=1)
    p = plan(lookup("qwen3:30b-a3b"), nodes, c)
    assert "no block-local plan (what engines run) fits" in p.rationale.notes[-1]
    hosts = [a.node_id for a in p.assignments]
    shared = {h for h in hosts if hosts.count(h) > 1}
    assert shared  # stages share nodes, each on one of the node's GPUs
    for a in p.assignments:
        assert a.usable_vram_bytes is not None
        assert a.estimated_vram_bytes <= a.usable_vram_bytes
        if a.node_id in shared:
            assert a.usable_vram_bytes == int(0.8 * 48 * 10**9)  # one GPU's share


def test_too_little_vram_raises_insufficient_vram_with_the_bytes() -> None:
    nodes = [node(0, 2, 1000), node(1, 2, 1000)]
    with pytest.raises(InsufficientVram) as info:
        plan(toy_moe(), nodes, V1)
    assert str(info.value) == (
        "model does not fit: needs 9400000000 bytes, total available 3200000000"
    )
    assert (info.value.needed, info.value.available) == (9_400_000_000, 3_200_000_000)


def test_backbone_layout_drops_only_the_routed_experts() -> None:
    model = toy_moe(experts=16, k=4)
    b = backbone_layout(model)
    assert b.experts is None
    assert b.block_sizes() == (200 * MB,) * 6
    assert b.block_read_sizes()[0] == 200 * MB
    assert b.weight_bytes == model.weight_bytes - 5 * 16 * 100 * MB


# -- dense models: exactly the V1 plans -------------------------------------------------

CASES = json.loads((FIXTURES / "plans" / "cases.json").read_text())


def _placement(data: dict[str, Any]) -> dict[str, Any]:
    """A plan's placement: everything but the cost model's prediction and certificate,
    which follow the cost model and its bounds rather than the V1 contract."""
    rationale = {
        k: v for k, v in data["rationale"].items() if k not in ("prediction", "certificate")
    }
    rationale["notes"] = [n for n in rationale["notes"] if not _is_cost_note(n)]
    return {**data, "rationale": rationale}


def _is_cost_note(note: str) -> bool:
    return (
        note.startswith(("certificate", "predicted", "KV capacity"))
        or "ms/step" in note
        or "assumed from the spec table" in note
    )


@pytest.mark.parametrize("case", CASES, ids=[c["plan"] for c in CASES])
def test_dense_models_give_the_stored_v1_plans(case: dict[str, object]) -> None:
    model = lookup(str(case["model"]))
    assert model is not None and model.experts is None
    nodes = load_nodes(EXAMPLES / "fleets" / f"{case['fleet']}.yaml")
    cons = Constraints(strategy="balance-by-vram", **case["constraints"])  # type: ignore[arg-type]
    stored = _placement(json.loads((FIXTURES / "plans" / str(case["plan"])).read_text()))
    assert _placement(plan_to_dict(plan(model, nodes, cons))) == stored
    assert _placement(plan_to_dict(plan(model, nodes, cons, experts=ExpertInputs()))) == stored
    assert place_experts(plan(model, nodes, cons), model, nodes, cons) == plan(model, nodes, cons)


# -- determinism ------------------------------------------------------------------------


def test_the_same_input_gives_byte_identical_plans() -> None:
    model = toy_moe()
    load = zipf_load(5, 16, seed=3)
    co = CoActivation(rows=(((0, 1, 50.0), (2, 3, 40.0)),) * 5)
    first = plan_to_json(plan(model, HETERO, V1, experts=ExpertInputs(load=load, coactivation=co)))
    again = plan_to_json(plan(model, HETERO, V1, experts=ExpertInputs(load=load, coactivation=co)))
    shuffled = plan_to_json(
        plan(model, HETERO[::-1], V1, experts=ExpertInputs(load=load, coactivation=co))
    )
    assert first == again == shuffled


# -- load balance -----------------------------------------------------------------------


def test_zipf_load_on_heterogeneous_nodes_is_balanced_at_least_as_well_as_the_eplb_rule() -> None:
    model = toy_moe(blocks=9, dense=1, experts=32, k=4, expert_mb=40)
    nodes = [node(0, 6, 3350), node(1, 6, 3350), node(2, 5, 2039), node(3, 5, 2039)]
    nodes += [node(4, 4, 1008), node(5, 4, 1008), node(6, 3, 936), node(7, 3, 936)]
    cons = Constraints(strategy="balance-by-vram", min_stages=8)
    load = zipf_load(8, 32, exponent=1.0, seed=7)
    base = plan(backbone_layout(model), nodes, cons)
    ours = expert_summary(place_experts(base, model, nodes, cons, load), model, nodes, load)
    eplb = eplb_place(base, model, nodes, cons, load, num_groups=4, gpus_per_host=4)
    rule = expert_summary(eplb, model, nodes, load)
    assert ours.imbalance_mean <= rule.imbalance_mean
    assert ours.imbalance_max <= rule.imbalance_max
    assert ours.imbalance_mean < 1.1
    # A node twice as fast carries about twice the load.
    shares = {r.node_id: r.load_share / r.speed_share for r in ours.nodes}
    assert all(0.8 < v < 1.2 for v in shares.values()), shares


def test_uniform_load_on_identical_nodes_is_perfectly_balanced() -> None:
    nodes = [node(i, 4, 1000) for i in range(4)]
    p = plan(toy_moe(), nodes, Constraints(strategy="balance-by-vram", min_stages=4))
    s = expert_summary(p, toy_moe(), nodes)
    assert s.imbalance_max == pytest.approx(1.0)
    assert s.num_replicas == 0
    assert [len(a.owned_experts) for a in p.assignments] == [20, 20, 20, 20]


# -- co-activation locality -------------------------------------------------------------


def clustered(blocks: int, experts: int, size: int) -> CoActivation:
    """Experts 0-3, 4-7, … are selected together; every other pair rarely."""
    row = []
    for e in range(experts):
        for f in range(e + 1, experts):
            row.append((e, f, 1000.0 if e // size == f // size else 1.0))
    return CoActivation(rows=(tuple(row),) * blocks)


def test_coactivated_clusters_are_kept_together_when_memory_allows() -> None:
    model = toy_moe(experts=16, k=4)
    nodes = [node(i, 4, 1000) for i in range(4)]
    cons = Constraints(strategy="balance-by-vram", min_stages=4)
    co = clustered(5, 16, 4)
    p = plan(model, nodes, cons, experts=ExpertInputs(coactivation=co))
    placed = holders(p, model)
    for block in range(1, 6):
        for cluster in range(4):
            stages = {placed[(block, e)][0] for e in range(cluster * 4, cluster * 4 + 4)}
            assert len(stages) == 1, (block, cluster, stages)
    load_only = plan(model, nodes, cons)
    after = expert_summary(p, model, nodes, coactivation=co)
    before = expert_summary(load_only, model, nodes, coactivation=co)
    assert after.transfers_per_token < before.transfers_per_token
    assert after.imbalance_max == pytest.approx(1.0)
    assert any("load-only placement" in n for n in p.rationale.notes)


def test_clusters_split_when_no_node_has_room_for_a_whole_cluster() -> None:
    model = toy_moe(experts=16, k=4)
    # 8 nodes of 2 experts per block: a cluster of 4 cannot stay whole.
    nodes = [node(i, 1.6, 1000) for i in range(8)]
    cons = Constraints(strategy="balance-by-vram", min_stages=6, vram_headroom_frac=0.0)
    p = plan(model, nodes, cons, experts=ExpertInputs(coactivation=clustered(5, 16, 4)))
    assert len(holders(p, model)) == 5 * 16


# -- the cost model's expert term -------------------------------------------------------


def test_expert_stage_time_is_reads_plus_all_to_all() -> None:
    model = toy_moe(blocks=2, dense=0, experts=2, k=1)
    model = ModelLayout(
        name="two",
        num_blocks=2,
        hidden_dim=1024,
        bytes_per_activation_elem=2,
        block_params_bytes=200 * MB + 100 * MB,
        block_bytes=(400 * MB, 200 * MB),
        head_params_bytes=0,
        embed_params_bytes=0,
        experts=ExpertLayout(
            num_experts=2, experts_per_token=1, expert_params_bytes=100 * MB, moe_blocks=(0,)
        ),
    )
    a, b = node(0, 4, 1000, link=100, lat=10), node(1, 4, 500, link=1000, lat=30)
    p = Plan(
        topology=Topology.PipelineWithExperts(2, 2),
        assignments=(
            StageAssignment(
                stage=0,
                node_id="n0",
                block_range=(0, 1),
                owns_embed=True,
                owns_head=False,
                estimated_vram_bytes=300 * MB,
                owned_experts=(ExpertId(block=0, expert=0),),
            ),
            StageAssignment(
                stage=1,
                node_id="n1",
                block_range=(1, 2),
                owns_embed=False,
                owns_head=True,
                estimated_vram_bytes=300 * MB,
                owned_experts=(ExpertId(block=0, expert=1),),
            ),
        ),
        rationale=PlanRationale(strategy="test"),
    )
    t0, t1 = expert_stage_times(p, model, [a, b])
    # Each expert is used by half the tokens; the slower node reads 0.5 * 100 MB at 500 GB/s.
    assert t0.compute_s == pytest.approx(0.5 * 100 * MB / 500e9)
    act_bits = 1024 * 2 * 8
    send = 0.5 * act_bits / 100e6
    back = 0.5 * act_bits / 1000e6
    assert t0.transfer_s == pytest.approx(send + back + 0.5 * (10 + 30) / 1e3)
    assert (t1.compute_s, t1.transfer_s) == (0.0, 0.0)
    batch = expert_stage_times(p, model, [a, b], batch=4)[0]
    assert batch.compute_s == pytest.approx((1 - 0.5**4) * 100 * MB / 500e9)
    assert math.isclose(batch.total_s, batch.compute_s + batch.transfer_s)


def test_statistics_of_the_wrong_shape_are_refused() -> None:
    with pytest.raises(ValueError, match=r"expert_load=.*must have one row per MoE block \(5\)"):
        plan(toy_moe(), HETERO, V1, experts=ExpertInputs(load=ExpertLoad(rows=((1.0,) * 16,))))


def test_the_cost_model_adds_the_expert_term_to_expert_plans() -> None:
    from stowplan.cost import predict

    model = toy_moe()
    wan = [node(i, 4, 1000, link=100, lat=20) for i in range(4)]
    cons = Constraints(strategy="balance-by-vram", min_stages=4)
    p = plan(model, wan, cons)
    pred = p.rationale.prediction
    assert pred is not None and p.rationale.certificate is None
    assert predict(model, wan, cons, p) == pred
    backbone = predict(backbone_layout(model), wan, cons, plan(backbone_layout(model), wan, cons))
    extra = expert_stage_times(p, model, wan)
    assert pred.time_per_token_s == pytest.approx(
        backbone.time_per_token_s + sum(e.total_s for e in extra)
    )
    # Over 20 ms links the all-to-all dominates the expert term.
    assert sum(e.transfer_s for e in extra) > 10 * sum(e.compute_s for e in extra)


# -- block-local vs expert-parallel -------------------------------------------------------


def _wan_fleet() -> list[NodeDescriptor]:
    return load_nodes(EXAMPLES / "fleets" / "mixed-consumer.yaml")


def test_over_wan_the_cost_model_keeps_experts_with_their_blocks() -> None:
    model = lookup("mixtral:8x7b")
    assert model is not None and model.experts is not None
    nodes = _wan_fleet()
    chosen = plan(model, nodes, V1)
    local = plan(model, nodes, V1, experts=ExpertInputs(placement=ExpertPlacement.BLOCK_LOCAL))
    spread = plan(model, nodes, V1, experts=ExpertInputs(placement=ExpertPlacement.EXPERT_PARALLEL))
    t = {
        name: p.rationale.prediction.time_per_token_s  # type: ignore[union-attr]
        for name, p in (("chosen", chosen), ("local", local), ("spread", spread))
    }
    assert t["local"] < t["spread"]  # 10-60 ms hops make every expert all-to-all expensive
    assert t["chosen"] == t["local"]
    (note,) = [n for n in chosen.rationale.notes if "the layout engines run" in n]
    assert note == (
        f"experts: block-local {t['local'] * 1e3:.4g} ms/token, the layout engines run; "
        f"expert-parallel (a custom stage worker, --expert-parallel) "
        f"{t['spread'] * 1e3:.4g} ms/token, no faster"
    )
    summary = expert_summary(chosen, model, nodes)
    assert summary.block_local and summary.transfers_per_token == 0.0
    for a in chosen.assignments:  # every stage owns exactly its own blocks' experts
        assert {x.block for x in a.owned_experts} == set(range(*a.block_range))
        assert len(a.owned_experts) == 8 * a.num_blocks


def test_the_note_calls_placements_as_fast_within_its_rounding() -> None:
    # On one node both placements keep every expert beside its block: their figures agree
    # to the note's four digits, and the note says so rather than "0% faster"; tokens/s
    # past 10,000 are written out, not as an exponent.
    model = lookup("qwen3:30b-a3b")
    assert model is not None
    nodes = h100_nodes(1)
    cons = Constraints(batch=64)
    chosen = plan(model, nodes, cons)
    spread = plan(
        model, nodes, cons, experts=ExpertInputs(placement=ExpertPlacement.EXPERT_PARALLEL)
    )
    a, b = chosen.rationale.prediction, spread.rationale.prediction
    assert a is not None and b is not None
    assert a.tokens_per_s > 10_000 and abs(b.tokens_per_s / a.tokens_per_s - 1) < 0.005
    (note,) = [n for n in chosen.rationale.notes if "the layout engines run" in n]
    assert note == (
        f"experts: block-local {a.tokens_per_s:,.0f} tokens/s, the layout engines run; "
        f"expert-parallel (a custom stage worker, --expert-parallel) {b.tokens_per_s:,.0f} "
        "tokens/s, as fast"
    )


def test_forcing_expert_parallel_spreads_experts_beyond_their_block() -> None:
    model = lookup("mixtral:8x7b")
    assert model is not None
    spread = plan(
        model, _wan_fleet(), V1, experts=ExpertInputs(placement=ExpertPlacement.EXPERT_PARALLEL)
    )
    assert not expert_summary(spread, model, _wan_fleet()).block_local


def test_every_figure_in_an_expert_plans_notes_is_the_final_plans_own():
    import re

    from rich.console import Console

    from stowplan.report.html import render_html
    from stowplan.report.terminal import render_plan
    from tests.common.expert_plans import deepseek_v3_on_16_nodes

    p = deepseek_v3_on_16_nodes()
    pred = p.rationale.prediction
    assert pred is not None and p.rationale.certificate is None
    notes = p.rationale.notes
    stage_notes = [n for n in notes if n.startswith("stage ")]
    assert len(stage_notes) == p.num_stages
    for a, note in zip(p.assignments, stage_notes, strict=True):
        m = re.fullmatch(
            r"stage (\d+) on (\S+): ([\d.]+) ms/step, VRAM ([\d.]+)% of usable "
            r"\((\d+) blocks, (\d+) experts\)",
            note,
        )
        assert m is not None, note
        assert (int(m[1]), m[2]) == (a.stage, a.node_id)
        assert m[3] == f"{pred.stage_time_s[a.stage] * 1e3:.2f}"
        assert a.usable_vram_bytes is not None
        assert m[4] == f"{100 * a.estimated_vram_bytes / a.usable_vram_bytes:.1f}"
        assert (int(m[5]), int(m[6])) == (a.num_blocks, len(a.owned_experts))
    kv = [
        int(x.replace(",", ""))
        for n in notes
        for x in re.findall(r"KV capacity ([\d,]+) tokens", n)
    ]
    assert kv == [pred.kv_capacity_tokens]
    assert not any("certificate (" in n for n in notes)
    # Both views print these notes, so they show the same figures.
    page = render_html(p)
    assert all(n.replace("'", "&#x27;") in page for n in stage_notes)
    assert re.findall(r"KV capacity ([\d,]+) tokens", page) == [f"{pred.kv_capacity_tokens:,}"]
    console = Console(width=400, record=True, color_system=None)
    render_plan(p, (), console)
    text = console.export_text()
    assert all(n in text for n in stage_notes)
    assert re.findall(r"KV capacity ([\d,]+) tokens", text) == [f"{pred.kv_capacity_tokens:,}"]


def test_a_calibration_derates_the_expert_reads_as_it_does_the_backbone() -> None:
    from stowplan.calibration import Calibration, DeviceCalibration, Engine, Figure
    from stowplan.cost import CostModel, predict

    model = toy_moe()
    nodes = [node(i, 4, 1000) for i in range(4)]
    cons = Constraints(strategy="balance-by-vram", min_stages=4)
    p = plan(model, nodes, cons)
    half = Calibration(
        name="half",
        engine=Engine.GENERIC,
        devices=(DeviceCalibration(device="*", bandwidth_fraction={"default": Figure(value=0.5)}),),
    )
    reads = sum(e.compute_s for e in expert_stage_times(p, model, nodes))
    assert reads > 0

    def backbone(cal: Calibration | None) -> float:
        cm = CostModel(backbone_layout(model), nodes, cons, cal)
        return cm.prediction(*cm.plan_order_bounds(p)).time_per_token_s

    plain = predict(model, nodes, cons, p)
    derated = predict(model, nodes, cons, p, calibration=half)
    # Half the bandwidth: the backbone's bytes and the experts' reads both take twice as long.
    assert derated.time_per_token_s - plain.time_per_token_s == pytest.approx(
        backbone(half) - backbone(None) + reads, rel=1e-9
    )


def test_more_stages_than_blocks_is_infeasible_with_the_numbers() -> None:
    from stowplan.errors import Infeasible

    model = toy_moe(blocks=3, dense=0)
    with pytest.raises(Infeasible) as exc:
        plan(model, [node(i, 4, 1000) for i in range(5)], Constraints(min_stages=4))
    assert "min_stages=4 but at most 3 stages are possible (5 nodes, 3 blocks" in str(exc.value)


def test_expert_parallel_holds_more_stages_than_nodes_on_multi_gpu_nodes() -> None:
    """Three 8-GPU nodes run four stages (two GPU groups on one node) whatever the
    placement, and the expert-parallel refusal past their GPUs names them."""
    from stowplan import lookup
    from stowplan.errors import Infeasible

    model = lookup("mixtral:8x7b")
    assert model is not None and model.experts is not None
    nodes = h100_nodes(3)
    c = Constraints(min_stages=4)
    spread = ExpertInputs(placement=ExpertPlacement.EXPERT_PARALLEL)
    p = plan(model, nodes, c, experts=spread)
    assert p.num_stages >= 4
    assert len({a.node_id for a in p.assignments}) < p.num_stages
    placed = {(x.block, x.expert) for a in p.assignments for x in a.owned_experts}
    ex = model.experts
    assert placed == {(b, e) for b in ex.moe_blocks for e in range(ex.num_experts)}
    for a in p.assignments:
        assert a.usable_vram_bytes is not None
        assert a.estimated_vram_bytes <= a.usable_vram_bytes
    # By default the block-local plan leads and its note gives the alternative's figure.
    local = plan(model, nodes, c)
    assert local.num_stages >= 4
    assert any("expert-parallel (a custom stage worker" in n for n in local.rationale.notes)
    with pytest.raises(Infeasible) as exc:
        plan(model, nodes, Constraints(min_stages=25), experts=spread)
    assert "min_stages=25 but at most 24 stages are possible (3 nodes, 24 GPUs" in str(exc.value)


def test_expert_parallel_stages_on_gpu_groups_are_predicted_as_nodes_of_their_own() -> None:
    """One 8 × H100 node as two stages of four GPUs, expert-parallel: every figure is that
    of two 4-GPU nodes joined by a link as fast as the GPUs' own (their share of the
    node's bandwidth for the experts' reads, the GPUs' link for the all-to-all)."""
    from dataclasses import replace

    from stowplan import lookup
    from stowplan.cost import predict
    from stowplan.cost.rates import node_rates
    from stowplan.model import gpu_group_node

    model = lookup("mixtral:8x7b")
    assert model is not None
    (node,) = h100_nodes(1)
    c = Constraints(min_stages=2, max_stages=2)
    spread = ExpertInputs(placement=ExpertPlacement.EXPERT_PARALLEL)
    p = plan(model, [node], c, experts=spread)
    assert [a.tensor_parallel for a in p.assignments] == [4, 4]
    rates, _ = node_rates(node, 0.0)
    halves = [
        replace(
            gpu_group_node(node, a.gpu_indices[0], a.tensor_parallel),
            id=f"half{a.stage}",
            link_mbps=rates.intra_bytes_per_s * 8 / 1e6,
            link_latency_ms=rates.intra_latency_s * 1e3,
        )
        for a in p.assignments
    ]
    apart = replace(
        p,
        assignments=tuple(
            replace(a, node_id=f"half{a.stage}", gpu_indices=()) for a in p.assignments
        ),
    )
    on_groups = predict(model, [node], c, p)
    on_nodes = predict(model, halves, c, apart)
    assert on_groups.stage_time_s == pytest.approx(on_nodes.stage_time_s, rel=1e-9)
    assert on_groups.time_per_token_s == pytest.approx(on_nodes.time_per_token_s, rel=1e-9)
    assert on_groups.kv_capacity_tokens == on_nodes.kv_capacity_tokens
    times = expert_stage_times(p, model, [node])
    assert [t.total_s for t in times] == pytest.approx(
        [t.total_s for t in expert_stage_times(apart, model, halves)], rel=1e-9
    )
    # The whole node's bandwidth and its network link would give other figures.
    whole = [replace(node, id=f"half{a.stage}") for a in p.assignments]
    assert [t.total_s for t in expert_stage_times(apart, model, whole)] != pytest.approx(
        [t.total_s for t in times], rel=1e-3
    )
