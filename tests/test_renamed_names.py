"""One name per concept: the former spellings of renamed fields, keywords and options keep
working, each with a :class:`DeprecationWarning` naming the new one, and only the new
names are written."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest

from stowplan.cluster.fleet import FleetRole, FleetSpec
from stowplan.cluster.parallelism import ParallelismSpec, nearest_valid, validate_parallelism
from stowplan.errors import InputError
from stowplan.model import ModelLayout
from stowplan.rules.tensor_parallel import kv_heads_allow, tensor_parallel_violation

DENSE = ModelLayout(
    name="dense",
    num_blocks=2,
    hidden_dim=1024,
    bytes_per_activation_elem=2,
    block_params_bytes=100,
    head_params_bytes=10,
    embed_params_bytes=10,
    num_attention_heads=32,
    num_kv_heads=8,
)
FLEET = FleetSpec(role=FleetRole.INFERENCE, num_nodes=2, gpus_per_node=8)


def test_parallelism_spec_names_the_degree_tensor_parallel() -> None:
    spec = ParallelismSpec(tensor_parallel=4, pipeline=2)
    assert (spec.tensor_parallel, spec.replica_gpus) == (4, 8)
    assert replace(spec, tensor_parallel=2).replica_gpus == 4
    with pytest.raises(InputError, match=r"^tensor_parallel=3: must divide num_attention_heads"):
        validate_parallelism(ParallelismSpec(tensor_parallel=3), FLEET, DENSE)


def test_parallelism_spec_tensor_is_a_deprecated_alias() -> None:
    with pytest.warns(DeprecationWarning, match=r"use tensor_parallel="):
        spec = ParallelismSpec(tensor=4, pipeline=2)  # type: ignore[call-arg]
    assert spec == ParallelismSpec(tensor_parallel=4, pipeline=2)
    with pytest.warns(DeprecationWarning, match=r"use ParallelismSpec\.tensor_parallel$"):
        assert spec.tensor == 4
    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(InputError, match="is the former name of tensor_parallel"),
    ):
        ParallelismSpec(tensor=4, tensor_parallel=4)  # type: ignore[call-arg]


def test_nearest_valid_takes_the_former_degree_name_with_a_warning() -> None:
    spec = ParallelismSpec(tensor_parallel=3)
    new = nearest_valid(spec, FLEET, DENSE, "tensor_parallel")
    assert new == (2, 4)
    with pytest.warns(DeprecationWarning, match='use "tensor_parallel"'):
        assert nearest_valid(spec, FLEET, DENSE, "tensor") == new


def test_tensor_parallel_rules_take_tp_as_a_deprecated_keyword() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kv_heads_allow(tensor_parallel=4, num_kv_heads=8)
        assert tensor_parallel_violation(tensor_parallel=4, layout=DENSE) is None
    with pytest.warns(
        DeprecationWarning, match=r"kv_heads_allow\(tp=\.\.\.\) .* use tensor_parallel="
    ):
        assert not kv_heads_allow(tp=3, num_kv_heads=8)  # type: ignore[call-arg]
    with pytest.warns(DeprecationWarning, match="use tensor_parallel="):
        assert tensor_parallel_violation(tp=3, layout=DENSE) is not None  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="got both tensor_parallel= and its former name tp="):
        kv_heads_allow(tp=2, tensor_parallel=2, num_kv_heads=8)  # type: ignore[call-arg]


def test_metric_is_the_certificate_objective_and_loads_from_its_string() -> None:
    import stowplan
    from stowplan.constraints import Metric
    from stowplan.plan import Certificate, plan_from_json, plan_to_dict, plan_to_json
    from stowplan.planner import plan
    from tests.common.toy import TOY_MODEL, toy_node

    assert stowplan.Metric is Metric and stowplan.Metric.__doc__
    assert [m.value for m in Metric] == ["latency", "throughput"]
    nodes = [toy_node(0), toy_node(1)]
    for batch, metric in ((1, Metric.LATENCY), (4, Metric.THROUGHPUT)):
        p = plan(TOY_MODEL, nodes, stowplan.Constraints(batch=batch))
        cert = p.rationale.certificate
        assert cert is not None and cert.objective is metric
        written = plan_to_dict(p)["rationale"]["certificate"]["objective"]
        assert type(written) is str and written == metric.value
        loaded = plan_from_json(plan_to_json(p))
        assert loaded == p and loaded.rationale.certificate is not None
        assert loaded.rationale.certificate.objective is metric
    figures = {"value": 1.0, "bound": 1.0, "exact": True, "gap": 0.0, "method": ""}
    assert Certificate(objective="throughput", **figures).objective is Metric.THROUGHPUT
    with pytest.raises(
        InputError, match=r"^objective='speed': must be one of latency, throughput$"
    ):
        Certificate(objective="speed", **figures)


def test_residency_headroom_is_written_as_vram_headroom_frac_and_kv_reserve_still_loads() -> None:
    import json

    from stowplan.planner import residency
    from stowplan.planner.residency import (
        DEFAULT_RESIDENCY_HEADROOM_FRAC,
        EmploymentPlan,
        employment_from_json,
        employment_to_json,
        plan_employment,
        plan_residency,
    )
    from tests.common.host import GIB, cap, host, matrix

    topo, m = host(vram=24 * GIB), matrix(cap("gpu0", 1000.0))
    p = plan_employment(topo, m, 10 * GIB, vram_headroom_frac=0.25)
    assert p.vram_headroom_frac == 0.25
    assert any("minus vram_headroom_frac 0.25" in note for note in p.rationale)
    data = json.loads(employment_to_json(p))
    assert data["vram_headroom_frac"] == 0.25 and "kv_reserve" not in data
    assert employment_from_json(employment_to_json(p)) == p
    old = {("kv_reserve" if k == "vram_headroom_frac" else k): v for k, v in data.items()}
    with pytest.warns(DeprecationWarning, match="kv_reserve is deprecated; use vram_headroom_frac"):
        assert employment_from_json(json.dumps(old)) == p
    with pytest.raises(InputError, match="former name of vram_headroom_frac; give one of them"):
        EmploymentPlan.from_dict({**data, "kv_reserve": 0.25})
    with pytest.warns(DeprecationWarning, match=r"use EmploymentPlan\.vram_headroom_frac$"):
        assert p.kv_reserve == 0.25
    with pytest.warns(DeprecationWarning, match=r"plan_employment\(kv_reserve=\.\.\.\)"):
        assert plan_employment(topo, m, 10 * GIB, kv_reserve=0.25) == p  # type: ignore[call-arg]
    with pytest.warns(DeprecationWarning, match=r"plan_residency\(kv_reserve=\.\.\.\)"):
        plan_residency(topo, m, DENSE, kv_reserve=0.25)  # type: ignore[call-arg]
    with pytest.warns(DeprecationWarning, match="use DEFAULT_RESIDENCY_HEADROOM_FRAC$"):
        assert residency.DEFAULT_KV_RESERVE == DEFAULT_RESIDENCY_HEADROOM_FRAC == 0.1


def test_cli_residency_takes_headroom_and_kv_reserve_as_its_deprecated_spelling(
    tmp_path, capsys
) -> None:
    import json

    from stowplan.cli import main
    from stowplan.host.passport import Passport, save_passport
    from tests.common.host import GIB, cap, host, matrix

    m = matrix(cap("gpu0", 400.0, upload_gbps=16.0), cap("cpu", 20.0))
    path = save_passport(Passport.create(host(vram=24 * GIB, ram=64 * GIB), m), tmp_path / "p.json")
    args = ["residency", "llama3.1:8b", "--passport", str(path), "--json"]
    assert main([*args, "--headroom", "0.3"]) == 0
    new = capsys.readouterr()
    assert json.loads(new.out)["vram_headroom_frac"] == 0.3 and new.err == ""
    assert main([*args, "--kv-reserve", "0.3"]) == 0
    old = capsys.readouterr()
    assert old.out == new.out
    assert old.err == "stowplan: note: --kv-reserve is deprecated; use --headroom\n"
    assert main([*args, "--kv-reserve", "0.3", "--headroom", "0.3"]) == 2
    assert capsys.readouterr().err == (
        "stowplan: error: --kv-reserve=0.3: is the former name of --headroom; give one\n"
    )
    assert main([*args, "--headroom", "1.5"]) == 2
    assert capsys.readouterr().err == (
        "stowplan: error: vram_headroom_frac=1.5: must be a fraction in [0, 1)\n"
    )
    assert main(["residency", "--help"]) == 0
    assert "--kv-reserve" not in capsys.readouterr().out
