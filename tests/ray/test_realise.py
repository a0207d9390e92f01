"""Realising plans on a real local multi-node Ray cluster (fake GPUs, fake VRAM labels).

One cluster for the module: a GPU-less head and four one-GPU nodes whose
``vram_bytes`` labels differ (5, 4, 3.5, 2 MiB; the demo model is 6.5 MiB).
The biggest node is removed by the last test.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import numpy as np
import pytest

from stowplan.cli import main
from stowplan.cli.calibration_opts import cli_calibration
from stowplan.cluster.local import FakeNode, start_local_cluster
from stowplan.cluster.nodes import GpuReport, describe, ray_node_descriptors
from stowplan.cluster.realise import (
    StageUnplaceable,
    realise,
    realise_with_replan,
    stage_actor_env,
)
from stowplan.demo.model import DemoConfig, demo_layout, generate_local
from stowplan.demo.pipeline import compare, config_args, run_pipeline, stage_worker_class
from stowplan.errors import InputError, InsufficientVram
from stowplan.files.fleets import load_nodes
from stowplan.model import Constraints, Strategy, usable_bytes
from stowplan.plan import plan_to_dict, with_inputs
from stowplan.planner import plan
from stowplan.stages.worker import stage_env

MIB = 1 << 20
FLEET = (
    FakeNode(gpu_name="RTX-4070", vram_bytes=5 * MIB),
    FakeNode(gpu_name="RTX-3060", vram_bytes=4 * MIB),
    FakeNode(gpu_name="RTX-2080", vram_bytes=7 * MIB // 2),
    FakeNode(gpu_name="GTX-1660", vram_bytes=2 * MIB),
)
BIGGEST = FLEET[0].gpu_name
CONFIG = DemoConfig()
LAYOUT = demo_layout(CONFIG)
PROMPT = [1, 2, 3]
TIMEOUT_S = 30.0
BY_VRAM = Constraints(strategy=Strategy.BALANCE_BY_VRAM)
"""The scenarios are built on VRAM alone: the fake nodes carry no speed figures."""


# -- pure pieces (no cluster) -----------------------------------------------------------------
def test_descriptor_takes_gpu_and_vram_from_labels_without_nvml() -> None:
    node = describe(
        "abc",
        {"gpu_name": "RTX-4090", "vram_bytes": "24GiB", "link_mbps": "1000"},
        {"GPU": 2.0, "CPU": 8.0},
        GpuReport(node_id="abc"),
    )
    assert (node.id, node.gpu_name, node.vram_bytes, node.num_gpus) == (
        "abc",
        "RTX-4090",
        24 << 30,
        2,
    )
    assert node.link_mbps == 1000.0
    assert dict(node.labels) == {"source": "ray", "assumed": "flops_tflops", "ray_gpus": "2"}


def test_descriptor_prefers_nvml_over_labels() -> None:
    report = GpuReport(node_id="n", gpu_names=("NVIDIA H100", "NVIDIA H100"),
                       gpu_memory_bytes=(80 << 30, 80 << 30))  # fmt: skip
    node = describe("n", {"gpu_name": "x", "vram_bytes": "1"}, {"GPU": 2.0}, report)
    assert (node.gpu_name, node.vram_bytes, node.num_gpus) == ("NVIDIA H100", 160 << 30, 2)
    assert ("measured", "nvml") in node.labels


def _write_passport(path) -> None:
    """A passport of a fixture host: 800 GB/s best circuit, a 25 Gbit/s link."""
    from dataclasses import replace

    from stowplan.host.passport import Passport, save_passport
    from tests.common.host import cap, fixture_topology, matrix

    topo = replace(fixture_topology("thamada_nvsim/RTX3090_smi_-a.txt"), link_mbps=25_000.0)
    save_passport(Passport.create(topo, matrix(cap("gpu0", 800.0), cap("cpu", 50.0))), path)


def test_descriptor_takes_link_and_bandwidth_from_the_passport_over_labels(tmp_path) -> None:
    from stowplan.cluster.nodes import passport_figures

    path = tmp_path / "passport.json"
    _write_passport(path)
    link, bandwidth = passport_figures(str(path))
    assert link == 25_000.0 and bandwidth == pytest.approx(800.0)
    labels = {"gpu_name": "g", "vram_bytes": "1GiB", "link_mbps": "1000", "mem_bandwidth_gbps": "9"}
    report = GpuReport(node_id="n", passport_link_mbps=link, passport_bandwidth_gbps=bandwidth)
    node = describe("n", labels, {"GPU": 1.0}, report)
    assert (node.link_mbps, node.mem_bandwidth_gbps) == (25_000.0, pytest.approx(800.0))
    assert ("passport", "link_mbps,mem_bandwidth_gbps") in node.labels
    # The passport measured one GPU; a node of two holds twice the bandwidth in all.
    pair = describe("n", labels, {"GPU": 2.0}, report)
    assert pair.num_gpus == 2 and pair.mem_bandwidth_gbps == pytest.approx(1600.0)
    # Without a passport the labels serve.
    plain = describe("n", labels, {"GPU": 1.0}, GpuReport(node_id="n"))
    assert (plain.link_mbps, plain.mem_bandwidth_gbps) == (1000.0, 9.0)
    assert passport_figures(str(tmp_path / "absent.json")) == (None, None)


def test_a_bad_vram_label_names_the_node_and_label() -> None:
    with pytest.raises(InputError) as info:
        describe("n1", {"vram_bytes": "lots"}, {"GPU": 1.0}, GpuReport(node_id="n1"))
    assert str(info.value).startswith("n1.labels.vram_bytes='lots': ")


# -- the cluster ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    local = start_local_cluster(FLEET)
    try:
        yield local
    finally:
        local.shutdown()


@pytest.fixture
def ray(cluster):
    import ray as ray_mod

    return ray_mod


def _groups_left(ray) -> list[str]:
    from ray.util.placement_group import placement_group_table

    return [k for k, v in placement_group_table().items() if v["state"] != "REMOVED"]


def _actors_alive() -> list[str]:
    from ray._private import state

    return [k for k, v in state.actors().items() if v["State"] != "DEAD"]


def _blocker(ray, node_id: str):
    """An actor holding the only GPU of ``node_id``."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0, num_gpus=1)
    class Hold:
        def ping(self) -> int:
            return 1

    actor = Hold.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
    ).remote()
    assert ray.get(actor.ping.remote(), timeout=TIMEOUT_S) == 1
    return actor


