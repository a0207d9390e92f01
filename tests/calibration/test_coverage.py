"""Coverage: what a profile's runs span, and the range a plan outside them is given."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stowplan.calibration import (
    Calibration,
    DeviceCalibration,
    Engine,
    Figure,
    PlanKind,
    PublishedRun,
    assess_coverage,
    calibration_label,
    plan_kind,
    profile_coverage,
    run_ratio,
    shipped_calibration,
)
from stowplan.model import Constraints, NodeDescriptor
from stowplan.models import lookup
from stowplan.planner import plan
from stowplan.planner.experts import ExpertInputs, ExpertPlacement

RTX4090 = "NVIDIA GeForce RTX 4090"


def _entry(device: str, fraction: float = 0.5) -> DeviceCalibration:
    match = ("4090",) if device == "rtx-4090" else ()
    return DeviceCalibration(
        device=device, match=match, bandwidth_fraction={"default": Figure(value=fraction)}
    )


def _run(ratio: float, **kw: object) -> PublishedRun:
    """A run measured at ``ratio`` × its held-out prediction of 100 tokens/s."""
    fields: dict[str, object] = {
        "engine": "vllm",
        "family": "rtx-4090",
        "gpu_name": RTX4090,
        "model": "m",
        "dtype": "bf16",
        "tokens_per_s": 100.0 * ratio,
        "held_out_tokens_per_s": 100.0,
        "read_bytes": 10**9,
        "num_blocks": 32,
        "bandwidth_gbps": 1000.0,
    }
    fields.update(kw)
    return PublishedRun(**fields)  # type: ignore[arg-type]


RUNS = (
    _run(0.8),
    _run(1.0),
    _run(1.2),
    _run(0.5, moe=True),
    _run(0.4, moe=True, attention="mla", expert_parallel=4, excluded="no MLA or all-to-all term"),
    _run(0.1, excluded="doubtful bytes"),  # a dense kind the fit has: never evidence
)
CAL = Calibration(
    name="t-default",
    engine=Engine.VLLM,
    devices=(_entry("rtx-4090"), _entry("*")),
    runs=RUNS,
)


def _kind(**kw: object) -> PlanKind:
    fields: dict[str, object] = {
        "gpu_names": (RTX4090,),
        "dtype": "bf16",
        "tensor_parallel": (1,),
    }
    fields.update(kw)
    return PlanKind(**fields)  # type: ignore[arg-type]


def test_coverage_is_what_the_fitted_runs_span() -> None:
    cov = profile_coverage(CAL)
    assert cov.runs == 4
    assert cov.gpu_families == {"rtx-4090"}
    assert cov.dtype_classes == {"f16"}
    assert cov.tensor_parallel == {1}
    assert cov.moe == {False, True}
    assert cov.mla == {False}  # the MLA run was kept out of the fit
    assert cov.expert_parallel == {False}
    assert cov.batches == {1}


def test_a_plan_inside_the_data_gets_no_range() -> None:
    verdict = assess_coverage(CAL, _kind(), 100.0)
    assert verdict.inside and verdict.known
    assert verdict.outside == ()
    assert verdict.low_tokens_per_s is None and verdict.high_tokens_per_s is None
    assert assess_coverage(CAL, _kind(moe=True), 100.0).inside


def test_a_batch_outside_the_data_is_ranged_by_the_runs_of_its_kind() -> None:
    verdict = assess_coverage(CAL, _kind(batch=4), 250.0)
    assert verdict.outside == ("batch 4",)
    # The three dense fitted runs (ratios 0.8, 1.0, 1.2); the doubtful dense run kept out
    # of the fit is not evidence, since fitted runs of its kind exist.
    assert verdict.nearest_runs == 3
    assert verdict.low_tokens_per_s == pytest.approx(200.0)
    assert verdict.high_tokens_per_s == pytest.approx(300.0)


def test_mla_with_expert_parallel_takes_the_kept_out_run_of_its_kind_then_the_next_kinds() -> None:
    verdict = assess_coverage(CAL, _kind(moe=True, mla=True, expert_parallel=True), 100.0)
    assert verdict.outside == ("MLA attention", "MoE with expert-parallel")
    # Distance 0: the kept-out MLA expert-parallel run (0.4); distance 2: the MoE run (0.5);
    # still under three runs, so distance 3: the dense runs (0.8, 1.0, 1.2).
    assert verdict.nearest_runs == 5
    assert verdict.low_tokens_per_s == pytest.approx(40.0)
    assert verdict.high_tokens_per_s == pytest.approx(120.0)


def test_gpu_dtype_and_tensor_parallel_outside_the_data_are_named() -> None:
    verdict = assess_coverage(
        CAL, _kind(gpu_names=("RTX 3070", RTX4090), dtype="fp8", tensor_parallel=(8, 1)), 10.0
    )
    assert verdict.outside == ("dtype fp8", "GPU RTX 3070", "tensor-parallel 8")
    # An engine that splits a host's layers over its GPUs runs a multi-GPU node as tp 1.
    split = replace(CAL, engine=Engine.LLAMACPP)
    assert assess_coverage(split, _kind(tensor_parallel=(4,)), 10.0).inside


def test_the_range_sets_aside_the_extreme_tenth_from_ten_runs_on() -> None:
    ratios = [0.3, 0.9, 0.92, 0.95, 1.0, 1.0, 1.02, 1.05, 1.1, 1.15, 1.2, 3.0]
    cal = replace(CAL, runs=tuple(_run(r) for r in ratios))
    verdict = assess_coverage(cal, _kind(batch=8), 100.0)
    assert verdict.nearest_runs == 12
    # ⌊12 / 10⌋ = 1 run set aside at each end: 0.3 and 3.0.
    assert verdict.low_tokens_per_s == pytest.approx(90.0)
    assert verdict.high_tokens_per_s == pytest.approx(120.0)


def test_a_run_without_a_held_out_figure_is_predicted_by_the_profile() -> None:
    run = _run(1.0, tokens_per_s=250.0, held_out_tokens_per_s=None, num_blocks=1)
    # 1 GB at 1000 GB/s × fraction 0.5 = 2 ms per token: 500 tokens/s predicted.
    assert run_ratio(run, CAL) == pytest.approx(0.5)
    assert run_ratio(_run(1.3), CAL) == pytest.approx(1.3)


def test_labels_name_the_engine_and_the_runs() -> None:
    assert calibration_label(CAL) == "engine vllm, calibrated on 4 published runs"
    fitted = replace(CAL, name="t-default+vllm-fitted")
    assert calibration_label(fitted) == "engine vllm, calibrated on 4 published runs and your fits"
    assert calibration_label(None) == "first-order model, uncalibrated"
    bare = replace(CAL, runs=())
    assert calibration_label(bare) == "engine vllm, calibration t-default"
    verdict = assess_coverage(bare, _kind(batch=8), 100.0)
    assert not verdict.known and not verdict.inside and verdict.low_tokens_per_s is None
    assert not assess_coverage(None, _kind(), 100.0).known


def test_the_shipped_default_spans_every_engines_runs_but_no_mla_or_expert_parallel() -> None:
    generic = shipped_calibration("generic")
    cov = profile_coverage(generic)
    engines = {r.engine for r in generic.fitted_runs}
    assert engines == {e.value for e in Engine}
    assert cov.runs == len(generic.fitted_runs) == 101
    assert {"rtx-4090", "h100-sxm", "b200", "mi300x", "apple-m2-ultra"} <= cov.gpu_families
    assert cov.dtype_classes == {"f16", "fp8", "q8", "q4"}
    assert cov.tensor_parallel == {1, 2, 4, 8}
    assert cov.moe == {False, True}
    assert cov.mla == {False} and cov.expert_parallel == {False}
    assert cov.batches == {1}
    # Every shipped profile records, besides its own runs, the kept-out run of the one
    # kind no published run fitted (MLA with expert-parallel).
    for engine in Engine:
        kept = [r for r in shipped_calibration(engine).runs if not r.fitted]
        assert any(r.attention == "mla" and r.expert_parallel > 1 for r in kept)


def _two_nodes() -> list[NodeDescriptor]:
    return [
        NodeDescriptor(id=f"n{i}", gpu_name="H100 SXM", vram_bytes="640GB", num_gpus=8)
        for i in range(2)
    ]


@pytest.mark.parametrize("spread", [True, False])
def test_plan_kind_reads_experts_away_from_their_blocks_as_expert_parallel(spread: bool) -> None:
    model = lookup("mixtral:8x7b")
    assert model is not None
    nodes = _two_nodes()
    experts = ExpertInputs(placement=ExpertPlacement.from_flag(spread))
    p = plan(model, nodes, Constraints(min_stages=2), experts=experts)
    kind = plan_kind(p, nodes, model)
    assert kind.moe and not kind.mla
    assert kind.expert_parallel is spread
    assert kind.gpu_names == ("H100 SXM",) * p.num_stages
    assert kind.tensor_parallel == tuple(a.tensor_parallel for a in p.assignments)
    assert kind.batch == 1
    assert plan_kind(p, nodes, model, attention="mla").mla
