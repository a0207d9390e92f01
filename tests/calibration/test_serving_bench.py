"""``stowplan calibrate --from-serving-bench``: vLLM / SGLang / trtllm-bench result files.

The two SGLang rows under ``tests/fixtures/serving-bench/`` are real (see its
SOURCES.md); neither is at concurrency 1. Every other input here is
CONSTRUCTED in the test, laid out as the tools' own source writes it
(vllm ``vllm/benchmarks/serve.py`` ``result_json``; TensorRT-LLM
``tensorrt_llm/bench/dataclasses/reporting.py`` ``get_statistics_dict``), with
numbers chosen by the test, not measured.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stowplan.calibration import (
    assumed,
    load_calibration_file,
    parse_serving_bench,
    resolve_calibration,
)
from stowplan.cli import main
from stowplan.errors import InputError
from stowplan.models import resolve_model
from tests.common.paths import FIXTURES

SB = FIXTURES / "serving-bench"
H100_GBPS = 3350.0  # the spec table's H100 SXM peak


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STOWPLAN_HOME", str(tmp_path))
    return tmp_path


def _read_bytes(model: str) -> tuple[int, int]:
    layout = resolve_model(model)
    return sum(layout.block_read_sizes()) + layout.head_params_bytes, layout.num_blocks


def _vllm_result(
    model_id: str, tpot_ms: float, *, max_concurrency: int | None = 1, **extra: object
) -> dict[str, object]:
    """CONSTRUCTED: a `vllm bench serve --save-result` object (key layout from vllm's source)."""
    result: dict[str, object] = {
        "date": "20250101-000000",
        "endpoint_type": "vllm",
        "backend": "vllm",
        "label": None,
        "model_id": model_id,
        "tokenizer_id": model_id,
        "num_prompts": 20,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": max_concurrency,
        "duration": 60.0,
        "completed": 20,
        "failed": 0,
        "mean_ttft_ms": 25.0,
        "median_ttft_ms": 24.0,
        "mean_tpot_ms": tpot_ms * 1.01,
        "median_tpot_ms": tpot_ms,
        "mean_itl_ms": tpot_ms * 1.01,
        "median_itl_ms": tpot_ms * 0.99,
        "max_concurrent_requests": 1 if max_concurrency == 1 else 20,
    }
    result.update(extra)
    return result


def _tpot_ms(model: str, fraction: float, block_s: float, bw_gbps: float, tp: int = 1) -> float:
    """Time per token (ms) of ``model`` on ``tp`` GPUs, without any collective cost."""
    read, blocks = _read_bytes(model)
    return (read / (bw_gbps * 1e9 * tp * fraction) + blocks * block_s) * 1e3


# -- parsing the real fixtures --------------------------------------------------------------


def test_real_sglang_rows_parse_exactly() -> None:
    (c32,) = parse_serving_bench((SB / "sglang_issue12389_c32.jsonl").read_text(), origin="c32")
    assert c32.tool == "sglang"
    assert c32.max_concurrency == 32
    assert c32.request_rate is None  # Infinity: all requests at time 0
    assert c32.requests == 300
    assert c32.median_tpot_ms == 49.45251944893692
    assert c32.mean_tpot_ms == 49.62953782860856
    assert c32.median_itl_ms == 38.86313899420202
    assert c32.mean_concurrency == 30.640292293574856
    assert c32.accept_length is None
    assert c32.time_per_token_s == pytest.approx(0.04945251944893692)
    assert c32.why_not_batch1() == "max_concurrency 32"

    (c16,) = parse_serving_bench((SB / "sglang_issue12389_c16.jsonl").read_text())
    assert c16.max_concurrency == 16
    assert c16.median_tpot_ms == 4.830382395428731
    assert c16.median_itl_ms == 0.0
    assert c16.mean_concurrency == 15.552023523175109
    assert c16.why_not_batch1() == "max_concurrency 16"


def test_both_real_rows_as_one_jsonl_file() -> None:
    text = "".join(
        (SB / f).read_text() for f in ("sglang_issue12389_c32.jsonl", "sglang_issue12389_c16.jsonl")
    )
    runs = parse_serving_bench(text, origin="sweep.jsonl")
    assert [r.max_concurrency for r in runs] == [32, 16]
    assert [r.label for r in runs] == ["sweep.jsonl:1 sglang c32", "sweep.jsonl:2 sglang c16"]


# -- concurrency filtering (constructed runs) ---------------------------------------------


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"max_concurrency": 1}, None),
        ({"max_concurrency": None, "completed": 1, "max_concurrent_requests": None}, None),
        ({"max_concurrency": None, "completed": 50, "max_concurrent_requests": 1}, None),
        ({"max_concurrency": 4, "max_concurrent_requests": 4}, "max_concurrency 4"),
        (
            {"max_concurrency": None, "max_concurrent_requests": 9},
            "max_concurrency not set (request_rate inf)",
        ),
        (
            {"max_concurrency": None, "request_rate": 2.0, "max_concurrent_requests": None},
            "max_concurrency not set (request_rate 2)",
        ),
        (
            {"max_concurrency": 1, "spec_decode_acceptance_length": 2.5},
            "speculative decoding (accept length 2.5)",
        ),
        (
            {
                "max_concurrency": 1,
                "median_tpot_ms": 0.0,
                "mean_tpot_ms": 0.0,
                "median_itl_ms": 0.0,
            },
            "no median/mean TPOT or median ITL > 0 (run it streaming)",
        ),
    ],
)
def test_only_one_request_at_a_time_is_batch1(fields: dict[str, object], why: str | None) -> None:
    obj = _vllm_result("meta-llama/Llama-3.1-8B-Instruct", 7.0)  # CONSTRUCTED
    obj.update(fields)
    (run,) = parse_serving_bench(json.dumps(obj))
    assert run.tool == "vllm"
    assert run.why_not_batch1() == why


