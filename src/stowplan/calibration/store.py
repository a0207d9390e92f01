"""Where profiles live: shipped defaults in ``data/<engine>.json``, fitted ones per user.

A fitted profile is written atomically to ``$STOWPLAN_HOME/calibration/<engine>.json``
(``STOWPLAN_HOME`` defaults to ``~/.stowplan``) and reused by every later plan:
:func:`resolve_calibration` puts the user's fitted device entries in front of
the shipped ones, so a fitted device wins and every other device keeps its
table figures.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from stowplan.calibration.profile import (
    Calibration,
    Engine,
    calibration_from_json,
    calibration_to_json,
)
from stowplan.errors import InputError
from stowplan.files.fileio import FileKind, read_text_file, write_text_atomic
from stowplan.quantities.checks import check_choice

__all__ = [
    "load_calibration_file",
    "resolve_calibration",
    "shipped_calibration",
    "user_calibration_path",
    "write_calibration",
]


def _engine(engine: str | Engine) -> Engine:
    return check_choice("--engine", engine, Engine)


def shipped_calibration(engine: str | Engine) -> Calibration:
    """The default profile shipped for ``engine``."""
    e = _engine(engine)
    text = (
        resources.files("stowplan.calibration")
        .joinpath(f"data/{e.value}.json")
        .read_text(encoding="utf-8")
    )
    return calibration_from_json(text, origin=f"data/{e.value}.json")


def load_calibration_file(path: str | Path) -> Calibration:
    """Read and validate a profile file; errors name the file."""
    p = Path(path)
    text = read_text_file(p, field="--calibration", kind=FileKind.CALIBRATION)
    try:
        return calibration_from_json(text, origin=str(p))
    except InputError as exc:
        if exc.field == str(p):
            raise
        raise InputError(f"{p}: {exc.field}", exc.value, exc.rule) from None


def user_calibration_path(engine: str | Engine) -> Path:
    """``$STOWPLAN_HOME/calibration/<engine>.json`` (``~/.stowplan`` by default)."""
    home = Path(os.environ.get("STOWPLAN_HOME") or Path.home() / ".stowplan")
    return home / "calibration" / f"{_engine(engine).value}.json"


def write_calibration(cal: Calibration, path: str | Path) -> None:
    """Write ``cal`` as canonical JSON, atomically."""
    write_text_atomic(path, calibration_to_json(cal))


def resolve_calibration(
    engine: str | Engine = Engine.GENERIC, path: str | Path | None = None
) -> Calibration:
    """The profile a plan uses.

    ``path`` if given, else the user's fitted devices in front of the shipped ones.
    """
    if path is not None:
        return load_calibration_file(path)
    cal = shipped_calibration(engine)
    user = user_calibration_path(engine)
    if user.is_file():
        fitted = load_calibration_file(user)
        for entry in reversed(fitted.devices):
            cal = cal.with_device(entry)
        cal = Calibration(
            name=f"{cal.name}+{fitted.name}",
            engine=cal.engine,
            devices=cal.devices,
            description=cal.description,
            runs=cal.runs,
        )
    return cal
