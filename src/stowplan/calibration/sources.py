"""Decode measurements from a benchmark file: llama-bench output or serving-benchmark results.

Each reader turns one :class:`~stowplan.calibration.request.CalibrationRequest`'s
file into :class:`DecodeRuns`: the engine whose profile is fitted, the device
and its peak bandwidth, and one :class:`~stowplan.calibration.fit.Measurement`
per batch-1 decode run.  Runs that are no GPU decode measurement are left out,
and ``on_note`` is told why, one sentence each, as they are met.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stowplan.calibration.device import choose_device_name, peak_bandwidth_gbps
from stowplan.calibration.fit import Measurement
from stowplan.calibration.llama_bench import estimate_num_blocks, parse_llama_bench, partial_offload
from stowplan.calibration.profile import Engine
from stowplan.calibration.request import CalibrationRequest
from stowplan.calibration.serving_bench import (
    BATCH1_RULE,
    ServingBenchResult,
    parse_serving_bench,
)
from stowplan.errors import InputError
from stowplan.files.fileio import FileKind, read_text_file
from stowplan.model import ModelLayout
from stowplan.models import resolve_model
from stowplan.quantities.checks import check_choice

__all__ = ["DecodeRuns", "llama_bench_runs", "serving_bench_runs"]

Note = Callable[[str], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeRuns:
    """The batch-1 decode runs of one benchmark file, ready to fit."""

    engine: Engine
    """The engine whose profile the fit goes into."""
    device_name: str
    bandwidth_gbps: float
    """The device's datasheet peak memory bandwidth (GB/s)."""
    measurements: tuple[Measurement, ...]
    source: str
    """The fitted figures' provenance: how many runs of which file."""


def llama_bench_runs(request: CalibrationRequest, *, on_note: Note) -> DecodeRuns:
    """The full-GPU token-generation runs of ``request.llama_bench``.

    Runs at depth 0 are preferred (deeper ones only when there are none).  A
    run's block count is ``request.blocks``, else estimated from its parameter
    count; a CPU run or a partial offload is left out with a note.  The engine
    defaults to llamacpp.

    Raises:
        InputError: for a bad ``engine``, no file, an unreadable file, no
            token-generation result, an unsettled device or bandwidth, a run
            without a size (or a parameter count, without ``blocks``), or no
            full-GPU run.
    """
    eng = check_choice("--engine", request.engine or Engine.LLAMACPP.value, Engine)
    path = request.llama_bench
    if path is None:
        raise InputError(
            "--from-llama-bench", None, "give llama-bench output (or --from-probe) to fit from"
        )
    results = parse_llama_bench(
        read_text_file(path, field="--from-llama-bench", kind=FileKind.BENCHMARK),
        origin=str(path),
    )
    decode = [r for r in results if r.is_decode and r.n_depth == 0] or [
        r for r in results if r.is_decode
    ]
    if not decode:
        raise InputError(
            "--from-llama-bench",
            str(path),
            "has no token-generation (tgN) results; run llama-bench with -n 128",
        )
    name = choose_device_name(
        request.device,
        sorted({g for r in decode for g in r.gpu_names}),
        "the llama-bench output does not name the GPU; pass e.g. --device 'RTX 4090'",
    )
    bw = peak_bandwidth_gbps(name, request.bandwidth_gbps)
    measurements = []
    for r in decode:
        if r.size_bytes <= 0:
            raise InputError(
                "--from-llama-bench", r.model_type, "result has no model size; cannot fit"
            )
        if request.blocks is None and r.n_params <= 0:
            raise InputError(
                "--blocks", None, f"{r.model_type!r} has no parameter count; pass the block count"
            )
        n = request.blocks if request.blocks is not None else estimate_num_blocks(r.n_params)
        why = partial_offload(r, n)
        if why is not None:
            on_note(
                f"{r.model_type} {r.test} left out of the GPU fit ({why}); "
                "benchmark with -ngl 99 to fit the GPU"
            )
            continue
        hops, tp = r.layout(request.gpus)
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
            str(path),
            "has no full-GPU token-generation run (every one had ngl 0 or fewer GPU layers "
            "than the model's blocks); run llama-bench with -ngl 99",
        )
    return DecodeRuns(
        engine=eng,
        device_name=name,
        bandwidth_gbps=bw,
        measurements=tuple(measurements),
        source=f"fitted to {len(measurements)} llama-bench runs in {path.name}",
    )