def test_time_per_token_falls_back_mean_tpot_then_median_itl() -> None:
    obj = _vllm_result("m", 7.0, median_tpot_ms=None)  # CONSTRUCTED
    (run,) = parse_serving_bench(json.dumps(obj))
    assert run.time_per_token_s == pytest.approx(7.07e-3)
    assert run.time_source == "mean TPOT"
    obj.update(mean_tpot_ms=0.0)
    (run,) = parse_serving_bench(json.dumps(obj))
    assert run.time_per_token_s == pytest.approx(6.93e-3)
    assert run.time_source == "median ITL"


def test_pretty_json_array_and_vllm_append_result_lines() -> None:
    a = _vllm_result("m", 7.0)  # CONSTRUCTED
    b = _vllm_result("m", 9.0, max_concurrency=8)  # CONSTRUCTED
    assert len(parse_serving_bench(json.dumps(a, indent=2))) == 1
    assert len(parse_serving_bench(json.dumps([a, b]))) == 2
    runs = parse_serving_bench(json.dumps(a) + "\n" + json.dumps(b) + "\n")  # --append-result
    assert [r.median_tpot_ms for r in runs] == [7.0, 9.0]


def test_trtllm_bench_report() -> None:
    report = {  # CONSTRUCTED, key layout of trtllm-bench's get_statistics_dict
        "engine": {"model": "meta-llama/Llama-3.1-8B", "backend": "Pytorch", "dtype": "bfloat16"},
        "machine": {"name": "NVIDIA H100 80GB HBM3", "memory.total": 79.1, "clocks.mem": 2.6},
        "world_info": {"tp_size": 2, "pp_size": 1, "max_batch_size": 1, "world_size": 2},
        "request_info": {"num_requests": 10, "avg_num_concurrent_requests": 1.0},
        "performance": {"total_latency_ms": 1000.0},
        "streaming_metrics": {
            "avg_tpot_ms": 4.2,
            "tpot_percentiles": {"p50": 4.1, "p95": 4.5, "average": 4.2},
        },
    }
    (run,) = parse_serving_bench(json.dumps(report))
    assert run.tool == "trtllm"
    assert run.device == "NVIDIA H100 80GB HBM3"
    assert (run.tensor_parallel, run.pipeline_parallel, run.max_batch_size) == (2, 1, 1)
    assert run.time_per_token_s == pytest.approx(4.1e-3)
    assert run.why_not_batch1() is None
    report["world_info"] = {"tp_size": 1, "max_batch_size": 64}
    (run,) = parse_serving_bench(json.dumps(report))
    assert run.why_not_batch1() == "max_concurrency not set (request_rate inf)"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("", "f"),
        ("not json at all", "f"),
        ('{"a": 1}', "f"),
        ("[]", "f"),
        ('{"median_tpot_ms": 5}\n{"median_tpot_ms": ', "f:2"),
        ("[1]", "f[0]"),
    ],
)
def test_parse_errors_name_the_file(text: str, field: str) -> None:
    with pytest.raises(InputError) as exc:
        parse_serving_bench(text, origin="f")
    assert exc.value.field == field


