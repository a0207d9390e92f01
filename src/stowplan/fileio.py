"""Deprecated: these names live in :mod:`stowplan.files.fileio`."""

from __future__ import annotations

from stowplan.moved import moved

__getattr__ = moved(
    __name__,
    dict.fromkeys(
        (
            "FileKind",
            "MAX_BYTES",
            "MiB",
            "STALE_TEMP_S",
            "check_output_file",
            "check_regular_file",
            "open_regular_file",
            "path_exists",
            "read_bytes_bounded",
            "read_document_file",
            "read_json_file",
            "read_text_file",
            "remove_stale_temps",
            "write_text_atomic",
        ),
        "stowplan.files.fileio",
    ),
)
