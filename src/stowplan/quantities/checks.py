"""Checks of user-given values that raise :class:`~stowplan.errors.InputError`.

One wording for every module: ``batch=0: must be an integer >= 1``,
``link_mbps=-1.0: must be a finite number >= 0``, ``strategy='fast': must be
one of balance-by-vram, latency, throughput, exact``. Each check returns the
value it accepted, converted where the type says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import StrEnum
from typing import TypeVar

from stowplan.errors import InputError
from stowplan.quantities.limits import MAX_NAME_CHARS

__all__ = [
    "ID_RULE",
    "ascii_number_text",
    "check_choice",
    "check_id",
    "check_int",
    "check_number",
    "check_rate",
]

E = TypeVar("E", bound=StrEnum)


ID_RULE = (
    f"must be printable text of 1 to {MAX_NAME_CHARS} characters "
    "(no line breaks or other control characters)"
)
"""What an id (a node's, a plan's model name) must be: it is printed in messages, tables
and the comments of generated shell scripts, so it is one printable line."""


def check_id(field: str, value: object) -> str:
    """``value`` when it is an id: a non-blank ``str`` of at most ``MAX_NAME_CHARS``
    characters, each printable (``str.isprintable``: no newline, tab, escape or other
    control or line-separator character)."""
    if (
        not isinstance(value, str)
        or not value.strip()
        or len(value) > MAX_NAME_CHARS
        or not value.isprintable()
    ):
        raise InputError(field, value, ID_RULE)
    return value


def ascii_number_text(field: str, text: str, rule: str) -> str:
    """``text`` when it is ASCII; else :class:`InputError` with ``rule``.

    Python's ``int``, ``float`` and ``str.isdigit`` take other scripts' digits (``'٣'``,
    ``'３'``: 3) and superscripts (``'²'``); a number stowplan reads is written in ASCII
    digits, so a text is checked with this before any of them sees it.
    """
    if not text.isascii():
        raise InputError(field, text, f"{rule} (ASCII digits 0-9 only)")
    return text


def check_int(field: str, value: object, *, minimum: int = 0, maximum: int | None = None) -> int:
    """``value`` when it is an ``int`` (not a ``bool``), ``>= minimum`` and ``<= maximum``.

    Without ``maximum`` the rule reads ``>= minimum``; with it, ``in [minimum, maximum]``.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        rule = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise InputError(field, value, f"must be an integer {rule}")
    return value


def check_number(
    field: str, value: object, *, positive: bool = False, upper: float | None = None
) -> float:
    """``value`` as a float when it is a finite ``int``/``float`` (not a ``bool``) and ``>= 0``.

    ``positive`` also rejects 0; ``upper`` rejects values above it (the rule
    then reads ``in [0, upper]``, or ``in (0, upper]`` when ``positive``).
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(field, value, "must be a finite number")
    try:
        v = float(value)
    except OverflowError:  # an int beyond a float's range
        v = math.inf
    if not math.isfinite(v) or v < 0 or (positive and v == 0) or (upper is not None and v > upper):
        rule = ">= 0" if not positive else "> 0"
        if upper is not None:
            rule = f"in (0, {upper}]" if positive else f"in [0, {upper}]"
        raise InputError(field, value, f"must be a finite number {rule}")
    return v


def check_rate(
    field: str, value: object, *, lower: float, upper: float, zero: bool = False
) -> float:
    """``value`` as a float when it is a finite number in ``[lower, upper]`` (or 0 with ``zero``).

    ``zero`` admits 0 as "unknown": the rule then reads ``must be 0 (unknown) or a
    number in [lower, upper]``.
    """
    v = math.nan
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            v = float(value)
        except OverflowError:  # an int beyond a float's range
            v = math.inf
    if not (lower <= v <= upper or (zero and v == 0)):
        span = f"[{lower:g}, {upper:g}]"
        rule = f"0 (unknown) or a number in {span}" if zero else f"a finite number in {span}"
        raise InputError(field, value, f"must be {rule}")
    return v


def check_choice(
    field: str,
    value: object,
    choices: type[E],
    *,
    normalise: Callable[[str], str] | None = None,
) -> E:
    """``value`` as a member of the closed vocabulary ``choices``.

    ``normalise`` (e.g. ``str.lower``) is applied to ``str(value)`` first; the
    message lists the accepted values in their declared order.
    """
    try:
        return choices(normalise(str(value)) if normalise is not None else value)  # type: ignore[arg-type]
    except ValueError:
        raise InputError(
            field, value, f"must be one of {', '.join(c.value for c in choices)}"
        ) from None
