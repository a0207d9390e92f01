"""``stowplan launch`` and ``stowplan demo-run``: realise a plan on Ray."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Annotated, Any

import typer

from stowplan.cli.app import app
from stowplan.cli.calibration_opts import cli_calibration, labelled_notes
from stowplan.cli.common import err_console, out_console
from stowplan.cli.launch_serve import launch_serve_plan, read_serve_plan, refuse_plan_options
from stowplan.cli.options import (
    FIRST_ORDER,
    NODES_HELP,
    Batch,
    Context,
    EngineOption,
    Headroom,
    MaxStages,
    MinStages,
    StrategyOption,
    parse_context,
)
from stowplan.cluster.ray_runtime import require_ray
from stowplan.errors import InputError, PlanError
from stowplan.files.fleets import load_nodes
from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.models import resolve_model
from stowplan.plan import plan_to_dict, with_inputs
from stowplan.planner import plan_blocks as make_plan
from stowplan.planner.context import default_context_tokens
from stowplan.quantities.checks import check_int, check_number
from stowplan.quantities.units import format_bytes
from stowplan.report.terminal import render_plan
from stowplan.stages.gpu_lists import stage_place_text
from stowplan.text.wording import plural, short_node_id

DEMO_NAMES = ("demo", "stowplan-demo")

RayOption = Annotated[
    str | None,
    typer.Option(
        "--ray",
        help="Address of a running Ray cluster; without it a local fake multi-node "
        "cluster is started on 127.0.0.1 and stopped at the end.",
    ),
]
Timeout = Annotated[
    float, typer.Option("--timeout", help="Seconds each attempt may take to place all stages.")
]
Attempts = Annotated[
    int, typer.Option("--max-attempts", help="Plans tried, excluding failed nodes each time.")
]


def _layout(model: str) -> ModelLayout:
    if model in DEMO_NAMES:
        from stowplan.demo.model import demo_layout

        return demo_layout()
    return resolve_model(model)


def _this_host(model: str) -> list[NodeDescriptor]:
    """This host as one node, from its cached passport (``stowplan probe`` writes it)."""
    from stowplan.host.node import node_from_passport
    from stowplan.host.passport import default_passport_path, read_passport

    path = default_passport_path()
    if not path.is_file():
        raise InputError(
            "--plan-debug",
            model,
            f"plans on this host from its passport, and {path} does not exist: run "
            "`stowplan probe` first, or pass --nodes FLEET_FILE or --ray ADDRESS",
        )
    return [node_from_passport(read_passport(path))]


def _no_cluster(model: str) -> InputError:
    """Why ``launch MODEL`` needs ``--ray``: the fake local cluster only fits the demo."""
    return InputError(
        "--ray",
        None,
        f"is needed to launch {model}: pass --ray ADDRESS of a running Ray cluster "
        "(--plan-debug shows the plan on this host, or with --nodes FLEET_FILE, starting "
        "nothing; `stowplan launch demo` runs the demo model on a local fake cluster)",
    )


@contextmanager
def _ray_session(address: str | None, verbose: bool = False) -> Iterator[None]:
    """Connect to ``address``, or start (and finally stop) a local fake cluster.

    Ray's log lines are shown only when ``verbose``.
    """
    import logging

    from stowplan.cluster.local import DEFAULT_FAKE_NODES, start_local_cluster

    if address is not None:
        ray = require_ray()
        if ray.is_initialized():  # already connected (a library caller, a test)
            yield
            return
        ray.init(
            address=address,
            log_to_driver=verbose,
            logging_level=logging.INFO if verbose else logging.WARNING,
        )
        try:
            yield
        finally:
            ray.shutdown()
        return
    local = start_local_cluster(DEFAULT_FAKE_NODES, verbose=verbose)
    err_console.print(
        f"started a local Ray cluster at {local.address} with {len(DEFAULT_FAKE_NODES)} "
        "fake GPU nodes: "
        + ", ".join(f"{n.gpu_name} {format_bytes(n.vram_bytes)}" for n in DEFAULT_FAKE_NODES)
    )
    try:
        yield
    finally:
        local.shutdown()


def _report_failure(attempt: Any) -> None:
    for f in attempt.failures:
        err_console.print(
            f"stage could not start: {f}; excluding node {short_node_id(f.node_id)}, replanning"
        )


def _print_stage_env(envs: list[dict[str, str]], places: list[str]) -> None:
    """Every stage's env as ``stowplan stage-env`` prints it, headed by its node and GPUs."""
    from stowplan.cli.stage_env_render import render_stage_env

    out_console.file.write(render_stage_env(envs, places))


