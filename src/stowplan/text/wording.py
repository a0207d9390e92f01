"""Small helpers for the words of messages and reports."""

from __future__ import annotations

__all__ = ["plural", "short_node_id"]


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``"1 node"``, ``"2 nodes"``: the count and the noun, plural unless the count is 1.

    ``many`` is the plural when it is not ``noun + "s"`` (``plural(2, "entry", "entries")``).
    """
    return f"{count} {noun if count == 1 else (many or noun + 's')}"


RAY_NODE_ID_CHARS = 56
"""Length of a Ray node id (28 bytes in hexadecimal)."""


def short_node_id(node_id: str, keep: int = 8) -> str:
    """A Ray node id (56 hexadecimal characters) shortened for display to its first ``keep``
    and an ellipsis, as ``git`` shortens hashes: ``'3f2a9c1b…'``; any other id unchanged."""
    if len(node_id) == RAY_NODE_ID_CHARS and all(c in "0123456789abcdef" for c in node_id):
        return f"{node_id[:keep]}…"
    return node_id
