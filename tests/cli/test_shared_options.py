"""The shared options say what the library's fields say, and list the enums' members."""

from __future__ import annotations

import re

import pytest
import typer
from typer.core import TyperGroup, TyperOption

from stowplan.calibration.profile import Engine
from stowplan.cli import app, main
from stowplan.cli.options import CONSTRAINT_DOCS, field_docs, plain
from stowplan.model import Constraints, Strategy

FIELD_OF_OPTION = {
    "--min-stages": "min_stages",
    "--max-stages": "max_stages",
    "--headroom": "vram_headroom_frac",
    "--batch": "batch",
    "--tp": "tensor_parallel",
}
"""Options whose help is their field's docstring, word for word."""


def _helps(command: str) -> dict[str, str]:
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    cmd = group.commands[command]
    return {opt: p.help or "" for p in cmd.params if isinstance(p, TyperOption) for opt in p.opts}


def test_field_docs_are_read_from_the_source_as_written() -> None:
    docs = field_docs(Constraints)
    assert docs["batch"] == "Concurrent sequences in flight."
    assert docs["min_stages"] == "Fewest pipeline stages (default 1)."
    assert docs["context_tokens"].split("\n\n")[1].startswith("None or 0: no KV reserve")
    # Every field with a docstring, and no field without one.
    assert set(docs) <= set(Constraints.__dataclass_fields__)
    assert "objective" not in docs


def test_plain_keeps_the_first_paragraph_without_markup() -> None:
    doc = "Uses ``batch`` and :func:`~stowplan.planner.fit`\n   on two lines.\n\nMore."
    assert plain(doc) == "Uses batch and fit on two lines."


@pytest.mark.parametrize("command", ["plan", "launch", "demo-run"])
def test_constraint_options_show_the_field_docstring(command: str) -> None:
    helps = _helps(command)
    for option, name in FIELD_OF_OPTION.items():
        if option in helps:
            assert helps[option] == plain(field_docs(Constraints)[name]), option
    strategy = plain(field_docs(Constraints)["strategy"]).removesuffix(".")
    assert helps["--strategy"] == f"{strategy}: balance-by-vram, latency, throughput or exact."
    assert {"--min-stages", "--max-stages", "--headroom", "--strategy"} <= set(helps)


def test_plan_options_name_every_enum_member_and_the_cli_defaults() -> None:
    helps = _helps("plan")
    assert {"--batch", "--tp", "--context", "--engine", "--nodes"} <= set(helps)
    for s in Strategy:
        assert s.value in helps["--strategy"]
    named = re.findall(r"[a-z][a-z-]+", helps["--engine"])
    assert {e.value for e in Engine} | {"first-order"} <= set(named)
    assert helps["--context"] == (
        "Context tokens per sequence to reserve KV cache for, for each of the batch sequences"
        " (default: 8192, or the model's maximum if smaller); 0: none; max: the largest "
        "that fits."
    )
    assert helps["--context"].startswith(CONSTRAINT_DOCS["context_tokens"].removesuffix("."))
    assert helps["--nodes"] == "Fleet file (YAML or JSON) of node objects."
    assert _helps("launch")["--nodes"].startswith("Fleet file (YAML or JSON) of node objects ")


def test_plan_help_fits_80_columns(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["plan", "--help"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    for option in ("--batch", "--context", "--strategy", "--engine", "--tp", "--nodes"):
        assert option in out
    assert "balance-by-vram" in out
    flat = " ".join(out.replace("│", " ").split())
    assert ".npy (layers × experts) as EPLB uses" in flat  # brackets would be eaten as markup
