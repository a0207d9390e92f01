"""Fuzz the cluster's pure pieces: topology, parallelism, fleet and worker environments."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from stowplan.cluster.fleet import FleetSpec
from stowplan.cluster.parallelism import ParallelismSpec, validate_parallelism
from stowplan.cluster.topology import (
    MAX_RANK,
    select_segment_nodes,
    topo_rank_from,
    topology_from_nodes,
)
from stowplan.models import lookup
from stowplan.stages.worker import stage_from_env
from tests.common.fuzz import fuzz, json_values, scalars, strings, typed
from tests.common.paths import FIXTURES

PLAN_JSON = (FIXTURES / "plans" / "llama3_1_70b__mixed-consumer__39.json").read_text()

well_formed = st.tuples(
    st.one_of(st.none(), st.sampled_from(["d1", "d2", "unknown"])),
    st.one_of(st.none(), st.integers(0, 10**6)),
)
topologies = st.one_of(
    st.dictionaries(st.text(max_size=6), well_formed, max_size=12),
    st.dictionaries(
        st.text(max_size=6),
        st.one_of(well_formed, st.tuples(scalars, scalars), json_values),
        max_size=12,
    ),
)


@fuzz
@given(
    topologies,
    st.one_of(st.integers(1, 4), st.integers(-1, 8), scalars),
    st.one_of(st.integers(1, 8), st.integers(-1, 16), scalars),
)
@example({"a": ("d1", "3"), "b": ("d1", 1)}, 1, 2)
@example({"a": ("d1", 2), "b": ("d1", 1), "c": ("d2", None)}, 2, 2)
def test_segment_selection_gives_segments_or_a_typed_error(
    topology: object, segment_size: object, num_nodes: object
) -> None:
    chosen = typed(select_segment_nodes, topology, segment_size, num_nodes)  # type: ignore[arg-type]
    if chosen is not None:
        assert isinstance(topology, dict)
        assert len(chosen.selected) == num_nodes
        assert all(len(s) == segment_size for s in chosen.segments)
        assert sorted((*chosen.selected, *chosen.remainder)) == sorted(topology)


env_values = st.one_of(strings, st.integers(-5, 10**20).map(str), st.just("9" * 5000))


@fuzz
@given(
    st.dictionaries(st.sampled_from(["SLURM_TOPOLOGY_ADDR", "SLURM_PROCID"]), env_values),
    st.one_of(strings, st.just("node" + "9" * 5000)),
)
@example({"SLURM_TOPOLOGY_ADDR": ".".join(["s1"] * 3000)}, "h")
def test_topological_ranks_are_positive_and_within_ray_or_an_input_error(
    env: dict[str, str], hostname: str
) -> None:
    found = typed(topo_rank_from, env, hostname)
    if found is not None:
        assert 1 <= found[0] <= MAX_RANK


@fuzz
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "Alive": st.booleans(),
                "NodeID": strings,
                "Resources": st.dictionaries(
                    st.sampled_from(["topo_rank", "nvlink_domain_x", "GPU"]),
                    st.one_of(st.floats(0, 1e6), st.integers(0, 100)),
                ),
            }
        ),
        max_size=6,
    )
)
def test_topology_from_ray_records_gives_ranks(nodes: list[dict[str, object]]) -> None:
    typed(topology_from_nodes, nodes)


@fuzz
@given(
    st.one_of(
        st.tuples(*[st.sampled_from([1, 2, 3, 4, 8, 16])] * 4),
        st.tuples(*[st.one_of(st.integers(1, 64), scalars)] * 4),
    ),
    st.sampled_from(["trainer", "inference", "inference", "sandbox", "x"]),
    st.one_of(st.integers(1, 64), st.integers(1, 64), scalars),
    st.one_of(st.integers(1, 16), st.integers(0, 16), scalars),
    st.one_of(st.none(), st.none(), st.integers(1, 8), scalars),
    st.sampled_from([None, "llama3.1:8b", "mixtral:8x7b", "deepseek-v3", "qwen3:30b-a3b"]),
)
def test_parallel_degrees_validate_or_raise_a_typed_error(
    degrees: tuple[object, ...],
    role: str,
    num_nodes: object,
    gpus_per_node: object,
    segment_size: object,
    model: str | None,
) -> None:
    tp, pp, dp, ep = degrees
    spec = typed(ParallelismSpec, tensor_parallel=tp, pipeline=pp, data=dp, expert=ep)  # type: ignore[arg-type]
    fleet = typed(
        FleetSpec,
        role=role,  # type: ignore[arg-type]
        num_nodes=num_nodes,  # type: ignore[arg-type]
        gpus_per_node=gpus_per_node,  # type: ignore[arg-type]
        segment_size=segment_size,  # type: ignore[arg-type]
    )
    if spec is not None and fleet is not None:
        check = typed(validate_parallelism, spec, fleet, None if model is None else lookup(model))
        if check is not None:
            assert check.world_size <= fleet.total_gpus


fleet_envs = st.fixed_dictionaries(
    {
        "STOWPLAN_FLEET_ROLE": st.sampled_from(["trainer", "inference", "sandbox", " Inference "]),
        "STOWPLAN_NUM_NODES": st.integers(1, 64).map(str),
        "STOWPLAN_GPUS_PER_NODE": st.integers(0, 16).map(str),
    },
    optional={
        "STOWPLAN_PG_STRATEGY": st.sampled_from(["PACK", "spread", "STRICT_PACK", "x"]),
        "STOWPLAN_SEGMENT_SIZE": st.integers(1, 8).map(str),
        "STOWPLAN_MAX_COLOCATED_WORKER_GROUPS": st.integers(1, 4).map(str),
    },
)
fleet_keys = sorted(
    [
        "STOWPLAN_FLEET_ROLE",
        "STOWPLAN_NUM_NODES",
        "STOWPLAN_GPUS_PER_NODE",
        "STOWPLAN_PG_STRATEGY",
        "STOWPLAN_SEGMENT_SIZE",
        "STOWPLAN_MAX_COLOCATED_WORKER_GROUPS",
    ]
)


@fuzz
@given(st.one_of(fleet_envs, st.dictionaries(st.sampled_from(fleet_keys), env_values)))
@example(
    {
        "STOWPLAN_FLEET_ROLE": "inference",
        "STOWPLAN_NUM_NODES": "4",
        "STOWPLAN_GPUS_PER_NODE": "8",
        "STOWPLAN_SEGMENT_SIZE": "2",
    }
)
def test_a_fleet_environment_gives_a_fleet_or_an_input_error(env: dict[str, str]) -> None:
    typed(FleetSpec.from_env, env)


worker_envs = st.fixed_dictionaries(
    {"STAGE": st.integers(0, 5).map(str)},
    optional={
        "NUM_STAGES": st.integers(1, 6).map(str),
        "PLAN_STAGE_BLOCKS": st.tuples(st.integers(0, 40), st.integers(0, 40)).map(
            lambda t: f"{t[0]},{t[1]}"
        ),
        "PLAN_OWNS_EMBED": st.sampled_from(["1", "0", "yes", "maybe"]),
        "PLAN_OWNS_HEAD": st.sampled_from(["true", "off", ""]),
        "PLAN_JSON": st.sampled_from([PLAN_JSON, "", "{}"]),
    },
)
worker_keys = ["STAGE", "NUM_STAGES", "PLAN_STAGE_BLOCKS", "PLAN_OWNS_EMBED", "PLAN_OWNS_HEAD"]


@fuzz
@given(
    st.one_of(
        worker_envs,
        st.dictionaries(
            st.sampled_from([*worker_keys, "PLAN_JSON"]),
            st.one_of(env_values, st.just(PLAN_JSON), st.just("3,7"), st.just("1")),
        ),
    ),
    st.one_of(st.none(), st.integers(1, 200)),
)
def test_the_worker_contract_gives_a_stage_or_an_input_error(
    env: dict[str, str], num_blocks: int | None
) -> None:
    stage = typed(stage_from_env, env, num_blocks=num_blocks)
    if stage is not None:
        lo, hi = stage.block_range
        assert 0 <= lo < hi and 0 <= stage.stage < stage.num_stages
