"""``stowplan serve``: how many users a fleet serves under TTFT/TPOT limits, or the
cheapest nodes serving a target."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from stowplan.cli.app import app
from stowplan.cli.calibration_opts import CALIBRATION_HELP, cli_calibration
from stowplan.cli.common import err_console, load_fleet, out_console, warn_about_gpus
from stowplan.cli.options import EngineOption, Headroom, MaxStages, Nodes
from stowplan.cli.progress import run_progress
from stowplan.errors import InputError
from stowplan.model import Constraints
from stowplan.models import resolve_model
from stowplan.quantities.units import parse_rate_per_s, parse_seconds, parse_time_per_token_s
from stowplan.report.serve_html import write_serve_html_report
from stowplan.report.serving import render_serve_plan
from stowplan.serving import serve
from stowplan.workload import Workload


@app.command("serve")
def serve_command(
    model: Annotated[
        str,
        typer.Argument(
            help="Known model name, Hugging Face id, config.json, checkpoint folder or .gguf file."
        ),
    ],
    nodes: Nodes = None,
    offers: Annotated[
        Path | None, typer.Option("--offers", help="vast.ai `search offers --raw` JSON.")
    ] = None,
    prompt: Annotated[int, typer.Option("--prompt", help="Prompt tokens of a request.")] = 2048,
    output: Annotated[int, typer.Option("--output", help="Output tokens of a request.")] = 256,
    ttft: Annotated[
        str, typer.Option("--ttft", help="Longest time to the first token, e.g. 1s or 800ms.")
    ] = "1s",
    tpot: Annotated[
        str,
        typer.Option(
            "--tpot",
            help="Longest time per output token, e.g. 50ms, or a rate a user sees: 20tok/s.",
        ),
    ] = "50ms",
    users: Annotated[
        int | None,
        typer.Option("--users", help="Cheapest nodes serving this many concurrent users."),
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option("--rate", help="Cheapest nodes serving this many requests, e.g. 5/s."),
    ] = None,
    dtype: Annotated[
        str | None, typer.Option("--dtype", help="Serve the model stored in this dtype.")
    ] = None,
    max_stages: MaxStages = None,
    headroom: Headroom = None,
    engine: EngineOption = None,
    calibration: Annotated[
        Path | None, typer.Option("--calibration", help=CALIBRATION_HELP)
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the serve-plan JSON.")] = False,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html", help="Also write a self-contained HTML report (replicas, latency curves)."
        ),
    ] = None,
) -> None:
    """Split the fleet into replicas of MODEL serving the most users within the SLOs.

    With --users or --rate: the cheapest nodes that serve them within the SLOs."""
    workload = Workload(
        prompt_tokens=prompt,
        output_tokens=output,
        ttft_s=parse_seconds(ttft, field="--ttft"),
        tpot_s=parse_time_per_token_s(tpot, field="--tpot"),
        users=users,
        rate_per_s=None if rate is None else parse_rate_per_s(rate, field="--rate"),
    )
    layout = resolve_model(model, dtype=dtype)
    fleet = load_fleet(nodes, offers)
    warn_about_gpus(fleet)
    constraints = Constraints(
        max_stages=max_stages,
        vram_headroom_frac=headroom,
        calibration=cli_calibration(engine, calibration),
    )
    with run_progress(err_console, "planning replicas: compositions tried") as bar:
        result = serve(layout, fleet, workload, constraints, progress=bar.advance)
    cal = constraints.calibration
    predicted = (
        "prediction: first-order (no calibration)"
        if cal is None
        else f"prediction: calibrated by the {cal.name} profile ({cal.engine.value})"
    )
    if html is not None:
        try:
            write_serve_html_report(
                html, result, layout, constraints, nodes=fleet, prediction=predicted
            )
        except OSError as exc:
            raise InputError("--html", str(html), f"cannot be written ({exc.strerror})") from None
    if as_json:
        out_console.file.write(result.to_json())
        return
    render_serve_plan(result, out_console)
    out_console.print(predicted)
