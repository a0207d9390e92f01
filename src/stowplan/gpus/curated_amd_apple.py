"""The curated AMD Instinct accelerators and Apple silicon chips.

Rows of :data:`stowplan.gpus.curated.CURATED`; the source tags are listed there.
"""

from __future__ import annotations

from stowplan.gpus.curated_row import gpu
from stowplan.gpus.spec import GpuSpec

__all__ = ["AMD", "APPLE"]

AMD: tuple[GpuSpec, ...] = (
    gpu("MI210", 1638.4, 64, "unverified (TPU 1640)", 181, "unverified", arch="CDNA 2.0", pcie=4),
    gpu("MI250", 3276.8, 128, "STAS (3.28 TB/s)", 362, "STAS", arch="CDNA 2.0", pcie=4),
    gpu("MI250X", 3276.8, 128, "STAS (3.28 TB/s)", 383, "STAS", arch="CDNA 2.0", pcie=4),
    gpu(
        "MI300A",
        5300,
        128,
        "unverified (TPU lists 10300)",
        980.6,
        "unverified",
        arch="CDNA 3.0",
        pcie=5,
    ),
    gpu(
        "MI300X",
        5300,
        192,
        "STAS (TPU lists 10300)",
        1307.4,
        "STAS",
        aliases=("mi300x oam",),
        arch="CDNA 3.0",
        nvlink=448,
        pcie=5,
        link_source="Infinity Fabric 7 links x 128 GB/s bidirectional (unverified)",
    ),
    gpu("MI325X", 6000, 256, "STAS (TPU lists 10300)", 1300, "STAS", arch="CDNA 3.0", pcie=5),
    gpu("MI355X", 8000, 288, "STAS", 2500, "STAS", arch="CDNA 4.0", pcie=5),
)

_APPLE_SOURCE = "unverified (Apple's announcement of the chip)"
APPLE: tuple[GpuSpec, ...] = tuple(
    gpu(name, bw, mem, src, None, "Apple publishes no dense 16-bit FLOP/s", arch="Apple")
    for name, bw, mem, src in (
        ("M1", 68.25, 16, _APPLE_SOURCE),
        ("M1 Pro", 200, 32, _APPLE_SOURCE),
        ("M1 Max", 400, 64, _APPLE_SOURCE),
        ("M1 Ultra", 800, 128, _APPLE_SOURCE),
        ("M2", 100, 24, _APPLE_SOURCE),
        ("M2 Pro", 200, 32, _APPLE_SOURCE),
        ("M2 Max", 400, 96, _APPLE_SOURCE),
        ("M2 Ultra", 800, 192, "APPLE-M2U"),
        ("M3", 100, 24, _APPLE_SOURCE),
        ("M3 Pro", 150, 36, _APPLE_SOURCE),
        ("M3 Max", 400, 128, _APPLE_SOURCE + "; the 30-core GPU bin has 300"),
        ("M3 Ultra", 819, 512, _APPLE_SOURCE),
        ("M4", 120, 32, _APPLE_SOURCE),
        ("M4 Pro", 273, 64, _APPLE_SOURCE),
        ("M4 Max", 546, 128, _APPLE_SOURCE + "; the 32-core GPU bin has 410"),
    )
)
