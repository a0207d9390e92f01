"""The EPLB-shaped packing rule: a load matrix in, every expert's copies out."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stowplan import InputError
from stowplan.planner.experts import pack_experts
from stowplan.planner.experts.packing import _pack_layer


def test_copies_go_heaviest_first_to_the_node_that_finishes_first() -> None:
    got = pack_experts([[4, 3, 2, 1]], [1, 1], [2, 2], redundant_per_layer=0, experts_per_token=2)
    assert got.holders == ([[0], [1], [1], [0]],)
    assert got.load_only is None


def test_a_node_twice_as_fast_takes_twice_the_load() -> None:
    got = pack_experts([[4, 3, 2, 1]], [2, 1], [4, 4], redundant_per_layer=0, experts_per_token=2)
    assert got.holders == ([[0], [1], [0], [0]],)  # loads 7 and 3: finish times 3.5 and 3


def test_a_hot_expert_gets_a_replica_on_another_node() -> None:
    got = pack_experts([[10, 1, 1, 1]], [1, 1], [3, 3], redundant_per_layer=1, experts_per_token=2)
    assert got.holders == ([[0, 1], [0], [1], [0]],)


def test_no_replica_when_no_copy_would_carry_half_a_node_mean_load() -> None:
    got = pack_experts([[1, 1, 1, 1]], [1, 1], [4, 4], redundant_per_layer=4, experts_per_token=2)
    assert [len(hs) for hs in got.holders[0]] == [1, 1, 1, 1]


def test_co_activated_experts_share_a_node_and_the_load_only_packing_is_kept() -> None:
    got = pack_experts(
        [[1, 1, 1, 1], [1, 1, 1, 1]],
        [1, 1],
        [4, 4],
        redundant_per_layer=0,
        experts_per_token=2,
        pairs=[[(0, 1, 0.9)], [(2, 3, 0.9)]],
    )
    assert got.holders[0][0] == got.holders[0][1]
    assert got.holders[1][2] == got.holders[1][3]
    assert got.load_only == ([[0], [1], [0], [1]], [[0], [1], [0], [1]])


@given(
    layers=st.integers(1, 4),
    experts=st.integers(1, 12),
    speeds=st.lists(st.floats(0.1, 1.0), min_size=1, max_size=5),
    extra=st.integers(0, 10),
    redundant=st.integers(0, 4),
    data=st.data(),
)
def test_every_expert_is_placed_within_the_slots_on_distinct_nodes(
    layers: int,
    experts: int,
    speeds: list[float],
    extra: int,
    redundant: int,
    data: st.DataObject,
) -> None:
    n = len(speeds)
    weight = data.draw(
        st.lists(
            st.lists(st.floats(0.0, 100.0), min_size=experts, max_size=experts),
            min_size=layers,
            max_size=layers,
        )
    )
    need = layers * experts + extra
    slots = [need // n + (1 if j < need % n else 0) for j in range(n)]
    got = pack_experts(
        weight, speeds, slots, redundant_per_layer=redundant, experts_per_token=2
    ).holders
    assert len(got) == layers and all(len(row) == experts for row in got)
    used = [0] * n
    for row in got:
        assert all(hs and len(set(hs)) == len(hs) for hs in row)
        assert sum(len(hs) for hs in row) <= experts + redundant
        for hs in row:
            for j in hs:
                used[j] += 1
    assert all(u <= s for u, s in zip(used, slots, strict=True))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([[1, 1], [1]], [1], [4]), "weight[1]='<1 experts>': must have 2 values"),
        (([[1, 1]], [1, 1], [4]), "slots='<1 nodes>': must have one per speed (2)"),
        (([[1, 1]], [0.0], [4]), "speeds[0]=0.0: must be a finite number > 0"),
        (([[1, 1]], [1, 1], [2, -1]), "slots[1]=-1: must be an integer >= 0"),
        (([[1, 1]], [1, 1], [1, 0]), "slots=1: must hold every expert of every layer (2)"),
    ],
)
def test_bad_shapes_are_input_errors(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(InputError) as exc:
        pack_experts(*args, redundant_per_layer=0, experts_per_token=2)  # type: ignore[arg-type]
    assert str(exc.value) == message


@given(
    w=st.lists(st.integers(1, 20), min_size=2, max_size=12),
    speeds=st.lists(st.sampled_from([1.0, 1.5, 2.0, 3.0]), min_size=2, max_size=5),
    budget=st.integers(0, 4),
    slack=st.lists(st.integers(0, 30), min_size=5, max_size=5),
    pairs=st.booleans(),
)
def test_a_quota_above_the_copies_a_layer_places_never_binds(
    w: list[int], speeds: list[float], budget: int, slack: list[int], pairs: bool
) -> None:
    # pack_experts caps every quota at num_experts + budget + 1 to pack layers alike once.
    cap = len(w) + budget + 1
    quota = [cap + s for s in slack[: len(speeds)]]
    capped = [cap] * len(speeds)
    layer_pairs = [(0, 1, 0.9)] if pairs else None
    assert _pack_layer(w, speeds, quota, budget, layer_pairs, 2, 0.05) == _pack_layer(
        w, speeds, capped, budget, layer_pairs, 2, 0.05
    )


def test_layers_alike_are_packed_alike_and_each_takes_its_own_slots() -> None:
    one = pack_experts([[3, 1, 1, 1]], [1, 1], [3, 3], redundant_per_layer=1, experts_per_token=2)
    got = pack_experts(
        [[3, 1, 1, 1]] * 3, [1, 1], [9, 9], redundant_per_layer=1, experts_per_token=2
    )
    assert got.holders == one.holders * 3
    assert got.holders[0] is not got.holders[1]
