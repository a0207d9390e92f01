"""Parsers of ``nvidia-smi`` output: the fallback when NVML cannot be loaded.

Three formats are understood, all as printed by real drivers:

* ``nvidia-smi -q -x`` — XML (schemas v11 to v13);
* ``nvidia-smi -q`` (same as ``-a``) — indented ``Key : value`` text;
* ``nvidia-smi --query-gpu=name,uuid,memory.total,... --format=csv`` with or
  without ``nounits`` (``memory.total [MiB]`` / ``81559 MiB``);
* the default ``nvidia-smi`` summary table (names, memory; no UUID or PCIe).

:func:`parse_nvidia_smi` detects the format. Every parser returns one
:class:`GpuRecord` per physical GPU (MIG instances are not GPUs); values the
tool prints as ``N/A`` become ``None``. The Fabric block is not interpreted
here. This module is pure: it never runs the tool.
"""

from __future__ import annotations

import csv
import io
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from stowplan.errors import InputError

__all__ = [
    "GpuRecord",
    "SmiReport",
    "parse_nvidia_smi",
    "parse_query_csv",
    "parse_query_text",
    "parse_query_xml",
    "parse_summary_table",
    "pcie_gbps",
]

MIB = 2**20

_PCIE_GT_PER_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
"""Usable GB/s per lane and direction after line coding (PCI-SIG figures, rounded)."""


def pcie_gbps(gen: int | None, width: int | None) -> float | None:
    """Theoretical one-direction PCIe bandwidth in GB/s; None when either input is unknown."""
    if gen is None or width is None or gen not in _PCIE_GT_PER_LANE_GBPS:
        return None
    return round(_PCIE_GT_PER_LANE_GBPS[gen] * width, 3)


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuRecord:
    """What one ``nvidia-smi`` report says about one GPU."""

    index: int
    """Position in the report (0-based)."""
    name: str
    uuid: str | None
    bus_id: str | None
    memory_total_mib: int | None
    memory_free_mib: int | None
    pcie_gen_max: int | None
    """Highest PCIe generation the GPU's link supports."""
    pcie_gen_current: int | None
    """Generation in use when the report was taken (idle GPUs drop to gen 1)."""
    pcie_width_max: int | None
    """Lanes, e.g. 16."""
    pcie_width_current: int | None

    @property
    def memory_total_bytes(self) -> int | None:
        """``memory_total_mib`` in bytes."""
        return None if self.memory_total_mib is None else self.memory_total_mib * MIB

    @property
    def bus_gbps(self) -> float | None:
        """Theoretical host-link GB/s from the maximum generation and width."""
        return pcie_gbps(self.pcie_gen_max, self.pcie_width_max)


@dataclass(frozen=True, slots=True, kw_only=True)
class SmiReport:
    """A parsed report: the driver and every GPU in it."""

    format: str
    """``xml``, ``text``, ``csv``, ``table`` or ``nvml``."""
    driver_version: str | None
    gpus: tuple[GpuRecord, ...]


_NA = {"", "n/a", "[n/a]", "not available", "unknown error", "[unknown error]"}


def _clean(value: str | None) -> str | None:
    if value is None:
        return None
    v = value.strip()
    if v.lower() in _NA or (v.startswith("[") and v.endswith("]")):
        return None
    # a value followed by a bracketed remark: "610.57.04 [Deprecated; ...]"
    return re.sub(r"\s*\[[^\]]*\]$", "", v) or None


def _int(value: str | None) -> int | None:
    """The leading integer of ``value`` (``"81559 MiB"`` → 81559, ``"16x"`` → 16).

    None when there is none, or when it has more than 18 digits (no count nvidia-smi prints).
    """
    v = _clean(value)
    if v is None:
        return None
    m = re.match(r"\s*(\d+)", v)
    return int(m.group(1)) if m and len(m.group(1)) <= 18 else None


# -- XML -------------------------------------------------------------------------------


def _xml_text(elem: ET.Element, path: str) -> str | None:
    found = elem.find(path)
    return None if found is None or found.text is None else found.text


