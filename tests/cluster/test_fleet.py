"""FleetSpec invariants, env parsing and role defaults."""

from __future__ import annotations

import dataclasses

import pytest

from stowplan.cluster.fleet import FleetRole, FleetSpec, PlacementStrategy, get_fleet_role
from stowplan.errors import InputError

BASE = {"STOWPLAN_FLEET_ROLE": "trainer", "STOWPLAN_NUM_NODES": "4", "STOWPLAN_GPUS_PER_NODE": "8"}


def test_from_env_reads_every_variable() -> None:
    env = BASE | {
        "STOWPLAN_PG_STRATEGY": "strict_pack",
        "STOWPLAN_MAX_COLOCATED_WORKER_GROUPS": "2",
        "STOWPLAN_SEGMENT_SIZE": "2",
    }
    spec = FleetSpec.from_env(env)
    assert spec == FleetSpec(
        role=FleetRole.TRAINER,
        num_nodes=4,
        gpus_per_node=8,
        placement_strategy=PlacementStrategy.STRICT_PACK,
        max_colocated_worker_groups=2,
        segment_size=2,
    )
    assert spec.total_gpus == 32


@pytest.mark.parametrize(
    ("role", "gpus", "strategy"),
    [("trainer", "8", "SPREAD"), ("inference", "8", "PACK"), ("sandbox", "0", "SPREAD")],
)
def test_each_role_gets_the_default_strategy_of_its_collective_pattern(
    role: str, gpus: str, strategy: str
) -> None:
    env = {"STOWPLAN_FLEET_ROLE": role, "STOWPLAN_NUM_NODES": "2", "STOWPLAN_GPUS_PER_NODE": gpus}
    assert FleetSpec.from_env(env).strategy == PlacementStrategy(strategy)


def test_sandbox_needs_no_gpu_variable() -> None:
    spec = FleetSpec.from_env({"STOWPLAN_FLEET_ROLE": "sandbox", "STOWPLAN_NUM_NODES": "16"})
    assert (spec.gpus_per_node, spec.num_nodes) == (0, 16)


def test_fleet_spec_is_frozen() -> None:
    spec = FleetSpec.from_env(BASE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.num_nodes = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {},
            "STOWPLAN_FLEET_ROLE=None: is required; set it to one of trainer, inference, sandbox",
        ),
        (
            BASE | {"STOWPLAN_FLEET_ROLE": "critic"},
            "STOWPLAN_FLEET_ROLE='critic': must be one of trainer, inference, sandbox",
        ),
        (
            {"STOWPLAN_FLEET_ROLE": "trainer"},
            "STOWPLAN_NUM_NODES=None: is required (an integer >= 1)",
        ),
        (BASE | {"STOWPLAN_NUM_NODES": "four"}, "STOWPLAN_NUM_NODES='four': must be an integer"),
        (
            BASE | {"STOWPLAN_NUM_NODES": "0"},
            "STOWPLAN_NUM_NODES=0: must be an integer in [1, 16384]",
        ),
        (
            {"STOWPLAN_FLEET_ROLE": "inference", "STOWPLAN_NUM_NODES": "2"},
            "STOWPLAN_GPUS_PER_NODE=None: is required for the inference fleet (> 0)",
        ),
        (
            BASE | {"STOWPLAN_FLEET_ROLE": "sandbox"},
            "STOWPLAN_GPUS_PER_NODE=8: must be 0 for the sandbox fleet (it is CPU-only)",
        ),
        (
            BASE | {"STOWPLAN_GPUS_PER_NODE": "0"},
            "STOWPLAN_GPUS_PER_NODE=0: must be > 0 for the trainer fleet",
        ),
        (
            BASE | {"STOWPLAN_PG_STRATEGY": "RANDOM"},
            "STOWPLAN_PG_STRATEGY='RANDOM': must be one of SPREAD, PACK, STRICT_PACK",
        ),
        (
            BASE | {"STOWPLAN_MAX_COLOCATED_WORKER_GROUPS": "0"},
            "STOWPLAN_MAX_COLOCATED_WORKER_GROUPS=0: must be an integer in [1, 16384]",
        ),
        (
            BASE | {"STOWPLAN_SEGMENT_SIZE": "3"},
            "STOWPLAN_SEGMENT_SIZE=3: must divide STOWPLAN_NUM_NODES=4 (4 % 3 = 1)",
        ),
        (
            {
                "STOWPLAN_FLEET_ROLE": "sandbox",
                "STOWPLAN_NUM_NODES": "4",
                "STOWPLAN_SEGMENT_SIZE": "2",
            },
            "STOWPLAN_SEGMENT_SIZE=2: must be unset for the sandbox fleet (it uses no NVLink)",
        ),
    ],
)
def test_invalid_fleets_name_the_variable_and_value(env: dict[str, str], message: str) -> None:
    with pytest.raises(InputError) as info:
        FleetSpec.from_env(env)
    assert str(info.value) == message


def test_get_fleet_role_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOWPLAN_FLEET_ROLE", " Inference ")
    assert get_fleet_role() is FleetRole.INFERENCE
    monkeypatch.delenv("STOWPLAN_FLEET_ROLE")
    with pytest.raises(InputError, match="is required"):
        get_fleet_role()
