"""serve() on multi-GPU nodes and large fleets: replicas side by side on one node's GPUs,
one plan for nodes that differ only in price, groups of small nodes, the pooled bound."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
from rich.console import Console

from stowplan import Constraints, InputError, Workload, serve
from stowplan.cluster.replicas import check_disjoint
from stowplan.exports.serving import export_serve_plan
from stowplan.report.serving import render_serve_plan
from stowplan.serving.bounds import FleetRates
from stowplan.serving.compositions import grouped_compositions, node_classes
from stowplan.serving.reuse import renamed_text as rename
from tests.common.replica_check import recomputed
from tests.common.toy import TOY_MODEL, toy_node

GB = 10**9
WORK = Workload(prompt_tokens=100, output_tokens=100, ttft_s=1.0, tpot_s=0.1)


def _slow_link_node(i: int, gpus: int, **kw: object):
    """``gpus`` toy GPUs behind a slow GPU link: tensor parallel pays for its all-reduce."""
    base: dict[str, object] = dict(
        num_gpus=gpus,
        vram_bytes=gpus * 10 * GB,
        mem_bandwidth_gbps=100.0 * gpus,
        flops_estimate=1.0 * gpus,
        price_per_hour=1.0,
        intra_link_gbps=1.0,
        intra_link_latency_us=2000.0,
    )
    base.update(kw)
    return toy_node(i, **base)


def test_a_multi_gpu_node_holds_replicas_side_by_side_on_disjoint_gpus():
    node = _slow_link_node(0, 4)
    sp = serve(TOY_MODEL, [node], WORK)
    # One GPU each: four replicas, GPUs 0..3, each a quarter of the rent.
    assert len(sp.replicas) == 4
    gpus = sorted(g for r in sp.replicas for a in r.plan.assignments for g in a.gpu_indices)
    assert gpus == [0, 1, 2, 3]
    check_disjoint(sp)
    for r in sp.replicas:
        assert r.node_ids == ("n0",)
        assert r.price_per_hour == pytest.approx(0.25)
        assert r.plan.rationale.prediction.cost_per_hour == pytest.approx(0.25)
        got = recomputed(TOY_MODEL, r, [node], WORK)
        assert (got.users, got.ttft_s, got.tpot_s) == (r.users, r.ttft_s, r.tpot_s)
    assert sp.users == sum(r.users for r in sp.replicas) == 4 * sp.replicas[0].users
    assert sp.price_per_hour == pytest.approx(1.0)
    # The whole node as one tensor-parallel replica serves fewer.
    one_gpu = serve(TOY_MODEL, [_slow_link_node(0, 1, vram_bytes=10 * GB)], WORK)
    assert sp.users == 4 * one_gpu.users
    assert sp.certificate.bound >= sp.users


def test_side_by_side_replicas_that_share_a_gpu_are_refused():
    sp = serve(TOY_MODEL, [_slow_link_node(0, 2)], WORK)
    first, second = sp.replicas
    stages = tuple(
        replace(a, gpu_indices=first.plan.assignments[0].gpu_indices)
        for a in second.plan.assignments
    )
    clash = replace(second, plan=replace(second.plan, assignments=stages))
    with pytest.raises(InputError, match="disjoint GPUs of one node"):
        check_disjoint(replace(sp, replicas=(first, clash)))


def test_nodes_alike_but_for_their_price_share_one_plan_and_each_shows_its_own_rent():
    nodes = [
        toy_node(0, flops_estimate=1.0, price_per_hour=1.0, link_mbps=8.0),
        toy_node(1, flops_estimate=1.0, price_per_hour=2.5, link_mbps=80.0),
    ]
    sp = serve(TOY_MODEL, nodes, WORK)
    assert sorted(r.node_ids for r in sp.replicas) == [("n0",), ("n1",)]
    by_node = {r.node_ids[0]: r for r in sp.replicas}
    assert by_node["n0"].users == by_node["n1"].users
    for nid, price in (("n0", 1.0), ("n1", 2.5)):
        pred = by_node[nid].plan.rationale.prediction
        assert pred.cost_per_hour == pytest.approx(price)
        assert by_node[nid].price_per_hour == pytest.approx(price)
        notes = " ".join(by_node[nid].plan.rationale.notes)
        assert f"${price:.2f}/h" in notes
        assert f"on {nid}:" in notes


def test_a_copy_on_a_node_alike_keeps_its_notes_naming_its_own_node():
    nodes = [toy_node(i, flops_estimate=1.0, price_per_hour=1.0) for i in range(3)]
    sp = serve(TOY_MODEL, nodes, WORK)
    assert sorted(r.node_ids for r in sp.replicas) == [("n0",), ("n1",), ("n2",)]
    first = sp.replicas[0].plan.rationale.notes
    for r in sp.replicas:
        (nid,) = r.node_ids
        notes = r.plan.rationale.notes
        assert len(notes) == len(first)  # renamed, none dropped
        text = " ".join(notes)
        assert f"on {nid}:" in text
        others = {"n0", "n1", "n2"} - {nid}
        assert not any(f"on {o}:" in text for o in others)


def test_node_ids_in_notes_are_renamed_whole_and_at_once():
    text = "stage 0 on a: 1 ms; a/gpu0-1 and ab, b"
    assert rename(text, {"a": "b", "b": "a"}) == "stage 0 on b: 1 ms; a/gpu0-1 and ab, a"
    assert rename(text, {"a/gpu0-1": "c/gpu2-3"}) == "stage 0 on a: 1 ms; c/gpu2-3 and ab, b"


def _small_fleet(n: int):
    """``n`` unlike single-GPU nodes, each too small for the toy model alone."""
    return [
        toy_node(i, vram_bytes=3 * GB, flops_estimate=1.0, link_mbps=800.0 + i, price_per_hour=1.0)
        for i in range(n)
    ]


def test_a_fleet_too_large_to_enumerate_is_cut_into_groups_that_hold_the_weights():
    nodes = _small_fleet(12)
    classes = node_classes(nodes)
    assert len(classes) == 12  # 4,095 compositions: more than serve() plans
    index = {n.id: i for i, n in enumerate(nodes)}
    rates = FleetRates.of(TOY_MODEL, nodes, Constraints(), WORK)
    groups = grouped_compositions(rates, classes, index, WORK)
    assert groups
    for g in groups:
        held = sum(rates.usable[i] for i, taken in enumerate(g) if taken)
        assert held >= rates.weight_bytes
    sp = serve(TOY_MODEL, nodes, WORK)
    assert len(sp.replicas) >= 2
    used = [nid for r in sp.replicas for nid in r.node_ids]
    assert len(used) == len(set(used))
    assert sp.certificate.bound >= sp.users
    assert sp.certificate.gap < 1.0
    # Every composition's bound is still packed for the certificate (4,095 of them).
    assert "every composition's relaxation bound, packed" in sp.certificate.method
    for r in sp.replicas:
        got = recomputed(TOY_MODEL, r, nodes, WORK)
        assert got.users == r.users


def test_side_by_side_replicas_export_on_their_own_gpus_and_ports():
    sp = serve(TOY_MODEL, [_slow_link_node(0, 2)], WORK)
    assert len(sp.replicas) == 2
    out = export_serve_plan(sp, "vllm", model="meta-llama/Llama-3.1-8B")
    first, second = (next(c for c in e.commands if "vllm serve" in c) for e in out.replicas)
    assert first.startswith("CUDA_VISIBLE_DEVICES=0 ") and "--port" not in first
    assert second.startswith("CUDA_VISIBLE_DEVICES=1 ") and second.endswith("--port 8001")
    (dp,) = out.commands
    assert dp.startswith("CUDA_VISIBLE_DEVICES=0,1 ") and "--data-parallel-size 2" in dp
    llama = export_serve_plan(sp, "llamacpp", model="/m/toy.gguf")
    servers = [c for e in llama.replicas for c in e.commands if "llama-server" in c]
    assert "--port" not in servers[0] and servers[1].endswith("--port 8081")


def test_the_table_names_the_gpus_of_replicas_side_by_side():
    sp = serve(TOY_MODEL, [_slow_link_node(0, 2)], WORK)
    buf = io.StringIO()
    render_serve_plan(sp, Console(file=buf, width=80))
    text = buf.getvalue()
    assert "n0/gpu0" in text and "n0/gpu1" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_a_target_counts_every_copy_side_by_side_on_a_node():
    node = _slow_link_node(0, 4)
    most = serve(TOY_MODEL, [node], WORK)
    assert len(most.replicas) == 4
    # The whole node's copies reach the users they serve together: not one copy's.
    sp = serve(TOY_MODEL, [node], replace(WORK, users=most.users))
    assert sp.users == most.users
    assert sp.price_per_hour == pytest.approx(1.0)
    assert sp.certificate.bound <= sp.price_per_hour
