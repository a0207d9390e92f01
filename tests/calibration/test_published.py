"""The published decode set: every run sourced, and the calibrated model's leave-one-out
error within the issue's 20 % per GPU family where the first-order model is not."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("calibration_bench", BENCH / "calibration.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


RUNS: list[dict[str, object]] = json.loads((BENCH / "published_decode.json").read_text())["runs"]


@pytest.mark.parametrize("run", RUNS, ids=lambda r: f"{r['family']}-{r['model']}-{r['dtype']}")
def test_every_published_run_names_its_source_and_its_bandwidth_source(
    run: dict[str, object],
) -> None:
    for key in ("source", "bandwidth_source", "gpu_name", "model", "dtype", "engine"):
        assert isinstance(run[key], str) and run[key], key
    assert float(run["tokens_per_s"]) > 0  # type: ignore[arg-type]
    assert int(run["read_bytes"]) > 0  # type: ignore[call-overload]
    assert int(run["num_blocks"]) > 0  # type: ignore[call-overload]
    assert int(run["hops"]) == int(run["num_gpus"]) - 1  # type: ignore[call-overload]


def test_vllm_runs_derive_tokens_per_s_from_the_published_time_per_output_token() -> None:
    vllm = [r for r in RUNS if r["engine"] == "vllm"]
    assert vllm
    for r in vllm:
        assert float(r["tokens_per_s"]) == 1 / float(r["tpot_s"])  # type: ignore[arg-type]


def test_calibrated_median_error_per_family_is_within_20_percent_and_first_order_is_not() -> None:
    table = _bench().published_table(RUNS)
    rows = [line for line in table if line.startswith("| ") and "%" in line]
    assert len(rows) >= 13
    cal_by_row = {}
    first_all = cal_all = None
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        first, cal = (float(re.sub("%", "", c)) for c in cells[2:4])
        if cells[0] == "**all**":
            first_all, cal_all = first, cal
        else:
            cal_by_row[cells[0]] = cal
    assert max(cal_by_row.values()) <= 20, cal_by_row
    assert first_all is not None and cal_all is not None
    assert first_all > 20 >= cal_all


def test_engine_table_reports_first_order_and_the_shipped_vllm_profile_for_the_vllm_run() -> None:
    rows = _bench().engine_table(RUNS)
    vllm = [line for line in rows if line.startswith("| vllm |")]
    assert len(vllm) == 1
    cells = [c.strip() for c in vllm[0].strip("|").split("|")]
    measured, first, shipped = float(cells[3]), float(cells[4]), float(cells[6])
    assert measured == pytest.approx(45.7, abs=0.05)
    # Weights / peak over-predicts; the shipped profile's 0.8 fraction and block cost under-predict.
    assert first > measured > shipped
    assert abs(first - measured) / measured < 0.2
    assert abs(shipped - measured) / measured < 0.2