def parse_query_xml(text: str) -> SmiReport:
    """Parse ``nvidia-smi -q -x``; raise :class:`InputError` when it is not that XML."""
    try:
        root = ET.fromstring(text.strip())
    except ET.ParseError as exc:
        raise InputError("nvidia-smi -q -x", text[:40], f"is not XML ({exc})") from None
    if root.tag != "nvidia_smi_log":
        raise InputError("nvidia-smi -q -x", root.tag, "root element must be <nvidia_smi_log>")
    gpus: list[GpuRecord] = []
    for i, g in enumerate(root.findall("gpu")):
        link = "pci/pci_gpu_link_info/"
        gpus.append(
            GpuRecord(
                index=i,
                name=(_xml_text(g, "product_name") or "unknown").strip(),
                uuid=_clean(_xml_text(g, "uuid")),
                bus_id=_clean(g.get("id")),
                memory_total_mib=_int(_xml_text(g, "fb_memory_usage/total")),
                memory_free_mib=_int(_xml_text(g, "fb_memory_usage/free")),
                pcie_gen_max=_int(_xml_text(g, link + "pcie_gen/max_link_gen")),
                pcie_gen_current=_int(_xml_text(g, link + "pcie_gen/current_link_gen")),
                pcie_width_max=_int(_xml_text(g, link + "link_widths/max_link_width")),
                pcie_width_current=_int(_xml_text(g, link + "link_widths/current_link_width")),
            )
        )
    return SmiReport(
        format="xml", driver_version=_clean(_xml_text(root, "driver_version")), gpus=tuple(gpus)
    )


# -- text (-q) -------------------------------------------------------------------------


@dataclass(slots=True)
class _Node:
    value: str | None
    children: list[tuple[str, _Node]]

    def get(self, *path: str) -> _Node | None:
        node: _Node | None = self
        for key in path:
            if node is None:
                return None
            node = next((child for k, child in node.children if k == key), None)
        return node

    def text(self, *path: str) -> str | None:
        node = self.get(*path)
        return None if node is None else node.value


_GPU_HEADER = re.compile(r"^GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")


def _text_tree(text: str) -> _Node:
    root = _Node(None, [])
    stack: list[tuple[int, _Node]] = [(-1, root)]
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("="):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        line = raw.strip()
        key, sep, value = line.partition(":")
        if _GPU_HEADER.match(line) or not sep:
            key, value_opt = line, None
        else:
            key, value_opt = key.strip(), value.strip()
        while stack[-1][0] >= indent:
            stack.pop()
        node = _Node(value_opt, [])
        stack[-1][1].children.append((key, node))
        stack.append((indent, node))
    return root


def parse_query_text(text: str) -> SmiReport:
    """Parse ``nvidia-smi -q`` (or ``-a``); raise :class:`InputError` when it is not that."""
    if "Attached GPUs" not in text:
        raise InputError("nvidia-smi -q", text[:40], "has no 'Attached GPUs' line")
    root = _text_tree(text)
    gpus: list[GpuRecord] = []
    for key, g in root.children:
        if not key.startswith("GPU "):
            continue
        link = ("PCI", "GPU Link Info")
        gpus.append(
            GpuRecord(
                index=len(gpus),
                name=g.text("Product Name") or "unknown",
                uuid=_clean(g.text("GPU UUID")),
                bus_id=key.removeprefix("GPU ").strip(),
                memory_total_mib=_int(g.text("FB Memory Usage", "Total")),
                memory_free_mib=_int(g.text("FB Memory Usage", "Free")),
                pcie_gen_max=_int(g.text(*link, "PCIe Generation", "Max")),
                pcie_gen_current=_int(g.text(*link, "PCIe Generation", "Current")),
                pcie_width_max=_int(g.text(*link, "Link Width", "Max")),
                pcie_width_current=_int(g.text(*link, "Link Width", "Current")),
            )
        )
    return SmiReport(
        format="text", driver_version=_clean(root.text("Driver Version")), gpus=tuple(gpus)
    )


# -- CSV (--query-gpu) -----------------------------------------------------------------


