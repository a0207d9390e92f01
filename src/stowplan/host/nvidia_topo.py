"""``nvidia-smi topo -m``: how every pair of a node's GPUs reaches the other (pure).

The matrix prints, for each pair of GPUs, one of

* ``NV#`` — a bonded set of ``#`` NVLinks (``NV12`` on a DGX A100, ``NV18`` on
  an H100/B200 HGX board);
* a PCIe path, best to worst: ``PIX`` (at most one PCIe bridge), ``PXB``
  (several bridges), ``PHB`` (through a host bridge), ``NODE`` (between host
  bridges of one NUMA node), ``SYS`` (across the CPU interconnect between NUMA
  nodes; older drivers print ``SOC``).

:func:`parse_topo_matrix` reads the GPU-by-GPU part of the matrix (NIC
columns, CPU/NUMA affinity and the legend are ignored; tabs or spaces as
separators; the terminal's underline escapes removed).
:func:`probed_intra_link` turns it into the node's ``intra_link_gbps`` and
``intra_link_latency_us``: the *weakest* pair of the GPUs considered decides,
since a collective goes at the pace of its slowest link.

* NVLink: ``#`` links × 25 GB/s per direction (NVLink 2-4; 50 for NVLink 5
  parts: B100/B200/GB200, see :func:`nvlink_gbps_per_link_for`), one step
  ≈ :data:`~stowplan.gpus.interconnect.NVLINK_LATENCY_US`;
* PCIe: the GPUs' host link (``pcie_gbps``, e.g. from ``nvidia-smi -q``), else
  PCIe gen 4 ×16; one step ≈ :data:`~stowplan.gpus.interconnect.PCIE_LATENCY_US`.

This module never runs the tool.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum

from stowplan.errors import InputError
from stowplan.gpus import normalise_gpu_name
from stowplan.gpus.interconnect import (
    NVLINK_LATENCY_US,
    PCIE_GBPS_X16,
    PCIE_LATENCY_US,
    nvlink_gbps_per_link,
)
from stowplan.quantities.limits import MAX_GPUS_PER_NODE

__all__ = [
    "DEFAULT_PCIE_GEN",
    "GpuPairLink",
    "GpuTopology",
    "LinkKind",
    "ProbedIntraLink",
    "nvlink_gbps_per_link_for",
    "parse_topo_matrix",
    "probed_intra_link",
]

FIELD = "nvidia-smi topo -m"
DEFAULT_PCIE_GEN = 4
"""PCIe generation assumed for a PCIe pair when the GPUs' host link is unknown."""


class LinkKind(StrEnum):
    """How two GPUs of one node reach each other (the matrix's vocabulary)."""

    NVLINK = "NV"
    PIX = "PIX"
    PXB = "PXB"
    PHB = "PHB"
    NODE = "NODE"
    SYS = "SYS"


