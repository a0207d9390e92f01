"""The cost model on hand-checked numbers (GPU lookup: tests/gpus/test_lookup.py)."""

from __future__ import annotations

import pytest

from stowplan import Constraints, NodeDescriptor
from stowplan.calibration import resolve_calibration
from stowplan.cost import CostModel
from stowplan.cost import model as cost_model
from stowplan.model import gpu_group_node
from stowplan.models import resolve_model
from tests.common.toy import TOY_MODEL, toy_node

MODEL = TOY_MODEL
_node = toy_node


def test_stage_times_hops_and_rates_match_hand_computation():
    cm = CostModel(MODEL, [_node(0), _node(1)], Constraints(vram_headroom_frac=0.0))
    ev = cm.evaluate([0, 1], [0, 2, 4])
    # stage 0: 2 GB / 100 GB/s = 20 ms + 1000*2 bytes over 1 MB/s = 2 ms
    assert ev.stage_time_s[0] == pytest.approx(0.022)
    # stage 1: (2 GB + head 1 GB) / 100 GB/s = 30 ms, no outbound transfer
    assert ev.stage_time_s[1] == pytest.approx(0.030)
    assert ev.hops_s == pytest.approx(0.020)
    assert ev.time_per_token_s == pytest.approx(0.072)
    assert ev.tokens_per_s == pytest.approx(1 / 0.072)  # one sequence: one token per cycle


def test_kv_capacity_is_the_tightest_stage():
    cm = CostModel(MODEL, [_node(0), _node(1)], Constraints(vram_headroom_frac=0.0))
    # stage 0 holds 2 GB + embed 1 GB: 7e9 free / 2000 B per token; stage 1 holds 3 GB
    assert cm.kv_capacity_tokens([0, 1], [0, 2, 4]) == 3_500_000


def test_kv_capacity_is_unknown_without_a_kv_figure():
    from dataclasses import replace

    model = replace(MODEL, kv_bytes_per_token=None)
    cm = CostModel(model, [_node(0)], Constraints())
    assert cm.kv_capacity_tokens([0], [0, 4]) is None


def test_price_per_hour_and_per_million_tokens():
    nodes = [_node(0, price_per_hour=0.5), _node(1, price_per_hour=0.25)]
    cm = CostModel(MODEL, nodes, Constraints(vram_headroom_frac=0.0))
    pred = cm.prediction([0, 1], [0, 2, 4])
    assert pred.cost_per_hour == pytest.approx(0.75)
    # one stream: 1 / 72 ms = 13.89 tokens/s → 0.75 $/h / (13.89 * 3600) * 1e6
    assert pred.usd_per_million_tokens == pytest.approx(0.75 / (3600 / 0.072) * 1e6)


def test_table_inputs_are_listed_as_assumed():
    node = _node(0, mem_bandwidth_gbps=None)
    pred = CostModel(MODEL, [node], Constraints()).prediction([0], [0, 4])
    assert any(a.startswith("n0.mem_bandwidth_gbps=1008") for a in pred.assumed)
    assert any("flops_estimate=165.2" in a for a in pred.assumed)


def test_relax_groups_returns_a_relaxed_model_and_leaves_this_one_as_it_was() -> None:
    whole = toy_node(0, num_gpus=2)
    groups = [gpu_group_node(whole, i, 1) for i in range(2)]
    cm = CostModel(TOY_MODEL, groups, Constraints(batch=4))
    before = (cm.block_s, cm.stage_s, cm.xfer_s, cm.latency_s)
    relaxed = cm.relax_groups()
    assert relaxed is not cm
    assert (cm.block_s, cm.stage_s, cm.xfer_s, cm.latency_s) == before
    assert relaxed.stage_s == (0.0, 0.0)
    assert relaxed.xfer_s == tuple(map(min, cm.xfer_s, cm.intra_xfer_s))
    assert relaxed.latency_s == tuple(map(min, cm.latency_s, cm.intra_latency_s))
    assert all(r <= c for r, c in zip(relaxed.block_s, cm.block_s, strict=True))
    view = relaxed.at_microbatch(2)
    assert view.stage_s == (0.0, 0.0)
    assert cm.at_microbatch(2).stage_s == cm.stage_s


