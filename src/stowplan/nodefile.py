"""Reading candidate nodes from files: fleet files (YAML/JSON) and provider offer lists.

A fleet file is a list of node objects, or an object with a ``nodes`` list.
Each node object has :class:`~stowplan.model.NodeDescriptor`'s fields; sizes
may be integers (bytes) or strings (``"24GiB"``), link speeds numbers (Mbit/s)
or strings (``"1Gbit"``); ``count: N`` repeats a node as ``<id>-0 … <id>-N-1``.

An offer file is vast.ai's ``search offers --raw`` JSON (a list of offers, one
offer, or ``{"offers": [...]}``).  Units there: ``gpu_ram``/``gpu_total_ram``
in MB as nvidia-smi prints them (MiB), ``total_flops`` summed over the offer's
GPUs, ``inet_up`` in Mbit/s, ``dph_total`` in $/hour for the whole offer.
``gpu_mem_bw`` is vast's own measurement, not a datasheet figure; it is kept
as a label and the spec table supplies the bandwidth.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from stowplan.checks import check_int
from stowplan.errors import InputError
from stowplan.fileio import FileKind, read_document_file
from stowplan.model import NodeDescriptor, check_unique_ids
from stowplan.units import parse_bytes, parse_link_mbps

__all__ = ["MAX_COUNT", "load_nodes", "load_offers", "nodes_from_data", "nodes_from_offers"]

MAX_COUNT = 4096
"""Most copies one fleet entry's ``count`` may make."""

_FIELDS = {
    "id",
    "gpu_name",
    "vram_bytes",
    "flops_estimate",
    "link_mbps",
    "mem_bandwidth_gbps",
    "link_latency_ms",
    "price_per_hour",
    "num_gpus",
    "labels",
    "count",
}
_REQUIRED = ("id", "gpu_name", "vram_bytes")


def _number(where: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InputError(where, value, "must be a finite number")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise InputError(where, value, "must be a finite number") from None
    if not math.isfinite(number):
        raise InputError(where, value, "must be a finite number")
    return number


def _whole(where: str, value: object, minimum: int) -> int:
    """A count given as an integer or an integral number (``2``, ``2.0``, ``"2"``)."""
    number = _number(where, value)
    if number != int(number) or number < minimum:
        raise InputError(where, value, f"must be an integer >= {minimum}")
    return int(number)


def _node(index: int, raw: object) -> list[NodeDescriptor]:
    where = f"nodes[{index}]"
    if not isinstance(raw, dict):
        raise InputError(where, raw, "must be an object with NodeDescriptor fields")
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise InputError(
            f"{where}.{unknown[0]}", raw[unknown[0]], f"is not a node field; use {sorted(_FIELDS)}"
        )
    for key in _REQUIRED:
        if key not in raw:
            raise InputError(f"{where}.{key}", None, "is required")
    node_id = str(raw["id"])
    kwargs: dict[str, Any] = {
        "id": node_id,
        "gpu_name": str(raw["gpu_name"]),
        "vram_bytes": parse_bytes(raw["vram_bytes"], field=f"{where}.vram_bytes"),
        "flops_estimate": _number(f"{where}.flops_estimate", raw.get("flops_estimate", 0.0)),
        "link_mbps": parse_link_mbps(raw.get("link_mbps", 0.0), field=f"{where}.link_mbps"),
    }
    for key in ("mem_bandwidth_gbps", "link_latency_ms", "price_per_hour"):
        if raw.get(key) is not None:
            kwargs[key] = _number(f"{where}.{key}", raw[key])
    if "num_gpus" in raw:
        kwargs["num_gpus"] = raw["num_gpus"]
    if "labels" in raw:
        labels = raw["labels"]
        if not isinstance(labels, dict):
            raise InputError(f"{where}.labels", labels, "must be a mapping of strings")
        kwargs["labels"] = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
    count = raw.get("count", 1)
    check_int(f"{where}.count", count, minimum=1)
    if count > MAX_COUNT:
        raise InputError(f"{where}.count", count, f"must be at most {MAX_COUNT}")
    if count == 1:
        return [NodeDescriptor(**kwargs)]
    return [NodeDescriptor(**{**kwargs, "id": f"{node_id}-{i}"}) for i in range(count)]


def nodes_from_data(data: object) -> list[NodeDescriptor]:
    """Nodes from already-parsed fleet data."""
    if isinstance(data, dict) and "nodes" in data:
        data = data["nodes"]
    if not isinstance(data, list) or not data:
        raise InputError("nodes", data, "must be a non-empty list of node objects")
    nodes = [n for i, raw in enumerate(data) for n in _node(i, raw)]
    check_unique_ids(nodes)
    return nodes


def load_nodes(path: str | Path) -> list[NodeDescriptor]:
    """Nodes from a YAML or JSON fleet file (read within :class:`FileKind` ``FLEET``'s limits)."""
    return nodes_from_data(read_document_file(path, field="file", kind=FileKind.FLEET))


def _offer(index: int, raw: object) -> NodeDescriptor:
    where = f"offers[{index}]"
    if not isinstance(raw, dict):
        raise InputError(where, raw, "must be a vast.ai offer object")
    for key in ("id", "gpu_name", "gpu_ram"):
        if raw.get(key) is None:
            raise InputError(f"{where}.{key}", None, "is required in a vast.ai offer")
    num_gpus = _whole(f"{where}.num_gpus", raw.get("num_gpus", 1), 0)
    per_gpu_mib = _number(f"{where}.gpu_ram", raw["gpu_ram"])
    if per_gpu_mib < 0:
        raise InputError(f"{where}.gpu_ram", per_gpu_mib, "must be >= 0 MB")
    total_mib = raw.get("gpu_total_ram")
    total_mib = (
        _number(f"{where}.gpu_total_ram", total_mib)
        if total_mib is not None
        else per_gpu_mib * num_gpus
    )
    if total_mib < 0:
        raise InputError(f"{where}.gpu_total_ram", total_mib, "must be >= 0 MB")

    labels = [("source", "vastai")]
    if raw.get("gpu_mem_bw") is not None:
        labels.append(("vast_gpu_mem_bw_gbps", str(raw["gpu_mem_bw"])))
    if raw.get("geolocation"):
        labels.append(("geolocation", str(raw["geolocation"])))
    price = raw.get("dph_total")
    return NodeDescriptor(
        id=f"offer-{raw['id']}",
        gpu_name=str(raw["gpu_name"]),
        vram_bytes=int(total_mib * 2**20),
        flops_estimate=_number(f"{where}.total_flops", raw.get("total_flops", 0.0)),
        link_mbps=_number(f"{where}.inet_up", raw.get("inet_up", 0.0)),
        price_per_hour=None if price is None else _number(f"{where}.dph_total", price),
        num_gpus=max(num_gpus, 1),
        labels=tuple(labels),
    )


def nodes_from_offers(data: object) -> list[NodeDescriptor]:
    """Nodes from already-parsed vast.ai offer JSON."""
    if isinstance(data, dict):
        data = data.get("offers", [data])
    if not isinstance(data, list) or not data:
        raise InputError("offers", data, "must be a non-empty list of vast.ai offers")
    nodes = [_offer(i, raw) for i, raw in enumerate(data)]
    check_unique_ids(nodes)
    return nodes


def load_offers(path: str | Path) -> list[NodeDescriptor]:
    """Nodes from a vast.ai ``search offers --raw`` JSON file."""
    return nodes_from_offers(read_document_file(path, field="file", kind=FileKind.OFFERS))