def serving_bench_runs(request: CalibrationRequest, *, on_note: Note) -> DecodeRuns:
    """The concurrency-1 runs of ``request.serving_bench`` (vLLM, SGLang or trtllm-bench).

    The engine defaults to the tool that wrote the file (trtllm, sglang, else
    vllm).  Each run reads the weights of ``request.model``, else of the model
    the run names, once per token; ``request.gpus`` counts every GPU of a run
    (tensor parallel within each of its pipeline stages), else the file's
    ``tp_size`` (1, with a note, when it does not say).

    Raises:
        InputError: for no file, an unreadable file, a bad ``engine``, no run at
            concurrency 1, a run whose model is not named or not known, an
            unsettled device or bandwidth, or ``gpus`` that its pipeline stages
            do not divide.
    """
    path = request.serving_bench
    if path is None:
        raise InputError("--from-serving-bench", None, "give a serving-benchmark result file")
    text = read_text_file(path, field="--from-serving-bench", kind=FileKind.BENCHMARK)
    runs = parse_serving_bench(text, origin=path.name)
    tools = {r.tool for r in runs}
    default = {"trtllm": Engine.TRTLLM, "sglang": Engine.SGLANG}.get(
        next(iter(tools)) if len(tools) == 1 else "", Engine.VLLM
    )
    eng = check_choice("--engine", request.engine or default.value, Engine)
    kept = _batch1_runs(runs, origin=path.name, on_note=on_note)
    specs = [_model_spec(r, request.model) for r in kept]
    layouts = {spec: _serving_model(spec, given=request.model is not None) for spec in specs}
    name = choose_device_name(
        request.device,
        sorted({r.device for r in kept if r.device}),
        "the benchmark results do not name the GPU; pass e.g. --device 'H100 SXM'",
    )
    bw = peak_bandwidth_gbps(name, request.bandwidth_gbps)
    gpus = request.gpus
    unsaid = [r.label for r in kept if gpus is None and r.tensor_parallel is None]
    if unsaid:
        on_note(
            f"{', '.join(unsaid)} do(es) not say how many GPUs served it; fitted as one "
            "GPU (pass --gpus N for a tensor-parallel run)"
        )
    measurements = []
    for r, spec in zip(kept, specs, strict=True):
        layout = layouts[spec]
        t = r.time_per_token_s
        assert t is not None  # _batch1_runs kept only runs with a time per token
        pp = r.pipeline_parallel or 1
        if gpus is not None and gpus % pp:
            raise InputError(
                "--gpus", gpus, f"must be a multiple of {r.label}'s {pp} pipeline stages"
            )
        measurements.append(
            Measurement(
                tokens_per_s=1.0 / t,
                read_bytes=sum(layout.block_read_sizes()) + layout.head_params_bytes,
                num_blocks=request.blocks if request.blocks is not None else layout.num_blocks,
                dtype=layout.dtype,
                hops=pp - 1,
                tensor_parallel=gpus // pp if gpus is not None else (r.tensor_parallel or 1),
                label=f"{r.label} {layout.name} ({r.time_source})",
            )
        )
    names = ", ".join(sorted({layouts[s].name for s in specs}))
    return DecodeRuns(
        engine=eng,
        device_name=name,
        bandwidth_gbps=bw,
        measurements=tuple(measurements),
        source=f"fitted to {len(measurements)} concurrency-1 serving runs "
        f"({', '.join(sorted({r.tool for r in kept}))}) of {names} in {path.name}",
    )


def _batch1_runs(
    runs: list[ServingBenchResult], *, origin: str, on_note: Note
) -> list[ServingBenchResult]:
    """The runs that are batch-1 decode measurements; a note for each one left out."""
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
            on_note(f"{r.label} left out of the fit ({why}){hint}")
            continue
        kept.append(r)
    if not kept:
        seen = sorted({str(r.max_concurrency) for r in runs})
        raise InputError(
            "max_concurrency",
            ", ".join(seen),
            f"{origin} has no run that served one request at a time (a batch-1 "
            f"decode measurement); {BATCH1_RULE}",
        )
    return kept


def _model_spec(run: ServingBenchResult, model: str | None) -> str:
    """``model`` when given, else the model ``run`` names."""
    spec = model or run.model
    if not spec:
        raise InputError(
            "--model",
            None,
            f"{run.label} does not name its model; pass the model the runs served "
            "(known name, Hugging Face id, config.json or checkpoint folder)",
        )
    return spec


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
