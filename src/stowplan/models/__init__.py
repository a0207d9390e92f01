"""Model layouts: the known-model table and readers of real model files."""

from __future__ import annotations

from stowplan.errors import InputError
from stowplan.model import ModelLayout
from stowplan.models.known import known_names, lookup

__all__ = ["known_names", "lookup", "resolve_model"]


def resolve_model(spec: str) -> ModelLayout:
    """A layout from a known name or Hugging Face id; raise ``InputError`` naming the choices."""
    layout = lookup(spec)
    if layout is None:
        raise InputError(
            "MODEL",
            spec,
            f"is not a known model; known: {', '.join(known_names())}",
        )
    return layout
