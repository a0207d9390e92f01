"""The throughput search splits an order of nodes once per kind of order: an order alike
to one already split, node for node, would split alike and score the same, so skipping
it leaves every plan as it was."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stowplan import Constraints, NodeDescriptor, PlanError, lookup, plan
from stowplan.plan import plan_to_json
from stowplan.planner.strategies import throughput
from tests.common.identical_nodes import fleet_with_copies


def _multi_gpu(seed: int, n: int) -> list[NodeDescriptor]:
    """``n`` nodes of 2-8 GPUs, most of them copies of a few."""
    base = fleet_with_copies(seed, n, 0.8, digits=3)
    return [replace(node, num_gpus=2 ** (1 + i % 3)) for i, node in enumerate(base)]


@pytest.mark.parametrize("model", ["gemma2:27b", "gemma3:27b", "gpt-oss:120b"])
def test_skipping_alike_orders_changes_no_plan(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = lookup(model)
    assert layout is not None
    skipped = 0
    for seed, batch in ((s, b) for s in range(6) for b in (8, 32)):
        nodes = fleet_with_copies(seed, 24, 0.7) if seed % 2 else _multi_gpu(seed, 12)
        c = Constraints(batch=batch)
        calls: list[int] = []
        with monkeypatch.context() as m:
            m.setattr(throughput, "min_bottleneck_split", _counting(calls))
            try:
                kept = plan_to_json(plan(layout, nodes, c))
            except PlanError:
                continue
            with_skips = len(calls)
            calls.clear()
            # Every order its own kind: nothing is skipped.
            m.setattr(throughput, "_alike", lambda cm, a, b: False)
            every = plan_to_json(plan(layout, nodes, c))
            skipped += len(calls) - with_skips
        assert kept == every, (seed, batch)
    assert skipped > 0  # the fleets have copies: some order is alike to another


def _counting(calls: list[int]):  # type: ignore[no-untyped-def]
    real = throughput.min_bottleneck_split

    def split(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args, **kwargs)

    return split
