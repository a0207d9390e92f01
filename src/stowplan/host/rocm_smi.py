"""Best-effort parser of ``rocm-smi`` output (AMD GPUs).

``rocm-smi`` prints one ``GPU[i]  : Key: value`` line per fact (``-a`` and
the ``--show*`` options) or, with no option, a concise table. This reads
the product name (``Card series``) and, when the report includes
``--showmeminfo vram``, ``VRAM Total Memory (B)`` and ``VRAM Total Used
Memory (B)``. The concise table and PCIe link facts are not interpreted: an
AMD GPU is listed with its memory when known and is not benchmarked (no
ROCm backend is wired in).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["RocmGpu", "parse_rocm_smi"]

_CONCISE = re.compile(r"^(?P<idx>\d+)\s+\[0x[0-9a-fA-F]+\s*:\s*0x[0-9a-fA-F]+\]")
_LINE = re.compile(r"^GPU\[(?P<idx>\d+)\]\s*:\s*(?P<key>[^:]+?)\s*:\s*(?P<value>.*)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class RocmGpu:
    """What ``rocm-smi`` says about one AMD GPU."""

    index: int
    name: str
    unique_id: str | None
    memory_total_bytes: int | None
    memory_used_bytes: int | None


def parse_rocm_smi(text: str) -> tuple[RocmGpu, ...]:
    """Every GPU named in ``rocm-smi`` output, in index order (empty when none)."""
    facts: dict[int, dict[str, str]] = {}
    lines = text.splitlines()
    for i, raw in enumerate(lines):
        m = _LINE.match(raw.strip())
        if m:
            facts.setdefault(int(m["idx"]), {})[m["key"].strip()] = m["value"].strip()
        row = _CONCISE.match(raw)
        if row and i + 1 < len(lines) and lines[i + 1].strip():
            # the concise table prints the name (20 characters) on the next line
            facts.setdefault(int(row["idx"]), {}).setdefault("Card series", lines[i + 1].strip())

    def number(value: str | None) -> int | None:
        return int(value) if value is not None and value.isdigit() else None

    return tuple(
        RocmGpu(
            index=i,
            name=f.get("Card series") or f.get("Card Series") or "AMD GPU",
            unique_id=f.get("Unique ID"),
            memory_total_bytes=number(f.get("VRAM Total Memory (B)")),
            memory_used_bytes=number(f.get("VRAM Total Used Memory (B)")),
        )
        for i, f in sorted(facts.items())
    )
