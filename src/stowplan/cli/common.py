"""Helpers shared by the command modules: consoles, fleet loading, constraint flags."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rich.console import Console

from stowplan.errors import InputError
from stowplan.model import NodeDescriptor
from stowplan.nodefile import load_nodes, load_offers

__all__ = ["err_console", "load_fleet", "out_console"]

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