MAX_TIMEOUT_S = 86_400.0
"""Longest ``--timeout`` accepted (a day)."""


def _check_attempts(timeout: float, max_attempts: int) -> None:
    """``--timeout`` in (0, a day] and ``--max-attempts`` >= 1, before anything starts."""
    check_int("--max-attempts", max_attempts, minimum=1)
    check_number("--timeout", timeout, positive=True, upper=MAX_TIMEOUT_S)


def _constraints(
    min_stages: int | None,
    max_stages: int | None,
    headroom: float | None,
    strategy: str | None,
    context_tokens: int | None = None,
    *,
    batch: int = 1,
    engine: str | None = None,
) -> Constraints:
    """The constraints ``plan`` builds from the same options: the same sequences and the
    same calibrated prediction (``--engine``, default ``generic``)."""
    return Constraints(
        min_stages=min_stages,
        max_stages=max_stages,
        vram_headroom_frac=headroom,
        strategy=strategy,  # type: ignore[arg-type]  # validated by Constraints
        batch=batch,
        context_tokens=context_tokens,
        calibration=cli_calibration(engine, None),
    )


def _launch_context(value: str | None, layout: ModelLayout) -> int | None:
    """KV tokens per sequence a launched plan reserves: ``plan``'s default unless given."""
    asked = parse_context(value)
    if isinstance(asked, str):  # "max"
        raise InputError(
            "--context",
            value,
            "must be a number of tokens here: `stowplan plan --context max` "
            "finds the largest that fits",
        )
    tokens = default_context_tokens(layout) if asked is None else asked
    return tokens or None


def _plan_debug(
    layout: ModelLayout, fleet: list[NodeDescriptor], constraints: Constraints, as_json: bool
) -> None:
    from stowplan.cluster.realise import stage_actor_env

    result = with_inputs(make_plan(layout, fleet, constraints), model_source=None, nodes=fleet)
    envs = stage_actor_env(result)  # exactly what realise gives each stage actor
    if as_json:
        doc = {"plan": plan_to_dict(result), "stage_env": envs}
        out_console.file.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        return
    render_plan(result, fleet, out_console, notes=labelled_notes(result, constraints.calibration))
    _print_stage_env(envs, [stage_place_text(a) for a in result.assignments])
    out_console.print("plan-debug: nothing was provisioned")


