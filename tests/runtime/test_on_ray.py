"""Stage actors on a real local multi-node Ray cluster (fake GPUs, 127.0.0.1) equal one process.

One cluster for the module: a GPU-less head and four one-GPU nodes of different VRAM
(400, 300, 200 and 150 kB; the tiny checkpoints weigh 160 to 470 kB), so plans are
heterogeneous and uneven.
"""

from __future__ import annotations

import json
import shutil
import tempfile

import numpy as np
import pytest

from stowplan.cli import main
from stowplan.cluster.groups import live_groups
from stowplan.cluster.local import FakeNode, start_local_cluster
from stowplan.cluster.nodes import ray_node_descriptors
from stowplan.errors import UnsupportedByWorker
from stowplan.model import Constraints
from stowplan.runtime.generation import generate_reference
from stowplan.runtime.pipeline import realise_checkpoint
from stowplan.runtime.run import run_checkpoint, tokenize
from tests.common.checkpoints import PROMPT, block_names, expected_reads
from tests.common.plans import make_tp_plan
from tests.common.ray_env import RAY_ENV

pytestmark = pytest.mark.ray

FLEET = (
    FakeNode(gpu_name="RTX-4070", vram_bytes=400_000, num_cpus=2),
    FakeNode(gpu_name="RTX-3060", vram_bytes=300_000, num_cpus=2),
    FakeNode(gpu_name="RTX-2080", vram_bytes=200_000, num_cpus=2),
    FakeNode(gpu_name="GTX-1660", vram_bytes=150_000, num_cpus=2),
)
NEW_TOKENS = 4
EMBED, NORM, HEAD = "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"


@pytest.fixture(scope="module")
def cluster():
    tmp = tempfile.mkdtemp(prefix="sprt-", dir="/tmp")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STOWPLAN_CACHE_DIR", f"{tmp}/cache")
        for key, value in (RAY_ENV | {"RAY_TMPDIR": tmp}).items():
            mp.setenv(key, value)
        mp.delenv("RAY_ADDRESS", raising=False)
        local = start_local_cluster(FLEET)
        try:
            yield local, ray_node_descriptors(timeout_s=60)
        finally:
            local.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


def _stage_names(folder, s, tied=False):
    names = block_names(folder, *s["block_range"])
    names |= {EMBED} if s["owns_embed"] else set()
    return names | ({NORM, EMBED if tied else HEAD} if s["owns_head"] else set())


def test_uneven_stages_on_a_heterogeneous_fleet_equal_one_process_and_read_only_their_tensors(
    cluster, checkpoints
) -> None:
    _, nodes = cluster
    folder = checkpoints["llama"]
    prompt = tokenize(folder, PROMPT)
    report = run_checkpoint(
        folder, nodes, prompt, NEW_TOKENS, constraints=Constraints(min_stages=3), check=True
    )
    plan = report.plan
    assert plan.num_stages >= 3
    assert len({a.num_blocks for a in plan.assignments}) > 1  # uneven
    (got,) = report.run.generations
    want = generate_reference(folder, prompt, NEW_TOKENS)
    assert got.tokens == want.tokens
    assert float(np.max(np.abs(got.logits - want.logits))) <= 1e-5
    assert report.comparison is not None and report.comparison.match
    for a, s in zip(plan.assignments, report.run.stages, strict=True):
        assert (s["node_id"], s["plan_node_id"], s["source"]) == (a.node_id, a.node_id, "PLAN_JSON")
        assert tuple(s["block_range"]) == a.block_range
        shards, header, data = expected_reads(folder, _stage_names(folder, s))
        assert set(s["shards"]) == shards
        assert (s["header_bytes"], s["tensor_bytes"]) == (header, data)
        assert s["steps"] == NEW_TOKENS
    assert report.run.ttft_s > 0 and report.run.decode_tokens_per_s > 0
    assert report.predicted_ttft_s > 0 and report.prediction.tokens_per_s > 0
    assert live_groups() == []  # released


def test_moe_sequences_run_as_the_plans_microbatches_and_each_equals_one_process(
    cluster, checkpoints
) -> None:
    _, nodes = cluster
    folder = checkpoints["mixtral"]
    prompt = tokenize(folder, PROMPT)
    report = run_checkpoint(
        folder, nodes, prompt, NEW_TOKENS, batch=4, constraints=Constraints(min_stages=2)
    )
    want = generate_reference(folder, prompt, NEW_TOKENS)
    assert len(report.run.generations) == 4
    for got in report.run.generations:
        assert got.tokens == want.tokens
        assert float(np.max(np.abs(got.logits - want.logits))) <= 1e-5
    m = min(4, report.plan.num_stages)
    # every stage ran each of the m microbatches once per token
    assert [s["steps"] for s in report.run.stages] == [m * NEW_TOKENS] * report.plan.num_stages
    assert report.prediction.batch == 4


def test_the_run_command_prints_match_for_one_stage_owning_embed_and_head(
    cluster, checkpoints, capsys, monkeypatch
) -> None:
    local, _ = cluster
    folder = checkpoints["qwen2-tied"]
    monkeypatch.setenv("RAY_ADDRESS", local.address)
    argv = ["run", str(folder), "--prompt", PROMPT, "--max-new-tokens", "3", "--max-stages", "1"]
    assert main([*argv, "--check", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["check"]["match"] is True and doc["check"]["first_difference"] is None
    (stage,) = doc["stages"]
    assert stage["owns_embed"] and stage["owns_head"]
    _, header, data = expected_reads(folder, _stage_names(folder, stage, tied=True))
    assert stage["bytes_read"] == header + data
    want = generate_reference(folder, tokenize(folder, PROMPT), 3)
    assert doc["tokens"] == list(want.tokens)
    assert main([*argv, "--check"]) == 0
    out = capsys.readouterr().out
    assert "MATCH: 3/3 tokens equal one process" in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_a_plan_the_worker_cannot_run_starts_nothing(cluster, checkpoints) -> None:
    _, nodes = cluster
    plan = make_tp_plan([(nodes[0].id, (0, 1), 2), (nodes[1].id, (), 2)], context_tokens=None)
    with pytest.raises(UnsupportedByWorker):
        realise_checkpoint(plan, checkpoints["llama"])
    assert live_groups() == []
