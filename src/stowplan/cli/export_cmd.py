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
from stowplan.fileio import read_text_file
from stowplan.model import NodeDescriptor
from stowplan.nodefile import load_nodes
from stowplan.plan import plan_from_json


@app.command("export")
def export_command(
    plan_file: Annotated[Path, typer.Argument(help="A plan JSON file (stowplan plan --json).")],
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
    """Print the settings that run PLAN on an engine: env, flags, command lines, files."""
    text = read_text_file(plan_file, field="PLAN")
    fleet: list[NodeDescriptor] | None = load_nodes(nodes) if nodes is not None else None
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
