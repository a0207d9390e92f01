"""Options shared by several commands, their help taken from the library's own words.

An option that sets a :class:`~stowplan.model.Constraints` field shows that
field's docstring (its first paragraph, markup removed): the text is written
once, beside the field.  Where the command line's default differs from the
library's (``--context``), the option adds its own default after the field's
first sentence.  Choices are listed from the enums (:class:`~stowplan.model.Strategy`,
:class:`~stowplan.calibration.profile.Engine`), so a new member shows up here.

Field docstrings are not kept by Python at run time; they are read from the
source of the class with :mod:`ast` when this module is imported.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from stowplan.calibration.profile import Engine
from stowplan.errors import InputError
from stowplan.model import Constraints, Strategy
from stowplan.quantities.limits import MAX_CONTEXT_TOKENS

__all__ = [
    "CONSTRAINT_DOCS",
    "ENGINE_HELP",
    "FIRST_ORDER",
    "NODES_HELP",
    "Batch",
    "Context",
    "EngineOption",
    "Headroom",
    "MaxStages",
    "MinStages",
    "Nodes",
    "StrategyOption",
    "TensorParallel",
    "choice_list",
    "field_docs",
    "plain",
]

FIRST_ORDER = "first-order"
"""The ``--engine`` value that predicts with the uncalibrated first-order model."""


def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each annotated field of ``cls``, as written."""
    tree = ast.parse(inspect.getsource(sys.modules[cls.__module__]))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    docs: dict[str, str] = {}
    for field, doc in zip(node.body, node.body[1:], strict=False):
        if (
            isinstance(field, ast.AnnAssign)
            and isinstance(field.target, ast.Name)
            and isinstance(doc, ast.Expr)
            and isinstance(doc.value, ast.Constant)
            and isinstance(doc.value.value, str)
        ):
            docs[field.target.id] = inspect.cleandoc(doc.value.value)
    return docs


_ROLE = re.compile(r":[a-z]+:`~?(?:[\w.]*\.)?(\w+)`")


def plain(doc: str) -> str:
    """The first paragraph of ``doc`` on one line, without reStructuredText markup."""
    first = doc.strip().split("\n\n")[0]
    text = _ROLE.sub(r"\1", first).replace("``", "")
    return " ".join(text.split())


def choice_list(values: type[Enum] | list[str]) -> str:
    """``"a, b or c"``: the values of an enum (or a list), in their order."""
    names = [str(m.value) for m in values] if isinstance(values, type) else list(values)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


CONSTRAINT_DOCS = {name: plain(doc) for name, doc in field_docs(Constraints).items()}
"""Per :class:`~stowplan.model.Constraints` field, its help text."""

NODES_HELP = "Fleet file (YAML or JSON) of node objects"
"""What ``--nodes`` names; a command says what it does with the fleet after it."""

ENGINE_HELP = (
    "Engine whose calibration profile predicts (and whose placement rule vllm and sglang "
    f"plans follow): {Engine.GENERIC.value} (the default: fitted to the published runs of "
    f"every engine), {', '.join(e.value for e in Engine if e is not Engine.GENERIC)}; or "
    f"{FIRST_ORDER} for the uncalibrated first-order model (weights / peak bandwidth, "
    "optimistic)."
)

_CONTEXT_CLI = (
    " (default: 8192, or the model's maximum if smaller); 0: none; max: the largest that fits."
)
"""What the command line adds to the field's first sentence: its own default and ``max``."""

MinStages = Annotated[int | None, typer.Option("--min-stages", help=CONSTRAINT_DOCS["min_stages"])]
MaxStages = Annotated[int | None, typer.Option("--max-stages", help=CONSTRAINT_DOCS["max_stages"])]
Headroom = Annotated[
    float | None, typer.Option("--headroom", help=CONSTRAINT_DOCS["vram_headroom_frac"])
]
StrategyOption = Annotated[
    str | None,
    typer.Option(
        "--strategy",
        help=f"{CONSTRAINT_DOCS['strategy'].removesuffix('.')}: {choice_list(Strategy)}.",
    ),
]
Batch = Annotated[int, typer.Option("--batch", help=CONSTRAINT_DOCS["batch"])]
Context = Annotated[
    str | None,
    typer.Option(
        "--context", help=CONSTRAINT_DOCS["context_tokens"].removesuffix(".") + _CONTEXT_CLI
    ),
]
TensorParallel = Annotated[
    int | None, typer.Option("--tp", help=CONSTRAINT_DOCS["tensor_parallel"])
]
EngineOption = Annotated[str | None, typer.Option("--engine", help=ENGINE_HELP)]
Nodes = Annotated[Path | None, typer.Option("--nodes", help=f"{NODES_HELP}.")]


def parse_context(value: str | None) -> int | str | None:
    """``--context``: None (the default context), ``"max"`` or tokens per sequence."""
    if value is None:
        return None
    text = value.strip().lower()
    if text == "max":
        return "max"
    if not (text.isascii() and text.isdigit()) or len(text) > 10 or int(text) > MAX_CONTEXT_TOKENS:
        raise InputError(
            "--context",
            value,
            f"must be a number of tokens in [0, {MAX_CONTEXT_TOKENS}] (0: no KV reserve) "
            "or 'max' (the largest that fits)",
        )
    return int(text)
