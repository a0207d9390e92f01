"""Parsing of human-written quantities: ``"24GiB"``, ``"20tok/s"``, ``"1Gbit"``.

Bytes are integers. Decimal prefixes (k, M, G, T) are powers of 1000, binary
prefixes (Ki, Mi, Gi, Ti) powers of 1024 (``kiB`` is read as ``KiB``).
``"24GB"`` is 24e9 bytes, computed in decimal arithmetic so that sizes beyond
2**53 are exact. Byte counts are at most
:data:`~stowplan.quantities.limits.MAX_BYTE_COUNT`, rates at most
:data:`~stowplan.quantities.limits.MAX_RATE`.
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_HALF_EVEN, Decimal

from stowplan.errors import InputError
from stowplan.quantities.checks import ascii_number_text
from stowplan.quantities.limits import MAX_BYTE_COUNT, MAX_RATE

__all__ = [
    "format_bytes",
    "parse_bytes",
    "parse_link_mbps",
    "parse_rate_per_s",
    "parse_seconds",
    "parse_time_per_token_s",
    "parse_tokens_per_s",
]

_PREFIX = {
    "": 1,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
_NUMBER = r"(?P<num>[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*"
_BYTES_RE = re.compile(_NUMBER + r"(?P<prefix>[kKMGT]i?)?(?P<unit>B|b|bytes?)?$")
_BITS_RE = re.compile(_NUMBER + r"(?P<prefix>[kKMGT])?(?P<unit>bit|bps|bit/s|b/s)$")
_TOKS_RE = re.compile(_NUMBER + r"(?:tok/s|tokens/s|t/s)?$")
_SECONDS_RE = re.compile(_NUMBER + r"(?P<unit>s|ms|us|min)?$")
_TOKS_ONLY_RE = re.compile(_NUMBER + r"(?:tok/s|tokens/s|t/s)$")
_PER_S_RE = re.compile(_NUMBER + r"(?P<unit>/s|/min|/h|req/s|rps)?$")
_SECONDS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "min": 60.0}
_PER_SECOND = {"": 1.0, "/s": 1.0, "req/s": 1.0, "rps": 1.0, "/min": 1 / 60, "/h": 1 / 3600}


_BYTES_RULE = f"must be a byte count in [0, {MAX_BYTE_COUNT}] (8 EiB)"


def _finite_non_negative(
    field: str, value: float, raw: object, rule: str = "must be a finite number >= 0"
) -> float:
    if not math.isfinite(value) or value < 0:
        raise InputError(field, raw, rule)
    if value > MAX_RATE:
        raise InputError(field, raw, f"must be at most {MAX_RATE:g}")
    return value


def _float(value: int | float) -> float:
    """``float(value)``; an integer beyond a float's range is infinity (then refused)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _scaled_bytes(field: str, number: str, multiplier: int, raw: object) -> int:
    """``number * multiplier`` rounded to whole bytes, exactly; within the byte-count cap."""
    if not math.isfinite(float(number)):
        raise InputError(field, raw, _BYTES_RULE)
    exact = Decimal(number) * multiplier
    if exact > MAX_BYTE_COUNT:
        raise InputError(field, raw, _BYTES_RULE)
    return int(exact.to_integral_value(rounding=ROUND_HALF_EVEN))


def parse_bytes(value: object, *, field: str = "bytes") -> int:
    """Return ``value`` as an integer byte count.

    Accepts a non-negative integer, or a string such as ``"24GiB"``, ``"24 GB"``,
    ``"512MiB"``, ``"1e9"``.
    """
    if isinstance(value, bool):
        raise InputError(field, value, "must be a byte count such as 25769803776 or '24GiB'")
    if isinstance(value, int):
        if value < 0:
            raise InputError(field, value, "must be >= 0")
        if value > MAX_BYTE_COUNT:
            raise InputError(field, value, _BYTES_RULE)
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            raise InputError(field, value, "must be a finite number >= 0")
        if value > MAX_BYTE_COUNT:
            raise InputError(field, value, _BYTES_RULE)
        return int(value)
    if isinstance(value, str) and len(value) <= 64:
        ascii_number_text(field, value, "must be a byte count such as '24GiB'")
        m = _BYTES_RE.match(value.strip())
        if m is not None and m.group("unit") != "b":
            return _scaled_bytes(field, m.group("num"), _PREFIX[m.group("prefix") or ""], value)
    raise InputError(
        field, value, "must be a byte count such as 25769803776, '24GiB', '24GB' or '512MiB'"
    )