def parse_query_csv(text: str) -> SmiReport:
    """Parse ``--query-gpu=... --format=csv[,nounits]`` output that has a header row.

    Recognised fields: ``name``, ``uuid``, ``pci.bus_id``, ``driver_version``,
    ``memory.total``, ``memory.free``, ``pcie.link.gen.max``,
    ``pcie.link.gen.current``, ``pcie.link.width.max``, ``pcie.link.width.current``.
    """
    try:
        reader = csv.reader(io.StringIO(text.strip(), newline=""), skipinitialspace=True)
        rows = [r for r in reader if r]
    except csv.Error as exc:
        raise InputError("nvidia-smi --query-gpu", text[:40], f"is not CSV ({exc})") from None
    if not rows:
        raise InputError("nvidia-smi --query-gpu", text[:40], "is empty")
    header = [re.sub(r"\s*\[.*\]$", "", h.strip()) for h in rows[0]]
    if "name" not in header and "uuid" not in header:
        raise InputError(
            "nvidia-smi --query-gpu", rows[0][:3], "needs a header row with 'name' or 'uuid'"
        )
    gpus: list[GpuRecord] = []
    driver: str | None = None
    for i, row in enumerate(rows[1:]):
        rec = dict(zip(header, (c.strip() for c in row), strict=False))
        driver = driver or _clean(rec.get("driver_version"))
        gpus.append(
            GpuRecord(
                index=i,
                name=_clean(rec.get("name")) or "unknown",
                uuid=_clean(rec.get("uuid")),
                bus_id=_clean(rec.get("pci.bus_id")),
                memory_total_mib=_int(rec.get("memory.total")),
                memory_free_mib=_int(rec.get("memory.free")),
                pcie_gen_max=_int(rec.get("pcie.link.gen.max")),
                pcie_gen_current=_int(rec.get("pcie.link.gen.current")),
                pcie_width_max=_int(rec.get("pcie.link.width.max")),
                pcie_width_current=_int(rec.get("pcie.link.width.current")),
            )
        )
    return SmiReport(format="csv", driver_version=driver, gpus=tuple(gpus))


# -- the default summary table (nvidia-smi with no arguments) ---------------------------

_ROW = re.compile(r"^\|\s+(?P<idx>\d+)\s+(?P<name>.+?)\s+(?:On|Off|WDDM|TCC)\s+\|\s+(?P<bus>\S+)")
_MEM = re.compile(r"(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB")
_DRIVER = re.compile(r"(?:Driver|KMD) Version:\s*(?P<v>\S+)")


def parse_summary_table(text: str) -> SmiReport:
    """Parse the default ``nvidia-smi`` table: index, name (as wide as the column), memory.

    The table prints no UUID and no PCIe link; those fields are None.
    """
    m = _DRIVER.search(text)
    if "NVIDIA-SMI" not in text or m is None:
        raise InputError("nvidia-smi", text[:40], "is not the nvidia-smi summary table")
    gpus: list[GpuRecord] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "Processes:" in line or "MIG devices" in line:
            break
        row = _ROW.match(line)
        if row is None or i + 1 >= len(lines):
            continue
        mem = _MEM.search(lines[i + 1])
        total = int(mem["total"]) if mem else None
        gpus.append(
            GpuRecord(
                index=int(row["idx"]),
                name=row["name"].strip(),
                uuid=None,
                bus_id=row["bus"],
                memory_total_mib=total,
                memory_free_mib=None if mem is None or total is None else total - int(mem["used"]),
                pcie_gen_max=None,
                pcie_gen_current=None,
                pcie_width_max=None,
                pcie_width_current=None,
            )
        )
    return SmiReport(format="table", driver_version=m["v"], gpus=tuple(gpus))


def parse_nvidia_smi(text: str) -> SmiReport:
    """Parse any of the four formats, detected from the text."""
    head = text.lstrip()[:200]
    if head.startswith("<?xml") or head.startswith("<nvidia_smi_log"):
        return parse_query_xml(text)
    if "Attached GPUs" in text:
        return parse_query_text(text)
    if "NVIDIA-SMI" in text[:600] and _DRIVER.search(text[:600]):
        return parse_summary_table(text)
    return parse_query_csv(text)
