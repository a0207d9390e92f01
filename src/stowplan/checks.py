"""Deprecated: these names live in :mod:`stowplan.quantities.checks`."""

from __future__ import annotations

from stowplan.moved import moved

__getattr__ = moved(
    __name__,
    dict.fromkeys(
        (
            "E",
            "ID_RULE",
            "ascii_number_text",
            "check_choice",
            "check_id",
            "check_int",
            "check_number",
            "check_rate",
        ),
        "stowplan.quantities.checks",
    ),
)
