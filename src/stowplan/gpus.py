"""GPU spec table: memory bandwidth and dense bf16 TFLOPs per GPU model, with sources.

The cost model takes a node's bandwidth and FLOPs from its descriptor when
given and from this table otherwise (by ``gpu_name``).  Figures are dense
(no 2:4 sparsity) bf16 tensor TFLOPs with FP32 accumulate, and bandwidth in
decimal GB/s.  Source tags:

* ``WP-Ada`` — NVIDIA Ada GPU Architecture whitepaper, appendix A.
* ``WP-RTXBW`` — NVIDIA RTX Blackwell GPU Architecture whitepaper, table 3.
* ``WP-GA102`` — NVIDIA Ampere GA102 whitepaper, appendix A, table 9.
* ``AIC`` — NVIDIA aiconfigurator system files (``systems/*.yaml``).
* ``STAS`` — stas00/ml-engineering, ``compute/accelerator/README.md``.
* ``GKW`` — glennklockwood.com, H100 page.
* ``APPLE-M2U`` — Apple newsroom, M2 Ultra announcement.
* ``DBGG`` — db.thegpu.guru card pages (memory bus width and data rate; bandwidth is
  their product).
* ``unverified`` — a commonly quoted figure not confirmed against a primary source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["GPU_SPECS", "GpuSpec", "lookup_gpu", "normalise_gpu_name"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """Datasheet figures of one GPU model."""

    name: str
    """Canonical name, e.g. ``RTX 4090``."""
    mem_bandwidth_gbps: float
    """Memory bandwidth, GB/s (decimal)."""
    bf16_tflops: float | None
    """Dense bf16 tensor TFLOPs (FP32 accumulate); None when not published."""
    memory_gb: float
    """Memory of the spec sheet, GB (decimal)."""
    source: str
    """Where the bandwidth and TFLOPs figures come from."""
    aliases: tuple[str, ...] = ()
    """Other spellings, already normalised (see :func:`normalise_gpu_name`)."""


GPU_SPECS: tuple[GpuSpec, ...] = (
    GpuSpec(
        name="RTX 3090",
        mem_bandwidth_gbps=936,
        bf16_tflops=71.0,
        memory_gb=24,
        source="bandwidth unverified; TFLOPs WP-GA102, WP-RTXBW",
        aliases=("3090",),
    ),
    GpuSpec(
        name="RTX 4090",
        mem_bandwidth_gbps=1008,
        bf16_tflops=165.2,
        memory_gb=24,
        source="WP-Ada",
        aliases=("4090",),
    ),
    GpuSpec(
        name="RTX 4080",
        mem_bandwidth_gbps=716.8,
        bf16_tflops=97.5,
        memory_gb=16,
        source="bandwidth DBGG (256-bit x 22.4 Gbps GDDR6X); TFLOPs unverified",
        aliases=("4080",),
    ),
    GpuSpec(
        name="RTX 5090",
        mem_bandwidth_gbps=1792,
        bf16_tflops=209.5,
        memory_gb=32,
        source="WP-RTXBW",
        aliases=("5090",),
    ),
    GpuSpec(
        name="A10G",
        mem_bandwidth_gbps=600,
        bf16_tflops=None,
        memory_gb=24,
        source="bandwidth unverified; TFLOPs not published for the A10G",
    ),
    GpuSpec(name="L4", mem_bandwidth_gbps=300, bf16_tflops=121, memory_gb=24, source="AIC"),
    GpuSpec(
        name="L40S", mem_bandwidth_gbps=864, bf16_tflops=362.05, memory_gb=48, source="AIC, STAS"
    ),
    GpuSpec(
        name="A100 40GB",
        mem_bandwidth_gbps=1555,
        bf16_tflops=312,
        memory_gb=40,
        source="bandwidth unverified; TFLOPs STAS",
        # A bare "A100" is taken as the 40 GB part: the lower bandwidth of the two.
        aliases=("a100 sxm4 40gb", "a100 pcie 40gb", "a100 40gb pcie", "a100 40gb sxm4", "a100"),
    ),
    GpuSpec(
        name="A100 80GB SXM4",
        mem_bandwidth_gbps=2039,
        bf16_tflops=312,
        memory_gb=80,
        source="AIC, STAS",
        aliases=("a100 sxm4 80gb", "a100 80gb", "a100 sxm 80gb", "a100 sxm"),
    ),
    GpuSpec(
        name="A100 80GB PCIe",
        mem_bandwidth_gbps=1935,
        bf16_tflops=312,
        memory_gb=80,
        source="AIC, STAS",
        aliases=("a100 pcie 80gb", "a100 pcie"),
    ),
    GpuSpec(
        name="H100 SXM5",
        mem_bandwidth_gbps=3350,
        bf16_tflops=989,
        memory_gb=80,
        source="AIC, STAS, GKW",
        aliases=("h100 80gb hbm3", "h100 sxm", "h100 sxm5 80gb", "h100"),
    ),
    GpuSpec(
        name="H100 PCIe",
        mem_bandwidth_gbps=2000,
        bf16_tflops=756.5,
        memory_gb=80,
        source="AIC, STAS",
        aliases=("h100 pcie 80gb",),
    ),
    GpuSpec(
        name="H200",
        mem_bandwidth_gbps=4800,
        bf16_tflops=989,
        memory_gb=141,
        source="AIC, STAS",
        aliases=("h200 sxm", "h200 141gb hbm3e", "h200 sxm 141gb"),
    ),
    GpuSpec(
        name="B200",
        mem_bandwidth_gbps=7700,
        bf16_tflops=2250,
        memory_gb=180,
        source="AIC (STAS says 8000 GB/s; the lower figure is used)",
    ),
    GpuSpec(
        name="GB200", mem_bandwidth_gbps=8000, bf16_tflops=2500, memory_gb=186, source="AIC, STAS"
    ),
    GpuSpec(
        name="MI300X",
        mem_bandwidth_gbps=5300,
        bf16_tflops=1307.4,
        memory_gb=192,
        source="STAS",
        aliases=("instinct mi300x",),
    ),
    GpuSpec(
        name="M2 Ultra",
        mem_bandwidth_gbps=800,
        bf16_tflops=None,
        memory_gb=192,
        source="APPLE-M2U (no dense 16-bit FLOP/s published)",
        aliases=("apple m2 ultra",),
    ),
)

_DROP = re.compile(r"\b(nvidia|geforce|amd|radeon|tesla)\b")


def normalise_gpu_name(name: str) -> str:
    """Lower-case, vendor words dropped, separators collapsed: ``'NVIDIA GeForce RTX 4090'``
    → ``'rtx 4090'``; ``'H100-80GB-HBM3'`` → ``'h100 80gb hbm3'``."""
    s = name.lower().replace("_", " ").replace("-", " ")
    s = _DROP.sub(" ", s)
    return " ".join(s.split())


def _index() -> dict[str, GpuSpec]:
    out: dict[str, GpuSpec] = {}
    for spec in GPU_SPECS:
        for key in (normalise_gpu_name(spec.name), *spec.aliases):
            out[key] = spec
            out[key.replace(" ", "")] = spec
    return out


_INDEX = _index()


def lookup_gpu(gpu_name: str) -> GpuSpec | None:
    """The spec of ``gpu_name`` (tolerant of vendor prefixes and spacing); None when unknown.

    ``lookup_gpu("NVIDIA GeForce RTX 4090")``, ``lookup_gpu("RTX 4090")`` and
    ``lookup_gpu("rtx4090")`` all give the RTX 4090 row; ``"H100 80GB HBM3"``
    (nvidia-smi's name of the SXM part) gives the H100 SXM5 row.
    """
    key = normalise_gpu_name(gpu_name)
    for candidate in (key, key.replace(" ", ""), key.removeprefix("rtx ")):
        if candidate in _INDEX:
            return _INDEX[candidate]
    # "RTX 4090 D", "H100 80GB HBM3 MIG 1g": the longest known name that starts the string.
    best: GpuSpec | None = None
    best_len = 0
    for known, spec in _INDEX.items():
        if " " in known and key.startswith(known + " ") and len(known) > best_len:
            if key[len(known) + 1 :].split()[0] in _OTHER_PART:
                continue  # "RTX 4080 SUPER" is not an RTX 4080
            best, best_len = spec, len(known)
    return best


_OTHER_PART = frozenset({"ti", "super", "max", "laptop", "mobile"})
"""Suffix words (as :func:`normalise_gpu_name` leaves them: ``Max-Q`` → ``max q``) that
name a different part, never a variant of the same one."""
