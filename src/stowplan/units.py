"""Deprecated: these names live in :mod:`stowplan.quantities.units`."""

from __future__ import annotations

from stowplan.moved import moved

__getattr__ = moved(
    __name__,
    dict.fromkeys(
        (
            "format_bytes",
            "parse_bytes",
            "parse_link_mbps",
            "parse_rate_per_s",
            "parse_seconds",
            "parse_time_per_token_s",
            "parse_tokens_per_s",
        ),
        "stowplan.quantities.units",
    ),
)
