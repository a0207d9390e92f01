"""``stowplan calibrate``: fit a device's calibration figures from the user's own runs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated

import typer

from stowplan.calibration import (
    MAX_BANDWIDTH_FRACTION,
    Calibration,
    DeviceCalibration,
    Engine,
    Figure,
    FitResult,
    Measurement,
    Provenance,
    calibration_to_dict,
    estimate_num_blocks,
    fit_device,
    load_calibration_file,
    normalise_gpu_name,
    parse_llama_bench,
    partial_offload,
    resolve_calibration,
    user_calibration_path,
    write_calibration,
)
from stowplan.cli.app import app
from stowplan.cli.common import err_console, out_console
from stowplan.errors import InputError
from stowplan.fileio import read_text_file
from stowplan.gpus import lookup_gpu


def _spec_bandwidth_gbps(gpu_name: str) -> float | None:
    """Peak memory bandwidth (GB/s) from the GPU spec table; None when the GPU is not in it."""
    spec = lookup_gpu(gpu_name)
    return spec.mem_bandwidth_gbps if spec is not None else None


def _device_key(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", normalise_gpu_name(name)).strip("-") or "device"


def _probe_entries(passport_path: Path | None, prior_cal: Calibration) -> list[DeviceCalibration]:
    """One device entry per circuit the host probe measured (its GEMV streaming rate).

    A circuit whose name is in the GPU spec table gets ``measured rate / spec peak`` as
    its bandwidth fraction, the baseline of nodes described by name; any other circuit
    (a CPU) gets 1.0: its nodes take the measured rate itself as their bandwidth.
    """
    try:
        from stowplan.host.passport import (
            PassportUnreadable,
            default_passport_path,
            read_passport,
        )
    except ImportError:
        raise InputError(
            "--from-probe",
            True,
            "needs the host probe (stowplan.host), which this build does not include; "
            "use --from-llama-bench FILE",
        ) from None
    path = passport_path if passport_path is not None else default_passport_path()
    if not path.exists():
        raise InputError(
            "--passport", str(path), "no hardware passport; run `stowplan probe` first"
        )
    try:
        passport = read_passport(path)
    except PassportUnreadable as exc:
        raise InputError(
            "--passport", str(path), f"{exc.reason}; run `stowplan probe --refresh`"
        ) from None
    entries = []
    for cap in passport.matrix.entries:
        circuit = passport.topology.circuit(cap.circuit)
        measured_gbps = cap.compute_bytes_per_s / 1e9
        spec_gbps = _spec_bandwidth_gbps(circuit.name)
        where = (
            f"stowplan probe: {cap.backend} f32 GEMV {cap.gemv_n}x{cap.gemv_n}, "
            f"{cap.ms_per_gemv:.3f} ms median of {cap.repeats}, {measured_gbps:.1f} GB/s, "
            f"passport {passport.fingerprint[:12]}"
        )
        if spec_gbps:
            value, source = measured_gbps / spec_gbps, f"{where} / spec {spec_gbps:g} GB/s"
        else:
            value, source = 1.0, f"{where}; no spec peak: the measured rate is the bandwidth"
        prior = prior_cal.for_device(circuit.name) or prior_cal.devices[-1]
        fractions = dict(prior.bandwidth_fraction)
        fractions["f32"] = Figure(
            value=round(min(value, MAX_BANDWIDTH_FRACTION), 4),
            provenance=Provenance.MEASURED,
            source=source,
        )
        block = prior.block_overhead_s
        if cap.decode_gbps is not None and cap.decode_block_s is not None:
            run = (
                f"stowplan probe decode run: f16 block GEMVs, {cap.decode_gbps:.1f} GB/s, "
                f"{cap.decode_block_s * 1e6:.1f} us/block, passport {passport.fingerprint[:12]}"
            )
            if spec_gbps:
                fractions["f16"] = Figure(
                    value=round(min(cap.decode_gbps / spec_gbps, MAX_BANDWIDTH_FRACTION), 4),
                    provenance=Provenance.MEASURED,
                    source=f"{run} / spec {spec_gbps:g} GB/s",
                )
            block = Figure(value=cap.decode_block_s, provenance=Provenance.MEASURED, source=run)
        entries.append(
            DeviceCalibration(
                device=_device_key(circuit.name),
                match=tuple(normalise_gpu_name(circuit.name).split()),
                bandwidth_fraction=fractions,
                block_overhead_s=block,
                hop_overhead_s=prior.hop_overhead_s,
                collective_overhead_s=prior.collective_overhead_s,
                compute_efficiency=prior.compute_efficiency,
            )
        )
    return entries


def _save(entries: list[DeviceCalibration], eng: Engine, target: Path) -> Calibration:
    existing = load_calibration_file(target) if target.is_file() else None
    profile = existing or Calibration(
        name=f"{eng.value}-fitted", engine=eng, devices=tuple(entries[:1])
    )
    for entry in reversed(entries):
        profile = profile.with_device(entry)
    write_calibration(profile, target)
    return profile


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
            help="GPUs the runs used (default: the file's gpu_info, else 1); "
            "split mode row fits the collective cost, layer the hop cost."
        ),
    ] = None,
    engine: Annotated[
        str, typer.Option(help="generic, llamacpp, vllm, trtllm or transformers.")
    ] = "llamacpp",
    out: Annotated[
        Path | None,
        typer.Option(help="Profile file to write (default: ~/.stowplan/calibration/ENGINE.json)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the fitted profile JSON.")] = False,
) -> None:
    """Fit this device's calibration from measured decode runs and save the profile."""
    try:
        eng = Engine(engine)
    except ValueError:
        raise InputError(
            "--engine", engine, f"must be one of {', '.join(e.value for e in Engine)}"
        ) from None
    target = out if out is not None else user_calibration_path(eng)
    if from_probe:
        entries = _probe_entries(passport, resolve_calibration(eng))
        profile = _save(entries, eng, target)
        if as_json:
            out_console.file.write(json.dumps(calibration_to_dict(profile), indent=2) + "\n")
            return
        for e in entries:
            f = e.bandwidth_fraction["f32"]
            line = f"{e.device}: bandwidth fraction (f32) {f.value:.3f} measured"
            f16 = e.bandwidth_fraction.get("f16")
            if f16 is not None and f16.provenance is Provenance.MEASURED:
                line += f", (f16 decode run) {f16.value:.3f} measured"
            if e.block_overhead_s.provenance is Provenance.MEASURED:
                line += f", block {e.block_overhead_s.value * 1e6:.1f} us measured"
            out_console.print(line, soft_wrap=True)
        out_console.print(_how_to_use(target, out is None, eng))
        return
    if from_llama_bench is None:
        raise InputError(
            "--from-llama-bench", None, "give llama-bench output (or --from-probe) to fit from"
        )
    results = parse_llama_bench(
        read_text_file(from_llama_bench, field="--from-llama-bench"), origin=str(from_llama_bench)
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
    if gpus is not None and gpus < 1:
        raise InputError("--gpus", gpus, "must be >= 1")
    listed = sorted({g for r in decode for g in r.gpu_names})
    if device is None and len(listed) > 1:
        raise InputError(
            "--device",
            ", ".join(listed),
            "the runs used different GPUs; fit one device at a time (pass --device)",
        )
    name = device or (listed[0] if listed else None)
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
        if blocks is None and r.n_params <= 0:
            raise InputError(
                "--blocks", None, f"{r.model_type!r} has no parameter count; pass the block count"
            )
        n = blocks if blocks is not None else estimate_num_blocks(r.n_params)
        why = partial_offload(r, n)
        if why is not None:
            err_console.print(
                f"note: {r.model_type} {r.test} left out of the GPU fit ({why}); "
                "benchmark with -ngl 99 to fit the GPU",
                soft_wrap=True,
            )
            continue
        hops, tp = r.layout(gpus)
        measurements.append(
            Measurement(
                tokens_per_s=r.tokens_per_s,
                read_bytes=r.size_bytes,
                num_blocks=n,
                dtype=r.dtype,
                hops=hops,
                tensor_parallel=tp,
                label=f"{r.model_type} {r.test}",
            )
        )
    if not measurements:
        raise InputError(
            "--from-llama-bench",
            str(from_llama_bench),
            "has no full-GPU token-generation run (every one had ngl 0 or fewer GPU layers "
            "than the model's blocks); run llama-bench with -ngl 99",
        )
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
    profile = _save([fit.device], eng, target)
    if as_json:
        out_console.file.write(json.dumps(calibration_to_dict(profile), indent=2) + "\n")
        return
    _render(fit, measurements, name, bw, target, eng, default_target=out is None)


def _how_to_use(target: Path, default_target: bool, eng: Engine) -> str:
    """Where the profile went and the plan option that reads it."""
    if default_target:
        return f"wrote {target}; `stowplan plan --engine {eng.value}` uses it"
    return f"wrote {target}; use it with `stowplan plan --calibration {target}`"


def _render(
    fit: FitResult,
    measurements: list[Measurement],
    name: str,
    bw: float,
    target: Path,
    eng: Engine,
    *,
    default_target: bool,
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
        "collective overhead (per block, tensor parallel)",
        f"{d.collective_overhead_s.value * 1e6:.1f} us",
        d.collective_overhead_s.provenance,
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
    out_console.print(_how_to_use(target, default_target, eng))
