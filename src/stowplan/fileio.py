"""Files at the edge: atomic writes, and reads whose failures are one-line input errors.

A reader of :func:`write_text_atomic`'s file sees the old file or the new one,
never half of one. :func:`read_text_file` and :func:`read_json_file` turn a
missing, unreadable or malformed file into an
:class:`~stowplan.errors.InputError` naming the flag or field, the path and
the reason.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from stowplan.errors import InputError

__all__ = ["read_json_file", "read_text_file", "write_text_atomic"]


def _mode_for(target: Path) -> int:
    """Keep an existing file's mode; a new file gets 0o666 less the umask, as open() would."""
    try:
        return target.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, _mode_for(target))
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_or_input_error(path: Path, field: str, errors: str) -> str:
    try:
        return path.read_text(encoding="utf-8", errors=errors)
    except OSError as exc:
        raise InputError(field, str(path), f"cannot be read ({exc.strerror})") from None


def read_text_file(path: str | Path, *, field: str, errors: str = "strict") -> str:
    """The UTF-8 text of ``path``; ``field`` names the flag or field in the error.

    ``errors`` is :meth:`bytes.decode`'s (``"replace"`` for tool output that may
    hold stray bytes). Raises :class:`InputError` when the file cannot be read
    or is not UTF-8 text.
    """
    p = Path(path)
    try:
        return _read_or_input_error(p, field, errors)
    except UnicodeDecodeError as exc:
        raise InputError(field, str(p), f"is not UTF-8 text ({exc})") from None


def read_json_file(path: str | Path, *, field: str) -> Any:
    """The parsed JSON document in ``path``; :class:`InputError` when unreadable or not JSON."""
    p = Path(path)
    try:
        return json.loads(_read_or_input_error(p, field, "strict"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(field, str(p), f"is not valid JSON ({exc})") from None