@pytest.mark.parametrize("calibrated", [False, True])
@pytest.mark.parametrize("relaxed", [False, True])
def test_a_microbatch_view_has_the_figures_of_a_model_built_for_it(
    calibrated: bool, relaxed: bool
) -> None:
    # at_microbatch shares the root's microbatch-free figures and computes the rest anew.
    model = resolve_model("mixtral:8x7b-q4_0")
    assert model is not None
    nodes = [
        NodeDescriptor(
            id="a",
            gpu_name="RTX 4090",
            vram_bytes=2 * 24 * 10**9,
            num_gpus=2,
            link_mbps=1000.0,
            link_latency_ms=0.5,
        ),
        NodeDescriptor(id="b", gpu_name="RTX 3090", vram_bytes=24 * 10**9, link_mbps=100.0),
    ]
    cal = resolve_calibration("generic") if calibrated else None
    c = Constraints(batch=8, context_tokens=4096, calibration=cal)
    root = CostModel(model, nodes, c)
    if relaxed:
        root = root.relax_groups()
    for mb in (1, 3, 8):
        fresh = CostModel(model, nodes, c, microbatch=mb)
        if relaxed:
            fresh._relax()
        view = root.at_microbatch(mb)
        skip = {"_views", "_root", "_expand"}  # _expand: a function of _kind_of
        assert {k: v for k, v in vars(view).items() if k not in skip} == {
            k: v for k, v in vars(fresh).items() if k not in skip
        }


@pytest.mark.parametrize("calibrated", [False, True])
def test_figures_per_kind_of_node_equal_each_node_priced_alone(calibrated: bool) -> None:
    # The per-node figures are computed once per kind of node (alike but for the id) and
    # spread: every node's must be what a model of that node alone gives it.
    model = resolve_model("mixtral:8x7b-q4_0")
    assert model is not None
    kinds = [
        dict(gpu_name="RTX 4090", vram_bytes=2 * 24 * 10**9, num_gpus=2, link_mbps=1000.0),
        dict(gpu_name="RTX 3090", vram_bytes=24 * 10**9, link_mbps=100.0),
        dict(gpu_name="RTX 3090", vram_bytes=24 * 10**9, link_mbps=250.0),
    ]
    nodes = [
        NodeDescriptor(id=f"n{i}", **kinds[k])  # type: ignore[arg-type]
        for i, k in enumerate([0, 1, 0, 2, 1, 1, 2, 0])
    ]
    cal = resolve_calibration("generic") if calibrated else None
    c = Constraints(batch=8, context_tokens=4096, calibration=cal)
    whole = CostModel(model, nodes, c)
    assert len(set(whole.stage_class)) == 3
    for mb in (1, 3, 8):
        view = whole.at_microbatch(mb)
        for d, node in enumerate(nodes):
            alone = CostModel(model, [node], c, microbatch=mb)
            for name in ("flop_s_per_byte", "xfer_s", "intra_xfer_s", "all_reduce_s", "block_s"):
                assert getattr(view, name)[d] == getattr(alone, name)[0], (name, d)
        assert [view.stage_class.index(k) for k in view.stage_class] == [0, 1, 0, 3, 1, 1, 3, 0]


@pytest.mark.parametrize("engine", [None, "generic", "vllm", "llamacpp"])
def test_figures_on_arrays_equal_each_node_priced_alone(engine: str | None) -> None:
    # From KIND_ARRAYS kinds of node a model computes each microbatch's figures on arrays
    # (calibrated ones too): value for value those of a model of each node alone (lists).
    model = resolve_model("llama3.1:70b")
    assert model is not None
    gpus = ("RTX 4090", "RTX 3090", "A100 80GB SXM4", "H100 SXM5")
    nodes = [
        NodeDescriptor(
            id=f"n{i}",
            gpu_name=gpus[i % 4],
            vram_bytes=(1 + i % 3) * 24 * 10**9,
            num_gpus=1 + i % 3,
            link_mbps=100.0 + 7.0 * i,
            intra_link_gbps=None if i % 5 else 64.0 + i,
        )
        for i in range(cost_model.KIND_ARRAYS + 6)
    ]
    cal = resolve_calibration(engine) if engine is not None else None
    c = Constraints(batch=16, context_tokens=4096, calibration=cal)
    whole = CostModel(model, nodes, c)
    assert whole._rate_arrays is not None  # the array path is the one tested
    assert (whole._cal_arrays is not None) == (engine is not None)
    for mb in (1, 5, 16):
        view = whole.at_microbatch(mb)
        for d, node in enumerate(nodes):
            alone = CostModel(model, [node], c, microbatch=mb)
            assert alone._rate_arrays is None
            for name in ("flop_s_per_byte", "xfer_s", "intra_xfer_s", "all_reduce_s", "block_s"):
                assert getattr(view, name)[d] == getattr(alone, name)[0], (name, d)


