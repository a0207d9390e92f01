"""The plan's nodes reordered (:func:`stowplan.planner.strategies.cycle.relocated`): each
stage's node moved to the front or the end of the order, split again for the least cycle,
where blocks differ (deepseek-v3: three dense blocks before 58 MoE blocks)."""

from __future__ import annotations

import random

import pytest

from stowplan import Constraints, plan
from stowplan.cost import CostModel
from stowplan.models import resolve_model
from stowplan.planner import strategies
from stowplan.planner.strategies import cycle
from stowplan.planner.strategies.cycle_split import least_cycle_split
from tests.common.bounded_apart import not_reshaped
from tests.common.gpu_fleets import nodes_of

_H200, _B200, _A100, _L4 = (
    ("H200", 141, 1),
    ("B200", 180, 1),
    ("A100 40GB SXM4", 40, 1),
    ("L4", 24, 1),
)

# Sixteen single-GPU nodes on LAN links (Mbit/s, ms).
_SIXTEEN = [
    (*_H200, 95_000.0, 0.4), (*_L4, 86_100.0, 0.37), (*_B200, 43_600.0, 0.17),
    (*_A100, 90_500.0, 0.19), (*_H200, 61_300.0, 0.09), (*_A100, 74_200.0, 0.1),
    (*_A100, 64_100.0, 0.31), (*_A100, 23_900.0, 0.27), (*_B200, 13_200.0, 0.11),
    (*_B200, 52_800.0, 0.07), (*_B200, 94_100.0, 0.31), (*_A100, 38_900.0, 0.32),
    (*_B200, 73_500.0, 0.43), (*_L4, 43_100.0, 0.07), (*_L4, 53_100.0, 0.34),
    (*_L4, 92_400.0, 0.49),
]  # fmt: skip

_SEARCHED_ORDER = [2, 9, 10, 12, 0, 4, 5, 8]
"""The order the searches find for deepseek-v3 at 16 sequences on :data:`_SIXTEEN`:
five B200, two H200, then an A100 holding one block before the last B200."""


def _planned(**limits: int):
    nodes = nodes_of(_SIXTEEN)
    return plan(resolve_model("deepseek-v3"), nodes, Constraints(batch=16, **limits))


def test_a_small_node_moved_to_the_front_takes_the_first_block_and_the_plan_gains():
    """The searches' order split for its least cycle gives 1,531.7 tokens/s; its A100 moved
    to the front (the embedding and block 0 alone) gives 1,558.1, and the plan is that."""
    nodes = nodes_of(_SIXTEEN)
    model, c = resolve_model("deepseek-v3"), Constraints(batch=16)
    cm = CostModel(model, nodes, c).for_stages(8)
    searched = least_cycle_split(cm, _SEARCHED_ORDER)
    assert searched is not None
    before = 16 / cm.evaluate(*searched).cycle_s
    assert before == pytest.approx(1531.7, abs=0.1)
    order, bounds = cycle.relocated(CostModel(model, nodes, c), searched)
    assert order == [5, *(d for d in _SEARCHED_ORDER if d != 5)]
    assert bounds[:2] == [0, 1]
    after = 16 / cm.evaluate(order, bounds).cycle_s
    assert after == pytest.approx(1558.1, abs=0.1)
    got = _planned()
    assert got.rationale.prediction is not None
    assert got.rationale.prediction.tokens_per_s == pytest.approx(after, rel=1e-9)
    assert got.assignments[0].node_id == "n05" and got.assignments[0].block_range == (0, 1)


def test_without_the_reorder_the_plan_is_the_searched_order(monkeypatch: pytest.MonkeyPatch):
    """The checkout without it plans the 1,531.7 tokens/s pipeline: the gain is the reorder's
    (the certificate's neighbours of that pipeline, which find it too, left out)."""
    monkeypatch.setattr(strategies.cycle, "relocated", lambda cm, p: p)
    not_reshaped(monkeypatch)
    got = _planned()
    assert got.rationale.prediction is not None
    assert got.rationale.prediction.tokens_per_s == pytest.approx(1531.7, abs=0.1)