# -- the CLI end to end -----------------------------------------------------------------------


def test_fit_recovers_known_figures_from_two_model_sizes(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One file, two model sizes named by their model_id: the fit splits fraction and block cost.

    The fit's light pull towards the shipped prior (H100 SXM: fraction 0.92) keeps the
    recovered figures a few per cent off the constructed ones, hence the tolerances.
    """
    fraction, block_s = 0.8, 30e-6
    rows = [
        _vllm_result(hf, _tpot_ms(known, fraction, block_s, H100_GBPS))  # CONSTRUCTED
        for hf, known in (
            ("meta-llama/Llama-3.2-1B-Instruct", "llama3.2:1b"),
            ("meta-llama/Llama-3.1-8B-Instruct", "llama3.1:8b"),
        )
    ]
    assert rows[0]["median_tpot_ms"] == pytest.approx(1.4022, rel=1e-3)
    assert rows[1]["median_tpot_ms"] == pytest.approx(6.5608, rel=1e-3)
    f = tmp_path / "two-sizes.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc = main(["calibrate", "--from-serving-bench", str(f), "--device", "H100 SXM"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "llama3.2:1b" in out and "llama3.1:8b" in out
    (entry,) = load_calibration_file(home / "calibration" / "vllm.json").devices
    assert entry.fraction("bf16").value == pytest.approx(fraction, rel=0.05)
    assert entry.block_overhead_s.value == pytest.approx(block_s, rel=0.15)
    assert entry.compute_efficiency.provenance.value == "assumed"
    assert "of llama3.1:8b, llama3.2:1b in two-sizes.jsonl" in entry.block_overhead_s.source


def test_cli_fits_only_the_concurrency1_run_of_a_sweep(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sweep file of one model at several concurrencies: only c=1 is fitted, the rest noted."""
    fraction, block_s = 0.8, 25e-6
    model = "meta-llama/Llama-3.1-8B-Instruct"
    rows = [  # CONSTRUCTED
        _vllm_result(model, _tpot_ms("llama3.1:8b", fraction, block_s, H100_GBPS)),
        _vllm_result(model, 9.9, max_concurrency=8),
        _vllm_result(model, 12.5, max_concurrency=32),
    ]
    f = tmp_path / "sweep.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc = main(
        ["calibrate", "--from-serving-bench", str(f), "--model", model, "--device", "H100 SXM"]
    )
    captured = capsys.readouterr()
    assert rc == 0
    notes = [ln for ln in captured.err.splitlines() if ln.startswith("note:")]
    assert len(notes) == 3
    assert "sweep.jsonl:2 vllm c8 left out of the fit (max_concurrency 8)" in notes[0]
    assert "(max_concurrency 32)" in notes[1]
    # vLLM's result file does not record the tensor-parallel size: the fit says what it assumed.
    assert "sweep.jsonl:1 vllm c1 do(es) not say how many GPUs served it" in notes[2]
    assert "key h100-sxm" in captured.out
    assert "`stowplan plan --engine vllm` uses it" in captured.out
    written = home / "calibration" / "vllm.json"
    (entry,) = load_calibration_file(written).devices
    assert entry.device == "h100-sxm"
    assert entry.fraction("bf16").provenance.value == "fitted"
    assert "concurrency-1 serving runs (vllm) of llama3.1:8b in sweep.jsonl" in (
        entry.fraction("bf16").source
    )
    # The single run is explained exactly; plans with --engine vllm now use the fit.
    used = resolve_calibration("vllm").for_device("H100 SXM")
    assert used == entry
    t = 1 / (
        _read_bytes("llama3.1:8b")[0] / (H100_GBPS * 1e9 * entry.fraction("bf16").value)
        + 32 * entry.block_overhead_s.value
    )
    assert t == pytest.approx(1e3 / rows[0]["median_tpot_ms"], rel=1e-3)  # type: ignore[operator]