@pytest.mark.ray
def test_nodes_come_from_the_cluster_with_their_labelled_vram(cluster) -> None:
    nodes = ray_node_descriptors(timeout_s=TIMEOUT_S)
    assert sorted((n.gpu_name, n.vram_bytes) for n in nodes) == sorted(
        (f.gpu_name, f.vram_bytes) for f in FLEET
    )
    assert {n.id for n in nodes} == {cluster.node_id(w) for w in cluster.workers}


@pytest.mark.ray
def test_nodes_take_link_and_bandwidth_from_a_passport_on_the_node(cluster, tmp_path) -> None:
    path = tmp_path / "passport.json"
    _write_passport(path)
    nodes = ray_node_descriptors(timeout_s=TIMEOUT_S, passport_path=str(path))
    assert len(nodes) == len(FLEET)
    for node in nodes:
        assert node.link_mbps == 25_000.0
        assert node.mem_bandwidth_gbps == pytest.approx(800.0)
        assert ("passport", "link_mbps,mem_bandwidth_gbps") in node.labels


@pytest.mark.ray
def test_each_stage_runs_on_its_node_with_the_plan_env_and_matches_one_process(ray) -> None:
    nodes = ray_node_descriptors(timeout_s=TIMEOUT_S)
    # The realised plan records its nodes' descriptors (a CPU stage's GPU ids come from them).
    expected = with_inputs(plan(LAYOUT, nodes, BY_VRAM), model_source=None, nodes=nodes)
    assert expected.num_stages == 3
    with realise_with_replan(
        LAYOUT, nodes, BY_VRAM, stage_worker_class(), actor_args=(config_args(CONFIG),),
        timeout_s=TIMEOUT_S,
    ) as realisation:  # fmt: skip
        assert realisation.plan == expected and realisation.attempts == ()
        infos = ray.get([a.info.remote() for a in realisation.actors], timeout=TIMEOUT_S)
        for a, info, env in zip(expected.assignments, infos, stage_env(expected), strict=True):
            assert info["node_id"] == a.node_id == info["plan_node_id"]
            assert info["env"] == env
            assert info["block_range"] == list(a.block_range)
            assert info["source"] == "PLAN_JSON"
        run = run_pipeline(realisation.actors, CONFIG, PROMPT, 12, timeout_s=60)
    reference = generate_local(CONFIG, PROMPT, 12)
    assert run.generation.tokens == reference.tokens
    np.testing.assert_allclose(run.generation.logits, reference.logits, rtol=0, atol=1e-4)
    assert compare(run.generation, reference).match
    assert [s.steps for s in run.stages] == [len(PROMPT) + 11] * 3
    assert _groups_left(ray) == [] and _actors_alive() == []