@app.command("launch")
def launch_command(
    model: Annotated[
        str,
        typer.Argument(
            help="Known model name, Hugging Face id, config.json, checkpoint folder, "
            ".gguf file, 'demo', or a serve plan (stowplan serve --json): every replica."
        ),
    ],
    ray_address: RayOption = None,
    nodes: Annotated[
        Path | None,
        typer.Option(
            "--nodes", help=f"{NODES_HELP} to plan on instead of the Ray cluster's nodes."
        ),
    ] = None,
    plan_debug: Annotated[
        bool,
        typer.Option("--plan-debug", help="Print the plan and every stage's env; start nothing."),
    ] = False,
    min_stages: MinStages = None,
    max_stages: MaxStages = None,
    headroom: Headroom = None,
    strategy: StrategyOption = None,
    context: Context = None,
    batch: Batch = 1,
    engine: EngineOption = None,
    timeout: Timeout = 30.0,
    max_attempts: Attempts = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show Ray's log lines.")] = False,
) -> None:
    """Plan MODEL on the Ray cluster's nodes and start one stage actor per stage.

    A serve plan launches every replica as planned (one placement group per stage,
    replicas on disjoint nodes), each stage with its replica's stage env.
    Without --ray only the demo model launches (on a local fake cluster); --plan-debug
    prints the plan and every stage's environment and starts nothing: on --nodes, on
    the demo's fake nodes, or on this host (its cached passport).
    """
    _check_attempts(timeout, max_attempts)
    served = read_serve_plan(model)
    if served is not None:
        refuse_plan_options(
            model,
            {
                "--nodes": nodes,
                "--min-stages": min_stages,
                "--max-stages": max_stages,
                "--headroom": headroom,
                "--strategy": strategy,
                "--context": context,
                "--batch": batch if batch != 1 else None,
                "--engine": engine,
            },
        )
        if ray_address is None and not plan_debug:
            raise InputError(
                "--ray",
                None,
                f"is needed to launch the serve plan {model}: its replicas name the nodes "
                "of a running Ray cluster (--plan-debug prints their stage envs)",
            )
        with _ray_session(ray_address, verbose) if not plan_debug else nullcontext():
            launch_serve_plan(served, plan_debug=plan_debug, as_json=as_json, timeout=timeout)
        return
    layout = _layout(model)
    constraints = _constraints(
        min_stages,
        max_stages,
        headroom,
        strategy,
        _launch_context(context, layout),
        batch=batch,
        engine=engine,
    )
    # Read the fleet file before any cluster starts: a bad file fails at once.
    given = load_nodes(nodes) if nodes is not None else None
    if ray_address is None and plan_debug:  # start nothing: plan on what is described here
        if given is None and model in DEMO_NAMES:
            from stowplan.cluster.local import fake_node_descriptors

            given = fake_node_descriptors()
        _plan_debug(layout, given if given is not None else _this_host(model), constraints, as_json)
        return
    if ray_address is None and model not in DEMO_NAMES:
        raise _no_cluster(model)
    with _ray_session(ray_address, verbose):
        from stowplan.cluster.nodes import ray_node_descriptors
        from stowplan.cluster.realise import contract_stage_class, realise_with_replan

        fleet = given if given is not None else ray_node_descriptors(timeout_s=timeout)
        if plan_debug:
            _plan_debug(layout, fleet, constraints, as_json)
            return
        realisation = realise_with_replan(
            layout,
            fleet,
            constraints,
            contract_stage_class(),
            max_attempts=max_attempts,
            timeout_s=timeout,
            on_failure=_report_failure,
        )
        with realisation:
            ray = require_ray()
            infos = ray.get([a.info.remote() for a in realisation.actors], timeout=timeout)
            if as_json:
                doc = {"plan": plan_to_dict(realisation.plan), "stages": infos}
                out_console.file.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
            else:
                render_plan(
                    realisation.plan,
                    fleet,
                    out_console,
                    notes=labelled_notes(realisation.plan, constraints.calibration),
                )
                for info in infos:
                    where = (
                        "on its planned node"
                        if info["node_id"] == info["plan_node_id"]
                        else (f"on {short_node_id(info['node_id'])}, NOT its planned node")
                    )
                    lo, hi = info["block_range"]
                    out_console.print(
                        f"stage {info['stage']} started {where}; resolved blocks [{lo}, {hi}) "
                        f"from {info['source']}"
                    )
        if not as_json:
            out_console.print(f"released {plural(realisation.plan.num_stages, 'stage')}")


def _parse_prompt(raw: str) -> list[int]:
    try:
        return [int(p) for p in raw.split(",") if p.strip()]
    except ValueError:
        raise InputError("--prompt", raw, "must be comma-separated token ids, e.g. 1,2,3") from None


