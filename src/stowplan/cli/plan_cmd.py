"""``stowplan plan``, ``stowplan models``, ``stowplan stage-env``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from stowplan.cli.app import app
from stowplan.cli.calibration_opts import (
    CALIBRATION_HELP,
    cli_calibration,
    model_attention,
    plan_verdict,
    target_named,
)
from stowplan.cli.common import err_console, load_fleet, out_console, warn_about_gpus
from stowplan.cli.options import (
    NODES_HELP,
    Batch,
    Context,
    EngineOption,
    Headroom,
    MaxStages,
    MinStages,
    Nodes,
    StrategyOption,
    TensorParallel,
    parse_context,
)
from stowplan.cli.progress import search_progress
from stowplan.errors import InputError
from stowplan.files.fileio import read_text_file
from stowplan.files.fleets import load_nodes
from stowplan.model import Constraints, ModelLayout, NodeDescriptor, Objective
from stowplan.models import known_names, lookup, model_source, resolve_model
from stowplan.moe.stats import load_coactivation, load_expert_load
from stowplan.plan import Plan, plan_from_json, plan_to_json, with_inputs
from stowplan.planner import plan as make_plan
from stowplan.planner.baselines import compare_plans as compare_baselines
from stowplan.planner.context import (
    ContextFit,
    default_context_tokens,
    fit_context,
    plan_within_context,
)
from stowplan.planner.experts import ExpertInputs, ExpertPlacement, expert_summary
from stowplan.quantities.units import format_bytes, parse_tokens_per_s
from stowplan.report.calibration import annotate_notes
from stowplan.report.comparison import comparison_to_json
from stowplan.report.experts import render_experts
from stowplan.report.html import write_html_report
from stowplan.report.terminal import render_comparison, render_plan
from stowplan.rules.plan_fit import check_plan_fits
from stowplan.stages.gpu_lists import stage_place_text
from stowplan.stages.worker import stage_env


@app.command("plan")
def plan_command(
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
    dtype: Annotated[
        str | None,
        typer.Option(
            "--dtype", help="Plan the model stored in this dtype: bf16, fp8, int4, q4_k_m …"
        ),
    ] = None,
    min_stages: MinStages = None,
    max_stages: MaxStages = None,
    tensor_parallel: TensorParallel = None,
    headroom: Headroom = None,
    strategy: StrategyOption = None,
    batch: Batch = 1,
    context: Context = None,
    target: Annotated[
        str | None,
        typer.Option(help="Cheapest node set reaching this rate, e.g. 20tok/s (needs prices)."),
    ] = None,
    compare: Annotated[
        bool,
        typer.Option(
            "--compare",
            help="Print peer rules (exo, vLLM, …) side by side; with --json, one document "
            "of the plan, its expected range and the peers' plans.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan JSON.")] = False,
    expert_load: Annotated[
        Path | None,
        typer.Option(
            "--expert-load",
            help="MoE expert load per block: JSON, or .npy (layers × experts) as EPLB uses.",
        ),
    ] = None,
    coactivation: Annotated[
        Path | None,
        typer.Option(
            "--coactivation",
            help="MoE co-selection counts: JSON pairs, or .npy (layers × experts × experts).",
        ),
    ] = None,
    html: Annotated[
        Path | None, typer.Option("--html", help="Also write a self-contained HTML report.")
    ] = None,
    expert_parallel: Annotated[
        bool | None,
        typer.Option(
            "--expert-parallel/--block-local",
            help="MoE: spread experts over the nodes, or keep them with their blocks "
            "(default: whichever the cost model predicts faster).",
        ),
    ] = None,
    engine: EngineOption = None,
    calibration: Annotated[
        Path | None, typer.Option("--calibration", help=CALIBRATION_HELP)
    ] = None,
) -> None:
    """Plan MODEL on the given nodes and print the plan."""
    layout = resolve_model(model, dtype=dtype)
    fleet = load_fleet(nodes, offers)
    asked = parse_context(context)
    constraints = Constraints(
        min_stages=min_stages,
        max_stages=max_stages,
        tensor_parallel=tensor_parallel,
        vram_headroom_frac=headroom,
        strategy=strategy,  # type: ignore[arg-type]  # validated by Constraints
        batch=batch,
        context_tokens=(
            default_context_tokens(layout)
            if asked is None
            else asked
            if isinstance(asked, int)
            else 0  # --context max: searched below
        ),
        objective=Objective.COST if target is not None else Objective.SPEED,
        target_tokens_per_s=None
        if target is None
        else parse_tokens_per_s(target, field="--target"),
        calibration=cli_calibration(engine, calibration),
    )
    load = load_expert_load(expert_load) if expert_load is not None else None
    co = load_coactivation(coactivation) if coactivation is not None else None
    placement = ExpertPlacement.from_flag(expert_parallel)
    experts = ExpertInputs(load=load, coactivation=co, placement=placement)

    def planner(m: ModelLayout, n: Sequence[NodeDescriptor], c: Constraints) -> Plan:
        return make_plan(m, n, c, experts=experts)

    fit: ContextFit | None = None
    with search_progress(err_console, constraints.target_tokens_per_s), target_named(constraints):
        if asked == "max":
            fit = fit_context(layout, fleet, constraints, planner=planner)
            result = fit.plan
            constraints = replace(constraints, context_tokens=fit.context_tokens)
        else:
            result = plan_within_context(layout, fleet, constraints, planner=planner)
    warn_about_gpus(fleet)  # once the plan is made: an error stays the one line on stderr
    result = with_inputs(result, model_source=model_source(model), nodes=fleet)
    baselines = compare_baselines(layout, fleet, constraints) if compare or html is not None else ()
    verdict = plan_verdict(
        result, fleet, layout, constraints.calibration, model_attention(model, dtype)
    )
    notes = annotate_notes(result.rationale.notes, verdict, constraints.batch)
    notes = (*notes, *_kv_read_note(layout, constraints))
    if html is not None:
        try:
            write_html_report(
                html,
                result,
                fleet,
                layout=layout,
                baselines=baselines,
                notes=notes,
                verdict=verdict,
            )
        except OSError as exc:
            raise InputError("--html", str(html), f"cannot be written ({exc.strerror})") from None
    if as_json:
        # The same notes the terminal shows: the calibration named, the range outside it.
        named = replace(result, rationale=replace(result.rationale, notes=notes))
        if compare:
            out_console.file.write(comparison_to_json(named, baselines, fleet, verdict))
        else:
            out_console.file.write(plan_to_json(named))
        return
    render_plan(result, fleet, out_console, notes=notes)
    out_console.print(_context_line(layout, constraints, asked, fit), soft_wrap=True)
    if layout.experts is not None:
        render_experts(result, expert_summary(result, layout, fleet, load, co), out_console)
    prediction = result.rationale.prediction
    if prediction is not None and prediction.calibration is not None:
        out_console.print(f"calibration: {prediction.calibration}")
    if compare:
        render_comparison(result, baselines, out_console)


def _kv_read_note(layout: ModelLayout, c: Constraints) -> tuple[str, ...]:
    """The note that a decode step reads the KV reserve at half its length."""
    tokens = c.context_tokens or 0
    if tokens == 0 or layout.kv_bytes_per_token is None:
        return ()
    return (
        f"decode reads each sequence's KV at {c.kv_read_context:,.0f} tokens: half the "
        f"{tokens:,}-token reserve, a sequence's mean context as it grows",
    )


def _context_line(
    layout: ModelLayout, c: Constraints, asked: int | str | None, fit: ContextFit | None
) -> str:
    """What KV cache the plan reserves, and why that much."""
    tokens = c.context_tokens or 0
    seqs = f"{c.batch:,} sequence{'' if c.batch == 1 else 's'}"
    if layout.kv_bytes_per_token is None:
        return "KV cache: not reserved (the model's layout has no KV-cache figure)"
    if tokens == 0 and fit is None:
        return "KV cache: none reserved (--context 0); the engine gets what is left"
    reserved = f"KV reserved for {tokens:,} tokens × {seqs}"
    if fit is not None:
        why = (
            "the model's maximum context"
            if fit.limited_by_model
            else "the largest context that fits"
        )
        return f"{reserved} ({why}; --context max)"
    if asked is None:
        return f"{reserved} (default; --context to change)"
    return reserved


@app.command("models")
def models_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the known models."""
    rows: list[dict[str, Any]] = []
    for name in known_names():
        m = lookup(name)
        assert m is not None
        rows.append(
            {
                "name": name,
                "blocks": m.num_blocks,
                "hidden_dim": m.hidden_dim,
                "params": m.total_params,
                "weight_bytes": m.weight_bytes,
                "dtype": m.dtype,
            }
        )
    if as_json:
        out_console.file.write(json.dumps(rows, indent=2) + "\n")
        return
    from rich.table import Table

    table = Table("name", "blocks", "hidden", "params", "weights", "dtype")
    for r in rows:
        params = r["params"]
        table.add_row(
            str(r["name"]),
            str(r["blocks"]),
            str(r["hidden_dim"]),
            f"{params / 1e9:.2f}B" if isinstance(params, int) else "-",
            format_bytes(r["weight_bytes"]),
            str(r["dtype"]),
        )
    out_console.print(table)


@app.command("stage-env")
def stage_env_command(
    plan_file: Annotated[Path, typer.Argument(help="A plan JSON file (stowplan plan --json).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    fmt: Annotated[
        str,
        typer.Option("--format", help="text, shell (export lines to source) or json (as --json)."),
    ] = "text",
    stage: Annotated[int | None, typer.Option("--stage", help="Only this stage.")] = None,
    nodes: Annotated[
        Path | None,
        typer.Option("--nodes", help=f"{NODES_HELP}: the plan's nodes, checked against it."),
    ] = None,
) -> None:
    """Print the environment each stage's worker receives."""
    from stowplan.cli.stage_env_render import render_stage_env

    p = plan_from_json(read_text_file(plan_file, field="PLAN"))
    known = lookup(p.model_name) if p.model_name else None
    recorded = p.nodes or None  # the descriptors the plan recorded, unless --nodes is given
    check_plan_fits(p, layout=known, nodes=load_nodes(nodes) if nodes is not None else recorded)
    places = [stage_place_text(a) for a in p.assignments]
    text = render_stage_env(stage_env(p), places, "json" if as_json else fmt, stage)
    out_console.file.write(text)
