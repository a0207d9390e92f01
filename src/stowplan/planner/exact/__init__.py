"""Everything behind the ``scipy`` extra: exact optima, bounds and the node-set MILP.

* :mod:`~stowplan.planner.exact.pipelines` — the optimum pipeline of the workload's
  objective (subset DP, MILP) and the bounds that certify plans;
* :mod:`~stowplan.planner.exact.node_sets` — the cheapest node set a pipeline meeting a rate
  could run on (``objective=cost``);
* :mod:`~stowplan.planner.exact.highs` — every MILP's solve, HiGHS's native output kept
  off the standard output.

SciPy is imported only where a MILP is solved; without it they raise
:class:`~stowplan.errors.DependencyError`.
"""

from __future__ import annotations

from stowplan.planner.exact.node_sets import SetChoice, SetMilp
from stowplan.planner.exact.pipelines import (
    CYCLE_EXACT_LIMIT,
    ENUMERATION_LIMIT,
    Optimum,
    fluid_bound,
    least_cycle,
    solve_exact,
    stage_matrix,
)

__all__ = [
    "CYCLE_EXACT_LIMIT",
    "ENUMERATION_LIMIT",
    "Optimum",
    "SetChoice",
    "SetMilp",
    "fluid_bound",
    "least_cycle",
    "solve_exact",
    "stage_matrix",
]
