"""A plan with a prediction, a certificate and baselines, as the report shows them."""

from __future__ import annotations

from dataclasses import dataclass

from stowplan import Constraints, load_nodes, lookup, plan
from stowplan.model import NodeDescriptor
from stowplan.plan import Certificate, Plan, PlanRationale, Prediction
from tests.conftest import EXAMPLES


@dataclass(frozen=True, slots=True, kw_only=True)
class Baseline:
    name: str
    tokens_per_s: float
    time_per_token_s: float
    num_stages: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RationaleWithBaselines(PlanRationale):
    """The rationale as planners that compare against baselines will carry it."""

    baselines: tuple[Baseline, ...] = ()


def sample_plan() -> tuple[Plan, list[NodeDescriptor]]:
    fleet = load_nodes(EXAMPLES / "fleets" / "mixed-consumer.yaml")
    base = plan(lookup("llama3.1:70b"), fleet, Constraints(context_tokens=8192))
    times = tuple(0.020 + 0.004 * i for i in range(base.num_stages))
    prediction = Prediction(
        batch=1,
        tokens_per_s=1 / max(times),
        time_per_token_s=sum(times),
        stage_time_s=times,
        bottleneck_stage=times.index(max(times)),
        kv_capacity_tokens=9100,
        cost_per_hour=2.06,
        assumed=("mem_bandwidth_gbps of RTX A6000",),
    )
    certificate = Certificate(
        objective="latency",
        value=sum(times),
        bound=sum(times) * 0.97,
        exact=False,
        gap=0.03,
        method="LP relaxation",
    )
    rationale = RationaleWithBaselines(
        strategy=base.rationale.strategy,
        notes=base.rationale.notes,
        prediction=prediction,
        certificate=certificate,
        baselines=(
            Baseline(name="even split", tokens_per_s=5.1, time_per_token_s=0.21, num_stages=6),
            Baseline(name="vram-balanced", tokens_per_s=6.0, time_per_token_s=0.19, num_stages=6),
        ),
    )
    return (
        Plan(
            topology=base.topology,
            assignments=base.assignments,
            rationale=rationale,
            model_name=base.model_name,
            num_blocks=base.num_blocks,
            context_tokens=base.context_tokens,
        ),
        fleet,
    )
