"""``stowplan probe`` and ``stowplan residency``: one host's devices and the model's residency."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from stowplan.circuits import HostTopology
from stowplan.cli.app import app
from stowplan.cli.calibration_opts import cli_calibration
from stowplan.cli.common import err_console, out_console
from stowplan.cli.options import EngineOption
from stowplan.errors import InputError, InsufficientVram
from stowplan.host.passport import (
    Passport,
    PassportUnreadable,
    default_passport_path,
    obtain_passport,
    read_passport,
)
from stowplan.model import Constraints, ModelLayout
from stowplan.models import resolve_model
from stowplan.planner.residency import (
    DEFAULT_RESIDENCY_HEADROOM_FRAC,
    EmploymentPlan,
    employment_to_json,
    plan_residency,
)
from stowplan.quantities.units import format_bytes
from stowplan.text.wording import plural


def _probe(current: HostTopology, quick: bool, threads: int | None = None) -> Passport:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from stowplan.host.bench import measure

    with Progress(
        TextColumn("measuring {task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=quick,
    ) as bar:
        tasks: dict[str, int] = {}

        def progress(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = int(bar.add_task(label, total=total))
            bar.update(tasks[label], completed=done)  # type: ignore[arg-type]

        matrix, notes = measure(current, quick=quick, progress=progress, threads=threads)
    return Passport.create(current, matrix, (*current.notes, *notes))


def _passport(
    path: Path | None, *, quick: bool, refresh: bool, threads: int | None = None
) -> tuple[Passport, bool]:
    from stowplan.host.discover import discover

    return obtain_passport(
        current=discover(),
        probe=lambda topo: _probe(topo, quick, threads),
        path=path,
        refresh=refresh,
        quick=quick,
    )


def _render_passport(p: Passport, reused: bool) -> None:
    topo = p.topology
    origin = "cached passport" if reused else "fresh probe"
    gpus = f"GPUs found by {topo.source}" if topo.source != "none" else "no GPU found"
    out_console.print(
        f"host {topo.hostname}: {plural(len(topo.circuits), 'circuit')}, "
        f"RAM {format_bytes(topo.ram_bytes)}, {gpus} ({origin}, {p.created_at})"
    )
    circuits = Table("circuit", "kind", "name", "pool", "capacity", "bus")
    for c in topo.circuits:
        pool = topo.pool(c.pool)
        bus = f"PCIe{c.pcie_gen} x{c.pcie_width} {c.bus_gbps} GB/s" if c.bus_gbps else "in pool"
        circuits.add_row(
            c.id, c.kind.value, c.name, pool.id, format_bytes(pool.capacity_bytes), bus
        )
    out_console.print(circuits)
    matrix = Table("rank", "circuit", "backend", "gemv_n", "ms/gemv", "spread", "GB/s", "upload")
    for i, e in enumerate(p.matrix.entries):
        upload = "∞ (in pool)" if e.in_pool else f"{e.upload_gbps:.1f} GB/s"
        matrix.add_row(
            str(i),
            e.circuit,
            e.backend,
            str(e.gemv_n),
            f"{e.ms_per_gemv:.3f}",
            f"{e.ms_spread:.0%}",
            f"{e.compute_bytes_per_s / 1e9:.2f}",
            upload,
        )
    out_console.print(matrix)
    for note in p.notes:
        out_console.print(f"note: {note}")


@app.command("probe")
def probe_command(
    quick: Annotated[
        bool, typer.Option("--quick", help="Small benchmark (about a second).")
    ] = False,
    refresh: Annotated[
        bool, typer.Option("--refresh", help="Probe again even when a passport matches.")
    ] = False,
    passport: Annotated[
        Path | None, typer.Option("--passport", help="Passport file (default: the cache).")
    ] = None,
    threads: Annotated[
        int | None,
        typer.Option(
            "--threads",
            help="BLAS threads for the CPU benchmark (default: the BLAS's own; use 1 on a "
            "shared host, and run the model the same way).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the passport JSON.")] = False,
) -> None:
    """Discover and measure this host's devices; cache the result as its passport."""
    p, reused = _passport(
        passport, quick=quick, refresh=refresh or threads is not None, threads=threads
    )
    if as_json:
        out_console.file.write(p.to_json())
        return
    _render_passport(p, reused)
    out_console.print(f"passport: {passport or default_passport_path()}")


_SMALLER_DTYPES = ("q8_0", "q6_k", "q5_k_m", "q4_k_m", "q3_k_m", "q2_k")
"""GGUF file types tried, largest first, when a model does not fit: the error names one."""


_DEPRECATED_KV_RESERVE = "stowplan: note: --kv-reserve is deprecated; use --headroom"