def test_cli_tensor_parallel_runs_recover_fraction_and_block_cost(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """TP2 runs of two sizes: the GPUs' bandwidths add up and every block pays the collective.

    With only tensor-parallel runs the collective cannot be told from the block cost, so it
    keeps the profile's figure (said in a note) and the fit recovers the rest exactly.
    """
    from stowplan.calibration import shipped_calibration

    prior = shipped_calibration("trtllm").for_device("H100 SXM")
    assert prior is not None
    coll = prior.collective_overhead_s.value
    fraction, block_s = 0.7, 40e-6
    rows = []
    for hf, known in (
        ("meta-llama/Llama-3.2-1B-Instruct", "llama3.2:1b"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama3.1:8b"),
    ):
        _, blocks = _read_bytes(known)
        tpot = _tpot_ms(known, fraction, block_s, H100_GBPS, tp=2) + blocks * coll * 1e3
        rows.append(_vllm_result(hf, tpot))  # CONSTRUCTED
    f = tmp_path / "tp2.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["calibrate", "--from-serving-bench", str(f), "--device", "H100 SXM", "--gpus", "2"]
    assert main([*args, "--engine", "trtllm"]) == 0
    err = capsys.readouterr().err
    assert "note: every run is tensor parallel" in err
    (entry,) = load_calibration_file(home / "calibration" / "trtllm.json").devices
    assert entry.collective_overhead_s == assumed(prior.collective_overhead_s)
    assert entry.fraction("bf16").value == pytest.approx(fraction, rel=0.05)
    assert entry.block_overhead_s.value == pytest.approx(block_s, rel=0.15)
    # Read as one GPU (no --gpus) the same runs would claim twice the bandwidth.
    f1 = tmp_path / "tp1.jsonl"
    f1.write_text(f.read_text())
    assert main(["calibrate", "--from-serving-bench", str(f1), "--device", "H100 SXM",
                 "--engine", "trtllm", "--out", str(tmp_path / "one.json")]) == 0  # fmt: skip
    (one,) = load_calibration_file(tmp_path / "one.json").devices
    assert one.fraction("bf16").value == 1.0  # capped: a GPU never beats its peak


def test_cli_trtllm_report_names_device_and_defaults_to_trtllm(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = {  # CONSTRUCTED
        "engine": {"model": "meta-llama/Llama-3.1-8B"},
        "machine": {"name": "NVIDIA H100 80GB HBM3"},
        "world_info": {"tp_size": 1, "pp_size": 1, "max_batch_size": 1},
        "request_info": {"num_requests": 10},
        "streaming_metrics": {"avg_tpot_ms": 7.1, "tpot_percentiles": {"p50": 7.0}},
    }
    f = tmp_path / "report.json"
    f.write_text(json.dumps(report))
    rc = main(["calibrate", "--from-serving-bench", str(f), "--model", "llama3.1:8b"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "device 'NVIDIA H100 80GB HBM3'" in out
    assert (home / "calibration" / "trtllm.json").is_file()
    # --gpus counts every GPU of the run: with two pipeline stages it must split evenly.
    report["world_info"] = {"tp_size": 2, "pp_size": 2, "max_batch_size": 1}
    f.write_text(json.dumps(report))
    args = ["calibrate", "--from-serving-bench", str(f), "--model", "llama3.1:8b"]
    assert main([*args, "--gpus", "3"]) == 2
    assert "--gpus=3: must be a multiple of" in capsys.readouterr().err
    assert main([*args, "--gpus", "4", "--json"]) == 0
    fitted = json.loads(capsys.readouterr().out)["devices"][0]
    assert fitted["hop_overhead_s"]["provenance"] == "fitted"  # pp 2: one stage hop


def test_cli_model_from_a_config_json(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = FIXTURES / "hf-configs" / "Llama-3.2-1B.json"
    f = tmp_path / "r.json"
    f.write_text(json.dumps(_vllm_result("meta-llama/Llama-3.2-1B", 1.9)))  # CONSTRUCTED
    rc = main(
        [
            "calibrate",
            "--from-serving-bench",
            str(f),
            "--model",
            str(config),
            "--device",
            "H100 SXM",
        ]
    )
    assert rc == 0
    assert "Llama-3.2-1B" in capsys.readouterr().out


def test_cli_real_file_without_concurrency1_run_is_one_line_error(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        [
            "calibrate",
            "--from-serving-bench",
            str(SB / "sglang_issue12389_c32.jsonl"),
            "--model",
            "qwen2.5:7b",
            "--device",
            "H100 SXM",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 2
    (note,) = [ln for ln in captured.err.splitlines() if ln.startswith("note:")]
    assert "sglang c32 left out of the fit (max_concurrency 32)" in note
    (error,) = [ln for ln in captured.err.splitlines() if ln.startswith("stowplan: error:")]
    assert error.startswith("stowplan: error: max_concurrency='32': ")
    assert "accepted: max_concurrency 1" in error
    assert not (home / "calibration" / "vllm.json").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model", "/no/such/config.json"], "MODEL='/no/such/config.json': does not exist"),
        (["--model", "no-such-model"], "MODEL='no-such-model': is not a known model"),
        (["--model", "llama3.1:8b"], "--device=None: the benchmark results do not name the GPU"),
        (
            ["--model", "llama3.1:8b", "--device", "Imaginary GPU 9000"],
            "--bandwidth-gbps=None: no spec bandwidth known for 'Imaginary GPU 9000'",
        ),
        (["--model", "llama3.1:8b", "--gpus", "0"], "--gpus=0: must be >= 1"),
        (["--model", "llama3.1:8b", "--blocks", "0"], "--blocks=0: must be >= 1"),
        (
            ["--model", "llama3.1:8b", "--bandwidth-gbps", "0"],
            "--bandwidth-gbps=0.0: must be a finite number > 0",
        ),
        (["--model", "llama3.1:8b", "--engine", "ollama"], "--engine='ollama': must be one of"),
        (
            ["--model", "llama3.1:8b", "--from-probe"],
            "fit from one source at a time",
        ),
    ],
)
def test_cli_errors_are_one_line_exit_2(
    home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    expected: str,
) -> None:
    f = tmp_path / "r.json"
    f.write_text(json.dumps(_vllm_result("m", 7.0)))  # CONSTRUCTED
    rc = main(["calibrate", "--from-serving-bench", str(f), *args])
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert expected in lines[0]


def test_cli_missing_file_is_an_input_error(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["calibrate", "--from-serving-bench", "/no/such/file.json", "--model", "llama3.1:8b"])
    assert rc == 2
    assert "--from-serving-bench" in capsys.readouterr().err


def test_cli_an_sglang_file_fits_the_sglang_profile(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # CONSTRUCTED: the real issue #12389 row with max_concurrency set to 1 (its TPOT kept).
    row = json.loads((SB / "sglang_issue12389_c32.jsonl").read_text().replace("Infinity", "1"))
    row["max_concurrency"] = 1
    f = home / "c1.jsonl"
    f.write_text(json.dumps(row) + "\n")
    args = ["calibrate", "--from-serving-bench", str(f), "--model", "qwen2.5:7b"]
    assert main([*args, "--device", "H100 SXM"]) == 0
    assert "`stowplan plan --engine sglang` uses it" in capsys.readouterr().out
    assert (home / "calibration" / "sglang.json").is_file()
    assert not (home / "calibration" / "vllm.json").exists()
