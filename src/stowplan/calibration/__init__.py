"""Calibrated decode-speed predictions: profiles, their application, fits from measurements.

* :mod:`.profile` — the :class:`Calibration` / :class:`DeviceCalibration` types and JSON.
* :mod:`.apply` — one stage's calibrated time (what :mod:`stowplan.cost` calls).
* :mod:`.fit` — least-squares fit of a device's figures from decode runs.
* :mod:`.llama_bench` — parser of ``llama-bench`` output.
* :mod:`.serving_bench` — parser of vLLM / SGLang / TensorRT-LLM serving-benchmark results.
* :mod:`.store` — the shipped profiles (``data/*.json``) and the user's fitted ones.
* :mod:`.run` — :func:`calibrate`, one calibration run (what ``stowplan calibrate`` calls),
  with its value objects in :mod:`.request`.
* :mod:`.sources` — decode measurements from llama-bench or serving-benchmark files.
* :mod:`.probe` — device entries from the host probe's passport.
* :mod:`.merge` — a fit on top of an engine's profile; new entries merged into a profile file.
* :mod:`.device` — a device's profile key and its datasheet peak bandwidth.
* :mod:`.runs` — the published runs a shipped profile was fitted to, recorded in it.
* :mod:`.coverage` — whether a plan lies inside a profile's runs, and the range to expect
  when it does not.
* :mod:`.prefill` — the prefill compute per device and engine, fitted from published
  prompt-processing runs (``data/prefill_runs.json``), with its range outside them.
"""

from __future__ import annotations

from stowplan.calibration.apply import (
    FIRST_ORDER_LABEL,
    NodeCalibration,
    StageEstimate,
    calibrate_stage,
    calibration_label,
    describe_calibration,
    node_calibration,
    stage_time_s,
)
from stowplan.calibration.coverage import (
    MIN_NEAREST_RUNS,
    Coverage,
    CoverageVerdict,
    PlanKind,
    assess_coverage,
    plan_kind,
    profile_coverage,
    run_ratio,
)
from stowplan.calibration.device import device_key, peak_bandwidth_gbps
from stowplan.calibration.fit import FitResult, Measurement, fit_device
from stowplan.calibration.llama_bench import (
    LlamaBenchResult,
    estimate_num_blocks,
    parse_llama_bench,
    partial_offload,
)
from stowplan.calibration.merge import fit_on_profile, merge_entries, save_entries
from stowplan.calibration.probe import PassportReading, probe_entries
from stowplan.calibration.profile import (
    CALIBRATION_SCHEMA_VERSION,
    MAX_BANDWIDTH_FRACTION,
    Calibration,
    DeviceCalibration,
    Engine,
    Figure,
    Provenance,
    assumed,
    calibration_from_dict,
    calibration_from_json,
    calibration_to_dict,
    calibration_to_json,
    dtype_class,
    normalise_gpu_name,
)
from stowplan.calibration.request import CalibrationOutcome, CalibrationRequest, DeviceFit
from stowplan.calibration.run import PassportReader, calibrate
from stowplan.calibration.runs import PublishedRun
from stowplan.calibration.serving_bench import (
    ServingBenchResult,
    parse_serving_bench,
)
from stowplan.calibration.sources import DecodeRuns, llama_bench_runs, serving_bench_runs
from stowplan.calibration.store import (
    load_calibration_file,
    resolve_calibration,
    shipped_calibration,
    user_calibration_path,
    write_calibration,
)

__all__ = [
    "CALIBRATION_SCHEMA_VERSION",
    "FIRST_ORDER_LABEL",
    "MAX_BANDWIDTH_FRACTION",
    "MIN_NEAREST_RUNS",
    "Calibration",
    "CalibrationOutcome",
    "CalibrationRequest",
    "Coverage",
    "CoverageVerdict",
    "DecodeRuns",
    "DeviceCalibration",
    "DeviceFit",
    "Engine",
    "Figure",
    "FitResult",
    "LlamaBenchResult",
    "Measurement",
    "NodeCalibration",
    "PassportReader",
    "PassportReading",
    "PlanKind",
    "Provenance",
    "PublishedRun",
    "ServingBenchResult",
    "StageEstimate",
    "assess_coverage",
    "assumed",
    "calibrate",
    "calibrate_stage",
    "calibration_from_dict",
    "calibration_from_json",
    "calibration_label",
    "calibration_to_dict",
    "calibration_to_json",
    "describe_calibration",
    "device_key",
    "dtype_class",
    "estimate_num_blocks",
    "fit_device",
    "fit_on_profile",
    "llama_bench_runs",
    "load_calibration_file",
    "merge_entries",
    "node_calibration",
    "normalise_gpu_name",
    "parse_llama_bench",
    "parse_serving_bench",
    "partial_offload",
    "peak_bandwidth_gbps",
    "plan_kind",
    "probe_entries",
    "profile_coverage",
    "resolve_calibration",
    "run_ratio",
    "save_entries",
    "serving_bench_runs",
    "shipped_calibration",
    "stage_time_s",
    "user_calibration_path",
    "write_calibration",
]
