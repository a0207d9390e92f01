"""Helpers shared by the command modules: consoles, fleet loading, constraint flags."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rich.console import Console

from stowplan.cost import DEFAULT_BANDWIDTH_GBPS
from stowplan.errors import InputError
from stowplan.files.fleets import load_nodes, load_offers
from stowplan.gpus import resolve_gpu, unknown_gpu_message
from stowplan.model import NodeDescriptor

__all__ = ["err_console", "load_fleet", "out_console", "warn_about_gpus"]

# Markup off: node ids, model names and notes come from the user and may hold "[...]".
# Styling is done with rich Text objects instead.
out_console = Console(highlight=False, markup=False, soft_wrap=False)
err_console = Console(stderr=True, highlight=False, markup=False)


def load_fleet(nodes: Path | None, offers: Path | None) -> list[NodeDescriptor]:
    """Nodes from ``--nodes`` and/or ``--offers``; at least one is required."""
    fleet: list[NodeDescriptor] = []
    if nodes is None and offers is None:
        raise InputError(
            "--nodes", None, "give a fleet file with --nodes or an offer list with --offers"
        )
    if nodes is not None:
        fleet += load_nodes(nodes)
    if offers is not None:
        fleet += load_offers(offers)
    dupes = sorted(i for i, k in Counter(n.id for n in fleet).items() if k > 1)
    if dupes:
        raise InputError(
            "nodes[].id", dupes[0], "node ids must be unique across --nodes and --offers"
        )
    return fleet


def warn_about_gpus(fleet: list[NodeDescriptor]) -> None:
    """One stderr line per GPU name the plan must guess figures for: ``warning:`` when the
    name resolves to nothing (the default bandwidth is used), ``note:`` when it names
    several parts and one was assumed."""
    for node in fleet:
        if node.mem_bandwidth_gbps is not None and node.flops_estimate > 0:
            continue
        match = resolve_gpu(node.gpu_name, node.vram_bytes // node.num_gpus or None)
        if match is None and node.mem_bandwidth_gbps is None:
            message = unknown_gpu_message(node.gpu_name, DEFAULT_BANDWIDTH_GBPS)
            err_console.print(f"warning: node {node.id}: {message}", soft_wrap=True)
        elif match is not None and match.assumption is not None:
            err_console.print(f"note: node {node.id}: {match.assumption}", soft_wrap=True)
