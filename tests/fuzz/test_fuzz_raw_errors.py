"""Fuzz the public functions that raised raw exceptions: each gives a result or a typed error.

``ZeroDivisionError`` (a MoE layout without MoE blocks in the expert summary, a
circuit timed at ``5e-324`` ms), ``OverflowError`` (a headroom or a memory pool
of ``10**400``), ``OSError`` (a 1,000-character model name on the Accelerate
export) and ``TypeError``/``OverflowError`` (``resolve_gpu`` with memory of the
wrong type or size) were the classes; each is an explicit example here.
"""

from __future__ import annotations

import math

from hypothesis import example, given
from hypothesis import strategies as st

from stowplan.circuits import (
    CapabilityMatrix,
    Circuit,
    CircuitCapability,
    CircuitKind,
    HostTopology,
    MemoryPool,
    PoolKind,
)
from stowplan.constraints import Constraints
from stowplan.exports import export_plan
from stowplan.gpus import resolve_gpu
from stowplan.model import ExpertLayout, ModelLayout
from stowplan.plan import (
    Plan,
    PlanRationale,
    StageAssignment,
    Topology,
    plan_from_json,
)
from stowplan.planner.experts import expert_summary
from stowplan.planner.residency import plan_employment
from tests.common.fuzz import HOSTILE_INTS, floats, fuzz, ints, scalars, typed
from tests.common.paths import FIXTURES
from tests.common.toy import TOY_MODEL, toy_node

numbers = st.one_of(ints, floats, st.sampled_from([10**400, -(10**400), 5e-324]))


@fuzz
@given(numbers)
@example(10**400)
@example(-(10**400))
@example(math.nan)
def test_a_headroom_is_a_constraint_or_an_input_error(value: float) -> None:
    c = typed(Constraints, vram_headroom_frac=value)
    if c is not None:
        assert 0 <= c.headroom < 1


@fuzz
@given(numbers, st.sampled_from([1, 2, 4096, 32768]))
@example(5e-324, 4096)
@example(10**400, 1)
def test_a_circuit_capability_is_finite_or_an_input_error(ms: float, n: int) -> None:
    cap = typed(CircuitCapability, circuit="gpu0", backend="synthetic", gemv_n=n, ms_per_gemv=ms)
    if cap is not None:
        assert 0 < cap.compute_bytes_per_s < math.inf


def _host(capacity: object) -> HostTopology:
    return HostTopology(
        hostname="h",
        circuits=(Circuit(id="gpu0", kind=CircuitKind.DGPU, name="RTX 4090", pool="vram0"),),
        pools=(
            MemoryPool(
                id="vram0",
                kind=PoolKind.VRAM,
                capacity_bytes=capacity,  # type: ignore[arg-type]
                free_bytes=0,
            ),
            MemoryPool(id="system", kind=PoolKind.SYSTEM, capacity_bytes=2**36, free_bytes=0),
        ),
    )


@fuzz
@given(st.one_of(ints, st.sampled_from(HOSTILE_INTS)), st.one_of(ints, floats))
@example(10**400, 10**9)
@example(2**40, 10**400)
def test_the_residency_planner_takes_any_pool_and_model_size(capacity: int, model: int) -> None:
    matrix = CapabilityMatrix(
        entries=(
            CircuitCapability(circuit="gpu0", backend="synthetic", gemv_n=4096, ms_per_gemv=0.1),
        )
    )
    host = typed(_host, capacity)
    if host is not None:
        typed(plan_employment, host, matrix, model)


@fuzz
@given(
    st.one_of(scalars, st.lists(st.integers(), max_size=2)), st.sampled_from(["RTX 4090", "H100"])
)
@example("80GB", "RTX 4090")
@example(10**400, "RTX 4090")
@example(2.5, "H100")
@example([1], "H100")
def test_resolve_gpu_takes_any_memory_argument(memory: object, name: str) -> None:
    match = typed(resolve_gpu, name, memory)  # type: ignore[arg-type]
    if match is not None:
        assert match.spec.mem_bandwidth_gbps > 0


def _moe_without_moe_blocks() -> ModelLayout:
    experts = ExpertLayout(
        num_experts=8, experts_per_token=2, expert_params_bytes=10**6, moe_blocks=()
    )
    return ModelLayout(
        name="moe-none",
        num_blocks=TOY_MODEL.num_blocks,
        hidden_dim=TOY_MODEL.hidden_dim,
        bytes_per_activation_elem=2,
        block_params_bytes=TOY_MODEL.block_params_bytes,
        head_params_bytes=TOY_MODEL.head_params_bytes,
        embed_params_bytes=TOY_MODEL.embed_params_bytes,
        experts=experts,
    )


def test_an_expert_summary_of_a_layout_without_moe_blocks_is_even() -> None:
    plan = Plan(
        topology=Topology.PipelineChain(2),
        assignments=(
            StageAssignment(
                stage=0,
                node_id="n0",
                block_range=(0, 2),
                owns_embed=True,
                owns_head=False,
                estimated_vram_bytes=3 * 10**9,
            ),
            StageAssignment(
                stage=1,
                node_id="n1",
                block_range=(2, 4),
                owns_embed=False,
                owns_head=True,
                estimated_vram_bytes=3 * 10**9,
            ),
        ),
        rationale=PlanRationale(strategy="latency"),
    )
    summary = expert_summary(plan, _moe_without_moe_blocks(), [toy_node(0), toy_node(1)])
    assert (summary.imbalance_mean, summary.imbalance_max) == (1.0, 1.0)
    assert summary.num_placed == 0 and summary.transfers_per_token == 0.0
    assert [n.speed_share for n in summary.nodes] == [0.5, 0.5]


PLAN = plan_from_json((FIXTURES / "plans" / "llama3_1_70b__mixed-consumer__39.json").read_text())


@fuzz
@given(st.sampled_from(["m" * 1000, "m/" * 600, "\x00", "é" * 200, "a" * 4096]))
@example("m" * 1000)
def test_an_export_takes_any_model_argument(model: str) -> None:
    result = typed(export_plan, PLAN, "accelerate", model=model, family="llama")
    if result is not None:
        assert repr(model) in result.commands[0]  # the snippet's from_pretrained argument
