"""The NVLink fabric of a host, read from ``nvidia-smi -q`` (pure: text in, values out).

Multi-node NVLink systems (GB200 NVL72 and kin) report, per GPU, a ``Fabric``
block::

    Fabric
        State                             : Completed
        Status                            : Success
        CliqueId                          : 2
        ClusterUUID                       : dc6e40c4-d722-4357-9ba6-5291dd461278

GPUs that share a ClusterUUID and a CliqueId share one NVLink switch fabric:
an *NVLink domain*.  A GPU belongs to a domain only when its fabric
registration finished (State ``Completed``) and succeeded (Status
``Success``) and its ClusterUUID is a real one: ``N/A``, empty or all zeros
(every single-node H100 HGX box prints zeros) mean *no* domain.

The domain key is ``<clusteruuid>_<cliqueid>``; a node registers it with Ray
as the custom resource ``nvlink_domain_<key>``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stowplan.errors import InputError
from stowplan.files.safeload import parse_json

__all__ = [
    "DOMAIN_RESOURCE_PREFIX",
    "GpuFabric",
    "domain_resource",
    "node_domain",
    "parse_fabric",
    "parse_fabric_json_lines",
]

DOMAIN_RESOURCE_PREFIX = "nvlink_domain_"
"""Prefix of the Ray custom resource that names a node's NVLink domain."""

_NVML_FABRIC_STATE_COMPLETED = 3
"""``NVML_GPU_FABRIC_STATE_COMPLETED``."""

_ABSENT = {"", "n/a", "na", "none", "[n/a]", "not supported", "[not supported]"}
_GPU_HEADER = re.compile(
    r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$"
)
_KEY_VALUE = re.compile(r"^\s*([A-Za-z][A-Za-z ]*?)\s*:\s*(.*?)\s*$")
_XML_GPU = re.compile(r"<gpu\s+id=\"([^\"]+)\"\s*>(.*?)</gpu>", re.S)
_XML_FABRIC = re.compile(r"<fabric>(.*?)</fabric>", re.S)


def _absent(value: str | None) -> bool:
    return value is None or value.strip().lower() in _ABSENT


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuFabric:
    """The fabric registration of one GPU, as reported (strings kept verbatim)."""

    gpu: str
    """PCI bus id (``00000000:18:00.0``) or, when the source has none, the GPU's index."""
    state: str | None
    """``Completed``, ``In Progress``, ``Not Started``, ``N/A`` …"""
    status: str | None
    """``Success`` or the failure (``Insufficient Resources`` …)."""
    clique_id: str | None
    cluster_uuid: str | None

    @classmethod
    def from_nvml(
        cls, *, gpu: str, state: int, status: int, clique_id: int, cluster_uuid: bytes | str
    ) -> GpuFabric:
        """From ``nvmlDeviceGetGpuFabricInfo`` values (state 3 = completed, status 0 = success)."""
        if isinstance(cluster_uuid, bytes | bytearray):
            raw = bytes(cluster_uuid)
            if len(raw) == 16:
                h = raw.hex()
                uuid = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
            else:
                uuid = raw.decode("ascii", "replace").strip("\x00")
        else:
            uuid = cluster_uuid
        return cls(
            gpu=gpu,
            state="Completed" if state == _NVML_FABRIC_STATE_COMPLETED else str(state),
            status="Success" if status == 0 else str(status),
            clique_id=str(clique_id),
            cluster_uuid=uuid,
        )

    @property
    def domain(self) -> str | None:
        """``<clusteruuid>_<cliqueid>`` when the GPU is in a real NVLink domain, else None."""
        if (self.state or "").strip().lower() != "completed":
            return None
        if (self.status or "").strip().lower() != "success":
            return None
        if _absent(self.cluster_uuid) or _absent(self.clique_id):
            return None
        assert self.cluster_uuid is not None and self.clique_id is not None
        uuid = self.cluster_uuid.strip().lower()
        if not re.fullmatch(r"[0-9a-f-]+", uuid) or not uuid.replace("-", "").strip("0"):
            return None
        clique = self.clique_id.strip()
        if not clique.isdigit():
            return None
        return f"{uuid}_{int(clique)}"


