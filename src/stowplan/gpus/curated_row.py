"""One row of the curated GPU table (:mod:`stowplan.gpus.curated`) and the link wordings
its rows share.

The rows themselves live by vendor and market in ``curated_nvidia_datacenter``,
``curated_nvidia_desktop`` and ``curated_amd_apple``.
"""

from __future__ import annotations

from stowplan.gpus.derive import derive_tensor_tflops
from stowplan.gpus.spec import GpuSpec

__all__ = ["BRIDGE", "NO_LINK", "gpu"]


def gpu(
    name: str,
    bw: float,
    memory_gb: float,
    bw_source: str,
    tflops: float | None = None,
    tflops_source: str = "",
    *,
    derive: tuple[str, int, float, bool] | None = None,
    aliases: tuple[str, ...] = (),
    arch: str | None = None,
    nvlink: float | None = None,
    pcie: int | None = None,
    link_source: str = "",
) -> GpuSpec:
    """One row; ``derive=(architecture, tensor cores, boost MHz, consumer)`` computes the
    TFLOPs (TPU core count and clock) when no figure is given."""
    if tflops is None and derive is not None:
        out = derive_tensor_tflops(derive[0], derive[1], derive[2], consumer=derive[3])
        assert out is not None, name
        tflops, tflops_source = out[0], f"{out[1]} (TPU counts)"
    return GpuSpec(
        name=name,
        mem_bandwidth_gbps=bw,
        bf16_tflops=tflops,
        memory_gb=memory_gb,
        bandwidth_source=bw_source,
        tflops_source=tflops_source or "not published",
        aliases=aliases,
        architecture=arch or (derive[0].split(" GA100")[0] if derive else None),
        nvlink_gbps=nvlink,
        pcie_gen=pcie,
        interconnect_source=link_source,
    )


NO_LINK = "no NVLink; peers over PCIe"
"""The link of a part without NVLink."""
BRIDGE = "NVLink bridge (optional) 112.5 GB/s bidirectional"
"""The link of a part with an optional two-card NVLink bridge."""
