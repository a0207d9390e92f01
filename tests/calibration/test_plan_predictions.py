"""Plans predict the published decode speeds: the shipped profiles, applied by the planner's
cost model to a node of the run's GPU and tensor-parallel degree, land within 20 % (median)
of what was measured, where the first-order plan does not."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median

import pytest

from stowplan.calibration import dtype_class, shipped_calibration
from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.models import lookup
from stowplan.planner import plan

RUNS = json.loads(
    (Path(__file__).resolve().parents[2] / "benchmarks" / "published_decode.json").read_text()
)["runs"]


def _cases() -> list[tuple[dict[str, object], ModelLayout]]:
    """Runs of a known model in the layout's own weight type (bf16 checkpoints, mostly)."""
    out = []
    for r in RUNS:
        model = lookup(str(r["model"]).split(" ")[0])
        if r.get("excluded") or model is None:
            continue
        if dtype_class(model.dtype) == dtype_class(str(r["dtype"])):
            out.append((r, model))
    return out


CASES = _cases()


def _node(r: dict[str, object]) -> NodeDescriptor:
    tp = int(r.get("tensor_parallel", 1))  # type: ignore[call-overload]
    return NodeDescriptor(
        id="host",
        gpu_name=str(r["gpu_name"]),
        vram_bytes=10**13,
        flops_estimate=1000.0 * tp,
        link_mbps=100_000.0,
        num_gpus=tp,
        mem_bandwidth_gbps=float(r["bandwidth_gbps"]) * tp,  # type: ignore[arg-type]
    )


def _error(r: dict[str, object], model: ModelLayout, calibrated: bool) -> float:
    cal = shipped_calibration(str(r["engine"])) if calibrated else None
    p = plan(model, [_node(r)], Constraints(calibration=cal)).rationale.prediction
    assert p is not None
    measured = float(r["tokens_per_s"])  # type: ignore[arg-type]
    return (p.tokens_per_s - measured) / measured


def test_there_are_single_gpu_tensor_parallel_and_moe_cases() -> None:
    tps = {int(r.get("tensor_parallel", 1)) for r, _ in CASES}  # type: ignore[call-overload]
    assert {1, 2, 4, 8} <= tps
    assert any(m.experts is not None for _, m in CASES)
    assert len({r["engine"] for r, _ in CASES}) >= 2


def test_calibrated_plans_are_within_20_percent_where_first_order_plans_are_not() -> None:
    cal = [abs(_error(r, m, True)) for r, m in CASES]
    first = [abs(_error(r, m, False)) for r, m in CASES]
    assert median(cal) <= 0.2, sorted(cal)
    assert median(first) > 0.3
    # The worst, +41 %: vLLM gpt-oss-20b on an MI300X, published slower (137.5 tokens/s)
    # than on an H100 PCIe (149), which the MI300X dominates on the datasheet; held in
    # datasheet order it cannot be predicted slower than that.
    assert max(cal) < 0.45


@pytest.mark.parametrize("tp", [2, 8])
def test_a_tensor_parallel_plan_names_the_fitted_collective_cost(tp: int) -> None:
    r, model = next(
        (r, m)
        for r, m in CASES
        if int(r.get("tensor_parallel", 1)) == tp  # type: ignore[call-overload]
    )
    cal = shipped_calibration(str(r["engine"]))
    p = plan(model, [_node(r)], Constraints(calibration=cal)).rationale.prediction
    assert p is not None and p.calibration is not None
    assert f"{r['family']}: " in p.calibration
    assert "collective fitted" in p.calibration
