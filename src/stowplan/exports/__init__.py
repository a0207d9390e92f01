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
from dataclasses import replace

from stowplan.errors import StowplanError
from stowplan.exports.accelerate import FAMILIES, export_accelerate
from stowplan.exports.llamacpp import export_llamacpp
from stowplan.exports.pipeline import partition_string
from stowplan.exports.result import Engine, EngineExport, UnsupportedByEngine
from stowplan.exports.sglang import export_sglang
from stowplan.exports.vllm import export_vllm
from stowplan.model import ModelLayout, NodeDescriptor
from stowplan.plan import Plan
from stowplan.quantities.checks import check_choice

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
    nodes_file: str | None = None,
) -> EngineExport:
    """Translate ``plan`` into the settings of engine ``to``.

    ``nodes`` (optional; default the plan's own :attr:`~stowplan.plan.Plan.nodes`) tell
    addresses, GPU counts and which nodes are the CPU; ``model`` is the
    path or id to put on the command line (default: the plan's model name);
    ``layout``/``family`` give the module names for Accelerate (default: the model file
    ``model`` points at when it is a path, else the known model of the plan's name);
    ``nodes_file`` is the fleet file a refusal's replanning command names (default
    ``FLEET``). Raises :class:`InputError` for an unknown engine or family and
    :class:`UnsupportedByEngine` for a placement the engine cannot run; when the planner
    can avoid it, the message ends with the ``stowplan plan … --engine …`` line that does.
    Raises :class:`~stowplan.errors.Infeasible` for a plan whose stages cannot hold the KV
    cache of its context (see :func:`~stowplan.exports.context.check_kv_fits`).
    """
    from stowplan.exports.common import resolve_layout
    from stowplan.exports.context import check_kv_fits
    from stowplan.rules.plan_fit import check_plan_fits

    engine = check_choice("--to", to, Engine, normalise=lambda v: v.strip().lower())
    if nodes is None and plan.nodes:
        nodes = plan.nodes  # the descriptors the plan recorded (stowplan plan --json)
    try:
        resolved = resolve_layout(plan, layout, model)
    except StowplanError:
        if engine in (Engine.LLAMACPP, Engine.ACCELERATE):
            raise  # they need the layout's family or experts
        resolved = None  # vLLM and SGLang take the model as given; the KV check does without
    check_plan_fits(plan, layout=resolved, nodes=nodes)
    kv_notes = check_kv_fits(plan, resolved, nodes_file)
    if engine is Engine.VLLM:
        result = export_vllm(plan, nodes=nodes, model=model, nodes_file=nodes_file)
    elif engine is Engine.SGLANG:
        result = export_sglang(plan, nodes=nodes, model=model, nodes_file=nodes_file)
    elif engine is Engine.LLAMACPP:
        result = export_llamacpp(
            plan, nodes=nodes, model=model, layout=resolved, nodes_file=nodes_file
        )
    else:
        result = export_accelerate(
            plan, nodes=nodes, model=model, layout=resolved, family=family, nodes_file=nodes_file
        )
    return replace(result, notes=(*result.notes, *kv_notes)) if kv_notes else result