@pytest.mark.ray
def test_a_node_made_unplaceable_is_replanned_and_tokens_still_match(ray) -> None:
    nodes = ray_node_descriptors(timeout_s=TIMEOUT_S)
    busy = next(n.id for n in nodes if n.gpu_name == BIGGEST)
    assert busy in {a.node_id for a in plan(LAYOUT, nodes, BY_VRAM).assignments}
    blocker = _blocker(ray, busy)
    reported = []
    try:
        with realise_with_replan(
            LAYOUT, nodes, BY_VRAM, stage_worker_class(), actor_args=(config_args(CONFIG),),
            timeout_s=3.0, on_failure=reported.append,
        ) as realisation:  # fmt: skip
            assert [f.node_id for a in realisation.attempts for f in a.failures] == [busy]
            assert reported == list(realisation.attempts)
            assert "NO_RESOURCES" in str(realisation.attempts[0].failures[0])
            assert busy not in {a.node_id for a in realisation.plan.assignments}
            run = run_pipeline(realisation.actors, CONFIG, PROMPT, 8, timeout_s=60)
    finally:
        ray.kill(blocker)
    assert run.generation.tokens == generate_local(CONFIG, PROMPT, 8).tokens
    assert _groups_left(ray) == []


@pytest.mark.ray
def test_too_few_nodes_raise_plan_error_with_numbers_and_leave_nothing(ray) -> None:
    nodes = [n for n in ray_node_descriptors(timeout_s=TIMEOUT_S) if n.gpu_name != BIGGEST]
    first = plan(LAYOUT, nodes, BY_VRAM)
    assert first.num_stages == 3  # all three smaller nodes are needed
    busy = first.assignments[0].node_id
    blocker = _blocker(ray, busy)
    try:
        with pytest.raises(InsufficientVram) as info:
            realise_with_replan(
                LAYOUT, nodes, BY_VRAM, stage_worker_class(), actor_args=(config_args(CONFIG),),
                timeout_s=2.0,
            )  # fmt: skip
    finally:
        ray.kill(blocker)
    usable = sum(usable_bytes(n, 0.2) for n in nodes if n.id != busy)
    assert str(info.value) == (
        f"model does not fit: needs {LAYOUT.weight_bytes} bytes, total available {usable}"
    )
    assert _groups_left(ray) == [] and _actors_alive() == []


@pytest.mark.ray
def test_plan_debug_prints_plan_and_env_and_creates_no_group(cluster, ray, capsys) -> None:
    from ray.util.placement_group import placement_group_table

    before = len(placement_group_table())
    assert (
        main(["launch", "demo", "--ray", cluster.address, "--plan-debug", "--min-stages", "4"]) == 0
    )
    out = capsys.readouterr().out
    assert len(placement_group_table()) == before
    assert out.count("PLAN_JSON=<") == 4 and "STAGE=3" in out
    assert "plan-debug: nothing was provisioned" in out


