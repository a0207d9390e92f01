"""The cost model applies a calibration profile; plans name it with its provenance."""

from __future__ import annotations

from pathlib import Path

import pytest

from stowplan.calibration import (
    Calibration,
    DeviceCalibration,
    Engine,
    Figure,
    calibration_to_json,
    shipped_calibration,
)
from stowplan.cli import main
from stowplan.cost import CostModel
from stowplan.model import Constraints, NodeDescriptor
from stowplan.models import lookup
from stowplan.planner import plan
from tests.common.paths import EXAMPLES

GPU = NodeDescriptor(
    id="a", gpu_name="NVIDIA GeForce RTX 3090", vram_bytes=24 * 2**30, flops_estimate=71.0,
    link_mbps=1000.0,
)  # fmt: skip
CAL = Calibration(
    name="test",
    engine=Engine.LLAMACPP,
    devices=(
        DeviceCalibration(
            device="rtx-3090",
            bandwidth_fraction={"default": Figure(value=0.9), "q4": Figure(value=0.5)},
            block_overhead_s=Figure(value=1e-4),
            hop_overhead_s=Figure(value=1e-3),
            compute_efficiency=Figure(value=0.5),
        ),
    ),
)


def test_one_stage_time_is_bandwidth_fraction_plus_block_costs() -> None:
    model = lookup("llama3.1:8b-q4_0")
    assert model is not None
    first = CostModel(model, [GPU], Constraints())
    cal = CostModel(model, [GPU], Constraints(), CAL)
    read = sum(model.block_read_sizes()) + model.head_params_bytes
    bw = 936e9  # spec table
    assert first.stage_time(0, 0, 32, True, True) == pytest.approx(read / bw)
    # Every block pays the block cost once; the head and the KV cache pay none.
    assert cal.stage_time(0, 0, 32, True, True) == pytest.approx(read / (bw * 0.5) + 1e-4 * 32)
    # A non-last stage pays the hop's fixed cost with its outbound transfer.
    half = sum(model.block_read_sizes()[:16])
    xfer = first.stage_time(0, 0, 16, True, False) - half / bw
    assert cal.stage_time(0, 0, 16, True, False) == pytest.approx(
        half / (bw * 0.5) + 1e-4 * 16 + xfer + 1e-3
    )


def test_plans_carry_the_calibration_and_are_slower_than_first_order() -> None:
    model = lookup("llama3.1:8b-q4_0")
    assert model is not None
    plain = plan(model, [GPU], Constraints())
    calibrated = plan(model, [GPU], Constraints(calibration=shipped_calibration("llamacpp")))
    p0, p1 = plain.rationale.prediction, calibrated.rationale.prediction
    assert p0 is not None and p1 is not None
    assert p0.calibration is None
    assert p1.calibration == (
        "engine llamacpp, calibrated on 35 published runs: "
        "llamacpp-default [rtx-3090: bandwidth fitted, block fitted, hop fitted, compute table]"
    )
    # The published RTX 3090 runs decode at 0.50-0.70 of first order; so must the plan.
    assert 0.4 < p1.tokens_per_s / p0.tokens_per_s < 0.75


