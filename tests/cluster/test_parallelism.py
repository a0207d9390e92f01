"""Pre-flight validation: the table of rejected configurations and what passes."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stowplan.cluster.fleet import FleetRole, FleetSpec, PlacementStrategy
from stowplan.cluster.parallelism import ParallelismSpec, nearest_valid, validate_parallelism
from stowplan.errors import InputError
from stowplan.model import ExpertLayout, ModelLayout

FLEET = FleetSpec(role=FleetRole.INFERENCE, num_nodes=2, gpus_per_node=8)
MOE = ModelLayout(
    name="moe-60",
    num_blocks=4,
    hidden_dim=2048,
    bytes_per_activation_elem=2,
    block_params_bytes=1000,
    head_params_bytes=10,
    embed_params_bytes=10,
    num_attention_heads=16,
    num_kv_heads=4,
    experts=ExpertLayout(
        num_experts=60, experts_per_token=4, expert_params_bytes=10, moe_blocks=(0, 1, 2, 3)
    ),
)


def _attention(name: str, heads: int, kv_heads: int) -> ModelLayout:
    """A small dense layout whose only interesting numbers are its head counts."""
    return ModelLayout(
        name=name,
        num_blocks=2,
        hidden_dim=1024,
        bytes_per_activation_elem=2,
        block_params_bytes=100,
        head_params_bytes=10,
        embed_params_bytes=10,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
    )


DENSE = _attention("dense", 32, 8)
GQA = _attention("gqa-48", 48, 8)
GQA_ODD = _attention("gqa-odd", 6, 3)
TRAINER_2X8 = FleetSpec(role=FleetRole.TRAINER, num_nodes=2, gpus_per_node=8)


def P(tp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1) -> ParallelismSpec:
    return ParallelismSpec(tensor_parallel=tp, pipeline=pp, data=dp, expert=ep)


def test_seed_example_ep_not_a_multiple_of_tp_is_rejected() -> None:
    with pytest.raises(InputError) as info:
        validate_parallelism(P(tp=4, dp=2, ep=6), FLEET)
    assert str(info.value) == "ep=6: must be a multiple of tp=4 (6 % 4 = 2); nearest valid: 4, 8"


@pytest.mark.parametrize(
    ("spec", "fleet", "layout", "message"),
    [
        (
            P(tp=3),
            FLEET,
            DENSE,
            "tensor_parallel=3: must divide num_attention_heads=32 of dense (32 % 3 = 2); nearest valid: 2, 4",
        ),
        (
            P(tp=6),
            FleetSpec(role=FleetRole.TRAINER, num_nodes=2, gpus_per_node=8),
            GQA,
            "tensor_parallel=6: must divide num_kv_heads=8 of gqa-48 (8 % 6 = 2); nearest valid: 4, 8",
        ),
        (
            P(tp=12),
            FleetSpec(role=FleetRole.TRAINER, num_nodes=2, gpus_per_node=8),
            GQA,
            "tensor_parallel=12: exceeds num_kv_heads=8 of gqa-48, so must be a multiple of it "
            "(KV heads replicated; 12 % 8 = 4); nearest valid: 8, 16",
        ),
        (
            P(tp=4),
            FLEET,
            GQA_ODD,
            "tensor_parallel=4: must divide num_attention_heads=6 of gqa-odd (6 % 4 = 2); nearest valid: 3, 6",
        ),
        (
            P(tp=8, pp=4),
            FLEET,
            None,
            "tp×pp=32: one replica (8×4 = 32 GPUs) exceeds the fleet's 16 GPUs (2 nodes × 8 GPUs)",
        ),
        (
            P(tp=4, pp=2, dp=3),
            FLEET,
            None,
            "tp×pp×dp=24: 4×2×3 = 24 GPUs exceeds the fleet's 16 GPUs (2 nodes × 8 GPUs); "
            "the largest dp that fits is 2",
        ),
        (
            P(tp=3, dp=5),
            FLEET,
            None,
            "dp=5: replicas of 3×1 = 3 GPUs fit 2 per node (8 // 3), 4 on 2 nodes; "
            "the largest dp that fits is 4",
        ),
        (
            P(tp=2, dp=4, ep=8),
            FLEET,
            MOE,
            "ep=8: must divide num_experts=60 (60 % 8 = 4); nearest valid: 6",
        ),
        (
            P(tp=2, dp=2, ep=6),
            FLEET,
            None,
            "ep=6: exceeds the world size tp×pp×dp = 2×1×2 = 4; nearest valid: 4",
        ),
        (P(tp=2, dp=2, ep=2), FLEET, DENSE, "ep=2: dense has no routed experts; use 1"),
        (
            P(tp=4, pp=4),
            FleetSpec(
                role=FleetRole.INFERENCE,
                num_nodes=2,
                gpus_per_node=8,
                placement_strategy=PlacementStrategy.STRICT_PACK,
            ),
            None,
            "STOWPLAN_PG_STRATEGY='STRICT_PACK': cannot hold a replica of tp×pp = 16 GPUs on "
            "nodes of 8 GPUs (STRICT_PACK keeps a group on one node); use PACK or SPREAD",
        ),
        (
            P(),
            FleetSpec(role=FleetRole.SANDBOX, num_nodes=4, gpus_per_node=0),
            None,
            "STOWPLAN_FLEET_ROLE='sandbox': has no GPUs; parallel degrees need the trainer "
            "or inference fleet",
        ),
    ],
)
def test_rejected_configurations_state_the_arithmetic(
    spec: ParallelismSpec, fleet: FleetSpec, layout: ModelLayout | None, message: str
) -> None:
    with pytest.raises(InputError) as info:
        validate_parallelism(spec, fleet, layout)
    assert str(info.value) == message


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_degrees_must_be_positive_integers(bad: object) -> None:
    with pytest.raises(
        InputError, match=r"^tensor_parallel=.*: must be an integer in \[1, 16777216\]$"
    ):
        ParallelismSpec(tensor_parallel=bad)  # type: ignore[arg-type]


def test_replica_within_a_node_uses_per_node_groups() -> None:
    check = validate_parallelism(P(tp=4, dp=4, ep=4), FLEET, MOE)
    assert (check.replica_gpus, check.world_size, check.fleet_gpus) == (4, 16, 16)
    assert not check.unified_group
    assert check.nodes_per_replica == 1


def test_replica_larger_than_a_node_needs_a_unified_group() -> None:
    check = validate_parallelism(P(tp=4, pp=4), FLEET)
    assert check.unified_group
    assert check.nodes_per_replica == 2
    assert check.notes == (
        "replica tp×pp = 16 GPUs > 8 GPUs per node: one unified PACK group per replica "
        "over 2 nodes",
    )


@given(
    tp=st.sampled_from([1, 2, 4, 8, 16]),
    pp=st.integers(1, 4),
    dp=st.integers(1, 8),
    ep=st.integers(1, 32),
    nodes=st.integers(1, 4),
    gpn=st.sampled_from([1, 2, 4, 8]),
)
def test_accepted_configurations_fit_the_fleet_and_keep_ep_aligned_to_tp(
    tp: int, pp: int, dp: int, ep: int, nodes: int, gpn: int
) -> None:
    fleet = FleetSpec(role=FleetRole.TRAINER, num_nodes=nodes, gpus_per_node=gpn)
    try:
        check = validate_parallelism(P(tp=tp, pp=pp, dp=dp, ep=ep), fleet, MOE)
    except InputError:
        return
    assert check.world_size == tp * pp * dp <= nodes * gpn
    assert ep == 1 or (ep % tp == 0 and 60 % ep == 0 and ep <= check.world_size)
    assert 16 % tp == 0 and (4 % tp == 0 if tp <= 4 else tp % 4 == 0)
    assert check.unified_group == (tp * pp > gpn)


def test_suggested_dp_accounts_for_per_node_packing() -> None:
    # 3-GPU replicas fit 2 per 8-GPU node: 4 in all, not 16 // 3 = 5.
    with pytest.raises(InputError) as info:
        validate_parallelism(P(tp=3, dp=6), TRAINER_2X8)
    assert str(info.value) == (
        "tp×pp×dp=18: 3×1×6 = 18 GPUs exceeds the fleet's 16 GPUs (2 nodes × 8 GPUs); "
        "the largest dp that fits is 4"
    )
    assert validate_parallelism(P(tp=3, dp=4), TRAINER_2X8).world_size == 12


def test_kv_heads_follow_the_engines_partition_or_replicate_rule() -> None:
    # tp <= kv heads: tp divides them; tp > kv heads: kv heads divide tp (replicated).
    assert validate_parallelism(P(tp=16), TRAINER_2X8, DENSE).unified_group
    assert validate_parallelism(P(tp=8), TRAINER_2X8, GQA).replica_gpus == 8
    assert validate_parallelism(P(tp=6), FLEET, GQA_ODD).replica_gpus == 6


@pytest.mark.parametrize("name", ["deepseek-v3", "kimi-k2"])
def test_mla_models_with_one_latent_kv_head_accept_tp_8(name: str) -> None:
    from stowplan.models import resolve_model

    layout = resolve_model(name)
    assert layout.num_kv_heads == 1
    check = validate_parallelism(P(tp=8, ep=8), FLEET, layout)
    assert (check.replica_gpus, check.unified_group) == (8, False)


def _suggestions(message: str) -> tuple[str, list[int]]:
    """The degree a message suggests values for, and the values."""
    if "; the largest dp that fits is " in message:
        return "data", [int(message.rsplit(" ", 1)[1])]
    if "; nearest valid: " in message:
        field = {"tensor_parallel": "tensor_parallel", "ep": "expert"}[message.split("=", 1)[0]]
        tail = message.rsplit("; nearest valid: ", 1)[1]
        return field, [] if tail == "none" else [int(v) for v in tail.split(", ")]
    if message.endswith("; no dp fits with the other degrees unchanged"):
        return "data", []
    # The rules that suggest nothing, each recognised by its own wording: a message in
    # none of these forms fails the test (its wording drifted from what is checked here).
    unsuggested = ("one replica (", "has no routed experts; use 1", "cannot hold a replica")
    assert any(part in message for part in unsuggested), f"unrecognised message: {message}"
    return "", []


LAYOUTS = st.sampled_from([None, DENSE, MOE, GQA, GQA_ODD])


@given(
    tp=st.integers(1, 20),
    pp=st.integers(1, 4),
    dp=st.integers(1, 12),
    ep=st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16]),
    nodes=st.integers(1, 4),
    gpn=st.sampled_from([1, 2, 4, 6, 8]),
    layout=LAYOUTS,
)
def test_every_suggested_value_passes_validation(
    tp: int, pp: int, dp: int, ep: int, nodes: int, gpn: int, layout: ModelLayout | None
) -> None:
    fleet = FleetSpec(role=FleetRole.TRAINER, num_nodes=nodes, gpus_per_node=gpn)
    spec = P(tp=tp, pp=pp, dp=dp, ep=ep)
    try:
        validate_parallelism(spec, fleet, layout)
    except InputError as exc:
        degree, values = _suggestions(str(exc))
        for value in values:
            fixed = replace(spec, **{degree: value})
            validate_parallelism(fixed, fleet, layout)  # raises if the suggestion is wrong


@given(tp=st.integers(1, 40), layout=st.sampled_from([DENSE, MOE, GQA, GQA_ODD]))
def test_every_suggested_tp_divides_attention_heads_and_suits_kv_heads(
    tp: int, layout: ModelLayout
) -> None:
    fleet = FleetSpec(role=FleetRole.TRAINER, num_nodes=8, gpus_per_node=8)
    try:
        validate_parallelism(P(tp=tp), fleet, layout)
    except InputError as exc:
        degree, values = _suggestions(str(exc))
        assert degree == "tensor_parallel"
        assert values
        for value in values:
            assert layout.num_attention_heads is not None and layout.num_kv_heads is not None
            assert layout.num_attention_heads % value == 0
            kv = layout.num_kv_heads
            assert (kv % value == 0) if value <= kv else (value % kv == 0)
            validate_parallelism(P(tp=value), fleet, layout)


KV_ONLY = ModelLayout(
    name="kv-only",
    num_blocks=2,
    hidden_dim=1024,
    bytes_per_activation_elem=2,
    block_params_bytes=100,
    head_params_bytes=10,
    embed_params_bytes=10,
    num_kv_heads=4,
)


def _walked(
    spec: ParallelismSpec, fleet: FleetSpec, layout: ModelLayout | None, degree: str
) -> tuple[int | None, int | None]:
    """The nearest valid values found by trying every value up to the fleet's GPUs."""
    value = int(getattr(spec, degree))
    valid = []
    for v in range(1, fleet.total_gpus + 1):
        try:
            validate_parallelism(replace(spec, **{degree: v}), fleet, layout)
        except InputError:
            continue
        valid.append(v)
    below = [v for v in valid if v < value]
    above = [v for v in valid if v > value]
    return (below[-1] if below else None, above[0] if above else None)


