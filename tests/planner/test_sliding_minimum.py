"""The trip knapsack's sliding minima (stowplan.planner.exact.trip): each stage's least
cost over a window of block counts, figured by doubling over every row at once."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stowplan.planner.exact import trip


@st.composite
def _tables(draw: st.DrawFn) -> tuple[np.ndarray, int, float]:
    """A table of costs (some inf) over rows and block counts, a widest window and a rate."""
    rows = draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 6))
    n = draw(st.integers(1, 14))
    values = draw(
        st.lists(
            st.one_of(st.just(math.inf), st.floats(0.0, 50.0)),
            min_size=math.prod(rows) * n,
            max_size=math.prod(rows) * n,
        )
    )
    most = draw(st.integers(1, 20))
    rate = draw(st.floats(0.0, 3.0))
    return np.array(values, dtype=np.float64).reshape(*rows, n), most, rate


@settings(max_examples=150, deadline=None)
@given(_tables(), st.data())
def test_every_row_gets_the_least_of_its_own_window(case, data) -> None:  # type: ignore[no-untyped-def]
    """Figured over all rows at once, each row's minima are those of the row alone, bit
    for bit (a run that passes a row's end into the next is never read), and within
    rounding the least ``x[j − k] + k · rate`` over 1 ≤ k ≤ cap (inf where none)."""
    x, most, rate = case
    n = x.shape[-1]
    idx = np.arange(n)
    ramp = idx * rate
    levels = trip._levels(np, x, ramp, most)
    cap = data.draw(st.integers(1, most))
    got = trip._window(np, levels, ..., most, cap, ramp)
    assert np.array_equal(got, trip._take(np, x, cap, rate, idx))
    for row in np.ndindex(*x.shape[:-1]):
        alone = trip._take(np, x[row][None, :], cap, rate, idx)[0]
        assert np.array_equal(got[row], alone)
        for j in range(n):
            plain = min(
                (x[row][j - k] + k * rate for k in range(1, min(cap, j) + 1)), default=math.inf
            )
            assert got[row][j] == plain or math.isclose(
                got[row][j], plain, rel_tol=1e-12, abs_tol=1e-9
            )
    # A part of the rows (the first index), as the knapsack reads its first stage's.
    part = trip._window(np, levels, 0, most, cap, ramp)
    assert np.array_equal(part, got[0])
