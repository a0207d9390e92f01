"""The hardware passport: the probe's result cached as versioned JSON.

The file lives in the user cache folder: ``$STOWPLAN_CACHE_DIR`` when set,
else ``$XDG_CACHE_HOME/stowplan``, else ``~/.cache/stowplan``; its name is
``passport.json``. It is keyed by a host fingerprint (SHA-256 of hostname,
sorted GPU UUIDs, driver version and RAM size): when the fingerprint of the
host at hand differs, or the file cannot be read, the host is probed again
(with a warning on the ``stowplan.host`` logger for an unreadable file).
Writes go through a temporary file and a rename, so a reader — or a second
writer — never sees half a file.
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

from stowplan.fileio import write_text_atomic
from stowplan.host.topology import CapabilityMatrix, HostTopology

__all__ = [
    "PASSPORT_SCHEMA_VERSION",
    "Passport",
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
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Passport:
        return cls(
            schema_version=int(d["schema_version"]),
            fingerprint=str(d["fingerprint"]),
            created_at=str(d["created_at"]),
            topology=HostTopology.from_dict(d["topology"]),
            matrix=CapabilityMatrix.from_dict(d["matrix"]),
            notes=tuple(d.get("notes", ())),
        )


class PassportUnreadable(Exception):
    """The passport file exists but cannot be used (reason in the message)."""


def read_passport(path: str | Path) -> Passport:
    """Read a passport; raise :class:`PassportUnreadable` naming the file and the reason."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PassportUnreadable(f"{p}: cannot be read ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PassportUnreadable(f"{p}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("schema_version") != PASSPORT_SCHEMA_VERSION:
        version = data.get("schema_version") if isinstance(data, dict) else None
        raise PassportUnreadable(
            f"{p}: schema_version={version!r}, this stowplan reads {PASSPORT_SCHEMA_VERSION}"
        )
    try:
        return Passport.from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise PassportUnreadable(f"{p}: malformed ({type(exc).__name__}: {exc})") from None


def load_passport(path: str | Path | None = None) -> Passport | None:
    """The cached passport, or None when absent or unreadable (unreadable: a warning)."""
    p = Path(path) if path is not None else default_passport_path()
    if not p.exists():
        return None
    try:
        return read_passport(p)
    except PassportUnreadable as exc:
        log.warning("hardware passport ignored, will re-probe: %s", exc)
        return None


def save_passport(passport: Passport, path: str | Path | None = None) -> Path:
    """Write ``passport`` atomically; return the path written."""
    p = Path(path) if path is not None else default_passport_path()
    write_text_atomic(p, passport.to_json())
    return p


def obtain_passport(
    *,
    current: HostTopology,
    probe: Callable[[HostTopology], Passport],
    path: str | Path | None = None,
    refresh: bool = False,
) -> tuple[Passport, bool]:
    """The cached passport when it matches ``current``'s fingerprint, else a fresh probe.

    Returns ``(passport, reused)``. A fresh probe is saved to ``path``.
    """
    if not refresh:
        cached = load_passport(path)
        if cached is not None:
            if cached.fingerprint == fingerprint(current):
                return cached, True
            log.info("hardware passport is for another host or driver; re-probing")
    fresh = probe(current)
    save_passport(fresh, path)
    return fresh, False
