"""Deprecated: these names live in :mod:`stowplan.gpus.interconnect`."""

from __future__ import annotations

from stowplan.moved import moved

__getattr__ = moved(
    __name__,
    dict.fromkeys(
        (
            "IntraLink",
            "NVLINK_LATENCY_US",
            "PCIE_GBPS_X16",
            "PCIE_LATENCY_US",
            "intra_link",
            "nvlink_gbps_per_link",
        ),
        "stowplan.gpus.interconnect",
    ),
)
