"""``stowplan export PLAN.json --to vllm|sglang|llamacpp|accelerate``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from stowplan.cli.app import app
from stowplan.cli.common import out_console
from stowplan.cli.options import NODES_HELP
from stowplan.exports import Engine, export_plan
from stowplan.exports.serving import export_serve_plan
from stowplan.files.fileio import read_text_file
from stowplan.files.fleets import load_nodes
from stowplan.files.safeload import parse_json
from stowplan.model import NodeDescriptor
from stowplan.plan import plan_from_json
from stowplan.serve_plan import ServePlan


@app.command("export")
def export_command(
    plan_file: Annotated[
        Path,
        typer.Argument(
            help="A plan JSON file (stowplan plan --json), or a serve plan (stowplan serve "
            "--json): every replica then."
        ),
    ],
    to: Annotated[str, typer.Option("--to", help=f"Engine: {', '.join(e.value for e in Engine)}.")],
    nodes: Annotated[
        Path | None,
        typer.Option("--nodes", help=f"{NODES_HELP}: the plan's nodes (GPU counts, CPU nodes)."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Model path or id for the command line (default: plan's); a config.json, "
            "checkpoint folder or .gguf path also tells Accelerate the family.",
        ),
    ] = None,
    family: Annotated[
        str | None,
        typer.Option("--family", help="Architecture family for Accelerate's module names."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the export as JSON.")] = False,
) -> None:
    """Print the settings that run PLAN on an engine: env, flags, commands, files.

    For a serve plan, every replica's settings, sized for its users."""
    text = read_text_file(plan_file, field="PLAN")
    fleet: list[NodeDescriptor] | None = load_nodes(nodes) if nodes is not None else None
    if '"replicas"' in text:
        data = parse_json(text, field="PLAN", source=str(plan_file))
        if isinstance(data, dict) and "replicas" in data:
            served = export_serve_plan(ServePlan.from_dict(data), to, nodes=fleet, model=model)
            if as_json:
                doc = json.dumps(served.to_dict(), indent=2, sort_keys=True)
                out_console.file.write(doc + "\n")
                return
            out_console.file.write(served.render_text())
            return
    result = export_plan(
        plan_from_json(text),
        to,
        nodes=fleet,
        model=model,
        family=family,
        nodes_file=str(nodes) if nodes is not None else None,
    )
    if as_json:
        out_console.file.write(json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n")
        return
    out_console.file.write(result.render_text())
