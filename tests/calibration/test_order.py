"""Predictions respect physics and each other: a GPU that dominates another on the datasheet
is never predicted slower, more bandwidth, FLOP/s or link never slows a plan, and no
prediction beats reading a step's bytes at the hardware's peak, under every profile."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from stowplan.calibration import Engine, shipped_calibration
from stowplan.calibration.order import (
    Datasheet,
    datasheet,
    dominates,
    entry_datasheet,
    in_order_violations,
    ordered_entry,
    pool_in_order,
)
from stowplan.cost import CostModel
from stowplan.gpus import GPU_SPECS
from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.models import lookup
from stowplan.models.known import known_names
from stowplan.planner import plan

ENGINES = tuple(Engine)
MODELS = tuple(sorted(known_names()))


def _rated() -> tuple[str, ...]:
    """Curated GPUs whose name resolves to their own row, with bandwidth and FLOP/s known."""
    out = []
    for spec in GPU_SPECS:
        sheet = datasheet(spec.name)
        if sheet == Datasheet(bandwidth_gbps=spec.mem_bandwidth_gbps, tflops=spec.bf16_tflops or 0):
            out.append(spec.name)
    return tuple(out)


GPUS = _rated()
PAIRS = tuple(
    (a, b)
    for a in GPUS
    for b in GPUS
    if a != b and dominates(datasheet(a), datasheet(b))  # type: ignore[arg-type]
)


@cache
def _model(name: str) -> ModelLayout:
    model = lookup(name)
    assert model is not None
    return model


def _node(gpu: str, num_gpus: int, **kw: object) -> NodeDescriptor:
    """A node of ``num_gpus`` ``gpu``s at their datasheet figures, with a fixed intra-node
    link (a datasheet's bandwidth and FLOP/s are what dominance compares)."""
    sheet = datasheet(gpu)
    assert sheet is not None
    args: dict[str, object] = {
        "id": "a",
        "gpu_name": gpu,
        "vram_bytes": 10**13,
        "num_gpus": num_gpus,
        "mem_bandwidth_gbps": sheet.bandwidth_gbps * num_gpus,
        "flops_estimate": sheet.tflops * num_gpus,
        "link_mbps": 100_000.0,
        "intra_link_gbps": 450.0,
        "intra_link_latency_us": 5.0,
    }
    args.update(kw)
    return NodeDescriptor(**args)  # type: ignore[arg-type]


def _tokens_per_s(model: str, nodes: list[NodeDescriptor], engine: Engine, batch: int = 1) -> float:
    """Tokens/s of ``model`` split evenly over ``nodes`` in order, one stage each."""
    layout = _model(model)
    n = layout.num_blocks
    bounds = [round(i * n / len(nodes)) for i in range(len(nodes) + 1)]
    cm = CostModel(layout, nodes, Constraints(batch=batch, calibration=shipped_calibration(engine)))
    return cm.prediction(list(range(len(nodes))), bounds).tokens_per_s


def test_there_are_dominance_pairs_across_vendors_and_generations() -> None:
    assert len(GPUS) >= 40
    assert {("B200", "H200"), ("H200", "H100 SXM5"), ("H100 SXM5", "A100 80GB SXM4")} <= set(PAIRS)
    assert ("RTX 4090", "RTX 3090") in PAIRS and ("RTX 3090", "RTX 4090") not in PAIRS


@pytest.mark.parametrize("engine", ENGINES)
def test_shipped_profiles_hold_their_devices_in_datasheet_order(engine: Engine) -> None:
    cal = shipped_calibration(engine)
    sheets = [entry_datasheet(cal, d) for d in cal.devices]
    # Figures are stored rounded; the order holds to their last digit.
    assert in_order_violations(cal.devices, sheets, rel=1e-4) == []


@given(
    model=st.sampled_from(MODELS),
    pair=st.sampled_from(PAIRS),
    engine=st.sampled_from(ENGINES),
    num_gpus=st.sampled_from([1, 2, 8]),
    batch=st.sampled_from([1, 8]),
)
@example(
    model="gpt-oss:120b", pair=("H200", "H100 SXM5"), engine=Engine.GENERIC, num_gpus=8, batch=1
)
@example(model="gpt-oss:120b", pair=("B200", "H200"), engine=Engine.GENERIC, num_gpus=8, batch=1)
@example(model="gpt-oss:120b", pair=("B200", "H200"), engine=Engine.VLLM, num_gpus=8, batch=1)
@example(model="gpt-oss:120b", pair=("H200", "H100 SXM5"), engine=Engine.VLLM, num_gpus=8, batch=1)
@example(model="gpt-oss:120b", pair=("B200", "H100 SXM5"), engine=Engine.VLLM, num_gpus=8, batch=1)
@settings(max_examples=300, deadline=None)
def test_a_gpu_that_dominates_another_on_the_datasheet_is_never_predicted_slower(
    model: str, pair: tuple[str, str], engine: Engine, num_gpus: int, batch: int
) -> None:
    fast, slow = pair
    on_fast = _tokens_per_s(model, [_node(fast, num_gpus)], engine, batch)
    on_slow = _tokens_per_s(model, [_node(slow, num_gpus)], engine, batch)
    assert on_fast >= on_slow * (1 - 1e-9), (fast, on_fast, slow, on_slow)


KNOBS = {
    "mem_bandwidth_gbps": "bandwidth",
    "flops_estimate": "FLOP/s",
    "link_mbps": "network link",
    "intra_link_gbps": "intra-node link",
}


@given(
    model=st.sampled_from(MODELS),
    gpus=st.lists(st.sampled_from(GPUS), min_size=1, max_size=3),
    engine=st.sampled_from(ENGINES),
    num_gpus=st.sampled_from([1, 2, 4]),
    batch=st.sampled_from([1, 4]),
    which=st.integers(0, 2),
    knob=st.sampled_from(sorted(KNOBS)),
    factor=st.floats(1.0, 16.0),
)
@settings(max_examples=300, deadline=None)
def test_more_bandwidth_flops_or_link_on_a_node_never_slows_a_plan(
    model: str,
    gpus: list[str],
    engine: Engine,
    num_gpus: int,
    batch: int,
    which: int,
    knob: str,
    factor: float,
) -> None:
    nodes = [_node(g, num_gpus, id=f"n{i}", link_latency_ms=1.0) for i, g in enumerate(gpus)]
    i = which % len(nodes)
    faster = list(nodes)
    value = getattr(nodes[i], knob)
    faster[i] = NodeDescriptor(
        **{**{f: getattr(nodes[i], f) for f in nodes[i].__dataclass_fields__}, knob: value * factor}
    )
    before = _tokens_per_s(model, nodes, engine, batch)
    after = _tokens_per_s(model, faster, engine, batch)
    assert after >= before * (1 - 1e-9), (KNOBS[knob], factor, before, after)


@given(
    model=st.sampled_from(MODELS),
    gpu=st.sampled_from(GPUS),
    engine=st.sampled_from(ENGINES),
    num_gpus=st.sampled_from([1, 2, 8]),
    batch=st.sampled_from([1, 8]),
)
@example(model="gpt-oss:120b", gpu="B200", engine=Engine.GENERIC, num_gpus=8, batch=1)
@settings(max_examples=200, deadline=None)
def test_no_prediction_beats_reading_a_steps_bytes_at_the_peak_bandwidth(
    model: str, gpu: str, engine: Engine, num_gpus: int, batch: int
) -> None:
    layout = _model(model)
    node = _node(gpu, num_gpus)
    # One step reads every weight a token touches once, for the whole batch.
    read = sum(layout.block_read_sizes()) + layout.head_params_bytes
    peak = node.mem_bandwidth_gbps * 1e9  # type: ignore[operator]
    tokens_per_s = _tokens_per_s(model, [node], engine, batch)
    assert tokens_per_s <= batch * peak / read * (1 + 1e-9)


@pytest.mark.parametrize("engine", ENGINES)
def test_gpt_oss_120b_plans_faster_on_each_newer_8_gpu_node(engine: Engine) -> None:
    """The report that found the order broken: 8 × H100, H200, B200 under each profile."""
    layout = _model("gpt-oss:120b")
    speeds = []
    for gpu, gib in (("H100 SXM", 80), ("H200", 141), ("B200", 180)):
        node = NodeDescriptor(
            id="a", gpu_name=gpu, vram_bytes=8 * gib * 2**30, num_gpus=8, link_mbps=100_000
        )
        p = plan(layout, [node], Constraints(calibration=shipped_calibration(engine)))
        assert p.rationale.prediction is not None
        speeds.append(p.rationale.prediction.tokens_per_s)
    assert speeds == sorted(speeds), speeds


def test_gpt_oss_120b_on_8_b200_is_near_the_published_415_tokens_per_s() -> None:
    node = NodeDescriptor(
        id="a", gpu_name="B200", vram_bytes=8 * 180 * 2**30, num_gpus=8, link_mbps=100_000
    )
    p = plan(
        _model("gpt-oss:120b"), [node], Constraints(calibration=shipped_calibration("generic"))
    )
    assert p.rationale.prediction is not None
    assert p.rationale.prediction.tokens_per_s == pytest.approx(415, rel=0.2)


def test_a_gpu_on_the_star_entry_is_kept_between_the_devices_around_it() -> None:
    cal = shipped_calibration(Engine.SGLANG)  # entries: b200 and *
    b200 = ordered_entry(cal, "B200")
    h100 = ordered_entry(cal, "H100 SXM5")
    assert b200 is not None and h100 is not None and h100.device == "*"
    assert h100.block_overhead_s.value >= b200.block_overhead_s.value
    for c in ("f16", "q4"):
        assert 3350 * h100.fraction(c).value <= 7700 * b200.fraction(c).value


def test_no_gpu_fraction_exceeds_one_where_the_profile_is_applied() -> None:
    for engine in ENGINES:
        cal = shipped_calibration(engine)
        for gpu in GPUS:
            entry = ordered_entry(cal, gpu)
            assert entry is not None
            assert max(f.value for f in entry.bandwidth_fraction.values()) <= 1.0


@given(
    values=st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=12),
    data=st.data(),
)
def test_pooling_meets_every_pair_and_keeps_the_weighted_total(
    values: list[float], data: st.DataObject
) -> None:
    n = len(values)
    weights = data.draw(st.lists(st.floats(0.1, 10.0), min_size=n, max_size=n))
    pairs = data.draw(
        st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=20)
    )
    pairs = [(i, j) for i, j in pairs if i < j]  # a partial order: no cycles
    out = pool_in_order(values, weights, pairs)
    assert all(out[i] <= out[j] + 1e-9 for i, j in pairs)
    total = sum(w * v for w, v in zip(weights, values, strict=True))
    assert sum(w * v for w, v in zip(weights, out, strict=True)) == pytest.approx(
        total, abs=1e-6 * (1 + sum(abs(v) * w for v, w in zip(values, weights, strict=True)))
    )


@given(
    values=st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=12),
    data=st.data(),
)
def test_pooling_on_a_chain_is_the_least_squares_isotonic_fit(
    values: list[float], data: st.DataObject
) -> None:
    optimize = pytest.importorskip("scipy.optimize")
    n = len(values)
    weights = data.draw(st.lists(st.floats(0.1, 10.0), min_size=n, max_size=n))
    out = pool_in_order(values, weights, [(i, i + 1) for i in range(n - 1)])
    want = optimize.isotonic_regression(values, weights=weights).x
    assert out == pytest.approx(list(want), abs=1e-6 * (1 + max(abs(v) for v in values)))