@app.command("demo-run")
def demo_run_command(
    ray_address: RayOption = None,
    tokens: Annotated[int, typer.Option("--tokens", help="Tokens to generate.")] = 16,
    prompt: Annotated[str, typer.Option("--prompt", help="Prompt token ids.")] = "1,2,3",
    min_stages: MinStages = None,
    max_stages: MaxStages = None,
    headroom: Headroom = None,
    strategy: StrategyOption = None,
    timeout: Timeout = 30.0,
    max_attempts: Attempts = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Run the small numpy transformer as a pipeline across Ray stage actors.

    Checks the tokens and logits against a single-process run; exits 1 when
    they differ.
    """
    from stowplan.demo.model import DemoConfig, check_request, demo_layout, generate_local

    _check_attempts(timeout, max_attempts)
    config = DemoConfig()
    ids = _parse_prompt(prompt)
    check_request(config, ids, tokens)
    constraints = _constraints(min_stages, max_stages, headroom, strategy, engine=FIRST_ORDER)
    with _ray_session(ray_address):
        from stowplan.cluster.nodes import ray_node_descriptors
        from stowplan.cluster.realise import realise_with_replan
        from stowplan.demo.pipeline import compare, config_args, run_pipeline, stage_worker_class

        fleet = ray_node_descriptors(timeout_s=timeout)
        try:
            realisation = realise_with_replan(
                demo_layout(config),
                fleet,
                constraints,
                stage_worker_class(),
                actor_args=(config_args(config),),
                max_attempts=max_attempts,
                timeout_s=timeout,
                on_failure=_report_failure,
            )
        except PlanError:
            err_console.print(f"demo model needs {format_bytes(demo_layout(config).weight_bytes)}")
            raise
        with realisation:
            run = run_pipeline(realisation.actors, config, ids, tokens, timeout_s=timeout * 4)
    reference = generate_local(config, ids, tokens)
    result = compare(run.generation, reference)
    gpu = {n.id: n.gpu_name for n in fleet}
    if as_json:
        doc = {
            "plan": plan_to_dict(realisation.plan),
            "tokens": list(run.generation.tokens),
            "reference_tokens": list(reference.tokens),
            "match": result.match,
            "max_abs_logit_diff": result.max_abs_logit_diff,
            "tokens_per_s": run.tokens_per_s,
            "stages": [
                {
                    "stage": s.stage,
                    "node_id": s.node_id,
                    "block_range": list(s.block_range),
                    "weight_bytes": s.weight_bytes,
                    "steps": s.steps,
                    "busy_s": s.busy_s,
                    "tokens_per_s": s.tokens_per_s,
                }
                for s in run.stages
            ],
        }
        out_console.file.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    else:
        from rich.table import Table

        table = Table(
            title=f"demo pipeline: {plural(len(run.stages), 'stage')}", title_justify="left"
        )
        for col in ("stage", "node", "gpu", "blocks", "weights", "steps", "busy", "tok/s"):
            table.add_column(col, justify="left" if col in {"node", "gpu", "blocks"} else "right")
        for s in run.stages:
            table.add_row(
                str(s.stage),
                s.node_id[:12],
                gpu.get(s.node_id, "?"),
                f"[{s.block_range[0]}, {s.block_range[1]})",
                format_bytes(s.weight_bytes),
                str(s.steps),
                f"{s.busy_s * 1e3:.1f} ms",
                f"{s.tokens_per_s:,.0f}",
            )
        out_console.print(table)
        out_console.print(
            f"generated {len(run.generation.tokens)} tokens in {run.wall_s:.3f} s "
            f"({run.tokens_per_s:.1f} tok/s end to end): {list(run.generation.tokens)}"
        )
        verdict = "MATCH" if result.match else "MISMATCH"
        same = sum(a == b for a, b in zip(run.generation.tokens, reference.tokens, strict=True))
        out_console.print(
            f"{verdict}: {same}/{len(reference.tokens)} token ids equal the single-process run; "
            f"max |logit difference| {result.max_abs_logit_diff:.3g} "
            f"(tolerance {result.tolerance:g})"
        )
    if not result.match:
        sys.stdout.flush()
        raise typer.Exit(1)