def test_a_reorder_never_raises_the_cycle_and_keeps_every_node():
    """Random orders of eight of the sixteen nodes (each split for its least cycle): the
    reorder keeps the same nodes, one stage each, every block held, within the memory,
    and a cycle no higher; some orders gain."""
    nodes = nodes_of(_SIXTEEN)
    model, c = resolve_model("deepseek-v3"), Constraints(batch=16)
    cm = CostModel(model, nodes, c)
    view = cm.for_stages(8)
    rng = random.Random(5)
    gained = tried = 0
    for _ in range(12):
        order = [2, 8, 9, 10, 12, 0, 4, rng.choice([1, 3, 5, 6, 7, 11, 13, 14, 15])]
        rng.shuffle(order)
        p = least_cycle_split(view, order)
        if p is None:
            continue
        tried += 1
        got = cycle.relocated(cm, p)
        assert sorted(got[0]) == sorted(order)
        assert got[1][0] == 0 and got[1][-1] == model.num_blocks
        assert cm.fits_pipeline(*got)
        was, now = cm.evaluate(*p).cycle_s, cm.evaluate(*got).cycle_s
        assert now <= was
        gained += now < was * (1 - 1e-9)
    assert tried >= 8 and gained >= 1


def test_blocks_alike_are_not_reordered():
    """llama3.1:70b (blocks alike): the pipeline is handed back as it is."""
    nodes = nodes_of(_SIXTEEN)
    model, c = resolve_model("llama3.1:70b"), Constraints(batch=16)
    cm = CostModel(model, nodes, c)
    assert cm.uniform
    p = ([13, 1, 14], [0, 27, 54, 80])
    assert cycle.relocated(cm, p) is p


_A100P, _R5090, _H100 = ("A100 80GB PCIe", 80, 1), ("RTX 5090", 32, 1), ("H100 SXM5", 80, 1)

# Sixteen single-GPU nodes where kimi-k2 at one stream fits only expert-parallel.
_KIMI_SIXTEEN = [
    (*_A100P, 94_100.0, 0.33), (*_H200, 39_500.0, 0.06), (*_H200, 18_900.0, 0.44),
    (*_R5090, 48_700.0, 0.07), (*_H100, 83_400.0, 0.26), (*_A100P, 27_000.0, 0.5),
    (*_H100, 69_600.0, 0.27), (*_R5090, 34_100.0, 0.18), (*_H100, 46_000.0, 0.49),
    (*_H200, 27_200.0, 0.49), (*_H100, 20_800.0, 0.23), (*_R5090, 64_200.0, 0.4),
    (*_R5090, 78_900.0, 0.25), (*_H100, 68_400.0, 0.27), (*_H200, 21_500.0, 0.29),
    (*_A100P, 30_900.0, 0.39),
]  # fmt: skip


def test_a_moe_backbone_is_not_reordered(monkeypatch: pytest.MonkeyPatch):
    """kimi-k2 at one stream, expert-parallel: its backbone keeps the searches' order.
    Reordered as a plan is, the backbone is faster but the plan with its experts placed
    is 17 % slower."""
    nodes = nodes_of(_KIMI_SIXTEEN)
    model = resolve_model("kimi-k2")

    def tokens_per_s() -> float:
        got = plan(model, nodes, Constraints(batch=1))
        assert got.rationale.prediction is not None and got.rationale.certificate is None
        return got.rationale.prediction.tokens_per_s

    kept = tokens_per_s()
    monkeypatch.setattr(strategies.cycle, "relocated", lambda cm, p: p)
    assert tokens_per_s() == kept
    monkeypatch.undo()
    monkeypatch.setattr("stowplan.planner.is_backbone", lambda: False)
    assert tokens_per_s() < 0.9 * kept
