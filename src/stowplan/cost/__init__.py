"""The cost model, in one place: stage times, hops, tokens/s, KV capacity and $.

* :mod:`stowplan.cost.model` — :class:`CostModel` (the model itself; its
  docstring states the formulas);
* :mod:`stowplan.cost.rates` — a node's rates in SI units (:func:`node_rates`);
* :mod:`stowplan.cost.cycle` — microbatches and the cycle, served tokens/s,
  $ per token (:class:`Evaluation`);
* :mod:`stowplan.cost.experts` — the expert term of an expert-parallel plan
  (:func:`expert_stage_times`, :func:`expert_prediction`);
* :mod:`stowplan.cost.predict` — :func:`predict`, a plan's prediction, dense or
  expert-parallel.

Imports no planner: planners only ever call the cost model.
"""

from __future__ import annotations

from stowplan.cost.cycle import (
    Evaluation,
    cycle_seconds,
    microbatches,
    served_tokens_per_s,
    usd_per_million_tokens,
)
from stowplan.cost.experts import ExpertTime, expert_prediction, expert_stage_times
from stowplan.cost.model import CostModel
from stowplan.cost.predict import predict
from stowplan.cost.rates import DEFAULT_BANDWIDTH_GBPS, NodeRates, node_rates

__all__ = [
    "DEFAULT_BANDWIDTH_GBPS",
    "CostModel",
    "Evaluation",
    "ExpertTime",
    "NodeRates",
    "cycle_seconds",
    "expert_prediction",
    "expert_stage_times",
    "microbatches",
    "node_rates",
    "predict",
    "served_tokens_per_s",
    "usd_per_million_tokens",
]
