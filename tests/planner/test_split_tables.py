"""The greedy split's stage-time rows answer as the plain bisection does: the same reach
and the same next bottleneck, on random cost models, at bottlenecks that tie a stage's
time exactly and where the VRAM caps a node's reach."""

from __future__ import annotations

import math
import random

import pytest

from stowplan import Constraints, NodeDescriptor, lookup
from stowplan.planner.problem import prepare
from stowplan.planner.strategies import split_tables
from stowplan.planner.strategies.split_tables import (
    SplitTables,
    end_time,
    next_reach,
    reach,
)
from tests.common.identical_nodes import fleet_with_copies


def _fleet(seed: int, n: int) -> list[NodeDescriptor]:
    return fleet_with_copies(seed, n, 0.3)


@pytest.mark.parametrize(
    ("seed", "model", "batch"),
    [
        (0, "llama3.1:70b", 1),
        (1, "llama3.1:70b", 16),
        (2, "deepseek-v3", 16),
        (3, "qwen3:235b-a22b", 4),
        (4, "llama3.1:405b-q4_0", 64),
    ],
)
def test_rows_answer_as_the_bisection(seed: int, model: str, batch: int) -> None:
    rng = random.Random(seed)
    problem = prepare(lookup(model), _fleet(seed, 48), Constraints(batch=batch))
    cm = problem.cost_model()
    tables = SplitTables(cm)
    nb = cm.num_blocks
    capped = 0
    for d in rng.sample(range(len(cm.nodes)), 8):
        for lo in range(nb + 1):
            for first in (False, True):
                row = tables.row(d, lo, first)
                assert row is not None
                capped += lo + len(row) < nb
                # Every stage time exactly (ties), just below and above, and random.
                probes = [0.0, math.inf, *row, *(math.nextafter(t, 0.0) for t in row)]
                probes += [rng.uniform(0.0, 2 * row[-1]) for _ in range(4)] if row else []
                for t in probes:
                    hi = reach(cm, d, lo, t, first)
                    assert tables.reach(cm, d, lo, t, first) == (
                        hi,
                        next_reach(cm, d, lo, hi, first),
                    )
                assert tables.end(cm, d, lo, first) == end_time(cm, d, lo, first)
    assert capped  # the VRAM ends some rows before the last block


@pytest.mark.parametrize(
    ("seed", "model", "batch"),
    [
        (5, "llama3.1:405b", 16),
        (6, "llama3.1:70b", 1),
        (7, "gemma3:27b", 8),
        (8, "qwen3:235b-a22b", 4),
    ],
)
def test_rows_on_arrays_are_the_rows_in_python(
    seed: int, model: str, batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Long rows are computed on arrays: bit for bit the rows of the Python arithmetic."""
    problem = prepare(lookup(model), _fleet(seed, 40), Constraints(batch=batch))
    cm = problem.cost_model()
    arrays = SplitTables(cm)
    with monkeypatch.context() as m:
        m.setattr(split_tables, "numpy_module", lambda: None)
        plain = SplitTables(cm)
    long = 0
    for d in range(len(cm.nodes)):
        for lo in range(cm.num_blocks + 1):
            for first in (False, True):
                row = arrays.row(d, lo, first)
                assert row == plain.row(d, lo, first)
                long += row is not None and len(row) >= split_tables.ROW_ARRAY
    assert long  # some rows took the array path


@pytest.mark.parametrize(("seed", "model"), [(9, "llama3.1:70b"), (10, "deepseek-v3")])
def test_a_reach_asked_once_is_bisected_and_the_second_ask_builds_the_row(
    seed: int, model: str
) -> None:
    rng = random.Random(seed)
    cm = prepare(lookup(model), _fleet(seed, 32), Constraints(batch=4)).cost_model()
    tables = SplitTables(cm)
    nb = cm.num_blocks
    for d in rng.sample(range(len(cm.nodes)), 6):
        for lo in rng.sample(range(nb), 6):
            first = rng.random() < 0.5
            t_row = SplitTables(cm).row(d, lo, first)
            assert t_row  # a fleet of GPUs that each hold a block
            key = (cm.stage_class[d], lo, first)  # nodes of one class share it
            for _ in range(3):
                asked_before = key in tables._asked
                t = rng.choice([*t_row, rng.uniform(0.0, 2 * t_row[-1])])
                hi = reach(cm, d, lo, t, first)
                assert tables.reach(cm, d, lo, t, first) == (hi, next_reach(cm, d, lo, hi, first))
                assert (key in tables._rows) == asked_before
                assert key in tables._asked
