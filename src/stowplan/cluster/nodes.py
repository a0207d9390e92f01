"""Node descriptors of a live Ray cluster.

One small task runs on every alive node (pinned by node id, zero CPUs) and
reports what that host sees: the GPUs NVML lists when NVML is present,
otherwise nothing.  The descriptor then takes, in order of precedence,

* ``gpu_name`` / ``vram_bytes``: NVML's figures, else the node labels of the
  same names (set with ``ray start --labels``), else the Ray ``GPU`` count
  with an empty name and no VRAM;
* ``link_mbps`` / ``mem_bandwidth_gbps``: the node's hardware passport
  (:mod:`stowplan.host.passport`, read on the node itself by the probe task;
  :func:`stowplan.host.node_from_passport` turns it into figures) when one is
  there, else the labels ``link_mbps`` and ``mem_bandwidth_gbps``;
* ``flops_estimate``: the label ``flops_tflops``;
* ``intra_link_gbps`` / ``intra_link_latency_us`` (nodes of two or more GPUs):
  the node's ``nvidia-smi topo -m`` read on the node itself
  (:func:`stowplan.host.discover.probe_gpu_links`: the weakest GPU pair), else
  the passport's probe of the same; recorded in the ``measured`` label
  (``intra_link``) and the ``intra_link`` label (how it was read).  A matrix
  listing another number of GPUs than the node has is not used;

  a figure given by neither is 0 (the label ``assumed`` lists which).

``id`` is the Ray node id, so a plan over these descriptors names Ray nodes
directly.  Nodes without VRAM (the head of a CPU-only cluster) are left out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stowplan.cluster.ray_runtime import require_ray
from stowplan.errors import InputError, NodeProbeError, StowplanError
from stowplan.model import NodeDescriptor
from stowplan.quantities.units import parse_bytes

__all__ = [
    "GpuReport",
    "NodeProbeError",
    "describe",
    "passport_figures",
    "ray_gpu_count",
    "ray_node_descriptors",
]

NODE_ID_LABEL = "ray.io/node-id"


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuReport:
    """What the probe task saw on one node: NVML's GPUs (empty without NVML)."""

    node_id: str
    gpu_names: tuple[str, ...] = ()
    gpu_memory_bytes: tuple[int, ...] = ()
    passport_link_mbps: float | None = None
    """The fastest network link of the node's passport, Mbit/s (None: no passport)."""
    passport_bandwidth_gbps: float | None = None
    """The measured memory bandwidth of the passport's best circuit, GB/s."""
    intra_link_gbps: float | None = None
    """GB/s per direction of the node's weakest GPU pair, probed (None: not probed)."""
    intra_link_latency_us: float | None = None
    intra_link_source: str = ""
    """How the link was read (``nvidia-smi topo -m: weakest pair …``)."""
    intra_link_gpus: int = 0
    """GPUs in the matrix that was read (0: none read, or read by the passport's probe)."""


def _passport_node(path: str | None) -> NodeDescriptor | None:
    """The passport at ``path`` (default: this host's cache) as a node, or None when there
    is none, it is unreadable, or the default one names another host."""
    import socket

    from stowplan.host.node import node_from_passport
    from stowplan.host.passport import load_passport

    passport = load_passport(path)
    if passport is None:
        return None
    if path is None and passport.topology.hostname != socket.gethostname():
        return None
    try:
        return node_from_passport(passport)
    except StowplanError:
        return None


def passport_figures(path: str | None) -> tuple[float | None, float | None]:
    """``(link_mbps, mem_bandwidth_gbps)`` of the passport at ``path`` (default: this host's
    cache), or ``(None, None)`` when there is none, it is unreadable, or the default one
    names another host."""
    node = _passport_node(path)
    if node is None:
        return None, None
    link = node.link_mbps if node.link_mbps > 0 else None
    return link, node.mem_bandwidth_gbps


def _probe_nvml() -> tuple[tuple[str, ...], tuple[int, ...]]:
    """GPU names and memory via NVML; empty when NVML or the driver is absent."""
    try:
        import pynvml
    except ImportError:
        return (), ()
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound and friends: no NVIDIA GPU here
        return (), ()
    try:
        names, memory = [], []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            names.append(name.decode() if isinstance(name, bytes) else str(name))
            memory.append(int(pynvml.nvmlDeviceGetMemoryInfo(handle).total))
        return tuple(names), tuple(memory)
    finally:
        pynvml.nvmlShutdown()


def _probe_task(passport_path: str | None, gpu_name: str) -> GpuReport:
    import ray
    from stowplan.host.discover import probe_gpu_links

    names, memory = _probe_nvml()
    passport = _passport_node(passport_path)
    probed = probe_gpu_links(names[0] if names else gpu_name)
    intra: dict[str, Any] = {}
    if probed is not None:
        count, found = probed
        intra = {
            "intra_link_gbps": found.gbps,
            "intra_link_latency_us": found.latency_us,
            "intra_link_source": found.source,
            "intra_link_gpus": count,
        }
    elif passport is not None and passport.intra_link_gbps is not None:
        intra = {
            "intra_link_gbps": passport.intra_link_gbps,
            "intra_link_latency_us": passport.intra_link_latency_us,
            "intra_link_source": "passport: " + dict(passport.labels).get("intra_link", "probed"),
        }
    return GpuReport(
        node_id=ray.get_runtime_context().get_node_id(),
        gpu_names=names,
        gpu_memory_bytes=memory,
        passport_link_mbps=None
        if passport is None or passport.link_mbps <= 0
        else passport.link_mbps,
        passport_bandwidth_gbps=None if passport is None else passport.mem_bandwidth_gbps,
        **intra,
    )


