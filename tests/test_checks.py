"""The shared input checks: one wording everywhere, the value returned when accepted."""

from __future__ import annotations

import math

import pytest

from stowplan.errors import InputError
from stowplan.model import Strategy
from stowplan.quantities.checks import check_choice, check_int, check_number


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: check_int("batch", 0, minimum=1), "batch=0: must be an integer >= 1"),
        (lambda: check_int("batch", True), "batch=True: must be an integer >= 0"),
        (lambda: check_int("batch", 1.0), "batch=1.0: must be an integer >= 0"),
        (lambda: check_number("x", "1"), "x='1': must be a finite number"),
        (lambda: check_number("x", math.nan), "x=nan: must be a finite number >= 0"),
        (lambda: check_number("x", 0, positive=True), "x=0: must be a finite number > 0"),
        (lambda: check_number("x", 5.0, upper=4.0), "x=5.0: must be a finite number in [0, 4.0]"),
        (
            lambda: check_choice("strategy", "fast", Strategy),
            "strategy='fast': must be one of balance-by-vram, latency, throughput, exact",
        ),
    ],
)
def test_each_rejection_names_field_value_and_rule(call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError) as info:
        call()
    assert str(info.value) == message


def test_accepted_values_come_back_converted() -> None:
    assert check_int("n", 3, minimum=1) == 3
    assert check_number("x", 2) == 2.0 and isinstance(check_number("x", 2), float)
    assert check_number("x", 4.0, upper=4.0) == 4.0
    assert check_choice("s", " LATENCY ", Strategy, normalise=lambda v: v.strip().lower()) is (
        Strategy.LATENCY
    )
