"""Calibrated decode-speed predictions: profiles, their application, fits from measurements.

* :mod:`.profile` — the :class:`Calibration` / :class:`DeviceCalibration` types and JSON.
* :mod:`.apply` — one stage's calibrated time (what :mod:`stowplan.cost` calls).
* :mod:`.fit` — least-squares fit of a device's figures from decode runs.
* :mod:`.llama_bench` — parser of ``llama-bench`` output.
* :mod:`.serving_bench` — parser of vLLM / SGLang / TensorRT-LLM serving-benchmark results.
* :mod:`.store` — the shipped profiles (``data/*.json``) and the user's fitted ones.
"""

from __future__ import annotations

from stowplan.calibration.apply import (
    NodeCalibration,
    StageEstimate,
    calibrate_stage,
    describe_calibration,
    node_calibration,
    stage_time_s,
)
from stowplan.calibration.fit import FitResult, Measurement, fit_device
from stowplan.calibration.llama_bench import (
    LlamaBenchResult,
    estimate_num_blocks,
    parse_llama_bench,
    partial_offload,
)
from stowplan.calibration.profile import (
    CALIBRATION_SCHEMA_VERSION,
    MAX_BANDWIDTH_FRACTION,
    Calibration,
    DeviceCalibration,
    Engine,
    Figure,
    Provenance,
    calibration_from_dict,
    calibration_from_json,
    calibration_to_dict,
    calibration_to_json,
    dtype_class,
    normalise_gpu_name,
)
from stowplan.calibration.serving_bench import (
    ServingBenchResult,
    parse_serving_bench,
)
from stowplan.calibration.store import (
    load_calibration_file,
    resolve_calibration,
    shipped_calibration,
    user_calibration_path,
    write_calibration,
)

__all__ = [
    "CALIBRATION_SCHEMA_VERSION",
    "MAX_BANDWIDTH_FRACTION",
    "Calibration",
    "DeviceCalibration",
    "Engine",
    "Figure",
    "FitResult",
    "LlamaBenchResult",
    "Measurement",
    "NodeCalibration",
    "Provenance",
    "ServingBenchResult",
    "StageEstimate",
    "calibrate_stage",
    "calibration_from_dict",
    "calibration_from_json",
    "calibration_to_dict",
    "calibration_to_json",
    "describe_calibration",
    "dtype_class",
    "estimate_num_blocks",
    "fit_device",
    "load_calibration_file",
    "node_calibration",
    "normalise_gpu_name",
    "parse_llama_bench",
    "parse_serving_bench",
    "partial_offload",
    "resolve_calibration",
    "shipped_calibration",
    "stage_time_s",
    "user_calibration_path",
    "write_calibration",
]
