"""Deprecated: these names live in :mod:`stowplan.files.safeload`."""

from __future__ import annotations

from stowplan.moved import moved

__getattr__ = moved(
    __name__,
    dict.fromkeys(
        (
            "MAX_DEPTH",
            "MAX_NUMBER_CHARS",
            "MAX_YAML_NODES",
            "MalformedJson",
            "parse_json",
            "parse_yaml",
        ),
        "stowplan.files.safeload",
    ),
)
