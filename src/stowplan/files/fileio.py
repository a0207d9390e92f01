"""Files at the edge: atomic writes, and bounded reads of user files.

A reader of :func:`write_text_atomic`'s file sees the old file or the new one,
never half of one; a writer killed midway leaves a temporary file named after
the target and its pid, which the next write removes.

Every file a user names is read through :func:`read_bytes_bounded` (or a
function built on it): it refuses anything that is not a regular file (a
folder, a FIFO, ``/dev/zero``) before reading a byte of it, and anything
larger than the limit for its :class:`FileKind` (:data:`MAX_BYTES`). JSON and
YAML are then parsed within the limits of :mod:`stowplan.files.safeload`. Every
refusal is an :class:`~stowplan.errors.InputError` naming the flag or field,
the path and the reason.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import time
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import IO, Any, Final

from stowplan.errors import InputError
from stowplan.files.safeload import parse_json, parse_yaml

__all__ = [
    "MAX_BYTES",
    "FileKind",
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
]

MiB: Final = 2**20


class FileKind(StrEnum):
    """What a user file holds; each kind has its own size limit in :data:`MAX_BYTES`."""

    TEXT = "text"
    FLEET = "fleet"
    OFFERS = "offer list"
    PLAN = "plan"
    MODEL_CONFIG = "model config"
    PASSPORT = "passport"
    CALIBRATION = "calibration profile"
    EXPERT_STATS = "expert statistics"
    BENCHMARK = "benchmark output"
    TOOL_OUTPUT = "tool output"


MAX_BYTES: Final[Mapping[FileKind, int]] = {
    FileKind.TEXT: 16 * MiB,
    FileKind.FLEET: 16 * MiB,
    FileKind.OFFERS: 64 * MiB,
    FileKind.PLAN: 16 * MiB,
    FileKind.MODEL_CONFIG: 64 * MiB,  # a safetensors index of ~100k tensors is ~10 MB
    FileKind.PASSPORT: 4 * MiB,
    FileKind.CALIBRATION: 4 * MiB,
    FileKind.EXPERT_STATS: 256 * MiB,  # co-activation counts: layers x experts^2 numbers
    FileKind.BENCHMARK: 16 * MiB,
    FileKind.TOOL_OUTPUT: 16 * MiB,
}
"""The largest file of each kind that is read, in bytes."""


def _what(mode: int) -> str:
    """A file type in words, for a message."""
    for test, words in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return words
    return "not a regular file"


def _unreadable(field: str, path: Path, exc: OSError) -> InputError:
    reason = exc.strerror or type(exc).__name__
    return InputError(field, str(path), f"cannot be read ({reason})")


def _not_regular(field: str, path: Path, mode: int) -> InputError:
    return InputError(field, str(path), f"is {_what(mode)}; give a regular file")


def path_exists(path: str | Path) -> bool:
    """Whether ``path`` names something; False (never an error) for a name no file system
    accepts (too long, a NUL byte) or a broken link."""
    try:
        return Path(path).exists()
    except (OSError, ValueError):
        return False


def check_regular_file(path: str | Path, *, field: str) -> os.stat_result:
    """``path``'s status when it is a regular file (after symlinks); else :class:`InputError`."""
    p = Path(path)
    try:
        st = os.stat(p)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        if isinstance(exc, OSError):
            raise _unreadable(field, p, exc) from None
        raise InputError(field, str(p), "is not a valid path") from None
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(field, p, st.st_mode)
    return st


def check_output_file(path: str | Path, *, field: str) -> None:
    """Refuse, before any work, a path :func:`write_text_atomic` could not replace.

    An existing path must be a regular file; an existing ancestor must be a
    folder. Raises :class:`InputError` naming ``field`` and the path.
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not a valid path"
        raise InputError(field, str(p), f"cannot be written ({reason})") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise InputError(field, str(p), f"is {_what(st.st_mode)}; give a file name to write")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(field, str(p), f"cannot be written: {parent} is not a folder")
            break


def open_regular_file(path: str | Path, *, field: str) -> IO[bytes]:
    """``path`` opened for binary reading when it is a regular file; else :class:`InputError`.

    The type is checked before opening (opening a device can have effects) and
    again on the open descriptor (the path may have changed in between);
    the open never blocks, even on a FIFO.
    """
    p = Path(path)
    check_regular_file(p, field=field)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(p, flags)
    except OSError as exc:
        raise _unreadable(field, p, exc) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(field, p, mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_bytes_bounded(path: str | Path, *, field: str, kind: FileKind = FileKind.TEXT) -> bytes:
    """The bytes of the regular file ``path``, at most ``MAX_BYTES[kind]`` of them.

    Raises :class:`InputError` naming ``field`` and the path for a missing,
    unreadable or non-regular file and for one larger than the limit.
    """
    p = Path(path)
    limit = MAX_BYTES[kind]
    with open_regular_file(p, field=field) as fh:
        try:
            data = fh.read(limit + 1)
        except OSError as exc:
            raise _unreadable(field, p, exc) from None
    if len(data) > limit:
        raise InputError(
            field,
            str(p),
            f"is larger than {limit // MiB} MiB, the most a {kind.value} file may be",
        )
    return data


_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]+\.tmp$")
STALE_TEMP_S: Final = 3600.0
"""Age after which a temporary file is stale even when its writer's pid is running again."""


