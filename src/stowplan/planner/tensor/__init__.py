"""Tensor parallel inside nodes × pipeline across them (see :mod:`.groups`).

* :mod:`~stowplan.planner.tensor.groups` — :func:`plan_with_groups`, the search over
  GPU-group layouts every strategy runs under;
* :mod:`~stowplan.planner.tensor.layouts` — layouts, the engine rules that allow them;
* :mod:`~stowplan.planner.tensor.engines` — the engines' own stage splits;
* :mod:`~stowplan.planner.tensor.nodes` — a node's candidate GPU groups and their costs;
* :mod:`~stowplan.planner.tensor.exact` and :mod:`~stowplan.planner.tensor.joint` — the
  joint solve over degrees and pipelines, and its bounds.
"""

from __future__ import annotations

from stowplan.planner.tensor.groups import (
    LOCAL_SEARCH_NODES,
    EngineRule,
    Layout,
    describe_groups,
    engine_rule,
    expand,
    plan_with_groups,
    with_fixed_degree,
)

__all__ = [
    "LOCAL_SEARCH_NODES",
    "EngineRule",
    "Layout",
    "describe_groups",
    "engine_rule",
    "expand",
    "plan_with_groups",
    "with_fixed_degree",
]
