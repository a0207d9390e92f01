"""The joint solve's vector products and stage matrices give, bit for bit, what the
plain computation gives: products over the finite entries of a row only, and stage
matrices from byte and fit matrices made once per cost model."""

from __future__ import annotations

import math
from bisect import bisect_right

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stowplan import Constraints, NodeDescriptor, lookup
from stowplan.cost import CostModel
from stowplan.model import Metric
from stowplan.planner.exact.pipelines import stage_matrix
from stowplan.planner.problem import prepare
from stowplan.planner.tensor import exact as tensor_exact
from stowplan.planner.tensor.exact import solve_grouped
from stowplan.planner.tensor.nodes import GroupCosts, NodeSolver, row_then
from tests.common.h100 import h100_nodes

_TIMES = st.one_of(st.floats(0.0, 5.0), st.just(math.inf), st.sampled_from([0.0, 0.5, 1.0]))


def _plain_product(row: np.ndarray, matrix: np.ndarray, add: bool) -> np.ndarray:
    both = row[:, None] + matrix if add else np.maximum(row[:, None], matrix)
    return both.min(axis=0)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.integers(1, 12),
    cols=st.integers(1, 12),
    values=st.lists(_TIMES, min_size=12 * 13, max_size=12 * 13),
    add=st.booleans(),
)
def test_products_over_a_rows_finite_entries_are_the_whole_products(
    rows: int, cols: int, values: list[float], add: bool
) -> None:
    row = np.array(values[:rows])
    matrix = np.array(values[12 : 12 + rows * cols]).reshape(rows, cols)
    got = row_then(np, row, matrix, add)
    assert got.shape == (cols,)
    assert np.array_equal(got, _plain_product(row, matrix, add))
    # A transposed square matrix (a view), as the backward chains take their stages.
    square = np.array(values[: rows * rows]).reshape(rows, rows)
    assert np.array_equal(row_then(np, row, square.T, add), _plain_product(row, square.T, add))


@pytest.mark.parametrize("add", [True, False])
def test_products_of_rows_finite_in_their_middle_only(add: bool) -> None:
    rng = np.random.default_rng(7)
    matrix = rng.uniform(0.0, 2.0, (30, 30))
    matrix[np.tril_indices(30)] = np.inf
    for lo, hi in [(0, 30), (0, 1), (29, 30), (5, 17), (12, 13), (0, 0)]:
        row = np.full(30, np.inf)
        row[lo:hi] = rng.uniform(0.0, 2.0, hi - lo)
        if hi - lo > 4:
            row[lo + 2] = np.inf  # an infinite entry between finite ones
        got = row_then(np, row, matrix, add)
        assert np.array_equal(got, _plain_product(row, matrix, add))
        assert np.array_equal(row_then(np, row, matrix.T, add), _plain_product(row, matrix.T, add))


def _plain_stage_matrix(
    cm: CostModel, d: int, first: bool, last: bool, hop: float, xfer: float | None, cap: float
) -> np.ndarray:
    """:func:`stage_matrix` as it was first written, every pass on its own."""
    r = np.asarray(cm.read_prefix, dtype=float)
    kv = np.asarray(cm.kv_prefix, dtype=float)
    head = cm.head if last else 0
    w = r[None, :] - r[:, None] + head
    read = w + kv[None, :] - kv[:, None]
    with np.errstate(over="ignore", invalid="ignore"):
        t = np.maximum(read * cm.inv_bw[d], w * cm.flop_s_per_byte[d])
        blocks = np.arange(len(r))[None, :] - np.arange(len(r))[:, None]
        t = t + (blocks * cm.block_s[d] + cm.stage_s[d])
        out = cm.xfer_s[d] if xfer is None else xfer
        t = t + (0.0 if last else out)
        t = np.where(t <= cap, t, np.inf) + hop
    mp = cm.mem_prefix
    room = cm.usable[d] - (cm.embed if first else 0) - head
    n = len(mp)
    reach = np.array(
        [bisect_right(mp, mp[i] + room, lo=i) - 1 if room >= 0 else -1 for i in range(n)]
    )
    ends = np.arange(n)
    ok = (ends[None, :] > ends[:, None]) & (ends[None, :] <= reach[:, None])
    return np.where(ok, t, np.inf)


