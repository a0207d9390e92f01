"""Text that goes into a shell script or onto one line: quoting, comments, escapes.

Everything stowplan generates for a shell (``stage-env --format shell``, the
engine exports) embeds ids, labels and notes the user wrote. Two helpers, used
everywhere such text is embedded:

* :func:`shell_quote` — one shell word, whatever it holds (``$(…)``, ``;``,
  quotes, spaces, newlines): POSIX single quotes;
* :func:`shell_comment` — a ``# …`` comment line that stays one line: every
  character that is not printable (a newline, a carriage return, any control
  or line-separator character) is written as its Python escape (``\\n``).

:func:`one_line` is the escape itself, for messages: an error names a value on
one line.
"""

from __future__ import annotations

import shlex

from stowplan.errors import InputError

__all__ = ["check_env_name", "heredoc_marker", "one_line", "shell_comment", "shell_quote"]


def one_line(text: str) -> str:
    """``text`` with every non-printable character (``str.isprintable``) escaped as Python
    writes it in a literal (``\\n``, ``\\x1b``, ``\\u2028``): printable text is unchanged,
    anything else cannot end or rewrite the line it is printed on."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def shell_comment(text: str) -> str:
    """A comment line for a shell script: ``# `` and ``text`` made :func:`one_line`."""
    return f"# {one_line(text)}"


def shell_quote(word: str) -> str:
    """``word`` as one POSIX shell word (:func:`shlex.quote`): nothing in it is expanded."""
    return shlex.quote(word)


def heredoc_marker(text: str, base: str = "EOF") -> str:
    """A here-document delimiter no line of ``text`` equals: ``base``, else ``base`` with
    the least number appended that makes it unique."""
    lines = set(text.splitlines())
    marker, n = base, 0
    while marker in lines:
        n += 1
        marker = f"{base}_{n}"
    return marker


def check_env_name(name: str) -> str:
    """``name`` when it can be an environment variable's name in a shell (letters, digits
    and ``_``, not starting with a digit); else :class:`~stowplan.errors.InputError`."""
    if not (name.isascii() and name.isidentifier()):
        raise InputError("env", name, "must be a name of ASCII letters, digits and _")
    return name
