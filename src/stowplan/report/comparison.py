"""``plan --json --compare``: the plan, its expected range and the peer rules' plans as
one JSON document (the plan itself stays the plan JSON other commands read).

Shape (keys sorted when written)::

    {
      "kind": "stowplan.plan-comparison", "version": 1,
      "plan": { …the plan JSON… },
      "calibration": "engine generic, calibrated on 101 published runs",
      "expected_range": {"low_tokens_per_s": …, "high_tokens_per_s": …, "runs": …,
                         "outside": ["…"]} | null,
      "baselines": [{"rule": "exo", "fits": true, "stages": 2, "tokens_per_s": …,
                     "time_per_token_s": …,
                     "stages_detail": [{"node_id": "a", "blocks": [0, 40]}, …]}, …]
    }

``expected_range`` is null when the prediction lies inside the profile's data (or the
profile records none); ``outside`` says what of the plan lies outside it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from stowplan.calibration.coverage import CoverageVerdict
from stowplan.model import NodeDescriptor
from stowplan.plan import Plan, plan_to_dict
from stowplan.planner.baselines.peers import BaselineResult

__all__ = ["COMPARISON_KIND", "comparison_to_json"]

COMPARISON_KIND = "stowplan.plan-comparison"


def _range(verdict: CoverageVerdict) -> dict[str, Any] | None:
    if verdict.low_tokens_per_s is None or verdict.high_tokens_per_s is None:
        return None
    return {
        "low_tokens_per_s": verdict.low_tokens_per_s,
        "high_tokens_per_s": verdict.high_tokens_per_s,
        "runs": verdict.nearest_runs,
        "outside": list(verdict.outside),
    }


def _baseline(b: BaselineResult, nodes: Sequence[NodeDescriptor]) -> dict[str, Any]:
    fits = b.pipeline is not None and b.tokens_per_s is not None
    detail: list[dict[str, Any]] = []
    if b.pipeline is not None:
        order, bounds = b.pipeline
        detail = [
            {"node_id": nodes[d].id, "blocks": [bounds[s], bounds[s + 1]]}
            for s, d in enumerate(order)
        ]
    return {
        "rule": b.name,
        "fits": fits,
        "stages": b.num_stages if fits else None,
        "tokens_per_s": b.tokens_per_s if fits else None,
        "time_per_token_s": b.time_per_token_s if fits else None,
        "stages_detail": detail,
    }


def comparison_to_json(
    plan: Plan,
    baselines: Sequence[BaselineResult],
    nodes: Sequence[NodeDescriptor],
    verdict: CoverageVerdict,
) -> str:
    """The document of the module's docstring, canonical (sorted keys, 2-space indent).
    ``nodes``: the fleet the baselines were planned on (their node indices)."""
    doc = {
        "kind": COMPARISON_KIND,
        "version": 1,
        "plan": plan_to_dict(plan),
        "calibration": verdict.label,
        "expected_range": _range(verdict),
        "baselines": [_baseline(b, nodes) for b in baselines],
    }
    return json.dumps(doc, sort_keys=True, indent=2, allow_nan=False) + "\n"