@pytest.mark.parametrize(
    ("model", "nodes", "batch"),
    [("llama3.1:405b", 2, 16), ("llama3.1:70b", 1, 1), ("llama3.1:8b", 1, 64)],
)
def test_stage_matrices_are_the_plain_ones_bit_for_bit(model: str, nodes: int, batch: int) -> None:
    problem = prepare(lookup(model), h100_nodes(nodes), Constraints(batch=batch))
    # Groups of every degree (their rates, room and links differ), at two microbatches.
    groups = GroupCosts(problem, None)
    for cm in (groups.cm, groups.cm.at_microbatch(max(1, batch // 2))):
        for d in range(len(cm.nodes)):
            full = _plain_stage_matrix(cm, d, False, False, 0.0, None, math.inf)
            finite = full[np.isfinite(full)]
            cap = float(np.median(finite)) if finite.size else 1.0
            for first in (True, False):
                for last in (True, False):
                    for hop, xfer, c in [
                        (0.0, None, math.inf),
                        (1e-4, None, math.inf),
                        (2e-5, 3e-6, math.inf),
                        (1e-4, None, cap),
                        (0.0, 0.0, cap),
                    ]:
                        got = stage_matrix(cm, d, first, last, hop, xfer=xfer, cap=c)
                        want = _plain_stage_matrix(cm, d, first, last, hop, xfer, c)
                        assert np.array_equal(got, want)
                        assert got.flags.writeable  # the caller's own matrix


def test_stage_matrices_with_a_hop_of_minus_infinity_keep_the_plain_values() -> None:
    problem = prepare(lookup("llama3.1:8b"), h100_nodes(1), Constraints(batch=4))
    cm = problem.cost_model()
    for hop in (-math.inf, math.nan):
        for cap in (math.inf, 1e-3):
            got = stage_matrix(cm, 0, False, False, hop, cap=cap)
            want = _plain_stage_matrix(cm, 0, False, False, hop, None, cap)
            assert np.array_equal(got, want, equal_nan=True)


def _custom_nodes(count: int, bandwidth: float) -> list[NodeDescriptor]:
    return [
        NodeDescriptor(
            id=f"c{bandwidth:.0f}-{i}",
            gpu_name="custom",
            vram_bytes=8 * 80 * 10**9,
            flops_estimate=8 * 700.0,
            mem_bandwidth_gbps=8 * bandwidth,
            link_mbps=100_000.0,
            link_latency_ms=0.05,
            num_gpus=8,
            intra_link_gbps=450.0,
            intra_link_latency_us=3.0,
        )
        for i in range(count)
    ]


@pytest.mark.parametrize(
    ("model", "batch", "fleet"),
    [
        ("llama3.1:405b", 16, "h100 x2 + custom x2"),
        ("llama3.1:405b", 1, "h100 x4"),
        ("llama3.1:70b", 8, "h100 x1 + custom x2 + other x1"),
        ("llama3.1:70b", 1, "h100 x2"),
    ],
)
def test_rows_carried_once_per_interior_node_alike_give_the_plain_solve(
    monkeypatch: pytest.MonkeyPatch, model: str, batch: int, fleet: str
) -> None:
    nodes = {
        "h100 x2 + custom x2": [*h100_nodes(2), *_custom_nodes(2, 2000.0)],
        "h100 x4": h100_nodes(4),
        "h100 x1 + custom x2 + other x1": [
            *h100_nodes(1),
            *_custom_nodes(2, 2000.0),
            *_custom_nodes(1, 2600.0),
        ],
        "h100 x2": h100_nodes(2),
    }[fleet]
    problem = prepare(lookup(model), nodes, Constraints(batch=batch))
    objectives = (Metric.LATENCY, Metric.THROUGHPUT)
    carried = 0
    apply = tensor_exact._Interior.apply

    def counted(self: object, row: object) -> object:
        nonlocal carried
        carried += 1
        return apply(self, row)

    monkeypatch.setattr(tensor_exact._Interior, "apply", counted)
    shared = [solve_grouped(problem, objective) for objective in objectives]
    shared_count, carried = carried, 0
    # Every interior node its own key: no row is carried once for another node.
    init = tensor_exact._Interior.__init__

    def apart(self: tensor_exact._Interior, *args: object) -> None:
        init(self, *args)
        self.key = object()

    monkeypatch.setattr(tensor_exact._Interior, "__init__", apart)
    plain = [solve_grouped(problem, objective) for objective in objectives]
    assert shared == plain
    assert all(g is not None and g.stages for g in shared)
    assert 0 < shared_count < carried


def _plain_apply_mid(solver: NodeSolver, row: np.ndarray) -> np.ndarray:
    """:meth:`NodeSolver.apply_mid` as first written: every chain length, and every final
    stage after each chain on its own."""
    vec = row[None, :]
    p: list[np.ndarray | None] = [None] * (solver.gpus + 1)
    for u in range(1, solver.gpus + 1):
        for t, v in solver.kinds.items():
            src = vec if t == u else p[u - t] if t < u else None
            if src is None:
                continue
            cand = _dense(src, solver._stage(v, False, False, "intra"), solver.add)
            p[u] = cand if p[u] is None else np.minimum(p[u], cand)
    best = np.full(row.shape, np.inf)
    for t, v in solver.kinds.items():
        end = solver._stage(v, False, False, "net")
        best = np.minimum(best, _dense(vec, end, solver.add)[0])
        for u in range(1, solver.gpus - t + 1):
            chain = p[u]
            if chain is not None:
                best = np.minimum(best, _dense(chain, end, solver.add)[0])
    return best


def _dense(a: np.ndarray, b: np.ndarray, add: bool) -> np.ndarray:
    both = a[:, :, None] + b[None, :, :] if add else np.maximum(a[:, :, None], b[None, :, :])
    return both.min(axis=1)


@pytest.mark.parametrize(
    ("model", "batch", "allowed"),
    [("llama3.1:405b", 1, None), ("llama3.1:405b", 16, (2, 8)), ("llama3.1:70b", 4, (1, 4))],
)
def test_rows_through_an_interior_node_are_the_plain_products(
    model: str, batch: int, allowed: tuple[int, ...] | None
) -> None:
    problem = prepare(lookup(model), h100_nodes(2), Constraints(batch=batch))
    groups = GroupCosts(problem, allowed)
    rng = np.random.default_rng(11)
    for add in (True, False):
        solver = NodeSolver(groups, 0, problem.nodes[0].num_gpus, add)
        first = solver.node_matrix(True, False, False)[0][0]
        size = len(first)
        rows = [first]
        for lo, hi in [(0, size), (3, 20), (size // 2, size - 1), (size - 1, size)]:
            row = np.full(size, np.inf)
            row[lo:hi] = rng.uniform(
                0.0, float(np.nanmin(np.where(first > 0, first, np.nan))), hi - lo
            )
            rows.append(row)
        for row in rows:
            assert np.array_equal(solver.apply_mid(row), _plain_apply_mid(solver, row))


@pytest.mark.parametrize(
    ("model", "nodes", "batch", "objective"),
    [
        ("qwen3:30b-a3b", 8, 16, Metric.THROUGHPUT),
        ("qwen3:30b-a3b", 5, 16, Metric.LATENCY),
        ("llama3.1:70b", 4, 1, Metric.LATENCY),
        ("mixtral:8x7b", 6, 64, Metric.THROUGHPUT),
        ("llama3.1:405b", 3, 4, Metric.LATENCY),
    ],
)
def test_chains_of_nodes_alike_are_the_plain_chains(
    monkeypatch: pytest.MonkeyPatch, model: str, nodes: int, batch: int, objective: Metric
) -> None:
    """On nodes alike the chain over sets of nodes carries one row per count of nodes: the
    same table, value and closing, bit for bit, as the chain over every set, for the
    plain chain and for those where one node holds both ends (every split of its GPUs),
    and so the same joint solve."""
    plain, real_alike = tensor_exact._chain_dp, tensor_exact._alike_chain
    used: list[tuple[bool, bool]] = []
    """Per chain, whether it was carried by counts and whether one node held both ends."""

    def recording(*args: object) -> object:
        kind = real_alike(*args)  # type: ignore[arg-type]
        used.append((kind is not None, args[3] is not None))
        return kind

    def both(*args: object) -> object:
        got = plain(*args)  # type: ignore[arg-type]
        with monkeypatch.context() as m:
            m.setattr(tensor_exact, "_alike_chain", lambda *_: None)
            expected = plain(*args)  # type: ignore[arg-type]
        assert np.array_equal(got[0], expected[0])
        assert got[1] == expected[1] and got[2] == expected[2]
        return got

    problem = prepare(lookup(model), h100_nodes(nodes), Constraints(batch=batch))
    monkeypatch.setattr(tensor_exact, "_alike_chain", recording)
    monkeypatch.setattr(tensor_exact, "_chain_dp", both)
    solved = solve_grouped(problem, objective)
    assert solved is not None and solved.stages
    # The plain chain and those where one node holds both ends, all carried by counts.
    assert (True, False) in used and (True, True) in used
