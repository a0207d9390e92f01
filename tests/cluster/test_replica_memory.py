"""`validate` knows memory: whether one replica fits its GPUs, and a warning when a
tensor-parallel group crosses the network."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stowplan.cli import main
from stowplan.cluster.fleet import FleetRole, FleetSpec
from stowplan.cluster.parallelism import (
    GpuMemory,
    ParallelismSpec,
    replica_bytes_per_gpu,
    validate_parallelism,
)
from stowplan.errors import InputError
from stowplan.model import ModelLayout
from stowplan.models import resolve_model
from tests.common.paths import EXAMPLES

GIB = 2**30
TWO_H100 = str(EXAMPLES / "fleets" / "two-h100-nodes.yaml")
ONE_GPU = FleetSpec(role=FleetRole.INFERENCE, num_nodes=1, gpus_per_node=1)
TWO_BY_8 = FleetSpec(role=FleetRole.INFERENCE, num_nodes=2, gpus_per_node=8)


def _brute(sizes: list[int], stages: int, embed: int, head: int) -> int:
    """The least fullest stage over every split of ``sizes`` into 1..``stages`` runs."""
    n = len(sizes)
    best = None
    for k in range(1, min(stages, n) + 1):
        for cuts in itertools.combinations(range(1, n), k - 1):
            edges = [0, *cuts, n]
            runs = [sum(sizes[a:b]) for a, b in itertools.pairwise(edges)]
            runs[0] += embed
            runs[-1] += head
            worst = max(runs)
            best = worst if best is None else min(best, worst)
    assert best is not None
    return best


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(1, 50), min_size=1, max_size=7),
    st.integers(1, 8),
    st.integers(0, 60),
    st.integers(0, 60),
)
def test_the_fullest_stage_is_the_least_any_split_gives(sizes, stages, embed, head) -> None:
    layout = ModelLayout(
        name="toy",
        num_blocks=len(sizes),
        hidden_dim=8,
        bytes_per_activation_elem=2,
        block_params_bytes=round(sum(sizes) / len(sizes)),
        block_bytes=tuple(sizes),
        head_params_bytes=head,
        embed_params_bytes=embed,
    )
    assert replica_bytes_per_gpu(layout, 1, stages, 0) == _brute(sizes, stages, embed, head)


def test_a_405b_bf16_replica_does_not_fit_one_24_gib_gpu() -> None:
    model = resolve_model("llama3.1:405b")
    with pytest.raises(InputError) as info:
        validate_parallelism(ParallelismSpec(), ONE_GPU, model, GpuMemory(bytes_per_gpu=24 * GIB))
    err = info.value
    assert err.field == "tp×pp" and err.value == 1
    assert "one replica of llama3.1:405b at tp=1, pp=1 puts 759.9 GiB on its fullest GPU" in str(
        err
    )
    assert "more than the 19.2 GiB usable of a 24.0 GiB GPU" in str(err)
    assert "accepted: tp×pp of at least 40 such GPUs" in str(err)
    assert "\n" not in str(err)


def test_a_replica_that_fits_says_how_full_its_fullest_gpu_is() -> None:
    model = resolve_model("llama3.1:405b")
    memory = GpuMemory(bytes_per_gpu=80 * 10**9)
    check = validate_parallelism(
        ParallelismSpec(tensor_parallel=8, pipeline=2), TWO_BY_8, model, memory
    )
    assert check.bytes_per_gpu == replica_bytes_per_gpu(model, 8, 2, 8192)
    assert check.usable_bytes_per_gpu == 64 * 10**9
    assert check.bytes_per_gpu <= check.usable_bytes_per_gpu
    assert check.warnings == ()
    # tp 8 alone puts the whole model on one node's 8 GPUs: 95 GiB each, too much.
    with pytest.raises(InputError, match=r"tp×pp=8: .* nearest valid tp \(pp=1\): 16"):
        validate_parallelism(ParallelismSpec(tensor_parallel=8), TWO_BY_8, model, memory)


def test_weights_alone_and_experts_split_by_ep_weigh_less() -> None:
    model = resolve_model("llama3.1:405b")
    assert replica_bytes_per_gpu(model, 8, 2, 0) < replica_bytes_per_gpu(model, 8, 2, 8192)
    moe = resolve_model("mixtral:8x7b")
    assert replica_bytes_per_gpu(moe, 2, 1, 0, ep=8) < replica_bytes_per_gpu(moe, 2, 1, 0)


def test_tp_beyond_a_node_passes_with_a_network_warning() -> None:
    model = resolve_model("llama3.1:405b")
    check = validate_parallelism(
        ParallelismSpec(tensor_parallel=16), TWO_BY_8, model, GpuMemory(bytes_per_gpu=80 * 10**9)
    )
    assert len(check.warnings) == 1
    assert check.warnings[0].startswith("tp=16 > 8 GPUs per node: each tensor-parallel group")
    assert "cross the network" in check.warnings[0]
    # Within a node: no warning; without a model or memory: no fit figure.
    plain = validate_parallelism(ParallelismSpec(tensor_parallel=8), TWO_BY_8)
    assert plain.warnings == () and plain.bytes_per_gpu is None


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"bytes_per_gpu": 0}, "gpu_memory"),
        ({"bytes_per_gpu": GIB, "headroom": 1.0}, "headroom"),
        ({"bytes_per_gpu": GIB, "context_tokens": -1}, "context_tokens"),
    ],
)
def test_gpu_memory_names_the_field_it_refuses(kw, field) -> None:
    with pytest.raises(InputError) as info:
        GpuMemory(**kw)
    assert info.value.field == field


# -- the command line -----------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_fleet_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in (
        "STOWPLAN_FLEET_ROLE",
        "STOWPLAN_NUM_NODES",
        "STOWPLAN_GPUS_PER_NODE",
        "STOWPLAN_PG_STRATEGY",
        "STOWPLAN_SEGMENT_SIZE",
    ):
        monkeypatch.delenv(key, raising=False)


def test_cli_refuses_a_replica_that_does_not_fit_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["validate", "--model", "llama3.1:405b", "--role", "inference"]
    argv += ["--num-nodes", "1", "--gpus-per-node", "1", "--gpu-memory", "24GiB"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("stowplan: error: tp×pp=1: one replica of llama3.1:405b")
    assert "accepted: tp×pp of at least 40 such GPUs" in err
    assert err.count("\n") == 1


def test_cli_reads_the_gpu_memory_of_a_fleet_file_and_warns_on_tp_over_the_network(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["validate", "--model", "llama3.1:405b", "--role", "inference", "--nodes", TWO_H100]
    assert main([*base, "--tp", "16"]) == 0
    out, err = capsys.readouterr()
    assert err.startswith("warning: tp=16 > 8 GPUs per node")
    assert "replica fits: 47.5 GiB on the fullest GPU" in out
    assert main([*base, "--tp", "8"]) == 2
    assert "stowplan: error: tp×pp=8:" in capsys.readouterr().err
    assert main([*base, "--tp", "8", "--pp", "2", "--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["warnings"] == [] and err == ""
    assert doc["bytes_per_gpu"] <= doc["usable_bytes_per_gpu"] == 64 * 10**9


def test_cli_says_when_the_fit_was_not_checked(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["validate", "--model", "llama3.1:405b", "--role", "inference"]
    assert main([*argv, "--num-nodes", "2", "--gpus-per-node", "8", "--tp", "8"]) == 0
    assert "whether a replica fits was not checked" in capsys.readouterr().err
    assert main([*argv, "--num-nodes", "1", "--gpus-per-node", "1", "--gpu-memory", "lots"]) == 2
    assert "--gpu-memory" in capsys.readouterr().err