def _label_float(labels: Mapping[str, str], key: str, node_id: str) -> float | None:
    if key not in labels:
        return None
    try:
        value = float(labels[key])
    except ValueError:
        raise InputError(f"{node_id}.labels.{key}", labels[key], "must be a number") from None
    return value


def ray_gpu_count(resources: Mapping[str, float]) -> int:
    """Whole GPUs in a Ray resource map."""
    return int(resources.get("GPU", 0))


def describe(
    node_id: str, labels: Mapping[str, str], resources: Mapping[str, float], report: GpuReport
) -> NodeDescriptor:
    """One node's descriptor from its labels, its Ray resources and its probe report."""
    provenance = [("source", "ray")]
    measured: list[str] = []
    assumed = []
    ray_gpus = ray_gpu_count(resources)
    if report.gpu_names:
        gpu_name = report.gpu_names[0]
        vram = sum(report.gpu_memory_bytes)
        num_gpus = len(report.gpu_names)
        measured.append("nvml")
    else:
        gpu_name = labels.get("gpu_name", "")
        raw = labels.get("vram_bytes")
        vram = 0 if raw is None else parse_bytes(raw, field=f"{node_id}.labels.vram_bytes")
        num_gpus = max(1, ray_gpus)
    flops = _label_float(labels, "flops_tflops", node_id)
    link = _label_float(labels, "link_mbps", node_id)
    bandwidth = _label_float(labels, "mem_bandwidth_gbps", node_id)
    from_passport = []
    if report.passport_link_mbps is not None:
        link = report.passport_link_mbps
        from_passport.append("link_mbps")
    if report.passport_bandwidth_gbps is not None:
        # The passport measured one circuit (one GPU); the descriptor holds the node's total.
        bandwidth = report.passport_bandwidth_gbps * num_gpus
        from_passport.append("mem_bandwidth_gbps")
    intra_gbps, intra_us = report.intra_link_gbps, report.intra_link_latency_us
    if intra_gbps is not None and report.intra_link_gpus not in (0, max(1, num_gpus)):
        intra_gbps = intra_us = None  # the matrix of another set of GPUs (MIG, masked devices)
    if intra_gbps is not None:
        measured.append("intra_link")
    if measured:
        provenance.append(("measured", ",".join(measured)))
    if from_passport:
        provenance.append(("passport", ",".join(from_passport)))
    if intra_gbps is not None:
        provenance.append(("intra_link", report.intra_link_source))
    for key, value in (("flops_tflops", flops), ("link_mbps", link)):
        if value is None:
            assumed.append(key)
    if assumed:
        provenance.append(("assumed", ",".join(assumed)))
    provenance.append(("ray_gpus", str(ray_gpus)))
    return NodeDescriptor(
        id=node_id,
        gpu_name=gpu_name,
        vram_bytes=vram,
        flops_estimate=flops or 0.0,
        link_mbps=link or 0.0,
        mem_bandwidth_gbps=bandwidth if bandwidth else None,
        num_gpus=max(1, num_gpus),
        labels=tuple(provenance),
        intra_link_gbps=intra_gbps,
        intra_link_latency_us=intra_us,
    )


def alive_nodes() -> list[dict[str, Any]]:
    """``ray.nodes()`` entries of the alive nodes, in node-id order."""
    ray = require_ray()
    return sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: str(n["NodeID"]))


def ray_node_descriptors(
    *, timeout_s: float = 30.0, passport_path: str | None = None
) -> list[NodeDescriptor]:
    """Descriptors of the alive nodes of the connected Ray cluster that hold VRAM.

    Runs one zero-CPU task pinned to each node; raises :class:`NodeProbeError`
    when a node does not answer within ``timeout_s``.  Each node reads its
    passport at ``passport_path`` (default: its own cache dir's
    ``passport.json``, used only when it names that host).
    """
    ray = require_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0, max_retries=0)(_probe_task)
    nodes = alive_nodes()
    refs = {
        str(n["NodeID"]): probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(str(n["NodeID"]), soft=False)
        ).remote(passport_path, str(n.get("Labels", {}).get("gpu_name", "")))
        for n in nodes
    }
    out = []
    for n in nodes:
        node_id = str(n["NodeID"])
        try:
            report = ray.get(refs[node_id], timeout=timeout_s)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayError):
            with contextlib.suppress(Exception):  # already finished or gone with its node
                ray.cancel(refs[node_id], force=True)
            raise NodeProbeError(node_id, timeout_s) from None
        desc = describe(node_id, n.get("Labels", {}), n.get("Resources", {}), report)
        if desc.vram_bytes > 0:
            out.append(desc)
    return out