_PCIE_ORDER = (LinkKind.PIX, LinkKind.PXB, LinkKind.PHB, LinkKind.NODE, LinkKind.SYS)
"""PCIe paths, best first."""
_ALIASES = {"SOC": LinkKind.SYS}
_ACCEPTED = "X (self), NV# (NVLinks), PIX, PXB, PHB, NODE or SYS"
_GPU = re.compile(r"^GPU(\d+)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
"""Terminal escapes: nvidia-smi underlines the header row when it writes to a terminal."""
_NV = re.compile(r"^NV(\d+)$")
_NVLINK5 = re.compile(r"\bgb200\b|\bb200\b|\bb100\b|\bgb300\b|\bb300\b")


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuPairLink:
    """The path between two GPUs: its kind and, for NVLink, the number of bonded links."""

    kind: LinkKind
    nvlinks: int = 0

    @property
    def is_nvlink(self) -> bool:
        return self.kind is LinkKind.NVLINK

    @property
    def label(self) -> str:
        """As the matrix prints it: ``NV18``, ``PIX`` …"""
        return f"NV{self.nvlinks}" if self.is_nvlink else self.kind.value


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuTopology:
    """The GPU-by-GPU matrix of one node: ``links[a][b]`` is the path from GPU a to GPU b."""

    num_gpus: int
    links: tuple[tuple[GpuPairLink | None, ...], ...]
    """Row per GPU; the diagonal (a GPU to itself) is None."""

    def link(self, a: int, b: int) -> GpuPairLink:
        """The path between GPUs ``a`` and ``b`` (``a != b``)."""
        found = self.links[a][b]
        if found is None:
            raise InputError("gpu pair", (a, b), "must name two different GPUs")
        return found

    def pairs(self, gpus: Sequence[int] | None = None) -> Iterator[tuple[int, int, GpuPairLink]]:
        """Every unordered pair ``(a, b, link)`` with ``a < b`` among ``gpus`` (default: all)."""
        chosen = sorted(set(range(self.num_gpus) if gpus is None else gpus))
        for g in chosen:
            if not 0 <= g < self.num_gpus:
                raise InputError(
                    "gpus", list(gpus or ()), f"must be GPU indices in [0, {self.num_gpus - 1}]"
                )
        for i, a in enumerate(chosen):
            for b in chosen[i + 1 :]:
                yield a, b, self.link(a, b)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbedIntraLink:
    """The node's GPU-to-GPU figures as read from the matrix."""

    gbps: float
    """GB/s per direction of the weakest pair."""
    latency_us: float
    """One collective step over the weakest pair."""
    kind: str
    """``nvlink`` or ``pcie``."""
    weakest: tuple[int, int]
    """The GPU pair that decided."""
    link: str
    """Its path as printed (``NV12``, ``SYS`` …)."""
    source: str
    """One line: where the figures come from."""


def _cell(raw: str, a: int, b: int) -> GpuPairLink | None:
    token = raw.strip().upper()
    if token == "X" and a == b:
        return None
    nv = _NV.match(token)
    if nv and a != b:
        count = int(nv.group(1))
        if 1 <= count <= 1024:
            return GpuPairLink(kind=LinkKind.NVLINK, nvlinks=count)
    kind = _ALIASES.get(token) or next((k for k in _PCIE_ORDER if k.value == token), None)
    if kind is not None and a != b:
        return GpuPairLink(kind=kind)
    rule = "must be X (the GPU itself)" if a == b else f"must be one of {_ACCEPTED}"
    raise InputError(f"{FIELD} GPU{a}->GPU{b}", raw, rule)


def _header(lines: Sequence[list[str]], text: str) -> tuple[int, int]:
    """(line index of the header, number of GPU columns)."""
    for index, tokens in enumerate(lines):
        # The header starts GPU0 (then GPU1 … or the affinity columns); GPU0's row goes on "X".
        if not tokens or tokens[0] != "GPU0" or tokens[1:2] == ["X"]:
            continue
        n = 0
        while n < len(tokens) and tokens[n] == f"GPU{n}":
            n += 1
        return index, n
    raise InputError(
        FIELD, text[:40], "has no header row of GPU columns (GPU0 GPU1 …); pass the whole matrix"
    )


def parse_topo_matrix(text: str) -> GpuTopology:
    """The GPU-by-GPU links of ``nvidia-smi topo -m`` output.

    Raises :class:`InputError` naming the cell (``GPU0->GPU3``) for a value
    outside the vocabulary, and naming the GPUs whose rows are missing or cut
    short (a truncated paste).
    """
    if not isinstance(text, str):
        raise InputError(FIELD, text, "must be text")
    text = _ANSI.sub("", text)
    lines = [line.split() for line in text.splitlines()]
    start, n = _header(lines, text)
    if n > MAX_GPUS_PER_NODE:
        raise InputError(f"{FIELD} GPU columns", n, f"must be at most {MAX_GPUS_PER_NODE}")
    rows: dict[int, list[str]] = {}
    for tokens in lines[start + 1 :]:
        m = _GPU.match(tokens[0]) if tokens else None
        if m is None or int(m.group(1)) >= n or int(m.group(1)) in rows:
            continue
        rows[int(m.group(1))] = tokens[1:]
    missing = [f"GPU{g}" for g in range(n) if g not in rows]
    if missing:
        raise InputError(FIELD, missing, f"has no row for these of its {n} GPU columns")
    short = [f"GPU{g}" for g in range(n) if len(rows[g]) < n]
    if short:
        raise InputError(FIELD, short, f"rows must hold a cell for each of the {n} GPU columns")
    links = tuple(tuple(_cell(rows[a][b], a, b) for b in range(n)) for a in range(n))
    for a in range(n):
        for b in range(a + 1, n):
            if links[a][b] != links[b][a]:
                there, back = links[a][b], links[b][a]
                assert there is not None and back is not None
                raise InputError(
                    f"{FIELD} GPU{a}<->GPU{b}",
                    (there.label, back.label),
                    "must be the same path both ways",
                )
    return GpuTopology(num_gpus=n, links=links)


def nvlink_gbps_per_link_for(gpu_name: str) -> float:
    """GB/s per direction of one NVLink link of ``gpu_name``: 50 for NVLink 5 parts
    (B100, B200, GB200, B300), else 25 (NVLink 2-4)."""
    generation = 5 if _NVLINK5.search(normalise_gpu_name(gpu_name)) else 4
    return nvlink_gbps_per_link(generation)


def _pair_figures(link: GpuPairLink, per_link: float, pcie_gbps: float) -> tuple[float, float]:
    if link.is_nvlink:
        return link.nvlinks * per_link, NVLINK_LATENCY_US
    return pcie_gbps, PCIE_LATENCY_US


def _worse(link: GpuPairLink) -> int:
    """Larger for a worse path at equal figures (SYS below PIX, fewer NVLinks below more)."""
    return -link.nvlinks if link.is_nvlink else _PCIE_ORDER.index(link.kind) + 1


def probed_intra_link(
    topology: GpuTopology,
    *,
    gpu_name: str = "",
    gpus: Sequence[int] | None = None,
    pcie_gbps: float | None = None,
) -> ProbedIntraLink | None:
    """The weakest pair's figures among ``gpus`` (default: every GPU); None with fewer than two.

    ``gpu_name`` sets the GB/s of one NVLink link (:func:`nvlink_gbps_per_link_for`);
    ``pcie_gbps`` is the GPUs' host-link GB/s for PCIe pairs (default PCIe gen
    :data:`DEFAULT_PCIE_GEN` ×16, said so in ``source``).  Bandwidth is the
    minimum over the pairs, latency the maximum.
    """
    pairs = list(topology.pairs(gpus))
    if not pairs:
        return None
    per_link = nvlink_gbps_per_link_for(gpu_name)
    pcie = PCIE_GBPS_X16[DEFAULT_PCIE_GEN] if pcie_gbps is None else pcie_gbps
    figures = [(_pair_figures(link, per_link, pcie), a, b, link) for a, b, link in pairs]
    (gbps, _), a, b, link = min(figures, key=lambda f: (f[0][0], -f[0][1], -_worse(f[3])))
    latency = max(f[0][1] for f in figures)
    kind = "nvlink" if link.is_nvlink else "pcie"
    if link.is_nvlink:
        how = f"{link.nvlinks} NVLinks × {per_link:g} GB/s"
    elif pcie_gbps is None:
        how = f"PCIe, gen {DEFAULT_PCIE_GEN} ×16 assumed"
    else:
        how = "PCIe, the GPUs' host link"
    return ProbedIntraLink(
        gbps=gbps,
        latency_us=latency,
        kind=kind,
        weakest=(a, b),
        link=link.label,
        source=f"{FIELD}: weakest pair GPU{a}-GPU{b} {link.label} ({how}: {gbps:g} GB/s)",
    )
