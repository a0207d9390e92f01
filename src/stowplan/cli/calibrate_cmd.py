"""``stowplan calibrate``: fit a device's calibration figures from the user's own runs."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from typing import Annotated

import typer

from stowplan.calibration import (
    Calibration,
    Engine,
    FitResult,
    Measurement,
    estimate_num_blocks,
    fit_device,
    load_calibration_file,
    normalise_gpu_name,
    parse_llama_bench,
    resolve_calibration,
    user_calibration_path,
    write_calibration,
)
from stowplan.cli.app import app
from stowplan.cli.common import out_console
from stowplan.errors import InputError


def _spec_bandwidth_gbps(gpu_name: str) -> float | None:
    """Peak memory bandwidth from the GPU spec table, when this build has one."""
    try:
        gpus = importlib.import_module("stowplan.gpus")
    except ImportError:
        return None
    for fn_name in ("lookup_gpu", "lookup", "spec_for"):
        fn = getattr(gpus, fn_name, None)
        if callable(fn):
            try:
                spec = fn(gpu_name)
            except Exception:
                return None
            value = getattr(spec, "mem_bandwidth_gbps", None)
            return float(value) if isinstance(value, int | float) else None
    return None


def _device_key(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", normalise_gpu_name(name)).strip("-") or "device"


def _read(path: Path, flag: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(flag, str(path), f"cannot be read ({exc.strerror})") from None


def _from_probe() -> None:
    try:
        import stowplan.host  # noqa: F401
    except ImportError:
        raise InputError(
            "--from-probe",
            True,
            "needs the host probe (stowplan.host), which this build does not include; "
            "use --from-llama-bench FILE",
        ) from None
    raise InputError(
        "--from-probe",
        True,
        "the host probe in this build reports no decode measurements yet; "
        "use --from-llama-bench FILE",
    )


@app.command("calibrate")
def calibrate_command(
    from_llama_bench: Annotated[
        Path | None,
        typer.Option(
            "--from-llama-bench", help="llama-bench output: markdown, CSV, JSON or JSONL."
        ),
    ] = None,
    from_probe: Annotated[
        bool, typer.Option("--from-probe", help="Use the host probe's measured matrix.")
    ] = False,
    device: Annotated[
        str | None, typer.Option(help="GPU name, e.g. 'RTX 4090' (default: from the file).")
    ] = None,
    bandwidth_gbps: Annotated[
        float | None, typer.Option(help="Peak memory bandwidth in GB/s (default: spec table).")
    ] = None,
    blocks: Annotated[
        int | None, typer.Option(help="Blocks of the benchmarked model (default: estimated).")
    ] = None,
    engine: Annotated[str, typer.Option(help="generic, llamacpp, vllm or trtllm.")] = "llamacpp",
    out: Annotated[
        Path | None,
        typer.Option(help="Profile file to write (default: ~/.stowplan/calibration/ENGINE.json)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the fitted profile JSON.")] = False,
) -> None:
    """Fit this device's calibration from measured decode runs and save the profile."""
    if from_probe:
        _from_probe()
    if from_llama_bench is None:
        raise InputError("--from-llama-bench", None, "give llama-bench output to fit from")
    try:
        eng = Engine(engine)
    except ValueError:
        raise InputError(
            "--engine", engine, f"must be one of {', '.join(e.value for e in Engine)}"
        ) from None
    results = parse_llama_bench(
        _read(from_llama_bench, "--from-llama-bench"), origin=str(from_llama_bench)
    )
    decode = [r for r in results if r.is_decode and r.n_depth == 0] or [
        r for r in results if r.is_decode
    ]
    if not decode:
        raise InputError(
            "--from-llama-bench",
            str(from_llama_bench),
            "has no token-generation (tgN) results; run llama-bench with -n 128",
        )
    name = device or next((r.gpu_info for r in decode if r.gpu_info), None)
    if not name:
        raise InputError(
            "--device",
            None,
            "the llama-bench output does not name the GPU; pass e.g. --device 'RTX 4090'",
        )
    bw = bandwidth_gbps if bandwidth_gbps is not None else _spec_bandwidth_gbps(name)
    if bw is None:
        raise InputError(
            "--bandwidth-gbps", None, f"no spec bandwidth known for {name!r}; pass it in GB/s"
        )
    measurements = []
    for r in decode:
        if r.size_bytes <= 0:
            raise InputError(
                "--from-llama-bench", r.model_type, "result has no model size; cannot fit"
            )
        n = blocks if blocks is not None else estimate_num_blocks(r.n_params or r.size_bytes)
        measurements.append(
            Measurement(
                tokens_per_s=r.tokens_per_s,
                read_bytes=r.size_bytes,
                num_blocks=n,
                dtype=r.dtype,
                label=f"{r.model_type} {r.test}",
            )
        )
    target = out if out is not None else user_calibration_path(eng)
    base = resolve_calibration(eng)
    key = _device_key(name)
    prior = base.for_device(name) or base.devices[-1]
    fit: FitResult = fit_device(
        measurements,
        bandwidth_gbps=bw,
        prior=prior,
        device=key,
        match=tuple(normalise_gpu_name(name).split()),
        source=f"fitted to {len(measurements)} llama-bench runs in {from_llama_bench.name}",
    )
    existing = load_calibration_file(target) if target.is_file() else None
    profile = (
        existing.with_device(fit.device)
        if existing is not None
        else Calibration(name=f"{eng.value}-fitted", engine=eng, devices=(fit.device,))
    )
    write_calibration(profile, target)
    if as_json:
        from stowplan.calibration import calibration_to_dict

        out_console.file.write(json.dumps(calibration_to_dict(profile), indent=2) + "\n")
        return
    _render(fit, measurements, name, bw, target, eng)


def _render(
    fit: FitResult,
    measurements: list[Measurement],
    name: str,
    bw: float,
    target: Path,
    eng: Engine,
) -> None:
    from rich.table import Table

    d = fit.device
    out_console.print(f"device {name!r} (key {d.device}), peak bandwidth {bw:g} GB/s")
    figures = Table("figure", "value", "provenance")
    for cls, f in d.bandwidth_fraction.items():
        figures.add_row(f"bandwidth fraction ({cls})", f"{f.value:.3f}", f.provenance.value)
    figures.add_row(
        "block overhead", f"{d.block_overhead_s.value * 1e6:.1f} us", d.block_overhead_s.provenance
    )
    figures.add_row(
        "hop overhead", f"{d.hop_overhead_s.value * 1e6:.1f} us", d.hop_overhead_s.provenance
    )
    figures.add_row(
        "compute efficiency",
        f"{d.compute_efficiency.value:.2f}",
        d.compute_efficiency.provenance,
    )
    out_console.print(figures)
    runs = Table("run", "blocks", "measured tok/s", "fitted tok/s", "error")
    for m, p, e in zip(measurements, fit.predicted_tokens_per_s, fit.relative_errors, strict=True):
        runs.add_row(m.label, str(m.num_blocks), f"{m.tokens_per_s:.2f}", f"{p:.2f}", f"{e:+.1%}")
    out_console.print(runs)
    out_console.print(f"wrote {target}; `stowplan plan --engine {eng.value}` uses it")
