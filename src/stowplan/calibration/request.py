"""The value objects of one calibration run: what to fit from, and what came of it.

:class:`CalibrationRequest` names one source (llama-bench output, a
serving-benchmark result file or the host probe's passport) and the figures
the source may lack; it is checked when built.  :class:`CalibrationOutcome`
is what :func:`stowplan.calibration.calibrate` returns: the entries it
measured or fitted, the whole profile written and where.  Field names follow
the ``stowplan calibrate`` options, and so do the fields errors name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stowplan.calibration.fit import FitResult, Measurement
from stowplan.calibration.profile import Calibration, DeviceCalibration, Engine
from stowplan.errors import InputError
from stowplan.files.fileio import check_output_file
from stowplan.quantities.checks import check_number

__all__ = ["CalibrationOutcome", "CalibrationRequest", "DeviceFit"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationRequest:
    """What to calibrate from; at most one of ``llama_bench``, ``serving_bench``, ``probe``.

    Raises :class:`~stowplan.errors.InputError` when built with a count below 1,
    a bandwidth that is not a positive number, an ``out`` path that cannot be
    written, or two sources.  Without any source, :func:`calibrate` asks for
    llama-bench output.
    """

    llama_bench: Path | None = None
    """llama-bench output: markdown, CSV, JSON or JSONL."""
    serving_bench: Path | None = None
    """vllm bench serve / sglang.bench_serving / trtllm-bench result file; runs at
    concurrency 1 are fitted."""
    probe: bool = False
    """Use the host probe's measured matrix (from the hardware passport)."""
    passport: Path | None = None
    """Hardware passport for ``probe`` (default: the cached one)."""
    model: str | None = None
    """Model the serving benchmark ran: known name, HF id, config.json or checkpoint
    (default: the model each run names)."""
    device: str | None = None
    """GPU name, e.g. ``RTX 4090`` (default: the one the file names)."""
    bandwidth_gbps: float | None = None
    """Peak memory bandwidth in GB/s (default: the GPU spec table's)."""
    blocks: int | None = None
    """Blocks of the benchmarked model (default: estimated, or the model's)."""
    gpus: int | None = None
    """GPUs each run used (default: what the file says, else 1)."""
    engine: str | None = None
    """Engine whose profile is fitted (default: llamacpp; for a serving benchmark the
    tool that wrote the file: vllm, sglang or trtllm)."""
    out: Path | None = None
    """Profile file to write (default: the user's profile of the engine)."""

    def __post_init__(self) -> None:
        if self.gpus is not None and self.gpus < 1:
            raise InputError("--gpus", self.gpus, "must be >= 1")
        if self.blocks is not None and self.blocks < 1:
            raise InputError("--blocks", self.blocks, "must be >= 1")
        if self.bandwidth_gbps is not None:
            check_number("--bandwidth-gbps", self.bandwidth_gbps, positive=True)
        if self.out is not None:
            check_output_file(self.out, field="--out")
        if self.llama_bench is not None and self.probe:
            raise InputError(
                "--from-llama-bench",
                str(self.llama_bench),
                "fit from one source at a time (not with --from-probe)",
            )
        if self.serving_bench is not None and (self.llama_bench is not None or self.probe):
            raise InputError(
                "--from-serving-bench",
                str(self.serving_bench),
                "fit from one source at a time (not with --from-llama-bench / --from-probe)",
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceFit:
    """One device fitted to benchmark runs, and how well the fit explains them."""

    device_name: str
    """The GPU as given or as the file names it."""
    bandwidth_gbps: float
    """The datasheet peak the fractions are relative to (GB/s)."""
    measurements: tuple[Measurement, ...]
    """The runs fitted, in file order."""
    result: FitResult
    """The fitted entry, and each run's predicted tokens/s and relative error."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationOutcome:
    """What a calibration run measured or fitted, and the profile it wrote."""

    engine: Engine
    entries: tuple[DeviceCalibration, ...]
    """The device entries this run produced (one per probed circuit, or the fitted one)."""
    fit: DeviceFit | None
    """The fit behind the entry; None for entries measured by the host probe."""
    profile: Calibration
    """The whole profile written: these entries in front of the file's other devices."""
    target: Path
    """The file written."""
    default_target: bool
    """Whether ``target`` is the engine's default profile (no ``out`` given)."""
    notes: tuple[str, ...] = ()
    """What the run left out or assumed, one sentence each, in the order they arose."""