@pytest.mark.ray
def test_plan_debug_env_is_exactly_what_each_stage_actor_gets(cluster, ray, capsys) -> None:
    import os

    args = ["launch", "demo", "--ray", cluster.address, "--plan-debug", "--json"]
    assert main([*args, "--strategy", "balance-by-vram"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # launch's default reserve, and plan's calibrated prediction (engine generic)
    launched = replace(
        BY_VRAM, context_tokens=CONFIG.max_seq_len, calibration=cli_calibration(None, None)
    )
    nodes = ray_node_descriptors(timeout_s=TIMEOUT_S)
    expected = with_inputs(plan(LAYOUT, nodes, launched), model_source=None, nodes=nodes)
    assert doc["plan"] == plan_to_dict(expected)
    printed = doc["stage_env"]
    assert printed == stage_actor_env(expected)
    assert all(e["OMP_NUM_THREADS"] == e["MKL_NUM_THREADS"] == "1" for e in printed)

    class EnvProbe:
        def env(self, keys: list[str]) -> dict[str, str | None]:
            return {k: os.environ.get(k) for k in keys}

    with realise(expected, ray.remote(EnvProbe), timeout_s=TIMEOUT_S) as realisation:
        seen = ray.get(
            [a.env.remote(sorted(e)) for a, e in zip(realisation.actors, printed, strict=True)],
            timeout=TIMEOUT_S,
        )
    assert seen == printed


@pytest.mark.ray
def test_demo_run_cli_reports_a_match(cluster, capsys) -> None:
    rc = main(["demo-run", "--ray", cluster.address, "--tokens", "6", "--max-stages", "3"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "MATCH: 6/6 token ids equal the single-process run" in out
    assert "tok/s" in out


@pytest.mark.ray
def test_a_removed_node_is_reported_and_the_plan_recomputed(cluster, ray) -> None:
    nodes = ray_node_descriptors(timeout_s=TIMEOUT_S)
    biggest = next(n for n in nodes if n.gpu_name == BIGGEST)
    assert biggest.id in {a.node_id for a in plan(LAYOUT, nodes, BY_VRAM).assignments}
    cluster.remove(next(w for w in cluster.workers if cluster.node_id(w) == biggest.id))
    for _ in range(100):  # health checks mark it dead within about 1.5 s
        if biggest.id not in {n["NodeID"] for n in ray.nodes() if n["Alive"]}:
            break
        time.sleep(0.1)
    with pytest.raises(StageUnplaceable) as info:
        realise(plan(LAYOUT, nodes, BY_VRAM), stage_worker_class(), timeout_s=5.0)
    assert "node is not alive" in str(info.value) and _groups_left(ray) == []
    with realise_with_replan(
        LAYOUT, nodes, BY_VRAM, stage_worker_class(), actor_args=(config_args(CONFIG),),
        timeout_s=TIMEOUT_S,
    ) as realisation:  # fmt: skip
        assert realisation.attempts[0].failures[0].node_id == biggest.id
        assert biggest.id not in {a.node_id for a in realisation.plan.assignments}
        run = run_pipeline(realisation.actors, CONFIG, PROMPT, 6, timeout_s=60)
    assert run.generation.tokens == generate_local(CONFIG, PROMPT, 6).tokens


def test_plan_debug_from_a_fleet_file_needs_no_ray(tmp_path, capsys) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "nodes:\n"
        + "".join(
            f"  - {{id: n{i}, gpu_name: g, vram_bytes: {v}, flops_estimate: 1, link_mbps: 1}}\n"
            for i, v in enumerate((5 * MIB, 4 * MIB, 7 * MIB // 2))
        )
    )
    assert main(["launch", "demo", "--nodes", str(fleet), "--plan-debug", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [e["STAGE"] for e in doc["stage_env"]] == ["0", "1", "2"]
    launched = Constraints(
        context_tokens=CONFIG.max_seq_len, calibration=cli_calibration(None, None)
    )
    nodes = load_nodes(fleet)
    expected = with_inputs(plan(LAYOUT, nodes, launched), model_source=None, nodes=nodes)
    assert doc["plan"] == plan_to_dict(expected)
    assert doc["stage_env"] == stage_actor_env(expected)
    assert all(e.items() >= {"OMP_NUM_THREADS": "1"}.items() for e in doc["stage_env"])


def test_launch_of_a_model_too_big_for_the_fleet_says_so(tmp_path, capsys) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "nodes:\n  - {id: n0, gpu_name: g, vram_bytes: 1000000, flops_estimate: 1, link_mbps: 1}\n"
    )
    assert main(["launch", "demo", "--nodes", str(fleet), "--plan-debug"]) == 2
    err = capsys.readouterr().err
    kv = sum(LAYOUT.kv_bytes(b, CONFIG.max_seq_len) for b in range(LAYOUT.num_blocks))
    assert err == (
        f"stowplan: error: model does not fit: needs {LAYOUT.weight_bytes + kv} bytes, "
        "total available 800000\n"
    )
