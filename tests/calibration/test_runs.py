"""Published runs recorded in a profile: round trip and exact messages for bad records."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stowplan.calibration import (
    PublishedRun,
    calibration_from_json,
    calibration_to_json,
    shipped_calibration,
)
from stowplan.calibration.runs import run_from_dict, run_to_dict
from stowplan.errors import InputError

GOOD: dict[str, Any] = {
    "engine": "vllm",
    "family": "h100-sxm",
    "gpu_name": "NVIDIA H100 80GB HBM3",
    "model": "m",
    "dtype": "bf16",
    "tokens_per_s": 150.0,
    "read_bytes": 16 * 10**9,
    "num_blocks": 32,
    "bandwidth_gbps": 3350.0,
}


def test_a_run_round_trips_and_defaults_to_a_fitted_dense_single_gpu_batch_1_run() -> None:
    run = run_from_dict(GOOD)
    assert run.fitted and not run.moe and run.attention == "gqa"
    assert (run.tensor_parallel, run.expert_parallel, run.hops, run.batch) == (1, 1, 0, 1)
    assert run.num_gpus == 1
    assert run_from_dict(run_to_dict(run)) == run
    assert "held_out_tokens_per_s" not in run_to_dict(run)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"attention": "flash"}, "runs['m'].attention='flash': must be one of gqa, mla"),
        ({"tokens_per_s": 0}, "runs['m'].tokens_per_s=0: must be a finite number > 0"),
        ({"moe": 1}, "runs['m'].moe=1: must be true or false"),
        ({"expert_parallel": 0}, "runs['m'].expert_parallel=0: must be an integer >= 1"),
        ({"speed": 3}, "runs[].speed=3: unknown key; allowed: "),
        ({"family": ""}, "runs['m'].family='': must be a non-empty string"),
    ],
)
def test_bad_run_records_are_named(change: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError) as exc:
        run_from_dict({**GOOD, **change})
    assert str(exc.value).startswith(message)


def test_a_missing_key_and_an_unknown_engine_are_named() -> None:
    bad = {k: v for k, v in GOOD.items() if k != "read_bytes"}
    with pytest.raises(InputError, match=r"runs\[\]\.read_bytes=None: is required"):
        run_from_dict(bad)
    doc = json.loads(calibration_to_json(shipped_calibration("sglang")))
    doc["runs"][0]["engine"] = "exllama"
    with pytest.raises(InputError, match=r"runs\[0\]\.engine='exllama': must be one of generic"):
        calibration_from_json(json.dumps(doc))


def test_shipped_profiles_record_their_runs_with_held_out_predictions() -> None:
    cal = shipped_calibration("vllm")
    assert all(isinstance(r, PublishedRun) for r in cal.runs)
    assert len(cal.fitted_runs) == 10
    assert all(r.held_out_tokens_per_s is not None for r in cal.runs)
    back = calibration_from_json(calibration_to_json(cal))
    assert back == cal