def _temp_path(target: Path) -> Path:
    """``.<name>.<pid>.<random>.tmp`` beside ``target``: the writer is told by name."""
    return target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # running, as another user
        return True
    except (OverflowError, ValueError):  # no process can have this pid
        return False
    return True


def remove_stale_temps(target: str | Path) -> int:
    """Delete the temporary files killed writers of ``target`` left behind; return how many.

    Only files named as :func:`write_text_atomic` names them for this target
    are touched: those whose writer's process is gone, or older than
    :data:`STALE_TEMP_S` (its pid may have been reused). Errors are ignored:
    this is housekeeping.
    """
    p = Path(target)
    removed = 0
    try:
        entries = list(os.scandir(p.parent))
    except OSError:
        return 0
    now = time.time()
    for entry in entries:
        m = _TEMP_NAME.match(entry.name)
        if m is None or m.group("name") != p.name:
            continue
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
            pid = int(m.group("pid"))
            if pid != os.getpid() and _pid_running(pid) and age < STALE_TEMP_S:
                continue
            if pid == os.getpid() and age < STALE_TEMP_S:
                continue  # another thread of this process may be writing it
            os.unlink(entry.path)
            removed += 1
        except OSError:
            continue
    return removed


def write_text_atomic(path: str | Path, text: str, *, mode: int | None = None) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename.

    The file gets ``mode`` when given, else the mode of the file it replaces,
    else ``0o666`` less the process umask (as :func:`open` would): the
    temporary file is created with that mode by :func:`os.open`, never by
    changing the umask. Stale temporary files of earlier, killed writers of
    ``path`` are removed first (:func:`remove_stale_temps`).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target)
    try:
        keep: int | None = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        keep = None
    exact = mode if mode is not None else keep
    tmp = _temp_path(target)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o666 if exact is None else exact)
    try:
        if exact is not None:
            os.fchmod(fd, exact)  # the umask may have cleared bits of an exact mode
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_text_file(
    path: str | Path, *, field: str, kind: FileKind = FileKind.TEXT, errors: str = "strict"
) -> str:
    """The UTF-8 text of ``path`` (newlines as ``\\n``), read within ``kind``'s limit.

    ``field`` names the flag or field in the error; ``errors`` is
    :meth:`bytes.decode`'s (``"replace"`` for tool output that may hold stray
    bytes). Raises :class:`InputError` when the file cannot be read, is not a
    regular file, is too large or is not UTF-8 text.
    """
    p = Path(path)
    data = read_bytes_bounded(p, field=field, kind=kind)
    try:
        text = data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        raise InputError(field, str(p), f"is not UTF-8 text ({exc})") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_json_file(
    path: str | Path, *, field: str, kind: FileKind = FileKind.TEXT, nonfinite: bool = False
) -> Any:
    """The JSON document in ``path``, read and parsed within the limits.

    ``nonfinite`` accepts ``NaN``/``Infinity`` (see :func:`stowplan.files.safeload.parse_json`).
    Raises :class:`InputError` when the file cannot be read or is not JSON.
    """
    p = Path(path)
    text = read_text_file(p, field=field, kind=kind)
    return parse_json(text, field=field, source=str(p), nonfinite=nonfinite)


def read_document_file(path: str | Path, *, field: str, kind: FileKind = FileKind.TEXT) -> Any:
    """The YAML (``.yaml``/``.yml``) or else JSON document in ``path``, within the limits."""
    p = Path(path)
    if p.suffix.lower() in {".yaml", ".yml"}:
        return parse_yaml(read_text_file(p, field=field, kind=kind), field=field, source=str(p))
    return read_json_file(p, field=field, kind=kind)
