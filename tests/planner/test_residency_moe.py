"""Residency of MoE models (a token reads its routed experts), --dtype, KV and refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from stowplan.cli import main
from stowplan.errors import InputError, InsufficientVram
from stowplan.host.passport import Passport, save_passport
from stowplan.models import resolve_model
from stowplan.planner.residency import (
    EmploymentPlan,
    ResidencyProtocol,
    employment_to_json,
    plan_employment,
    plan_residency,
    read_bytes_per_token,
)
from tests.common.host import GIB, cap, host, matrix


def test_a_moe_model_is_timed_by_the_bytes_a_token_reads() -> None:
    model = resolve_model("gpt-oss:20b")
    read = read_bytes_per_token(model)
    assert read == sum(model.block_read_sizes()) + model.head_params_bytes
    assert 3 * GIB < read < 4 * GIB < 12 * GIB < model.weight_bytes  # 3.5 of 12.8 GiB
    p = plan_residency(host(vram=24 * GIB), matrix(cap("gpu0", 1000.0), cap("cpu", 50.0)), model)
    assert p.protocol is ResidencyProtocol.RESIDENT
    assert (p.model_bytes, p.read_bytes) == (model.weight_bytes, read)
    assert p.predicted_s_per_token == pytest.approx(read / 1e12)
    (note,) = [line for line in p.rationale if "a token reads" in line]
    assert "the experts it is routed to and one row of the embedding table" in note
    dense = resolve_model("llama3.1:8b")
    assert read_bytes_per_token(dense) == dense.weight_bytes - dense.embed_params_bytes
    # A dense model's note speaks of the embedding row it leaves unread, not of experts.
    q = plan_residency(host(vram=24 * GIB), matrix(cap("gpu0", 1000.0), cap("cpu", 50.0)), dense)
    (note,) = [line for line in q.rationale if "a token reads" in line]
    assert "(93.5%: one row of the embedding table)" in note and "expert" not in note


def test_an_overflow_is_read_and_streamed_in_the_token_s_share() -> None:
    topo = host(vram=8 * GIB)
    m = matrix(cap("gpu0", 1000.0, upload_gbps=64.0), cap("cpu", 10.0))
    full = plan_employment(topo, m, 20 * GIB, vram_headroom_frac=0.0)
    quarter = plan_employment(topo, m, 20 * GIB, vram_headroom_frac=0.0, read_bytes=5 * GIB)
    assert quarter.protocol is full.protocol is ResidencyProtocol.STREAMING
    assert quarter.overflow_bytes == full.overflow_bytes == 12 * GIB  # memory is all of it
    assert quarter.estimates[0].transfer_s == pytest.approx(3 * GIB / 64e9)
    assert quarter.predicted_s_per_token == pytest.approx(full.predicted_s_per_token / 4)


def test_kv_bytes_come_out_of_the_primary_s_budget() -> None:
    topo = host(vram=24 * GIB)
    m = matrix(cap("gpu0", 1000.0, upload_gbps=25.0), cap("cpu", 50.0))
    p = plan_employment(topo, m, 20 * GIB, vram_headroom_frac=0.1, kv_bytes=2 * GIB)
    headroom = math.ceil(24 * GIB * 0.1)
    assert p.resident_bytes == 24 * GIB - headroom - 2 * GIB
    assert p.overflow_bytes == 20 * GIB - p.resident_bytes and p.kv_bytes == 2 * GIB
    model = resolve_model("llama3.1:8b")
    with_context = plan_residency(topo, m, model, context_tokens=8192)
    assert with_context.kv_bytes == 32 * 8192 * 2 * 8 * 128 * 2  # 1 GiB: 32 blocks, 8 KV heads
    with pytest.raises(InputError, match=r"^context_tokens=-1: must be an integer >= 0$"):
        plan_residency(topo, m, model, context_tokens=-1)


def test_old_plan_json_without_read_bytes_still_loads() -> None:
    p = plan_employment(host(vram=24 * GIB), matrix(cap("gpu0", 1000.0)), 10 * GIB)
    data = json.loads(employment_to_json(p))
    assert (data["read_bytes"], data["kv_bytes"]) == (10 * GIB, 0)
    del data["read_bytes"], data["kv_bytes"]
    assert EmploymentPlan.from_dict(data) == p


def _passport(tmp_path: Path, vram: int, ram: int) -> Path:
    m = matrix(cap("gpu0", 400.0, upload_gbps=16.0), cap("cpu", 20.0))
    return save_passport(Passport.create(host(vram=vram, ram=ram), m), tmp_path / "p.json")


def test_cli_residency_of_a_moe_model_shows_what_a_token_reads(tmp_path, capsys) -> None:
    path = _passport(tmp_path, 24 * GIB, 64 * GIB)
    assert main(["residency", "gpt-oss:20b", "--passport", str(path)]) == 0
    out = capsys.readouterr().out
    assert "gpt-oss:20b (12.8 GiB, reads 3.5 GiB per token)" in out
    assert main(["residency", "gpt-oss:20b", "--passport", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["read_bytes"] < data["model_bytes"] / 3


def test_cli_residency_takes_dtype_and_context(tmp_path, capsys) -> None:
    path = _passport(tmp_path, 24 * GIB, 64 * GIB)
    args = ["residency", "llama3.1:8b", "--passport", str(path), "--json"]
    assert main([*args, "--dtype", "q4_k_m", "--context", "8192"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model_bytes"] == resolve_model("llama3.1:8b", dtype="q4_k_m").weight_bytes
    assert data["kv_bytes"] == GIB and data["protocol"] == "resident"
    assert main([*args, "--dtype", "q9"]) == 2
    assert capsys.readouterr().err.startswith("stowplan: error: --dtype='q9': is not a known dtype")
    assert main([*args, "--context", "-5"]) == 2
    assert capsys.readouterr().err == (
        "stowplan: error: --context=-5: must be an integer >= 0 (tokens)\n"
    )


def test_cli_refusal_is_one_line_with_the_numbers_and_a_dtype_that_fits(tmp_path, capsys) -> None:
    path = _passport(tmp_path, 6 * GIB, 8 * GIB)
    assert main(["residency", "llama3.1:8b", "--passport", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("stowplan: error: model does not fit")
    assert (
        "weights 15.0 GiB + KV 0.0 GiB + headroom 0.6 GiB (vram_headroom_frac 0.1) on gpu0's 6.0 GiB"
        in err
    )
    assert "no other pool holds it (largest other: 8.0 GiB)" in err
    assert err.rstrip().endswith("--dtype q8_0 (7.9 GiB) runs as heterogeneous-overflow")
    q8 = resolve_model("llama3.1:8b", dtype="q8_0")
    m = matrix(cap("gpu0", 400.0, upload_gbps=16.0), cap("cpu", 20.0))
    plan_residency(host(vram=6 * GIB, ram=8 * GIB), m, q8)  # the hint is true
    with pytest.raises(InsufficientVram):
        plan_residency(host(vram=6 * GIB, ram=8 * GIB), m, resolve_model("llama3.1:8b"))
