"""Fit a device on top of an engine's profile and merge new device entries into a profile file.

* :func:`fit_on_profile` — least-squares fit of one device, its prior taken from the
  engine's profile (the user's fitted devices in front of the shipped ones).
* :func:`merge_entries` — new entries in front of an existing profile (pure).
* :func:`save_entries` — :func:`merge_entries` into the profile file at a path, written
  atomically; the file's other devices are kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from stowplan.calibration.device import device_key, device_match
from stowplan.calibration.fit import FitResult, Measurement, fit_device
from stowplan.calibration.profile import Calibration, DeviceCalibration, Engine
from stowplan.calibration.store import (
    load_calibration_file,
    resolve_calibration,
    write_calibration,
)
from stowplan.errors import InputError

__all__ = ["fit_on_profile", "merge_entries", "save_entries"]


def fit_on_profile(
    measurements: Sequence[Measurement],
    *,
    device_name: str,
    bandwidth_gbps: float,
    engine: Engine,
    source: str,
    on_note: Callable[[str], None],
) -> FitResult:
    """Fit GPU ``device_name``'s figures to ``measurements``, pulled towards ``engine``'s profile.

    The prior is the profile's entry for ``device_name`` (else its last entry);
    the fitted entry is keyed by :func:`~stowplan.calibration.device.device_key`
    and every fraction is capped at 1.0 (a GPU streams at most at its datasheet
    peak of ``bandwidth_gbps`` GB/s).  When every run is tensor parallel the
    collective cost keeps the prior's figure, and ``on_note`` is told so.

    Raises:
        InputError: when the user's fitted profile file is unreadable or the
            measurements do not determine the figures.
    """
    base = resolve_calibration(engine)
    prior = base.for_device(device_name) or base.devices[-1]
    if {m.tensor_parallel > 1 for m in measurements} == {True}:
        on_note(
            "every run is tensor parallel, so the collective cost cannot be told from "
            f"the block cost: it keeps the profile's {prior.collective_overhead_s.value * 1e6:.1f} "
            "us per block and the block cost takes the rest (fit one-GPU runs too to split them)"
        )
    return fit_device(
        measurements,
        bandwidth_gbps=bandwidth_gbps,
        prior=prior,
        device=device_key(device_name),
        match=device_match(device_name),
        source=source,
        max_fraction=1.0,  # a GPU streams at most at its datasheet peak
    )


def merge_entries(
    entries: Sequence[DeviceCalibration], engine: Engine, existing: Calibration | None
) -> Calibration:
    """``existing`` with ``entries`` in front, in their order, each replacing its key.

    Without an ``existing`` profile the result is a new ``<engine>-fitted``
    profile holding just ``entries``.
    """
    profile = existing or Calibration(
        name=f"{engine.value}-fitted", engine=engine, devices=tuple(entries[:1])
    )
    for entry in reversed(entries):
        profile = profile.with_device(entry)
    return profile


def save_entries(entries: Sequence[DeviceCalibration], engine: Engine, target: Path) -> Calibration:
    """Merge ``entries`` into the profile file ``target`` (created if absent) and write it.

    Returns the whole profile written.

    Raises:
        InputError: when ``target`` holds an invalid profile (naming the file),
            or (field ``--out``) when it cannot be written.
    """
    existing = load_calibration_file(target) if target.is_file() else None
    profile = merge_entries(entries, engine, existing)
    try:
        write_calibration(profile, target)
    except OSError as exc:
        raise InputError(
            "--out", str(target), f"cannot be written ({exc.strerror or type(exc).__name__})"
        ) from None
    return profile
