"""The link between two GPUs of one node: per-direction bandwidth and one collective step.

A node's GPUs talk over NVLink (SXM/OAM parts, on an NVSwitch or a full mesh)
or over PCIe (everything else).  When a :class:`~stowplan.model.NodeDescriptor`
does not give ``intra_link_gbps`` / ``intra_link_latency_us`` and discovery
did not measure them, they come from the GPU's name:

* NVLink, GB/s per direction between two GPUs through the switch: V100 150
  (6 links × 25), A100 300 (12 × 25), H100/H200 450 (18 × 25), B200/GB200 900
  (18 × 50); one collective step ≈ 3 µs.
* PCIe otherwise: 16 lanes of the card's generation (gen 3 ≈ 16, gen 4 ≈ 32,
  gen 5 ≈ 64 GB/s per direction, raw rate); one step ≈ 12 µs (the transfer
  goes through the host bridge).

Every default is reported by :func:`intra_link` with the rule it came from, so
the cost model can list it in ``assumed``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stowplan.gpus import GpuSpec, normalise_gpu_name

__all__ = [
    "NVLINK_LATENCY_US",
    "PCIE_GBPS_X16",
    "PCIE_LATENCY_US",
    "IntraLink",
    "intra_link",
    "nvlink_gbps_per_link",
]

NVLINK_LATENCY_US = 3.0
"""One collective step between GPUs of an NVLink domain (launch plus switch hop)."""
PCIE_LATENCY_US = 12.0
"""One collective step between GPUs that reach each other over PCIe."""
PCIE_GBPS_X16 = {3: 15.75, 4: 31.5, 5: 63.0}
"""GB/s per direction of a ×16 PCIe link by generation (raw rate after line coding)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class IntraLink:
    """How two GPUs of one node reach each other."""

    gbps: float
    """GB/s per direction."""
    latency_us: float
    """One collective step."""
    kind: str
    """``nvlink`` or ``pcie``."""
    source: str
    """Why these figures: ``given``, or the rule of this module that chose them."""


# Part families (normalised names) and their NVLink GB/s per direction per GPU through the
# switch; only the SXM/OAM forms of these parts have NVLink to every peer.
_NVLINK: tuple[tuple[re.Pattern[str], float, str], ...] = (
    (re.compile(r"\bgb200\b|\bb200\b|\bb100\b"), 900.0, "NVLink 5: 18 links × 50 GB/s"),
    (re.compile(r"\bh200\b"), 450.0, "NVLink 4: 18 links × 25 GB/s"),
    (re.compile(r"\bh100\b(?!.*\bpcie\b)(?!.*\bnvl\b)"), 450.0, "NVLink 4: 18 links × 25 GB/s"),
    (re.compile(r"\bh800\b(?!.*\bpcie\b)"), 200.0, "NVLink 4 (H800: 8 links × 25 GB/s)"),
    (re.compile(r"\ba100\b(?!.*\bpcie\b)"), 300.0, "NVLink 3: 12 links × 25 GB/s"),
    (re.compile(r"\ba800\b(?!.*\bpcie\b)"), 200.0, "NVLink 3 (A800: 8 links × 25 GB/s)"),
    (re.compile(r"\bv100\b.*\bsxm"), 150.0, "NVLink 2: 6 links × 25 GB/s"),
    (re.compile(r"\bmi300x?\b|\bmi325x\b"), 64.0, "Infinity Fabric: 64 GB/s per peer"),
    (re.compile(r"\bmi250x?\b"), 50.0, "Infinity Fabric: 50 GB/s per peer"),
)

# PCIe generation by part family, for the figures of a card without NVLink.
_PCIE_GEN: tuple[tuple[re.Pattern[str], int], ...] = (
    (re.compile(r"\brtx 50\d0\b|\b50\d0\b|\brtx pro\b|\bb\d00\b|\bh\d00\b|\bgh200\b"), 5),
    (re.compile(r"\bl40s?\b|\bl4\b|\brtx 40\d0\b|\b40\d0\b|\bada\b|\ba100\b|\bmi\d+"), 4),
    (re.compile(r"\brtx 30\d0\b|\b30\d0\b|\ba\d0g?\b|\ba[2-6]000\b|\brtx a\d000\b"), 4),
)


def nvlink_gbps_per_link(generation: int) -> float:
    """GB/s per direction of one NVLink link: 25 for generations 2-4, 50 for 5."""
    return 50.0 if generation >= 5 else 25.0


def intra_link(
    gpu_name: str,
    *,
    gbps: float | None = None,
    latency_us: float | None = None,
    spec: GpuSpec | None = None,
) -> IntraLink:
    """The GPU-to-GPU link of a node of ``gpu_name`` parts; given figures win.

    ``spec``, the part ``gpu_name`` resolved to, decides first: its NVLink figure, else
    its PCIe generation; the name's family (this module's table) only when it has neither.
    """
    given = gbps is not None and latency_us is not None
    if spec is not None and spec.nvlink_gbps is not None:
        return IntraLink(
            gbps=spec.nvlink_gbps if gbps is None else gbps,
            latency_us=NVLINK_LATENCY_US if latency_us is None else latency_us,
            kind="nvlink",
            source="given" if given else f"{spec.name}: {spec.interconnect_source or 'NVLink'}",
        )
    if spec is not None and spec.pcie_gen in PCIE_GBPS_X16:
        gen = spec.pcie_gen
        return IntraLink(
            gbps=PCIE_GBPS_X16[gen] if gbps is None else gbps,
            latency_us=PCIE_LATENCY_US if latency_us is None else latency_us,
            kind="pcie",
            source="given" if given else f"{spec.name}: PCIe gen {gen} ×16",
        )
    key = normalise_gpu_name(gpu_name)
    for pattern, nv_gbps, why in _NVLINK:
        if pattern.search(key):
            return IntraLink(
                gbps=nv_gbps if gbps is None else gbps,
                latency_us=NVLINK_LATENCY_US if latency_us is None else latency_us,
                kind="nvlink",
                source="given" if gbps is not None and latency_us is not None else why,
            )
    gen = next((g for pattern, g in _PCIE_GEN if pattern.search(key)), 4)
    return IntraLink(
        gbps=PCIE_GBPS_X16[gen] if gbps is None else gbps,
        latency_us=PCIE_LATENCY_US if latency_us is None else latency_us,
        kind="pcie",
        source="given" if gbps is not None and latency_us is not None else f"PCIe gen {gen} ×16",
    )