def test_plan_cli_engine_and_calibration_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STOWPLAN_HOME", str(tmp_path / "home"))
    fleet = str(EXAMPLES / "fleets" / "mixed-consumer.yaml")
    assert main(["plan", "llama3.1:8b-q4_0", "--nodes", fleet, "--engine", "llamacpp"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert (
        "calibration: engine llamacpp, calibrated on 35 published runs: llamacpp-default [" in out
    )
    assert "predicted (engine llamacpp, calibrated on 35 published runs): " in out
    mine = tmp_path / "cal.json"
    mine.write_text(calibration_to_json(CAL), encoding="utf-8")
    assert main(["plan", "llama3.1:8b-q4_0", "--nodes", fleet, "--calibration", str(mine),
                 "--json"]) == 0  # fmt: skip
    assert '"calibration": "engine llamacpp: test [' in capsys.readouterr().out
    assert main(["plan", "llama3.1:8b-q4_0", "--nodes", fleet, "--engine", "x"]) == 2
    assert capsys.readouterr().err == (
        "stowplan: error: --engine='x': must be one of generic, llamacpp, vllm, trtllm, sglang, transformers, first-order\n"
    )


def test_a_measured_bandwidth_is_not_derated_again() -> None:
    from dataclasses import replace

    from stowplan.host import Passport, node_from_passport
    from tests.common.host import cap, fixture_topology, matrix

    model = lookup("llama3.1:8b-q4_0")
    assert model is not None
    topo = fixture_topology("thamada_nvsim/RTX3090_smi_-a.txt")
    passport = Passport.create(topo, matrix(cap("gpu0", 800.0, 25.0), cap("cpu", 20.0)))
    # The passport's FLOPs are an f32 GEMV lower bound; a large figure keeps this memory-bound.
    measured = replace(node_from_passport(passport), flops_estimate=1000.0)
    assert measured.mem_bandwidth_gbps == pytest.approx(800.0)
    datasheet = replace(measured, labels=())
    read = sum(model.block_read_sizes()) + model.head_params_bytes
    blocks = 1e-4 * 32
    got = CostModel(model, [measured], Constraints(), CAL).stage_time(0, 0, 32, True, True)
    assert got == pytest.approx(read / 800e9 + blocks)  # fraction 1.0: measured
    sheet = CostModel(model, [datasheet], Constraints(), CAL).stage_time(0, 0, 32, True, True)
    assert sheet == pytest.approx(read / (800e9 * 0.5) + blocks)  # fraction 0.5: q4 entry
    pred = CostModel(model, [measured], Constraints(), CAL).prediction([0], [0, 32])
    assert pred.calibration == (
        "engine llamacpp: test [rtx-3090: bandwidth measured, block table, hop table, compute table]"
    )


def test_bandwidth_is_measured_reads_the_measured_label() -> None:
    from dataclasses import replace

    from stowplan.calibration.apply import bandwidth_is_measured

    assert not bandwidth_is_measured(GPU)
    assert bandwidth_is_measured(replace(GPU, labels=(("measured", "bandwidth,flops"),)))
    assert bandwidth_is_measured(replace(GPU, labels=(("measured", "flops, bandwidth"),)))
    assert not bandwidth_is_measured(replace(GPU, labels=(("measured", "flops"),)))
    assert not bandwidth_is_measured(replace(GPU, labels=(("source", "bandwidth"),)))


def _rtx3090(
    engine: Engine, fraction: float, *, block: float, collective: float, hop: float = 0.0
) -> Calibration:
    """A one-entry profile for the RTX 3090 with the given figures (all ``table``)."""
    return Calibration(
        name="tp" if engine is Engine.VLLM else "layers",
        engine=engine,
        devices=(
            DeviceCalibration(
                device="rtx-3090",
                bandwidth_fraction={"default": Figure(value=fraction)},
                block_overhead_s=Figure(value=block),
                hop_overhead_s=Figure(value=hop),
                collective_overhead_s=Figure(value=collective),
            ),
        ),
    )


def test_a_tensor_parallel_node_pays_the_collective_cost_on_every_block() -> None:
    from dataclasses import replace

    model = lookup("llama3.1:8b")
    assert model is not None
    cal = _rtx3090(Engine.VLLM, 0.8, block=2e-5, collective=3e-5)
    pair = replace(GPU, id="pair", vram_bytes=48 * 2**30, num_gpus=2)
    read = sum(model.block_read_sizes()) + model.head_params_bytes
    one = CostModel(model, [GPU], Constraints(), cal).stage_time(0, 0, 32, True, True)
    two = CostModel(model, [pair], Constraints(), cal).stage_time(0, 0, 32, True, True)
    assert one == pytest.approx(read / (936e9 * 0.8) + 2e-5 * 32)
    # Twice the bandwidth, but every block also pays its all-reduces: the first-order two
    # all-reduces over PCIe gen 4 (31.5 GB/s, 12 µs a step), raised to the calibrated
    # collective where that measured more.
    ar = 12e-6 + 2 * (2 - 1) / 2 * model.hidden_dim * 2 / 31.5e9
    assert two == pytest.approx(read / (2 * 936e9 * 0.8) + (2e-5 + max(3e-5, 2 * ar)) * 32)
    # A long context's KV reads pay bandwidth only, never a block cost.
    ctx = Constraints(context_tokens=32_768)
    kv = CostModel(model, [pair], ctx, cal)
    kv_read = kv.kv_prefix[-1]
    assert kv_read > 10**9
    assert kv.stage_time(0, 0, 32, True, True) == pytest.approx(
        (read + kv_read) / (2 * 936e9 * 0.8) + (2e-5 + max(3e-5, 2 * ar)) * 32
    )
    pred = CostModel(model, [pair], Constraints(), cal).prediction([0], [0, 32])
    assert pred.calibration == (
        "engine vllm: "
        "tp [rtx-3090: bandwidth table, block table, hop table, collective table, compute table]"
    )
    # The single-GPU node's description does not mention a collective it never pays.
    single = CostModel(model, [GPU], Constraints(), cal).prediction([0], [0, 32])
    assert single.calibration is not None and "collective" not in single.calibration


def test_an_engine_that_splits_layers_runs_a_multi_gpu_host_as_a_pipeline() -> None:
    """llama.cpp's layer split: one GPU streams at a time, the token crosses the GPUs."""
    from dataclasses import replace

    model = lookup("llama3.1:8b-q4_0")
    assert model is not None
    # A collective of 1 s per block would show at once: a layer split never pays it.
    cal = _rtx3090(Engine.LLAMACPP, 0.7, block=2e-5, hop=4e-4, collective=1.0)
    three = replace(GPU, id="three", vram_bytes=72 * 2**30, num_gpus=3)
    read = sum(model.block_read_sizes()) + model.head_params_bytes
    got = CostModel(model, [three], Constraints(), cal).stage_time(0, 0, 32, True, True)
    assert got == pytest.approx(read / (936e9 * 0.7) + 2e-5 * 32 + 2 * 4e-4)
    # The same host under a tensor-parallel engine adds the bandwidths and pays the collective.
    tp = replace(cal, engine=Engine.VLLM)
    got_tp = CostModel(model, [three], Constraints(), tp).stage_time(0, 0, 32, True, True)
    ar = 12e-6 + 2 * (3 - 1) / 3 * model.hidden_dim * 2 / 31.5e9  # PCIe gen 4 all-reduce
    assert got_tp == pytest.approx(read / (3 * 936e9 * 0.7) + (2e-5 + max(1.0, 2 * ar)) * 32)
    # Planned under the layer-split rule, the 4.4 GiB model stays on one GPU of the host:
    # spreading it over three would only add the two hops.
    planned = plan(model, [three], Constraints(calibration=cal))
    assert [(a.node_id, a.tensor_parallel, a.gpu_indices) for a in planned.assignments] == [
        ("three", 1, (0,))
    ]
    pred = planned.rationale.prediction
    assert pred is not None and pred.tokens_per_s == pytest.approx(1 / (got - 2 * 4e-4))
    assert pred.calibration is not None and "collective" not in pred.calibration


def test_a_collective_figure_below_the_first_order_all_reduces_adds_nothing() -> None:
    from dataclasses import replace

    model = lookup("llama3.1:8b")
    assert model is not None
    pair = replace(GPU, id="pair", vram_bytes=48 * 2**30, num_gpus=2)
    low = _rtx3090(Engine.VLLM, 0.8, block=2e-5, collective=1e-6)
    first_order = CostModel(model, [pair], Constraints())
    calibrated = CostModel(model, [pair], Constraints(), low)
    # 2·AR over PCIe (≈ 24.5 µs) already exceeds the 1 µs measured: only the block cost adds.
    assert calibrated.block_s[0] == pytest.approx(first_order.block_s[0] + 2e-5)
