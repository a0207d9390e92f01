"""The coupled bound's product of per-node tables
(:func:`stowplan.planner.tensor.capacity._staged_min_plus`) against its definition
written out entry by entry, by both of its ways (one gather, and one block count at a
time) and with its operands either way round."""

from __future__ import annotations

import itertools
import math
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stowplan.planner.tensor import capacity


def _defined(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``out[h, j, k]``: the least ``a[h1, j1, k1] + b[h2, j2, k2]`` with ``h1 + h2 = h``,
    ``k1 + k2 = k`` and ``j1 + j2 = j``, or at or above the last count for the last."""
    hs, js, n = a.shape
    out = np.full(a.shape, math.inf)
    for (h1, j1, k1), (h2, j2, k2) in itertools.product(np.ndindex(a.shape), repeat=2):
        h, j, k = h1 + h2, min(j1 + j2, js - 1), k1 + k2
        if h < hs and k < n:
            out[h, j, k] = min(out[h, j, k], a[h1, j1, k1] + b[h2, j2, k2])
    return out


@st.composite
def _tables(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """Two tables of one shape, (2, counts, blocks), each entry a small time or inf."""
    shape = (2, draw(st.integers(2, 4)), draw(st.integers(1, 5)))
    entry = st.one_of(st.just(math.inf), st.integers(0, 40).map(lambda x: x / 8))
    size = shape[0] * shape[1] * shape[2]
    a, b = (
        np.array(draw(st.lists(entry, min_size=size, max_size=size))).reshape(shape)
        for _ in range(2)
    )
    return a, b


@pytest.mark.parametrize("gathered", [0, 10**9], ids=["count by count", "one gather"])
@settings(max_examples=150, deadline=None)
@given(_tables())
def test_the_product_is_its_definition(
    gathered: int, tables: tuple[np.ndarray, np.ndarray]
) -> None:
    """Random tables, some entries inf, each product equal to the definition's exactly
    (the same sums, their least)."""
    a, b = tables
    want = _defined(a, b)
    with patch.object(capacity, "GATHERED_ENTRIES", gathered):
        assert np.array_equal(capacity._staged_min_plus(np, a, b), want)
        assert np.array_equal(capacity._staged_min_plus(np, b, a), want)


def test_a_node_added_to_no_nodes_is_its_own_table() -> None:
    """The product with the table of no stages (0 at no stages and no blocks) is the other
    table, the counts at or above the last counted once."""
    table = np.full((2, 3, 4), math.inf)
    table[0, 1, 1:] = [1.0, 2.0, 3.5]
    table[1, 2, 2:] = [4.0, 4.5]
    none = np.full((2, 3, 4), math.inf)
    none[0, 0, 0] = 0.0
    assert np.array_equal(capacity._staged_min_plus(np, none, table), table)
