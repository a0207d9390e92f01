"""Plans as engine settings: vLLM, SGLang, llama.cpp and Accelerate.

::

    from stowplan.exports import export_plan
    result = export_plan(plan, "vllm")
    print(result.render_text())        # or result.to_dict()

Every exporter encodes the plan's blocks per stage exactly, or raises
:class:`UnsupportedByEngine` (a :class:`~stowplan.errors.PlanError`) naming what
the engine cannot express.
"""

from __future__ import annotations

from collections.abc import Sequence

from stowplan.checks import check_choice
from stowplan.exports.accelerate import FAMILIES, export_accelerate
from stowplan.exports.llamacpp import export_llamacpp
from stowplan.exports.result import Engine, EngineExport, UnsupportedByEngine
from stowplan.exports.vllm import export_sglang, export_vllm, partition_string
from stowplan.model import ModelLayout, NodeDescriptor
from stowplan.plan import Plan

__all__ = [
    "FAMILIES",
    "Engine",
    "EngineExport",
    "UnsupportedByEngine",
    "export_accelerate",
    "export_llamacpp",
    "export_plan",
    "export_sglang",
    "export_vllm",
    "partition_string",
]


def export_plan(
    plan: Plan,
    to: Engine | str,
    *,
    nodes: Sequence[NodeDescriptor] | None = None,
    model: str | None = None,
    layout: ModelLayout | None = None,
    family: str | None = None,
) -> EngineExport:
    """Translate ``plan`` into the settings of engine ``to``.

    ``nodes`` (optional) tell GPU counts and which nodes are the CPU; ``model`` is the
    path or id to put on the command line (default: the plan's model name);
    ``layout``/``family`` give the module names for Accelerate (default: the model file
    ``model`` points at when it is a path, else the known model of the plan's name).
    Raises :class:`InputError` for an unknown engine or family and
    :class:`UnsupportedByEngine` for a placement the engine cannot run.
    """
    from stowplan.exports.common import resolve_layout

    engine = check_choice("--to", to, Engine, normalise=lambda v: v.strip().lower())
    if engine is Engine.VLLM:
        return export_vllm(plan, nodes=nodes, model=model)
    if engine is Engine.SGLANG:
        return export_sglang(plan, nodes=nodes, model=model)
    resolved = resolve_layout(plan, layout, model)
    if engine is Engine.LLAMACPP:
        return export_llamacpp(plan, nodes=nodes, model=model, layout=resolved)
    return export_accelerate(plan, nodes=nodes, model=model, layout=resolved, family=family)
