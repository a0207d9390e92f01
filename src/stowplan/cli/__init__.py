"""The ``stowplan`` command line: parse, call the library, render.

Every :class:`~stowplan.errors.StowplanError` and usage error becomes one line
on stderr and exit code 2; no traceback reaches the user.  The command line
needs the ``cli`` extra (``typer`` and ``rich``; the library runs without it):
without the extra, :func:`main` says so in one line, exit code 2.
"""

from __future__ import annotations

import sys

from stowplan.errors import DependencyError

CLI_EXTRA_MODULES = ("typer", "rich")
"""What ``pip install 'stowplan[cli]'`` adds, and only the command line imports."""

try:
    from stowplan.cli.runner import app, run
except ImportError as exc:  # the cli extra is not installed
    _missing = (exc.name or "").split(".")[0]
    if _missing not in CLI_EXTRA_MODULES:
        raise
else:
    _missing = ""

__all__ = ["CLI_EXTRA_MODULES", "app", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code (also used as the console script)."""
    if _missing:
        print(f"stowplan: error: {DependencyError(_missing, 'cli')}", file=sys.stderr)
        return 2
    return run(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
