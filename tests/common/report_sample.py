"""A plan with a prediction, a certificate and baselines, as the report shows them."""

from __future__ import annotations

from stowplan import Constraints, load_nodes, lookup, plan
from stowplan.model import NodeDescriptor
from stowplan.plan import Certificate, Plan, PlanRationale, Prediction
from stowplan.planner.baselines.peers import BaselineResult, compare_plans
from tests.common.paths import EXAMPLES

CONSTRAINTS = Constraints(context_tokens=8192)


def sample_plan() -> tuple[Plan, list[NodeDescriptor]]:
    fleet = load_nodes(EXAMPLES / "fleets" / "mixed-consumer.yaml")
    base = plan(lookup("llama3.1:70b"), fleet, CONSTRAINTS)
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
    rationale = PlanRationale(
        strategy=base.rationale.strategy,
        notes=base.rationale.notes,
        prediction=prediction,
        certificate=certificate,
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


def sample_baselines(fleet: list[NodeDescriptor]) -> tuple[BaselineResult, ...]:
    """The peer rules' plans for the sample model and fleet (what ``--compare`` computes)."""
    return compare_plans(lookup("llama3.1:70b"), fleet, CONSTRAINTS)