@given(
    tp=st.integers(1, 20),
    pp=st.integers(1, 4),
    dp=st.integers(1, 12),
    ep=st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16]),
    nodes=st.integers(1, 4),
    gpn=st.sampled_from([1, 2, 4, 6, 8]),
    layout=st.sampled_from([None, DENSE, MOE, GQA, GQA_ODD, KV_ONLY]),
    strict=st.booleans(),
    degree=st.sampled_from(["tensor_parallel", "data", "expert"]),
)
def test_closed_form_suggestions_equal_the_walk_over_every_value(
    tp: int,
    pp: int,
    dp: int,
    ep: int,
    nodes: int,
    gpn: int,
    layout: ModelLayout | None,
    strict: bool,
    degree: str,
) -> None:
    fleet = FleetSpec(
        role=FleetRole.TRAINER,
        num_nodes=nodes,
        gpus_per_node=gpn,
        placement_strategy=PlacementStrategy.STRICT_PACK if strict else PlacementStrategy.PACK,
    )
    spec = P(tp=tp, pp=pp, dp=dp, ep=ep)
    got = nearest_valid(spec, fleet, layout, degree)
    if degree == "expert" and ep > fleet.total_gpus:
        return  # the walk stops at the fleet's GPUs; ep may be larger
    assert got == _walked(spec, fleet, layout, degree)


def test_suggestions_on_sixteen_million_gpus_take_no_time() -> None:
    import time

    from stowplan.models import resolve_model

    fleet = FleetSpec(role=FleetRole.INFERENCE, num_nodes=16384, gpus_per_node=1024)
    t0 = time.perf_counter()
    with pytest.raises(InputError) as info:
        validate_parallelism(P(tp=3), fleet, resolve_model("llama3.1:8b"))
    with pytest.raises(InputError):
        validate_parallelism(P(tp=1, dp=2 * 10**7), fleet, KV_ONLY)
    with pytest.raises(InputError):
        validate_parallelism(P(tp=3, dp=2), fleet, KV_ONLY)
    assert time.perf_counter() - t0 < 1.0
    assert str(info.value).endswith("nearest valid: 2, 4")