def _residency(
    p: Passport,
    layout: ModelLayout,
    headroom: float,
    context: int | None,
    constraints: Constraints,
) -> EmploymentPlan:
    """The residency plan, timed by the cost model ``plan`` and ``launch`` use on this host
    (its circuits as :func:`~stowplan.host.node.node_from_passport` nodes)."""
    from stowplan.calibration.apply import calibration_label
    from stowplan.host.node import whole_model_seconds

    return plan_residency(
        p.topology,
        p.matrix,
        layout,
        vram_headroom_frac=headroom,
        context_tokens=context,
        whole_model_s=whole_model_seconds(p, layout, constraints),
        model_label=calibration_label(constraints.calibration),
    )


def _smaller_dtype(
    model: str,
    p: Passport,
    headroom: float,
    context: int | None,
    weight_bytes: int,
    constraints: Constraints,
) -> str:
    """``; --dtype D (X GiB) runs as P`` for the largest GGUF file type that fits, else ``""``."""
    for dtype in _SMALLER_DTYPES:
        try:
            layout = resolve_model(model, dtype=dtype)
        except InputError:
            return ""  # a checkpoint or GGUF file: its bytes are what they are
        if layout.weight_bytes >= weight_bytes:
            continue
        try:
            plan = _residency(p, layout, headroom, context, constraints)
        except InsufficientVram:
            continue
        return (
            f"; --dtype {dtype} ({format_bytes(layout.weight_bytes)}) runs as {plan.protocol.value}"
        )
    return ""


@app.command("residency")
def residency_command(
    model: Annotated[
        str,
        typer.Argument(
            help="Known model name, Hugging Face id, config.json, checkpoint folder or .gguf file."
        ),
    ],
    passport: Annotated[
        Path | None,
        typer.Option("--passport", help="Plan against this passport file (no probe)."),
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option("--dtype", help="Plan the model stored in this dtype: bf16, q4_k_m, q2_k …"),
    ] = None,
    context: Annotated[
        int | None,
        typer.Option(help="Context tokens to hold the KV cache of (beside the reserve)."),
    ] = None,
    headroom: Annotated[
        float | None,
        typer.Option(
            "--headroom",
            help="Fraction of the primary pool kept free: beside the KV cache of --context "
            "when given, else the room of the KV cache and runtime buffers "
            f"(default {DEFAULT_RESIDENCY_HEADROOM_FRAC:g}).",
        ),
    ] = None,
    kv_reserve: Annotated[
        float | None,
        typer.Option("--kv-reserve", hidden=True, help="Deprecated spelling of --headroom."),
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="When a probe is needed, run the quick one.")
    ] = False,
    engine: EngineOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan JSON.")] = False,
) -> None:
    """Choose Resident, HeterogeneousOverflow or Streaming for MODEL on this host.

    Times per token come from the model ``plan`` and ``launch`` use (``--engine``,
    default ``generic``), on this host's measured circuits."""
    if context is not None and context < 0:
        raise InputError("--context", context, "must be an integer >= 0 (tokens)")
    if kv_reserve is not None and headroom is not None:
        raise InputError("--kv-reserve", kv_reserve, "is the former name of --headroom; give one")
    frac = next(
        (v for v in (headroom, kv_reserve) if v is not None), DEFAULT_RESIDENCY_HEADROOM_FRAC
    )
    layout = resolve_model(model, dtype=dtype)
    if passport is not None:
        try:
            p = read_passport(passport)
        except PassportUnreadable as exc:
            raise InputError("--passport", str(passport), str(exc)) from None
    else:
        p, _ = _passport(None, quick=quick, refresh=False)
    constraints = Constraints(context_tokens=context, calibration=cli_calibration(engine, None))
    try:
        plan = _residency(p, layout, frac, context, constraints)
    except InsufficientVram as exc:
        hint = _smaller_dtype(model, p, frac, context, layout.weight_bytes, constraints)
        raise InsufficientVram(exc.needed, exc.available, exc.detail + hint) from None
    if kv_reserve is not None:  # said once the plan is made: an error stays one line
        err_console.print(_DEPRECATED_KV_RESERVE, soft_wrap=True)
    if as_json:
        out_console.file.write(employment_to_json(plan))
        return
    reads = (
        f", reads {format_bytes(plan.read_bytes)} per token"
        if plan.read_bytes < plan.model_bytes
        else ""
    )
    kv = f", KV {format_bytes(plan.kv_bytes)}" if plan.kv_bytes else ""
    out_console.print(
        Text.assemble(
            f"{layout.name} ({format_bytes(plan.model_bytes)}{reads}{kv}) "
            f"on {p.topology.hostname}: ",
            (plan.protocol.value, "bold"),
            f", predicted {plan.predicted_s_per_token:.4f} s/token "
            f"({plan.predicted_tokens_per_s:.2f} tok/s)",
        )
    )
    table = Table("rank", "circuit", "role", "pool", "weights")
    for pl in plan.placements:
        table.add_row(
            str(pl.rank), pl.circuit, pl.role.value, pl.pool, format_bytes(pl.weight_bytes)
        )
    out_console.print(table)
    for line in plan.rationale:
        out_console.print(f"- {line}")
