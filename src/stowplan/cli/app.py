"""The typer application object every command module registers on."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="stowplan",
    help="Decide where every byte of an LLM lives across GPUs, hosts and clusters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
