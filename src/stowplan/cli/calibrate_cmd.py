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
    parse_serving_bench,
    partial_offload,
    resolve_calibration,
    user_calibration_path,
    write_calibration,
)
from stowplan.calibration.serving_bench import BATCH1_RULE
from stowplan.checks import check_choice, check_number
from stowplan.cli.app import app
from stowplan.cli.common import err_console, out_console
from stowplan.errors import InputError
from stowplan.fileio import FileKind, check_output_file, read_text_file
from stowplan.gpus import lookup_gpu
from stowplan.model import ModelLayout
from stowplan.models import resolve_model


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
    try:
        write_calibration(profile, target)
    except OSError as exc:
        raise InputError(
            "--out", str(target), f"cannot be written ({exc.strerror or type(exc).__name__})"
        ) from None
    return profile


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
            help="generic, llamacpp, vllm, trtllm, sglang or transformers (default: llamacpp; "
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
    if gpus is not None and gpus < 1:
        raise InputError("--gpus", gpus, "must be >= 1")
    if blocks is not None and blocks < 1:
        raise InputError("--blocks", blocks, "must be >= 1")
    if bandwidth_gbps is not None:
        check_number("--bandwidth-gbps", bandwidth_gbps, positive=True)
    if out is not None:
        check_output_file(out, field="--out")
    if from_llama_bench is not None and from_probe:
        raise InputError(
            "--from-llama-bench",
            str(from_llama_bench),
            "fit from one source at a time (not with --from-probe)",
        )
    if from_serving_bench is not None:
        if from_llama_bench is not None or from_probe:
            raise InputError(
                "--from-serving-bench",
                str(from_serving_bench),
                "fit from one source at a time (not with --from-llama-bench / --from-probe)",
            )
        _calibrate_from_serving_bench(
            from_serving_bench,
            model=model,
            device=device,
            bandwidth_gbps=bandwidth_gbps,
            blocks=blocks,
            gpus=gpus,
            engine=engine,
            out=out,
            as_json=as_json,
        )
        return
    eng = check_choice("--engine", engine or Engine.LLAMACPP.value, Engine)
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
        read_text_file(from_llama_bench, field="--from-llama-bench", kind=FileKind.BENCHMARK),
        origin=str(from_llama_bench),
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
    name = _device_name(
        device,
        sorted({g for r in decode for g in r.gpu_names}),
        "the llama-bench output does not name the GPU; pass e.g. --device 'RTX 4090'",
    )
    bw = _bandwidth(name, bandwidth_gbps)
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
    _fit_and_save(
        measurements,
        name=name,
        bw=bw,
        eng=eng,
        out=out,
        as_json=as_json,
        source=f"fitted to {len(measurements)} llama-bench runs in {from_llama_bench.name}",
    )


def _device_name(device: str | None, listed: list[str], missing: str) -> str:
    """``--device``, else the one GPU the file names; InputError when neither settles it."""
    if device is None and len(listed) > 1:
        raise InputError(
            "--device",
            ", ".join(listed),
            "the runs used different GPUs; fit one device at a time (pass --device)",
        )
    name = device or (listed[0] if listed else None)
    if not name:
        raise InputError("--device", None, missing)
    return name


def _bandwidth(name: str, bandwidth_gbps: float | None) -> float:
    """``--bandwidth-gbps``, else the spec table's peak for ``name``."""
    bw = bandwidth_gbps if bandwidth_gbps is not None else _spec_bandwidth_gbps(name)
    if bw is None:
        raise InputError(
            "--bandwidth-gbps", None, f"no spec bandwidth known for {name!r}; pass it in GB/s"
        )
    return bw


def _fit_and_save(
    measurements: list[Measurement],
    *,
    name: str,
    bw: float,
    eng: Engine,
    out: Path | None,
    as_json: bool,
    source: str,
) -> None:
    """Fit ``name``'s figures on top of ``eng``'s profile, save them and report."""
    target = out if out is not None else user_calibration_path(eng)
    base = resolve_calibration(eng)
    prior = base.for_device(name) or base.devices[-1]
    if {m.tensor_parallel > 1 for m in measurements} == {True}:
        err_console.print(
            "note: every run is tensor parallel, so the collective cost cannot be told from "
            f"the block cost: it keeps the profile's {prior.collective_overhead_s.value * 1e6:.1f} "
            "us per block and the block cost takes the rest (fit one-GPU runs too to split them)",
            soft_wrap=True,
        )
    fit: FitResult = fit_device(
        measurements,
        bandwidth_gbps=bw,
        prior=prior,
        device=_device_key(name),
        match=tuple(normalise_gpu_name(name).split()),
        source=source,
        max_fraction=1.0,  # a GPU streams at most at its datasheet peak
    )
    profile = _save([fit.device], eng, target)
    if as_json:
        out_console.file.write(json.dumps(calibration_to_dict(profile), indent=2) + "\n")
        return
    _render(fit, measurements, name, bw, target, eng, default_target=out is None)


