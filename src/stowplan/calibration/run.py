"""One calibration run: read the request's source, fit or measure, merge into a profile, save.

:func:`calibrate` is what ``stowplan calibrate`` calls; the CLI only parses its
options into a :class:`~stowplan.calibration.request.CalibrationRequest` and
renders the :class:`~stowplan.calibration.request.CalibrationOutcome`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from stowplan.calibration.merge import fit_on_profile, save_entries
from stowplan.calibration.probe import PassportReading, probe_entries
from stowplan.calibration.profile import Engine
from stowplan.calibration.request import CalibrationOutcome, CalibrationRequest, DeviceFit
from stowplan.calibration.sources import llama_bench_runs, serving_bench_runs
from stowplan.calibration.store import resolve_calibration, user_calibration_path
from stowplan.errors import InputError
from stowplan.quantities.checks import check_choice

__all__ = ["PassportReader", "calibrate"]

PassportReader = Callable[[Path | None], PassportReading]
"""Reads the hardware passport at a path (None: the cached one); raises
:class:`~stowplan.errors.InputError` (field ``--passport``) when there is none
or it cannot be used."""


def _ignore(note: str) -> None:
    """The default note sink: notes are still returned in the outcome."""


def calibrate(
    request: CalibrationRequest,
    *,
    on_note: Callable[[str], None] = _ignore,
    read_passport: PassportReader | None = None,
) -> CalibrationOutcome:
    """Fit or measure one device's calibration and save it into the engine's profile file.

    The source is ``request.serving_bench`` (its concurrency-1 runs),
    ``request.probe`` (one measured entry per circuit of the passport that
    ``read_passport`` returns) or ``request.llama_bench`` (its full-GPU
    token-generation runs).  A fit's prior is the engine's current profile
    (:func:`~stowplan.calibration.store.resolve_calibration`).  The new
    entries go in front of the devices already in the file written:
    ``request.out``, else the user's profile of the engine, which every later
    plan with that engine reads.  Every note (a run left out, an assumption
    made) is passed to ``on_note`` as it arises and returned in the outcome.

    Raises:
        InputError: naming the ``stowplan calibrate`` option (or the file's
            field) at fault: no or two sources, an unreadable or unusable
            file, a device or bandwidth that cannot be settled, an unknown
            engine or model, a probe without a ``read_passport``, or an
            output file that cannot be written.
    """
    notes: list[str] = []

    def note(text: str) -> None:
        notes.append(text)
        on_note(text)

    if request.probe:
        eng = check_choice("--engine", request.engine or Engine.LLAMACPP.value, Engine)
        target = request.out if request.out is not None else user_calibration_path(eng)
        prior = resolve_calibration(eng)
        if read_passport is None:
            raise InputError(
                "--from-probe",
                True,
                "needs the host probe (stowplan.host), which this build does not include; "
                "use --from-llama-bench FILE",
            )
        entries = probe_entries(read_passport(request.passport), prior)
        fit = None
    else:
        runs = (
            serving_bench_runs(request, on_note=note)
            if request.serving_bench is not None
            else llama_bench_runs(request, on_note=note)
        )
        eng = runs.engine
        target = request.out if request.out is not None else user_calibration_path(eng)
        result = fit_on_profile(
            runs.measurements,
            device_name=runs.device_name,
            bandwidth_gbps=runs.bandwidth_gbps,
            engine=eng,
            source=runs.source,
            on_note=note,
        )
        entries = (result.device,)
        fit = DeviceFit(
            device_name=runs.device_name,
            bandwidth_gbps=runs.bandwidth_gbps,
            measurements=runs.measurements,
            result=result,
        )
    profile = save_entries(entries, eng, target)
    return CalibrationOutcome(
        engine=eng,
        entries=entries,
        fit=fit,
        profile=profile,
        target=target,
        default_target=request.out is None,
        notes=tuple(notes),
    )
