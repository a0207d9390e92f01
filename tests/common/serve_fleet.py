"""A small fake-GPU fleet whose serve plan holds three replicas: one node alone, one node
of two GPUs (tensor parallel) and a two-stage pipeline of two small nodes — for the
launch tests, with and without Ray."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from stowplan import NodeDescriptor, ServePlan, Workload, serve
from stowplan.cluster.local import FakeNode
from stowplan.demo.model import demo_layout

MIB = 1 << 20
FLEET = (
    FakeNode(gpu_name="RTX-4090", vram_bytes=64 * MIB),
    FakeNode(gpu_name="RTX-3060", vram_bytes=5 * MIB),
    FakeNode(gpu_name="RTX-3060", vram_bytes=5 * MIB),
    FakeNode(gpu_name="RTX-3090", vram_bytes=64 * MIB, num_gpus=2, num_cpus=2),
)
"""The demo model is about 6.5 MiB: the 5 MiB nodes hold it only together.  The
two-GPU node has a CPU for each GPU: every stage's bundle takes one, so two replicas
side by side there need two."""
WORKLOAD = Workload(prompt_tokens=64, output_tokens=32, ttft_s=1.0, tpot_s=0.05)


def with_speeds(nodes: Sequence[NodeDescriptor]) -> list[NodeDescriptor]:
    """``nodes`` with the bandwidth, FLOPs and link serving needs (fake nodes state none)."""
    return [
        replace(n, mem_bandwidth_gbps=100.0, flops_estimate=0.01, link_mbps=10_000.0) for n in nodes
    ]


def serve_fleet(nodes: Sequence[NodeDescriptor]) -> ServePlan:
    """The demo model served on ``nodes`` (descriptors of :data:`FLEET`)."""
    return serve(demo_layout(), with_speeds(nodes), WORKLOAD)
