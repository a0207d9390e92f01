"""Running the command line: every command registered on :data:`app`, and :func:`run`.

Every :class:`~stowplan.errors.StowplanError` and usage error becomes one line
on stderr and exit code 2; no traceback reaches the user.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys

import typer
from typer._click.exceptions import NoArgsIsHelpError
from typer.exceptions import TyperException

from stowplan.cli.app import app
from stowplan.errors import StowplanError
from stowplan.quantities.checks import ascii_number_text
from stowplan.text.shell import one_line

__all__ = ["app", "run"]


def _register_commands() -> None:
    """Import every ``stowplan.cli.*_cmd`` module; each registers its commands on ``app``."""
    package = importlib.import_module("stowplan.cli")
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name.endswith("_cmd"):
            importlib.import_module(f"stowplan.cli.{info.name}")


_register_commands()


def _check_ascii_numbers(argv: list[str]) -> None:
    """Refuse a number written in other digits than ASCII's (``--batch ٣``, ``--tp ３``):
    Python's ``int`` and ``float``, which the option parser uses, would take it as 3."""
    for i, word in enumerate(argv):
        field, value = "argument", word
        if word.startswith("--") and "=" in word:
            field, value = word.split("=", 1)
        elif i > 0 and argv[i - 1].startswith("-"):
            field = argv[i - 1]
        if value.isascii():
            continue
        try:
            float(value)
        except (ValueError, OverflowError):
            continue
        ascii_number_text(field, value, "must be a number")


def run(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code."""
    command = typer.main.get_command(app)
    try:
        _check_ascii_numbers(sys.argv[1:] if argv is None else argv)
        command.main(args=argv, prog_name="stowplan", standalone_mode=False)
    except StowplanError as exc:
        print(f"stowplan: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        print("stowplan: aborted", file=sys.stderr)
        return 130
    except NoArgsIsHelpError as exc:
        # ``stowplan`` (or a command group) alone: its help is the answer, not an error.
        text = exc.format_message()
        if text.strip():
            print(text)
        return 0
    except TyperException as exc:  # usage errors: bad option values, missing arguments
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        print(f"stowplan: error: {one_line(message.strip())}", file=sys.stderr)
        return 2
    except Exception as exc:
        if os.environ.get("STOWPLAN_DEBUG"):
            raise
        print(
            f"stowplan: internal error: {type(exc).__name__}: {one_line(str(exc))} "
            "(set STOWPLAN_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 1
    return 0
