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
