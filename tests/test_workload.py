"""The serving workload: validated at construction; the CLI's time and rate units."""

from __future__ import annotations

import pytest

from stowplan import InputError, Workload
from stowplan.quantities.units import parse_rate_per_s, parse_seconds, parse_time_per_token_s


def test_a_workload_holds_p_plus_o_and_reads_at_p_plus_half_o():
    w = Workload(prompt_tokens=2048, output_tokens=256, ttft_s=1.0, tpot_s=0.05)
    assert w.context_tokens == 2304
    assert w.mean_context_tokens == 2176
    assert not w.has_target
    assert Workload(prompt_tokens=1, output_tokens=1, ttft_s=1, tpot_s=1, users=5).has_target


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"prompt_tokens": 0}, "prompt_tokens=0: must be an integer in [1, 1073741824]"),
        ({"output_tokens": 1.5}, "output_tokens=1.5: must be an integer in [1, 1073741824]"),
        ({"ttft_s": 0}, "ttft_s=0: must be a finite number in [1e-06, 1e+18]"),
        ({"tpot_s": float("nan")}, "tpot_s=nan: must be a finite number in [1e-06, 1e+18]"),
        ({"users": 0}, "users=0: must be an integer in [1, 1048576]"),
        ({"rate_per_s": -1.0}, "rate_per_s=-1.0: must be a finite number in [1e-06, 1e+18]"),
        (
            {"users": 5, "rate_per_s": 2.0},
            "rate_per_s=2.0: cannot be set with users=5; give one target (or neither)",
        ),
    ],
)
def test_a_bad_workload_names_the_field_the_value_and_the_rule(kw, message):
    base: dict[str, object] = dict(prompt_tokens=10, output_tokens=10, ttft_s=1.0, tpot_s=0.1)
    base.update(kw)
    with pytest.raises(InputError) as err:
        Workload(**base)  # type: ignore[arg-type]
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("50ms", 0.05), ("200us", 2e-4), ("2min", 120.0), ("0.5", 0.5), (3, 3.0)],
)
def test_times_read_with_their_unit(text, seconds):
    assert parse_seconds(text) == pytest.approx(seconds)


def test_time_per_token_reads_a_time_or_a_per_user_rate():
    assert parse_time_per_token_s("50ms") == pytest.approx(0.05)
    assert parse_time_per_token_s("20tok/s") == pytest.approx(0.05)
    assert parse_time_per_token_s("20 tokens/s") == pytest.approx(0.05)


def test_rates_read_per_second_minute_or_hour():
    assert parse_rate_per_s("5/s") == 5.0
    assert parse_rate_per_s("300/min") == pytest.approx(5.0)
    assert parse_rate_per_s("18000/h") == pytest.approx(5.0)
    assert parse_rate_per_s(2) == 2.0


@pytest.mark.parametrize("bad", ["0s", "-1s", "fast", "1e999s", "\u0663s", "5 parsecs", True])
def test_a_bad_time_is_refused_with_the_rule(bad):
    with pytest.raises(InputError) as err:
        parse_seconds(bad, field="--ttft")
    assert str(err.value).endswith("must be a time > 0 such as 1, '1s', '50ms' or '200us'")
    assert str(err.value).startswith("--ttft=")


@pytest.mark.parametrize("bad", ["0tok/s", "fast", "-5/s"])
def test_a_bad_tpot_or_rate_is_refused(bad):
    with pytest.raises(InputError):
        parse_time_per_token_s(bad, field="--tpot")
    with pytest.raises(InputError):
        parse_rate_per_s(bad, field="--rate")
