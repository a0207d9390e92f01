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
from stowplan.worker import stage_from_env
from tests.conftest import FIXTURES
from tests.fuzz.strategies import fuzz, json_values, scalars, strings, typed

PLAN_JSON = (FIXTURES / "plans" / "llama3_1_70b__mixed-consumer__39.json").read_text()

topologies = st.dictionaries(
    st.text(max_size=6),
    st.one_of(
        st.tuples(
            st.one_of(st.none(), st.sampled_from(["d1", "d2", "unknown"])),
            st.one_of(st.none(), st.integers(0, 10**6)),
        ),
        st.tuples(scalars, scalars),
        json_values,
    ),
    max_size=12,
)


@fuzz
@given(topologies, st.one_of(st.integers(-1, 8), scalars), st.one_of(st.integers(-1, 16), scalars))
@example({"a": ("d1", "3"), "b": ("d1", 1)}, 1, 2)
def test_segment_selection_gives_segments_or_a_typed_error(
    topology: object, segment_size: object, num_nodes: object
) -> None:
    chosen = typed(select_segment_nodes, topology, segment_size, num_nodes)  # type: ignore[arg-type]
    if chosen is not None:
        assert len(chosen.nodes) == num_nodes
        assert all(len(s) == segment_size for s in chosen.segments)


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
    st.tuples(*[st.one_of(st.integers(1, 64), scalars)] * 4),
    st.sampled_from(["trainer", "inference", "sandbox", "x"]),
    st.one_of(st.integers(1, 64), scalars),
    st.one_of(st.integers(0, 16), scalars),
    st.one_of(st.none(), st.integers(1, 8), scalars),
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
    spec = typed(ParallelismSpec, tensor=tp, pipeline=pp, data=dp, expert=ep)  # type: ignore[arg-type]
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


@fuzz
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "STOWPLAN_FLEET_ROLE",
                "STOWPLAN_NUM_NODES",
                "STOWPLAN_GPUS_PER_NODE",
                "STOWPLAN_PG_STRATEGY",
                "STOWPLAN_SEGMENT_SIZE",
                "STOWPLAN_MAX_COLOCATED_WORKER_GROUPS",
            ]
        ),
        env_values,
    )
)
def test_a_fleet_environment_gives_a_fleet_or_an_input_error(env: dict[str, str]) -> None:
    typed(FleetSpec.from_env, env)


@fuzz
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "STAGE",
                "NUM_STAGES",
                "PLAN_STAGE_BLOCKS",
                "PLAN_OWNS_EMBED",
                "PLAN_OWNS_HEAD",
                "PLAN_JSON",
            ]
        ),
        st.one_of(env_values, st.just(PLAN_JSON), st.just("3,7"), st.just("1")),
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
