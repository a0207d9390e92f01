"""The stowplan error tree.

::

    StowplanError
    ├── InputError            bad user input: names the field, the value and what is accepted
    ├── DependencyError       an optional extra is not installed
    └── PlanError             no placement satisfies the model, the nodes and the constraints
        ├── InsufficientVram  the model needs more bytes than the nodes offer
        ├── NoNodeFitsHead    no node can hold the largest indivisible component
        └── Infeasible        the constraints cannot be met (reason says which)

``InputError`` also subclasses :class:`ValueError` so callers that catch
``ValueError`` keep working.  The CLI turns every ``StowplanError`` into one
line on stderr and exit code 2.
"""

from __future__ import annotations

__all__ = [
    "DependencyError",
    "Infeasible",
    "InputError",
    "InsufficientVram",
    "NoNodeFitsHead",
    "PlanError",
    "StowplanError",
    "show_value",
]


_MAX_SHOWN = 300
"""Most characters of a value echoed in a message; the rest is summarised by its length."""


def show_value(value: object) -> str:
    """``repr(value)`` for a message, bounded: a huge value never makes a huge (or failing) line.

    An integer too long for :func:`repr` (Python refuses over 4,300 digits) is
    described by its digit count; any other repr longer than the bound is cut
    and its length given.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1000:
        return f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
    try:
        text = repr(value)
    except Exception:  # a repr that fails is not the user's message
        return f"<{type(value).__name__}>"
    if len(text) > _MAX_SHOWN:
        return f"{text[: _MAX_SHOWN - 40]}…({len(text)} characters)"
    return text


class StowplanError(Exception):
    """Root of every error stowplan raises on purpose."""


class InputError(StowplanError, ValueError):
    """A value given by the user is not acceptable.

    ``field`` names the offending field, ``value`` echoes it, the message says
    what would be accepted.
    """

    def __init__(self, field: str, value: object, rule: str) -> None:
        self.field = field
        self.value = value
        self.rule = rule
        super().__init__(f"{field}={show_value(value)}: {rule}")


class DependencyError(StowplanError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""

    def __init__(self, module: str, extra: str) -> None:
        self.module = module
        self.extra = extra
        super().__init__(
            f"this needs the optional package {module!r}; install it with "
            f"`pip install 'stowplan[{extra}]'`"
        )


class PlanError(StowplanError):
    """No plan satisfies the model, the nodes and the constraints."""


class InsufficientVram(PlanError):
    """The model needs ``needed`` bytes; the usable VRAM of all candidates is ``available``."""

    def __init__(self, needed: int, available: int, detail: str = "") -> None:
        self.needed = needed
        self.available = available
        self.detail = detail
        message = f"model does not fit: needs {needed} bytes, total available {available}"
        super().__init__(f"{message}; {detail}" if detail else message)


class NoNodeFitsHead(PlanError):
    """No node can hold the largest indivisible component (embed or head) of ``needed`` bytes."""

    def __init__(self, needed: int) -> None:
        self.needed = needed
        super().__init__(f"no node can hold the largest indivisible component ({needed} bytes)")


class Infeasible(PlanError):
    """The constraints are unsatisfiable; ``reason`` says why, with the numbers."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"constraints unsatisfiable: {reason}")
