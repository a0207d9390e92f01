"""The joint solve's shortcuts give what the plain solve gives: chains of GPU groups
multiplied offset by offset where every block is alike, and nodes alike solved once."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stowplan import Constraints, NodeDescriptor, lookup
from stowplan.calibration import resolve_calibration
from stowplan.model import Metric
from stowplan.planner.problem import prepare
from stowplan.planner.tensor import nodes as tensor_nodes
from stowplan.planner.tensor.exact import solve_grouped
from tests.common.h100 import h100_nodes


def _dense(a: np.ndarray, b: np.ndarray, add: bool) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        both = a[:, :, None] + b[None, :, :] if add else np.maximum(a[:, :, None], b[None, :, :])
    return both.min(axis=1)


def _toeplitz(row: list[float]) -> np.ndarray:
    n = len(row)
    out = np.full((n, n), np.inf)
    for i in range(n):
        for j in range(i + 1, n):
            out[i, j] = row[j - i]
    return out


_TIMES = st.one_of(st.floats(0.0, 5.0), st.just(float("inf")), st.sampled_from([0.5, 1.0]))


@settings(max_examples=80, deadline=None)
@given(
    size=st.integers(16, 40),
    f=st.lists(_TIMES, min_size=40, max_size=40),
    g=st.lists(_TIMES, min_size=40, max_size=40),
    add=st.booleans(),
)
def test_upper_toeplitz_products_by_rows_are_the_whole_products(size, f, g, add) -> None:
    a, b = _toeplitz([np.inf, *f[: size - 1]]), _toeplitz([np.inf, *g[: size - 1]])
    known: dict[int, tuple[object, object]] = {}
    fa, gb = tensor_nodes._upper_toeplitz(np, a, known), tensor_nodes._upper_toeplitz(np, b, known)
    assert fa is not None and gb is not None
    row = tensor_nodes._row_product(np, fa, tensor_nodes._shifted(np, gb), add)
    assert np.array_equal(tensor_nodes._expand(np, row), _dense(a, b, add))


def test_matrices_that_are_not_upper_toeplitz_are_told_apart() -> None:
    rng = np.random.default_rng(3)
    a = _toeplitz([np.inf, *rng.uniform(0, 1, 19)])
    known: dict[int, tuple[object, object]] = {}
    assert tensor_nodes._upper_toeplitz(np, a, known) is not None
    off = a.copy()
    off[4, 9] += 1.0  # one entry off its diagonal's value
    assert tensor_nodes._upper_toeplitz(np, off, known) is None
    lower = a.copy()
    lower[5, 2] = 1.0  # a finite entry below the diagonal
    assert tensor_nodes._upper_toeplitz(np, lower, known) is None
    # The answers are kept per matrix, each with its matrix.
    assert known[id(off)] == (off, None) and known[id(a)][0] is a


@pytest.mark.parametrize(
    ("model", "nodes", "batch", "engine"),
    [
        ("llama3.1:405b", 4, 16, "generic"),
        ("llama3.1:70b", 3, 1, None),
        ("llama3.1:8b", 4, 64, "sglang"),
    ],
)
def test_joint_solves_are_the_same_with_and_without_the_offset_products(
    monkeypatch: pytest.MonkeyPatch, model: str, nodes: int, batch: int, engine: str | None
) -> None:
    calibration = None if engine is None else resolve_calibration(engine)
    problem = prepare(
        lookup(model), h100_nodes(nodes), Constraints(batch=batch, calibration=calibration)
    )
    fast_calls = 0
    plain = tensor_nodes._row_product

    def counted(*args: object) -> object:
        nonlocal fast_calls
        fast_calls += 1
        return plain(*args)

    monkeypatch.setattr(tensor_nodes, "_row_product", counted)
    fast = [solve_grouped(problem, objective) for objective in (Metric.LATENCY, Metric.THROUGHPUT)]
    assert fast_calls  # every block of these models is alike: the offset products ran
    monkeypatch.setattr(tensor_nodes, "_TOEPLITZ_FROM", 10**9)
    whole = [solve_grouped(problem, objective) for objective in (Metric.LATENCY, Metric.THROUGHPUT)]
    assert fast == whole
    assert all(g is not None and g.stages for g in fast)


@pytest.mark.parametrize(
    ("model", "nodes", "batch"), [("llama3.1:405b", 4, 16), ("llama3.1:70b", 3, 1)]
)
def test_nodes_alike_are_solved_once_and_give_the_solve_of_nodes_told_apart(
    model: str, nodes: int, batch: int
) -> None:
    """A fleet of identical nodes, and the same fleet with every node given a name of its
    own (the same figures: nothing is shared between them by name): the same optimum,
    groups and node ids included."""

    def fleet(named: bool) -> list[NodeDescriptor]:
        return [
            NodeDescriptor(
                id=f"n{i}",
                gpu_name=f"custom {i}" if named else "custom",
                vram_bytes=8 * 80 * 10**9,
                flops_estimate=8 * 989.0,
                mem_bandwidth_gbps=8 * 3350.0,
                link_mbps=100_000.0,
                link_latency_ms=0.05,
                num_gpus=8,
                intra_link_gbps=450.0,
                intra_link_latency_us=3.0,
            )
            for i in range(nodes)
        ]

    alike = prepare(lookup(model), fleet(False), Constraints(batch=batch))
    apart = prepare(lookup(model), fleet(True), Constraints(batch=batch))
    for objective in (Metric.LATENCY, Metric.THROUGHPUT):
        assert solve_grouped(alike, objective) == solve_grouped(apart, objective)
