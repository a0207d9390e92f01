"""The hardware passport: the probe's result cached as versioned JSON.

The file lives in the user cache folder: ``$STOWPLAN_CACHE_DIR`` when set,
else ``$XDG_CACHE_HOME/stowplan``, else ``~/.cache/stowplan``; its name is
``passport.json``. It is keyed by a host fingerprint (SHA-256 of hostname,
sorted GPU UUIDs, driver version and RAM size): when the fingerprint of the
host at hand differs, or the file cannot be used, the host is probed again
(with a warning on the ``stowplan.host`` logger for an unusable file). A file
is unusable when it is not JSON, has another schema version, or fails
validation: a missing or ill-typed field, a circuit naming a missing pool, a
duplicate circuit, pool or matrix entry, a matrix entry naming no circuit, a
negative capacity, or a GEMV time giving an implausible rate. A quick
passport does not serve a request for a full probe (the host is probed
again); a full one serves a quick request. Before probing, the passport's
folder is checked to be writable, so a bad ``STOWPLAN_CACHE_DIR`` fails at once
with the path named.
Writes go through a temporary file and a rename, so a reader — or a second
writer — never sees half a file. The temporary file is named after the
passport and the writer's pid; one left by a killed writer is removed when the
cache is next used (:func:`obtain_passport`) or written. The file is created
with its mode given to :func:`os.open` (the umask is never changed). Every
unusable file — not JSON, nested or sized past the reader's limits, not a
regular file, ill-typed or inconsistent — is treated the same way: a warning
and a new probe; :func:`load_passport` returns None and never raises.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stowplan.circuits import CapabilityMatrix, HostTopology
from stowplan.errors import InputError, PassportUnreadable
from stowplan.files.fileio import (
    FileKind,
    path_exists,
    read_json_file,
    remove_stale_temps,
    write_text_atomic,
)

__all__ = [
    "PASSPORT_SCHEMA_VERSION",
    "Passport",
    "PassportUnreadable",
    "cache_dir",
    "default_passport_path",
    "fingerprint",
    "load_passport",
    "obtain_passport",
    "read_passport",
    "save_passport",
]

PASSPORT_SCHEMA_VERSION = 1
log = logging.getLogger("stowplan.host")


def cache_dir() -> Path:
    """The folder stowplan caches into (see the module docstring for the order)."""
    override = os.environ.get("STOWPLAN_CACHE_DIR")
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "stowplan"


def default_passport_path() -> Path:
    """``cache_dir() / "passport.json"``."""
    return cache_dir() / "passport.json"


def fingerprint(topology: HostTopology) -> str:
    """SHA-256 hex of hostname, sorted GPU UUIDs, driver version and RAM bytes."""
    key = json.dumps(
        [
            topology.hostname,
            list(topology.gpu_uuids),
            topology.driver_version,
            topology.ram_bytes,
        ]
    )
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class Passport:
    """One host's probe: topology, measured matrix, fingerprint and when it was made."""

    fingerprint: str
    created_at: str
    """UTC ISO-8601 time of the probe."""
    topology: HostTopology
    matrix: CapabilityMatrix
    notes: tuple[str, ...] = ()
    schema_version: int = PASSPORT_SCHEMA_VERSION

    def __post_init__(self) -> None:
        circuits = [c.id for c in self.topology.circuits]
        known = set(circuits)
        for e in self.matrix.entries:
            if e.circuit not in known:
                raise InputError(
                    f"matrix entry {e.circuit}.circuit",
                    e.circuit,
                    f"must name a circuit of the topology {circuits}",
                )

    @classmethod
    def create(
        cls, topology: HostTopology, matrix: CapabilityMatrix, notes: tuple[str, ...] = ()
    ) -> Passport:
        """A new passport stamped now, fingerprinted from ``topology``."""
        return cls(
            fingerprint=fingerprint(topology),
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            topology=topology,
            matrix=matrix,
            notes=notes,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "fingerprint": self.fingerprint,
            "created_at": self.created_at,
            "topology": self.topology.to_dict(),
            "matrix": self.matrix.to_dict(),
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Passport:
        """From JSON; :class:`InputError` naming the field, the value and the rule."""
        for key in ("fingerprint", "created_at"):
            if not isinstance(d.get(key), str):
                raise InputError(key, d.get(key), "must be a string")
        for key in ("topology", "matrix"):
            if not isinstance(d.get(key), dict):
                raise InputError(key, d.get(key), "must be a JSON object")
        notes = d.get("notes", [])
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            raise InputError("notes", notes, "must be a list of strings")
        return cls(
            schema_version=PASSPORT_SCHEMA_VERSION,
            fingerprint=d["fingerprint"],
            created_at=d["created_at"],
            topology=HostTopology.from_dict(d["topology"]),
            matrix=CapabilityMatrix.from_dict(d["matrix"]),
            notes=tuple(notes),
        )


def read_passport(path: str | Path) -> Passport:
    """Read a passport; raise :class:`PassportUnreadable` naming the file and the reason."""
    p = Path(path)
    try:
        data = read_json_file(p, field="passport", kind=FileKind.PASSPORT, nonfinite=True)
    except InputError as exc:
        raise PassportUnreadable(p, exc.rule.removeprefix("is ")) from None
    version = data.get("schema_version") if isinstance(data, dict) else None
    if not isinstance(data, dict) or type(version) is not int or version != PASSPORT_SCHEMA_VERSION:
        raise PassportUnreadable(
            p, f"schema_version={version!r}, this stowplan reads {PASSPORT_SCHEMA_VERSION}"
        )
    try:
        return Passport.from_dict(data)
    except InputError as exc:
        raise PassportUnreadable(p, f"invalid: {exc}") from None


def load_passport(path: str | Path | None = None) -> Passport | None:
    """The cached passport, or None when absent or unusable (unusable: a warning).

    Probes nothing; the warning says only that the file was ignored.
    """
    p = Path(path) if path is not None else default_passport_path()
    if not path_exists(p):
        return None
    try:
        return read_passport(p)
    except PassportUnreadable as exc:
        log.warning("hardware passport ignored: %s", exc)
        return None


def check_writable(path: Path) -> None:
    """Raise :class:`InputError` naming ``path`` when a passport cannot be written there."""
    folder = path.parent
    reason = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = f"its folder cannot be made ({exc.strerror or type(exc).__name__})"
    else:
        if path.is_dir():
            reason = "it is a folder"
        elif not os.access(folder, os.W_OK | os.X_OK):
            reason = "its folder is not writable"
    if reason is not None:
        raise InputError(
            "passport",
            str(path),
            f"cannot be written: {reason}; set STOWPLAN_CACHE_DIR to a writable folder "
            "or pass --passport FILE",
        )


def save_passport(passport: Passport, path: str | Path | None = None) -> Path:
    """Write ``passport`` atomically; return the path written.

    Raises :class:`InputError` naming the path when it cannot be written.
    """
    p = Path(path) if path is not None else default_passport_path()
    check_writable(p)
    try:
        write_text_atomic(p, passport.to_json())
    except OSError as exc:
        raise InputError(
            "passport", str(p), f"cannot be written ({exc.strerror or type(exc).__name__})"
        ) from None
    return p


def obtain_passport(
    *,
    current: HostTopology,
    probe: Callable[[HostTopology], Passport],
    path: str | Path | None = None,
    refresh: bool = False,
    quick: bool = False,
) -> tuple[Passport, bool]:
    """The cached passport when it matches ``current``'s fingerprint, else a fresh probe.

    ``quick`` says what kind of probe the caller asked for: a quick passport
    serves only a quick request; a full one serves both. Returns
    ``(passport, reused)``. Before probing, the passport's location is checked
    to be writable (:class:`InputError` naming it otherwise); a fresh probe is
    saved to ``path``.
    """
    p = Path(path) if path is not None else default_passport_path()
    remove_stale_temps(p)
    if not refresh and path_exists(p):
        try:
            cached: Passport | None = read_passport(p)
        except PassportUnreadable as exc:
            log.warning("hardware passport ignored, will re-probe: %s", exc)
            cached = None
        if cached is None:
            pass
        elif cached.fingerprint != fingerprint(current):
            log.info("hardware passport is for another host or driver; re-probing")
        elif cached.matrix.quick and not quick:
            log.info("hardware passport is from a quick probe; a full probe was asked for")
        else:
            return cached, True
    check_writable(p)
    fresh = probe(current)
    save_passport(fresh, p)
    return fresh, False
