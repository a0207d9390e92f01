"""``stowplan calibrate``: fit a device's calibration figures from the user's own runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from stowplan.calibration import (
    CalibrationOutcome,
    CalibrationRequest,
    DeviceFit,
    PassportReader,
    PassportReading,
    Provenance,
    calibrate,
    calibration_to_dict,
)
from stowplan.calibration.profile import Engine
from stowplan.cli.app import app
from stowplan.cli.common import err_console, out_console
from stowplan.cli.options import choice_list
from stowplan.errors import InputError


@app.command("calibrate")
def calibrate_command(
    from_llama_bench: Annotated[
        Path | None,
        typer.Option(
            "--from-llama-bench", help="llama-bench output: markdown, CSV, JSON or JSONL."
        ),
    ] = None,
    from_serving_bench: Annotated[
        Path | None,
        typer.Option(
            "--from-serving-bench",
            help="vllm bench serve --save-result JSON, sglang.bench_serving --output-file "
            "JSONL or trtllm-bench --report_json; runs at concurrency 1 are fitted.",
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Model the serving benchmark ran: known name, HF id, config.json or checkpoint.",
        ),
    ] = None,
    from_probe: Annotated[
        bool, typer.Option("--from-probe", help="Use the host probe's measured matrix.")
    ] = False,
    passport: Annotated[
        Path | None, typer.Option(help="Hardware passport for --from-probe (default: cached).")
    ] = None,
    device: Annotated[
        str | None, typer.Option(help="GPU name, e.g. 'RTX 4090' (default: from the file).")
    ] = None,
    bandwidth_gbps: Annotated[
        float | None, typer.Option(help="Peak memory bandwidth in GB/s (default: spec table).")
    ] = None,
    blocks: Annotated[
        int | None, typer.Option(help="Blocks of the benchmarked model (default: estimated).")
    ] = None,
    gpus: Annotated[
        int | None,
        typer.Option(
            help="GPUs each run used (default: the file's gpu_info / tp_size x pp_size, "
            "else 1); llama-bench split mode row and serving runs split them tensor "
            "parallel, llama-bench split mode layer into pipeline stages."
        ),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(
            help=f"{choice_list(Engine)} (default: llamacpp; "
            "for --from-serving-bench the tool that wrote the file: vllm, sglang or trtllm)."
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Profile file to write (default: ~/.stowplan/calibration/ENGINE.json)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the fitted profile JSON.")] = False,
) -> None:
    """Fit this device's calibration from measured decode runs and save the profile."""
    request = CalibrationRequest(
        llama_bench=from_llama_bench,
        serving_bench=from_serving_bench,
        probe=from_probe,
        passport=passport,
        model=model,
        device=device,
        bandwidth_gbps=bandwidth_gbps,
        blocks=blocks,
        gpus=gpus,
        engine=engine,
        out=out,
    )
    outcome = calibrate(
        request,
        on_note=lambda text: err_console.print(f"note: {text}", soft_wrap=True),
        read_passport=_passport_reader() if from_probe else None,
    )
    if as_json:
        out_console.file.write(json.dumps(calibration_to_dict(outcome.profile), indent=2) + "\n")
    elif outcome.fit is not None:
        _render_fit(outcome.fit)
        out_console.print(_how_to_use(outcome))
    else:
        _render_probe(outcome)
        out_console.print(_how_to_use(outcome))


def _passport_reader() -> PassportReader | None:
    """The host probe's passport reader, its errors as ``--passport`` ones; None without it."""
    try:
        from stowplan.host.passport import (
            PassportUnreadable,
            default_passport_path,
            read_passport,
        )
    except ImportError:
        return None

    def read(path: Path | None) -> PassportReading:
        p = path if path is not None else default_passport_path()
        if not p.exists():
            raise InputError(
                "--passport", str(p), "no hardware passport; run `stowplan probe` first"
            )
        try:
            return read_passport(p)
        except PassportUnreadable as exc:
            raise InputError(
                "--passport", str(p), f"{exc.reason}; run `stowplan probe --refresh`"
            ) from None

    return read


def _how_to_use(outcome: CalibrationOutcome) -> str:
    """Where the profile went and the plan option that reads it."""
    if outcome.default_target:
        return f"wrote {outcome.target}; `stowplan plan --engine {outcome.engine.value}` uses it"
    return f"wrote {outcome.target}; use it with `stowplan plan --calibration {outcome.target}`"


def _render_probe(outcome: CalibrationOutcome) -> None:
    """One line per probed circuit: its measured figures."""
    for e in outcome.entries:
        f = e.bandwidth_fraction["f32"]
        line = f"{e.device}: bandwidth fraction (f32) {f.value:.3f} measured"
        f16 = e.bandwidth_fraction.get("f16")
        if f16 is not None and f16.provenance is Provenance.MEASURED:
            line += f", (f16 decode run) {f16.value:.3f} measured"
        if e.block_overhead_s.provenance is Provenance.MEASURED:
            line += f", block {e.block_overhead_s.value * 1e6:.1f} us measured"
        out_console.print(line, soft_wrap=True)
        kept = [
            f"bandwidth fraction ({cls})"
            for cls, f in e.bandwidth_fraction.items()
            if f.provenance is Provenance.ASSUMED
        ] + [
            name
            for name, fig in (
                ("block", e.block_overhead_s),
                ("hop", e.hop_overhead_s),
                ("collective", e.collective_overhead_s),
                ("compute efficiency", e.compute_efficiency),
            )
            if fig.provenance is Provenance.ASSUMED
        ]
        if kept:
            out_console.print(
                f"  assumed (kept from the prior profile): {', '.join(kept)}", soft_wrap=True
            )


def _render_fit(fit: DeviceFit) -> None:
    """The fitted figures, then each run measured against the fit."""
    from rich.table import Table

    d = fit.result.device
    out_console.print(
        f"device {fit.device_name!r} (key {d.device}), peak bandwidth {fit.bandwidth_gbps:g} GB/s"
    )
    figures = Table("figure", "value", "provenance")
    for cls, f in d.bandwidth_fraction.items():
        figures.add_row(f"bandwidth fraction ({cls})", f"{f.value:.3f}", f.provenance.value)
    for label, fig in (
        ("block overhead", d.block_overhead_s),
        ("hop overhead", d.hop_overhead_s),
        ("collective overhead (per block, tensor parallel)", d.collective_overhead_s),
    ):
        figures.add_row(label, f"{fig.value * 1e6:.1f} us", fig.provenance)
    figures.add_row(
        "compute efficiency", f"{d.compute_efficiency.value:.2f}", d.compute_efficiency.provenance
    )
    out_console.print(figures)
    runs = Table("run", "blocks", "measured tok/s", "fitted tok/s", "error")
    predicted, errors = fit.result.predicted_tokens_per_s, fit.result.relative_errors
    for m, p, e in zip(fit.measurements, predicted, errors, strict=True):
        runs.add_row(m.label, str(m.num_blocks), f"{m.tokens_per_s:.2f}", f"{p:.2f}", f"{e:+.1%}")
    out_console.print(runs)
