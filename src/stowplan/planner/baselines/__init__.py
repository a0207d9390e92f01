"""What stowplan is compared with: peer placement rules and EPLB.

* :mod:`~stowplan.planner.baselines.peers` — exo, vLLM, Accelerate and the seed's v1 rule,
  re-implemented from their documented behaviour and costed by the same model;
* :mod:`~stowplan.planner.baselines.eplb` — DeepSeek's expert-parallel load balancer, the
  reference for expert placement (imported from its module: it reads the expert planner's
  inputs, which import the certificate that imports the peer rules).
"""

from __future__ import annotations

from stowplan.planner.baselines.peers import (
    BASELINES,
    BaselineResult,
    compare,
    compare_plans,
    run_baseline,
)

__all__ = ["BASELINES", "BaselineResult", "compare", "compare_plans", "run_baseline"]