def _parse_text(text: str) -> list[GpuFabric]:
    found: list[GpuFabric] = []
    gpu: str | None = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        header = _GPU_HEADER.match(line.strip())
        if header and not line.startswith(" "):
            gpu = header.group(1)
        if line.strip() == "Fabric":
            indent = len(line) - len(line.lstrip())
            fields: dict[str, str] = {}
            i += 1
            while i < len(lines):
                child = lines[i]
                if not child.strip() or len(child) - len(child.lstrip()) <= indent:
                    break
                kv = _KEY_VALUE.match(child)
                if kv and len(child) - len(child.lstrip()) > indent:
                    fields.setdefault(kv.group(1).strip(), kv.group(2))
                i += 1
            found.append(
                GpuFabric(
                    gpu=gpu if gpu is not None else str(len(found)),
                    state=fields.get("State"),
                    status=fields.get("Status"),
                    clique_id=fields.get("CliqueId"),
                    cluster_uuid=fields.get("ClusterUUID"),
                )
            )
            gpu = None
            continue
        i += 1
    return found


def _xml_field(block: str, tag: str) -> str | None:
    m = re.search(rf"<{tag}>(.*?)</{tag}>", block, re.S)
    return None if m is None else m.group(1).strip()


def _parse_xml(text: str) -> list[GpuFabric]:
    found: list[GpuFabric] = []
    for gpu_id, body in _XML_GPU.findall(text):
        m = _XML_FABRIC.search(body)
        if m is None:
            continue
        block = m.group(1)
        found.append(
            GpuFabric(
                gpu=gpu_id,
                state=_xml_field(block, "state"),
                status=_xml_field(block, "status"),
                clique_id=_xml_field(block, "cliqueId"),
                cluster_uuid=_xml_field(block, "clusterUuid"),
            )
        )
    return found


def parse_fabric(text: str) -> tuple[GpuFabric, ...]:
    """Every GPU's ``Fabric`` block in ``nvidia-smi -q`` text or ``-q -x`` XML, in order.

    GPUs whose output has no Fabric block (older drivers) are absent from the
    result; an output without any Fabric block gives ``()``.
    """
    if "<nvidia_smi_log" in text:
        return tuple(_parse_xml(text))
    return tuple(_parse_text(text))


def parse_fabric_json_lines(lines: Iterable[str]) -> tuple[GpuFabric, ...]:
    """GPUs from NVML fabric records, one JSON object a line.

    Keys: ``gpu_uuid``, ``clique_id``, ``cluster_uuid``, ``state``, ``status``
    (the shape monitoring agents export). Lines that are not such objects are skipped.
    """
    found: list[GpuFabric] = []
    for raw in lines:
        line = raw.strip().lstrip("#").strip()
        if not line.startswith("{"):
            continue
        try:
            record = parse_json(line.replace(",...}", "}"), field="fabric record", source=line)
        except InputError:
            continue
        if not isinstance(record, dict) or "cluster_uuid" not in record:
            continue
        found.append(
            GpuFabric(
                gpu=str(record.get("gpu_uuid", len(found))),
                state=str(record.get("state")),
                status=str(record.get("status")),
                clique_id=str(record.get("clique_id")),
                cluster_uuid=str(record.get("cluster_uuid")),
            )
        )
    return tuple(found)


def node_domain(gpus: Sequence[GpuFabric]) -> str | None:
    """The NVLink domain of a node: the one domain all its GPUs report, or None.

    Raises :class:`InputError` when the GPUs disagree (some in a domain, some
    not, or in different domains): such a node must not be pinned anywhere
    until its fabric is repaired.
    """
    domains = {g.gpu: g.domain for g in gpus}
    distinct = set(domains.values())
    if len(distinct) <= 1:
        return next(iter(distinct), None)
    shown = ", ".join(f"{gpu}={d or 'none'}" for gpu, d in domains.items())
    raise InputError(
        "Fabric",
        f"{len(distinct)} domains",
        f"all GPUs of one node must report the same NVLink domain; got {shown}",
    )


def domain_resource(domain: str) -> str:
    """The Ray custom-resource name for an NVLink domain key."""
    return f"{DOMAIN_RESOURCE_PREFIX}{domain}"
