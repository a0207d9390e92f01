"""Decode measurements read from benchmark files by the library, without the CLI.

The llama-bench files are the real fixtures under ``tests/fixtures/llama-bench/``
(see SOURCES.md); the serving-benchmark rows are CONSTRUCTED here in vLLM's
``--save-result`` layout, with numbers chosen by the test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stowplan.calibration import (
    CalibrationRequest,
    Engine,
    llama_bench_runs,
    serving_bench_runs,
)
from stowplan.errors import InputError
from stowplan.models import resolve_model

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
LB = FIXTURES / "llama-bench"
GIB = 2**30


def _vllm_row(model_id: str, tpot_ms: float, max_concurrency: int = 1) -> str:
    """CONSTRUCTED: one `vllm bench serve --save-result` line (keys from vllm's source)."""
    row = {
        "backend": "vllm",
        "model_id": model_id,
        "request_rate": "inf",
        "max_concurrency": max_concurrency,
        "completed": 20,
        "median_tpot_ms": tpot_ms,
        "mean_tpot_ms": tpot_ms,
        "median_itl_ms": tpot_ms,
        "max_concurrent_requests": max_concurrency,
    }
    return json.dumps(row) + "\n"


def test_the_rtx_4080_json_gives_its_one_tg128_run_with_the_spec_peak() -> None:
    notes: list[str] = []
    runs = llama_bench_runs(
        CalibrationRequest(llama_bench=LB / "readme_rtx4080.json"), on_note=notes.append
    )
    assert (runs.engine, runs.device_name, runs.bandwidth_gbps) == (
        Engine.LLAMACPP,
        "NVIDIA GeForce RTX 4080",
        716.8,
    )
    (m,) = runs.measurements
    assert (m.tokens_per_s, m.read_bytes, m.num_blocks, m.dtype) == (
        118.881588,
        4_677_120_000,
        28,  # estimated from 7.6 B parameters
        "Q4_K_M",
    )
    assert (m.hops, m.tensor_parallel) == (0, 1)
    assert runs.source == "fitted to 1 llama-bench runs in readme_rtx4080.json"
    assert notes == []


def test_llama_bench_gpus_split_by_layer_become_stage_hops() -> None:
    request = CalibrationRequest(
        llama_bench=LB / "readme_cuda_tg_models.md",
        device="RTX 4090",
        gpus=2,
        engine="vllm",
    )
    runs = llama_bench_runs(request, on_note=lambda _: None)
    assert runs.engine is Engine.VLLM and runs.bandwidth_gbps == 1008
    assert [m.tokens_per_s for m in runs.measurements] == [
        132.19,
        129.37,
        123.83,
        82.17,
        80.74,
        78.08,
    ]
    assert [m.num_blocks for m in runs.measurements] == [32] * 3 + [40] * 3
    assert runs.measurements[0].read_bytes == round(3.56 * GIB)
    assert runs.measurements[3].read_bytes == round(6.86 * GIB)
    assert {(m.hops, m.tensor_parallel) for m in runs.measurements} == {(1, 1)}


def test_cpu_and_partial_offload_runs_are_left_out_with_a_note_each(tmp_path: Path) -> None:
    lines = (LB / "readme_cuda_tg_models.md").read_text().splitlines()
    lines[7] = lines[7].replace("|  -1 |", "|   0 |")  # 13B tg128 on the CPU
    lines[8] = lines[8].replace("|  -1 |", "|  20 |")  # 13B tg256: 20 of 40 blocks
    table = tmp_path / "mixed.md"
    table.write_text("\n".join(lines) + "\n")
    notes: list[str] = []
    runs = llama_bench_runs(
        CalibrationRequest(llama_bench=table, device="RTX 4090", bandwidth_gbps=1000.0),
        on_note=notes.append,
    )
    assert [m.label for m in runs.measurements] == [
        "llama 7B mostly Q4_0 tg128",
        "llama 7B mostly Q4_0 tg256",
        "llama 7B mostly Q4_0 tg512",
        "llama 13B mostly Q4_0 tg512",
    ]
    assert runs.bandwidth_gbps == 1000.0
    assert notes == [
        "llama 13B mostly Q4_0 tg128 left out of the GPU fit (ngl 0: ran on the CPU); "
        "benchmark with -ngl 99 to fit the GPU",
        "llama 13B mostly Q4_0 tg256 left out of the GPU fit (ngl 20 < 40 layers: "
        "partial offload); benchmark with -ngl 99 to fit the GPU",
    ]


@pytest.mark.parametrize(
    ("request_fields", "field", "rule"),
    [
        ({}, "--from-llama-bench", "give llama-bench output (or --from-probe) to fit from"),
        (
            {"llama_bench": LB / "pr4766_rtx4090_cuda.md"},
            "--device",
            "the llama-bench output does not name the GPU; pass e.g. --device 'RTX 4090'",
        ),
        (
            {"llama_bench": LB / "readme_rtx4080.json", "device": "Imaginary 9000"},
            "--bandwidth-gbps",
            "no spec bandwidth known for 'Imaginary 9000'; pass it in GB/s",
        ),
        (
            {"llama_bench": LB / "readme_rtx4080.json", "engine": "ollama"},
            "--engine",
            "must be one of generic, llamacpp, vllm, trtllm, sglang, transformers",
        ),
    ],
)
def test_llama_bench_errors_name_the_option(
    request_fields: dict[str, object], field: str, rule: str
) -> None:
    with pytest.raises(InputError) as exc:
        llama_bench_runs(CalibrationRequest(**request_fields), on_note=lambda _: None)  # type: ignore[arg-type]
    assert (exc.value.field, exc.value.rule) == (field, rule)


def test_a_serving_run_reads_its_models_weights_once_per_token(tmp_path: Path) -> None:
    f = tmp_path / "runs.jsonl"
    f.write_text(
        _vllm_row("meta-llama/Llama-3.1-8B-Instruct", 6.25)
        + _vllm_row("meta-llama/Llama-3.1-8B-Instruct", 9.9, max_concurrency=8)
    )
    notes: list[str] = []
    runs = serving_bench_runs(
        CalibrationRequest(serving_bench=f, device="H100 SXM"), on_note=notes.append
    )
    layout = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    (m,) = runs.measurements
    assert runs.engine is Engine.VLLM and runs.bandwidth_gbps == 3350.0
    assert m.tokens_per_s == pytest.approx(160.0)  # 1000 ms / 6.25 ms
    assert m.read_bytes == sum(layout.block_read_sizes()) + layout.head_params_bytes
    assert (m.num_blocks, m.dtype, m.hops, m.tensor_parallel) == (32, "bf16", 0, 1)
    assert runs.source == (
        "fitted to 1 concurrency-1 serving runs (vllm) of llama3.1:8b in runs.jsonl"
    )
    assert notes == [
        "runs.jsonl:2 vllm c8 left out of the fit (max_concurrency 8); it is a batch-1 decode "
        "measurement only at concurrency 1: benchmark with --max-concurrency 1",
        "runs.jsonl:1 vllm c1 do(es) not say how many GPUs served it; fitted as one GPU "
        "(pass --gpus N for a tensor-parallel run)",
    ]


def test_serving_gpus_split_tensor_parallel_and_the_block_count_can_be_given(
    tmp_path: Path,
) -> None:
    f = tmp_path / "tp.json"
    f.write_text(_vllm_row("acme/unnamed", 5.0))
    notes: list[str] = []
    request = CalibrationRequest(
        serving_bench=f,
        model="llama3.2:1b",
        device="H100 SXM",
        gpus=4,
        blocks=20,
        bandwidth_gbps=3000.0,
        engine="sglang",
    )
    runs = serving_bench_runs(request, on_note=notes.append)
    (m,) = runs.measurements
    assert (runs.engine, runs.bandwidth_gbps) == (Engine.SGLANG, 3000.0)
    assert (m.tokens_per_s, m.num_blocks, m.tensor_parallel, m.hops) == (200.0, 20, 4, 0)
    assert notes == []


@pytest.mark.parametrize(
    ("rows", "model", "field", "rule_start"),
    [
        ([("m", 7.0, 8)], None, "max_concurrency", "r.jsonl has no run that served one request"),
        ([("", 7.0, 1)], None, "--model", "r.jsonl vllm c1 does not name its model"),
        ([("acme/x", 7.0, 1)], None, "--model", "the runs name the model 'acme/x', which is"),
        ([("m", 7.0, 1)], "llama3.1:8b", "--device", "the benchmark results do not name the GPU"),
    ],
)
def test_serving_errors_name_the_option(
    tmp_path: Path,
    rows: list[tuple[str, float, int]],
    model: str | None,
    field: str,
    rule_start: str,
) -> None:
    f = tmp_path / "r.jsonl"
    f.write_text("".join(_vllm_row(*r) for r in rows))
    with pytest.raises(InputError) as exc:
        serving_bench_runs(CalibrationRequest(serving_bench=f, model=model), on_note=lambda _: None)
    assert exc.value.field == field
    assert exc.value.rule.startswith(rule_start)