def _calibrate_from_serving_bench(
    path: Path,
    *,
    model: str | None,
    device: str | None,
    bandwidth_gbps: float | None,
    blocks: int | None,
    gpus: int | None,
    engine: str | None,
    out: Path | None,
    as_json: bool,
) -> None:
    """Fit from the concurrency-1 runs of a vLLM / SGLang / trtllm-bench result file."""
    text = read_text_file(path, field="--from-serving-bench", kind=FileKind.BENCHMARK)
    runs = parse_serving_bench(text, origin=path.name)
    tools = {r.tool for r in runs}
    default = {"trtllm": Engine.TRTLLM, "sglang": Engine.SGLANG}.get(
        next(iter(tools)) if len(tools) == 1 else "", Engine.VLLM
    )
    eng = check_choice("--engine", engine or default.value, Engine)
    kept = []
    for r in runs:
        why = r.why_not_batch1()
        if why is not None:
            hint = (
                "; it is a batch-1 decode measurement only at concurrency 1: "
                "benchmark with --max-concurrency 1"
                if not r.one_at_a_time
                else ""
            )
            err_console.print(f"note: {r.label} left out of the fit ({why}){hint}", soft_wrap=True)
            continue
        kept.append(r)
    if not kept:
        seen = sorted({str(r.max_concurrency) for r in runs})
        raise InputError(
            "max_concurrency",
            ", ".join(seen),
            f"{path.name} has no run that served one request at a time (a batch-1 "
            f"decode measurement); {BATCH1_RULE}",
        )
    specs = []
    for r in kept:
        spec = model or r.model
        if not spec:
            raise InputError(
                "--model",
                None,
                f"{r.label} does not name its model; pass the model the runs served "
                "(known name, Hugging Face id, config.json or checkpoint folder)",
            )
        specs.append(spec)
    layouts = {spec: _serving_model(spec, given=model is not None) for spec in specs}
    name = _device_name(
        device,
        sorted({r.device for r in kept if r.device}),
        "the benchmark results do not name the GPU; pass e.g. --device 'H100 SXM'",
    )
    bw = _bandwidth(name, bandwidth_gbps)
    measurements = []
    unsaid = [r.label for r in kept if gpus is None and r.tensor_parallel is None]
    if unsaid:
        err_console.print(
            f"note: {', '.join(unsaid)} do(es) not say how many GPUs served it; fitted as one "
            "GPU (pass --gpus N for a tensor-parallel run)",
            soft_wrap=True,
        )
    for r, spec in zip(kept, specs, strict=True):
        layout = layouts[spec]
        t = r.time_per_token_s
        assert t is not None  # why_not_batch1() checked it
        pp = r.pipeline_parallel or 1
        if gpus is not None and gpus % pp:
            raise InputError(
                "--gpus", gpus, f"must be a multiple of {r.label}'s {pp} pipeline stages"
            )
        tp = gpus // pp if gpus is not None else (r.tensor_parallel or 1)
        measurements.append(
            Measurement(
                tokens_per_s=1.0 / t,
                read_bytes=sum(layout.block_read_sizes()) + layout.head_params_bytes,
                num_blocks=blocks if blocks is not None else layout.num_blocks,
                dtype=layout.dtype,
                hops=pp - 1,
                tensor_parallel=tp,
                label=f"{r.label} {layout.name} ({r.time_source})",
            )
        )
    names = ", ".join(sorted({layouts[s].name for s in specs}))
    _fit_and_save(
        measurements,
        name=name,
        bw=bw,
        eng=eng,
        out=out,
        as_json=as_json,
        source=f"fitted to {len(measurements)} concurrency-1 serving runs "
        f"({', '.join(sorted({r.tool for r in kept}))}) of {names} in {path.name}",
    )


def _serving_model(spec: str, *, given: bool) -> ModelLayout:
    """The layout of ``spec``: ``--model`` as ``stowplan plan`` reads it, or a run's model id."""
    if given:
        return resolve_model(spec)
    try:
        return resolve_model(spec)
    except InputError:
        raise InputError(
            "--model",
            None,
            f"the runs name the model {spec!r}, which is not a known model or a local "
            "config/checkpoint here; pass --model (known name, Hugging Face id, config.json "
            "or checkpoint folder)",
        ) from None


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
