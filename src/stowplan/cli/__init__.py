"""The ``stowplan`` command line: parse, call the library, render.

Every :class:`~stowplan.errors.StowplanError` and usage error becomes one line
on stderr and exit code 2; no traceback reaches the user.
"""

from __future__ import annotations

import os
import sys

import click
import typer

from stowplan.cli import launch_cmd, plan_cmd  # noqa: F401  (registers its commands)
from stowplan.cli.app import app
from stowplan.errors import StowplanError

__all__ = ["app", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code (also used as the console script)."""
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="stowplan", standalone_mode=False)
    except StowplanError as exc:
        print(f"stowplan: error: {exc}", file=sys.stderr)
        return 2
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.exceptions.Abort:
        print("stowplan: aborted", file=sys.stderr)
        return 130
    except click.ClickException as exc:
        print(f"stowplan: error: {exc.format_message()}", file=sys.stderr)
        return 2
    except Exception as exc:
        if os.environ.get("STOWPLAN_DEBUG"):
            raise
        print(
            f"stowplan: internal error: {type(exc).__name__}: {exc} "
            "(set STOWPLAN_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
