"""Reading candidate nodes from files: fleet files (YAML/JSON) and provider offer lists.

A fleet file is a list of node objects, or an object with a ``nodes`` list;
:func:`load_nodes` also takes an offer file in its place.
Each node object has :class:`~stowplan.model.NodeDescriptor`'s fields; sizes
may be integers (bytes) or strings (``"24GiB"``), link speeds numbers (Mbit/s)
or strings (``"1Gbit"``); ``count: N`` repeats a node as ``<id>-0 … <id>-N-1``.
Rates are 0 (unknown) or within [:data:`~stowplan.quantities.limits.MIN_RATE`,
:data:`~stowplan.quantities.limits.MAX_RATE`]; a fleet holds at most
:data:`~stowplan.quantities.limits.MAX_NODES` nodes.

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

from stowplan.errors import InputError, show_value
from stowplan.files.fileio import FileKind, read_document_file
from stowplan.files.safeload import MalformedJson
from stowplan.model import NodeDescriptor, check_unique_ids
from stowplan.quantities.checks import ascii_number_text, check_id, check_int
from stowplan.quantities.limits import (
    MAX_BYTE_COUNT,
    MAX_GPUS_PER_NODE,
    MAX_NAME_CHARS,
    MAX_NODES,
    MAX_RATE,
    MIN_RATE,
)
from stowplan.quantities.units import parse_bytes, parse_link_mbps

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
    "intra_link_gbps",
    "intra_link_latency_us",
    "labels",
    "count",
}
_REQUIRED = ("id", "gpu_name", "vram_bytes")
_MAX_MIB = MAX_BYTE_COUNT // 2**20


def _number(where: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InputError(where, value, "must be a finite number")
    if isinstance(value, str):
        ascii_number_text(where, value, "must be a finite number")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise InputError(where, value, "must be a finite number") from None
    if not math.isfinite(number):
        raise InputError(where, value, "must be a finite number")
    return number


def _rate(where: str, value: object) -> float:
    """A rate: 0 (unknown) or a number in [MIN_RATE, MAX_RATE]."""
    number = _number(where, value)
    return _rate_range(where, number, value)


def _rate_range(where: str, number: float, raw: object) -> float:
    if number != 0 and not MIN_RATE <= number <= MAX_RATE:
        raise InputError(where, raw, f"must be 0 or a number in [{MIN_RATE:g}, {MAX_RATE:g}]")
    return number


def _label(value: object) -> str:
    """A label key or value as text: a string as given, anything else as a bounded repr."""
    return value if isinstance(value, str) else show_value(value)


def _name(where: str, value: object) -> str:
    """An id or GPU name: a non-empty string (an integer is taken as its digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10**MAX_NAME_CHARS:
        value = str(value)
    return check_id(where, value)


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
    unknown = sorted((k for k in raw if k not in _FIELDS), key=str)
    if unknown:
        raise InputError(
            f"{where}.{unknown[0]}", raw[unknown[0]], f"is not a node field; use {sorted(_FIELDS)}"
        )
    for key in _REQUIRED:
        if raw.get(key) is None:
            raise InputError(f"{where}.{key}", None, "is required")
    node_id = _name(f"{where}.id", raw["id"])
    link = f"{where}.link_mbps"
    kwargs: dict[str, Any] = {
        "id": node_id,
        "gpu_name": _name(f"{where}.gpu_name", raw["gpu_name"]),
        "vram_bytes": parse_bytes(raw["vram_bytes"], field=f"{where}.vram_bytes"),
        "flops_estimate": _rate(f"{where}.flops_estimate", raw.get("flops_estimate", 0.0)),
        "link_mbps": _rate_range(
            link, parse_link_mbps(raw.get("link_mbps", 0.0), field=link), raw.get("link_mbps")
        ),
    }
    for key in (
        "mem_bandwidth_gbps",
        "link_latency_ms",
        "price_per_hour",
        "intra_link_gbps",
        "intra_link_latency_us",
    ):
        if raw.get(key) is not None:
            kwargs[key] = _rate(f"{where}.{key}", raw[key])
    if "num_gpus" in raw:
        kwargs["num_gpus"] = _gpus(f"{where}.num_gpus", raw["num_gpus"])
    if "labels" in raw:
        labels = raw["labels"]
        if not isinstance(labels, dict):
            raise InputError(f"{where}.labels", labels, "must be a mapping of strings")
        kwargs["labels"] = tuple(sorted((_label(k), _label(v)) for k, v in labels.items()))
    count = raw.get("count", 1)
    check_int(f"{where}.count", count, minimum=1)
    if count > MAX_COUNT:
        raise InputError(f"{where}.count", count, f"must be at most {MAX_COUNT}")
    if count == 1:
        return [NodeDescriptor(**kwargs)]
    return [NodeDescriptor(**{**kwargs, "id": f"{node_id}-{i}"}) for i in range(count)]


def _gpus(where: str, value: object) -> int:
    check_int(where, value, minimum=1)
    assert isinstance(value, int)
    if value > MAX_GPUS_PER_NODE:
        raise InputError(where, value, f"must be an integer in [1, {MAX_GPUS_PER_NODE}]")
    return value


def _at_most_max_nodes(field: str, nodes: list[NodeDescriptor]) -> None:
    if len(nodes) > MAX_NODES:
        raise InputError(field, f"<{len(nodes)} nodes>", f"must hold at most {MAX_NODES} nodes")


def nodes_from_data(data: object) -> list[NodeDescriptor]:
    """Nodes from already-parsed fleet data."""
    if isinstance(data, dict) and "nodes" in data:
        data = data["nodes"]
    if not isinstance(data, list) or not data:
        raise InputError("nodes", data, "must be a non-empty list of node objects")
    if len(data) > MAX_NODES:
        raise InputError("nodes", f"<{len(data)} entries>", f"must hold at most {MAX_NODES} nodes")
    nodes: list[NodeDescriptor] = []
    for i, raw in enumerate(data):
        nodes += _node(i, raw)
        _at_most_max_nodes("nodes", nodes)
    check_unique_ids(nodes)
    return nodes


def load_nodes(path: str | Path) -> list[NodeDescriptor]:
    """Nodes from a YAML or JSON fleet file, or a vast.ai offer file (told apart by its keys),
    read within :class:`FileKind` ``FLEET``'s limits."""
    data = read_document_file(path, field="file", kind=FileKind.FLEET)
    return nodes_from_offers(data) if _is_offer_list(data) else nodes_from_data(data)


def _is_offer_list(data: object) -> bool:
    """vast.ai offers: ``{"offers": [...]}``, or objects with ``gpu_ram`` and no ``vram_bytes``."""
    if isinstance(data, dict) and "offers" in data:
        return True
    items = data if isinstance(data, list) else [data]
    return bool(items) and all(
        isinstance(i, dict) and "gpu_ram" in i and "vram_bytes" not in i for i in items
    )


def _offer(index: int, raw: object) -> NodeDescriptor:
    where = f"offers[{index}]"
    if not isinstance(raw, dict):
        raise InputError(where, raw, "must be a vast.ai offer object")
    for key in ("id", "gpu_name", "gpu_ram"):
        if raw.get(key) is None:
            raise InputError(f"{where}.{key}", None, "is required in a vast.ai offer")
    offer_id = _name(f"{where}.id", raw["id"])
    num_gpus = _whole(f"{where}.num_gpus", raw.get("num_gpus", 1), 0)
    if num_gpus > MAX_GPUS_PER_NODE:
        raise InputError(
            f"{where}.num_gpus", raw["num_gpus"], f"must be an integer in [0, {MAX_GPUS_PER_NODE}]"
        )
    per_gpu_mib = _number(f"{where}.gpu_ram", raw["gpu_ram"])
    if per_gpu_mib < 0:
        raise InputError(f"{where}.gpu_ram", per_gpu_mib, "must be >= 0 MB")
    if per_gpu_mib * max(num_gpus, 1) * 2**20 > MAX_BYTE_COUNT:
        raise InputError(
            f"{where}.gpu_ram", raw["gpu_ram"], f"times num_gpus must be at most {_MAX_MIB} MB"
        )
    total_mib = raw.get("gpu_total_ram")
    total_mib = (
        _number(f"{where}.gpu_total_ram", total_mib)
        if total_mib is not None
        else per_gpu_mib * num_gpus
    )
    if total_mib < 0:
        raise InputError(f"{where}.gpu_total_ram", total_mib, "must be >= 0 MB")
    if total_mib * 2**20 > MAX_BYTE_COUNT:
        raise InputError(f"{where}.gpu_total_ram", total_mib, f"must be at most {_MAX_MIB} MB")

    labels = [("source", "vastai")]
    if raw.get("gpu_mem_bw") is not None:
        labels.append(("vast_gpu_mem_bw_gbps", _label(raw["gpu_mem_bw"])))
    if raw.get("geolocation"):
        labels.append(("geolocation", _label(raw["geolocation"])))
    price = raw.get("dph_total")
    return NodeDescriptor(
        id=f"offer-{offer_id}",
        gpu_name=_name(f"{where}.gpu_name", raw["gpu_name"]),
        vram_bytes=int(total_mib * 2**20),
        flops_estimate=_rate(f"{where}.total_flops", raw.get("total_flops", 0.0)),
        link_mbps=_rate(f"{where}.inet_up", raw.get("inet_up", 0.0)),
        price_per_hour=None if price is None else _rate(f"{where}.dph_total", price),
        num_gpus=max(num_gpus, 1),
        labels=tuple(labels),
    )


def nodes_from_offers(data: object) -> list[NodeDescriptor]:
    """Nodes from already-parsed vast.ai offer JSON."""
    if isinstance(data, dict):
        data = data.get("offers", [data])
    if not isinstance(data, list) or not data:
        raise InputError("offers", data, "must be a non-empty list of vast.ai offers")
    if len(data) > MAX_NODES:
        raise InputError("offers", f"<{len(data)} offers>", f"must hold at most {MAX_NODES} offers")
    nodes = [_offer(i, raw) for i, raw in enumerate(data)]
    check_unique_ids(nodes)
    return nodes


def load_offers(path: str | Path) -> list[NodeDescriptor]:
    """Nodes from a vast.ai ``search offers --raw`` JSON file.

    Text that is not JSON (the CLI's table, printed without ``--raw``) is an
    :class:`InputError` saying to add ``--raw``.
    """
    try:
        data = read_document_file(path, field="file", kind=FileKind.OFFERS)
    except MalformedJson as exc:
        raise InputError(
            exc.field,
            exc.value,
            f"{exc.rule}; an offer list is the JSON of `vastai search offers --raw` "
            "(without --raw it prints a table)",
        ) from None
    return nodes_from_offers(data)