@pytest.mark.parametrize("engine", [None, "generic", "llamacpp"])
def test_a_fleet_of_many_copies_has_every_figure_of_its_nodes_priced_one_by_one(
    engine: str | None,
) -> None:
    # Figures are computed once per kind of descriptor (alike but for the id) and spread;
    # kinds that differ only in what no figure reads (a label) merge into one kind of the
    # model. Every per-node attribute must be the node's own, priced alone.
    from stowplan.cost.rates import node_rates
    from stowplan.model import node_kinds

    model = resolve_model("mixtral:8x7b-q4_0")
    assert model is not None
    whole = [
        NodeDescriptor(
            id=f"h{i}",
            gpu_name="RTX 4090",
            vram_bytes=8 * 24 * 10**9,
            num_gpus=8,
            link_mbps=1000.0,
            labels={"rack": "a" if i % 2 else "b"},
        )
        for i in range(6)
    ]
    nodes = [gpu_group_node(n, s, t) for n in whole for s, t in ((0, 4), (4, 2), (6, 1), (7, 1))]
    nodes += [toy_node(i, price_per_hour=1.0) for i in range(5)]
    nodes += [toy_node(9, mem_bandwidth_gbps=None)]
    cal = resolve_calibration(engine) if engine is not None else None
    c = Constraints(batch=8, context_tokens=4096, calibration=cal)
    parents = [n.id.split("/")[0] for n in nodes]
    fleet = CostModel(model, nodes, c, parents=parents)
    assert len(fleet._node_reps) == 8  # groups of 4, 2, 1 GPUs on two racks; two toys
    assert fleet.rates == tuple(node_rates(n, c.headroom)[0] for n in nodes)
    assert fleet.node_assumed == tuple(node_rates(n, c.headroom)[1] for n in nodes)
    assert fleet.assumed == tuple(a for n in nodes for a in node_rates(n, c.headroom)[1])
    assert fleet.index == {n.id: i for i, n in enumerate(nodes)}
    assert fleet.parent == tuple(parents)
    per_node = [
        "inv_bw",
        "inv_flops",
        "latency_s",
        "intra_latency_s",
        "usable",
        "tensor_parallel",
        "stage_s",
        "inv_prefill_flops",
        "prefill_sources",
        "flop_s_per_byte",
        "xfer_s",
        "intra_xfer_s",
        "all_reduce_s",
        "block_s",
    ]
    for d, node in enumerate(nodes):
        alone = CostModel(model, [node], c, parents=[parents[d]])
        for name in per_node:
            mine, its = getattr(fleet, name)[d], getattr(alone, name)[0]
            assert mine == its and type(mine) is type(its), (name, d)
        for name in ("_cal", "_cal_single", "_spread"):
            mine_all, its_all = getattr(fleet, name), getattr(alone, name)
            assert (mine_all[d] if mine_all else None) == (its_all[0] if its_all else None)
    for name in per_node:
        assert type(getattr(fleet, name)) is tuple, name
    for name in ("_cal", "_cal_single", "_spread"):
        assert type(getattr(fleet, name)) is (list if engine else type(getattr(alone, name)))
    # The model's kinds, first seen first, as found node by node.
    keys: dict[tuple[object, ...], int] = {}
    of = [
        keys.setdefault(
            (
                cost_model._rate_figures(fleet.rates[d]),
                fleet.tensor_parallel[d],
                fleet._cal[d] if fleet._cal else None,
                fleet._cal_single[d] if fleet._cal_single else None,
                fleet._spread[d] if fleet._spread else 1,
            ),
            len(keys),
        )
        for d in range(len(nodes))
    ]
    assert fleet._kind_of == tuple(of)
    assert fleet._kind_reps == [of.index(k) for k in range(len(keys))]
    assert len(fleet._kind_reps) < len(fleet._node_reps)  # the racks merge
    # Built again (the nodes' rates kept), the model is the same.
    again = CostModel(model, list(nodes), c, parents=parents)
    skip = {"_views", "_root", "_expand"}
    assert {k: v for k, v in vars(again).items() if k not in skip} == {
        k: v for k, v in vars(fleet).items() if k not in skip
    }
    assert node_kinds(nodes)[1] == fleet._node_reps
    relaxed = fleet.relax_groups()
    for d, node in enumerate(nodes):
        alone = CostModel(model, [node], c, parents=[parents[d]]).relax_groups()
        assert relaxed.block_s[d] == alone.block_s[0]
