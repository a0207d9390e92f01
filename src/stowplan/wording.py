"""Small helpers for the words of messages and reports."""

from __future__ import annotations

__all__ = ["plural"]


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``"1 node"``, ``"2 nodes"``: the count and the noun, plural unless the count is 1.

    ``many`` is the plural when it is not ``noun + "s"`` (``plural(2, "entry", "entries")``).
    """
    return f"{count} {noun if count == 1 else (many or noun + 's')}"
