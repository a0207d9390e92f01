"""Deprecated: these names live in :mod:`stowplan.text.shell`."""

from __future__ import annotations

from stowplan.moved import moved

__getattr__ = moved(
    __name__,
    dict.fromkeys(
        (
            "check_env_name",
            "heredoc_marker",
            "one_line",
            "shell_comment",
            "shell_quote",
        ),
        "stowplan.text.shell",
    ),
)