def parse_link_mbps(value: object, *, field: str = "link_mbps") -> float:
    """Link speed in Mbit/s from a number (already Mbit/s) or ``"1Gbit"``, ``"100Mbps"``."""
    if isinstance(value, bool):
        raise InputError(field, value, "must be Mbit/s as a number or a string like '1Gbit'")
    if isinstance(value, int | float):
        return _finite_non_negative(field, _float(value), value)
    if isinstance(value, str):
        ascii_number_text(field, value, "must be Mbit/s as a number or a string like '1Gbit'")
        m = _BITS_RE.match(value.strip())
        if m is not None:
            number = _finite_non_negative(field, float(m.group("num")), value)
            return _finite_non_negative(
                field, number * _PREFIX[m.group("prefix") or ""] / 1e6, value
            )
        try:
            number = float(value)
        except ValueError:
            pass
        else:
            return _finite_non_negative(field, number, value)
    raise InputError(field, value, "must be Mbit/s as a number or a string like '1Gbit', '100Mbps'")


def parse_tokens_per_s(value: object, *, field: str = "target") -> float:
    """Return tokens per second from a number or ``"20tok/s"``."""
    rule = "must be a finite number > 0 tokens/s"
    if isinstance(value, int | float) and not isinstance(value, bool):
        rate = _finite_non_negative(field, _float(value), value, rule)
    elif (
        isinstance(value, str)
        and ascii_number_text(field, value, "must be a rate such as 20 or '20tok/s'")
        and (m := _TOKS_RE.match(value.strip())) is not None
    ):
        rate = _finite_non_negative(field, float(m.group("num")), value, rule)
    else:
        raise InputError(field, value, "must be a rate such as 20 or '20tok/s'")
    if rate <= 0:
        raise InputError(field, value, rule)
    return rate


def _positive(field: str, value: float, raw: object, rule: str) -> float:
    """``value`` when finite, > 0 and at most :data:`~stowplan.quantities.limits.MAX_RATE`."""
    if not math.isfinite(value) or not 0 < value <= MAX_RATE:
        raise InputError(field, raw, rule)
    return value


def parse_seconds(value: object, *, field: str = "seconds") -> float:
    """Seconds from a number (already seconds) or ``"1s"``, ``"50ms"``, ``"200us"``,
    ``"2min"``; must be > 0."""
    rule = "must be a time > 0 such as 1, '1s', '50ms' or '200us'"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _positive(field, _float(value), value, rule)
    if isinstance(value, str) and (m := _SECONDS_RE.match(value.strip())) is not None:
        return _positive(
            field, float(m.group("num")) * _SECONDS[m.group("unit") or ""], value, rule
        )
    raise InputError(field, value, rule)


def parse_time_per_token_s(value: object, *, field: str = "tpot") -> float:
    """Seconds per output token from a time (``"50ms"``, ``0.05``) or a per-user rate
    (``"20tok/s"`` is 1/20 s = 50 ms); must be > 0."""
    rule = "must be a time per token > 0 such as '50ms' or a rate such as '20tok/s'"
    if isinstance(value, str) and (m := _TOKS_ONLY_RE.match(value.strip())) is not None:
        rate = _positive(field, float(m.group("num")), value, rule)
        return _positive(field, 1.0 / rate, value, rule)
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        try:
            return parse_seconds(value, field=field)
        except InputError:
            pass
    raise InputError(field, value, rule)


def parse_rate_per_s(value: object, *, field: str = "rate") -> float:
    """Requests per second from a number or ``"5/s"``, ``"5req/s"``, ``"300/min"``,
    ``"18000/h"``; must be > 0."""
    rule = "must be a rate > 0 such as 5, '5/s' or '300/min'"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _positive(field, _float(value), value, rule)
    if isinstance(value, str) and (m := _PER_S_RE.match(value.strip())) is not None:
        per = _PER_SECOND[m.group("unit") or ""]
        return _positive(field, float(m.group("num")) * per, value, rule)
    raise InputError(field, value, rule)


def format_bytes(n: float) -> str:
    """Human-readable binary size: ``format_bytes(25769803776) == '24.0 GiB'``."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"
