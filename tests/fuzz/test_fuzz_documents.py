"""Fuzz the readers of user documents: JSON/YAML, fleets, offers, plans, profiles, passports."""

from __future__ import annotations

import json
import math

from hypothesis import example, given
from hypothesis import strategies as st

from stowplan.calibration import calibration_from_json, shipped_calibration
from stowplan.calibration.profile import calibration_to_dict
from stowplan.files.fleets import nodes_from_data, nodes_from_offers
from stowplan.files.safeload import parse_json, parse_yaml
from stowplan.host.passport import Passport
from stowplan.moe.stats import coactivation_from_data, expert_load_from_data
from stowplan.plan import plan_from_dict, plan_from_json, plan_to_json
from stowplan.planner.residency import employment_from_json, employment_to_json, plan_employment
from stowplan.quantities.limits import MAX_BYTE_COUNT, MAX_NODES, MAX_RATE
from tests.common.fuzz import dumps, fuzz, json_texts, json_values, mutated, strings, typed
from tests.common.host import cap, fixture_topology, matrix
from tests.common.paths import FIXTURES

NODE = {
    "id": "a",
    "gpu_name": "RTX 4090",
    "vram_bytes": "24GiB",
    "flops_estimate": 165.0,
    "link_mbps": "1Gbit",
    "mem_bandwidth_gbps": 1008,
    "link_latency_ms": 5,
    "price_per_hour": 0.4,
    "num_gpus": 1,
    "labels": {"site": "x"},
    "count": 2,
}
OFFER = json.loads((FIXTURES / "vastai" / "offer_rtx4090_1x_2024_raw.json").read_text())
PLAN = json.loads((FIXTURES / "plans" / "llama3_1_70b__mixed-consumer__39.json").read_text())
PROFILE = calibration_to_dict(shipped_calibration("llamacpp"))
PASSPORT = Passport.create(
    fixture_topology("thamada_nvsim/H100NVLx2_smi_-a.txt"),
    matrix(cap("gpu0", 3000.0, upload_gbps=50.0), cap("gpu1", 2900.0, 50.0), cap("cpu", 80.0)),
).to_dict()

yaml_texts = st.one_of(
    st.text(max_size=200),
    json_values.map(dumps),
    st.integers(2, 12).map(
        lambda n: (
            "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
            + "".join(
                f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, n)
            )
        )
    ),
    st.sampled_from(
        ["a: &a [*a]\n", "- " * 100 + "x\n", "x: " + "9" * 5000, "!!python/object:os.system {}"]
    ),
)


@fuzz
@given(json_texts)
def test_parse_json_returns_data_or_an_input_error(text: str) -> None:
    data = typed(parse_json, text, field="f", source="s")
    if data is not None:
        assert json.loads(json.dumps(data)) == data


@fuzz
@given(yaml_texts)
def test_parse_yaml_returns_plain_data_or_an_input_error(text: str) -> None:
    data = typed(parse_yaml, text, field="f", source="s")
    assert (
        data is None
        or isinstance(data, dict | list | str | int | float | bool | bytes)
        or (type(data).__module__ == "datetime")
    )


@fuzz
@given(st.one_of(json_values, st.lists(mutated(NODE), min_size=1, max_size=4)))
@example([{**NODE, "labels": {"site": 10**5000}}])  # a label too long for str(int)
def test_fleet_data_gives_bounded_unique_nodes_or_an_input_error(data: object) -> None:
    nodes = typed(nodes_from_data, data)
    if nodes is not None:
        assert 1 <= len(nodes) <= MAX_NODES
        assert len({n.id for n in nodes}) == len(nodes)
        for n in nodes:
            assert 0 <= n.vram_bytes <= MAX_BYTE_COUNT
            assert 0 <= n.flops_estimate <= MAX_RATE and 0 <= n.link_mbps <= MAX_RATE
            assert n.id and n.id != "None"


@fuzz
@given(
    st.one_of(
        json_values,
        mutated(OFFER),
        st.lists(mutated(OFFER[0] if isinstance(OFFER, list) else OFFER), max_size=3),
    )
)
def test_offers_give_bounded_nodes_or_an_input_error(data: object) -> None:
    nodes = typed(nodes_from_offers, data)
    for n in nodes or []:
        assert 0 <= n.vram_bytes <= MAX_BYTE_COUNT
        assert math.isfinite(n.flops_estimate) and math.isfinite(n.link_mbps)


@fuzz
@given(st.one_of(mutated(PLAN), json_values))
def test_plan_data_gives_a_plan_that_round_trips_or_an_input_error(data: object) -> None:
    plan = typed(plan_from_dict, data)
    if plan is not None:
        assert plan_from_json(plan_to_json(plan)) == plan


@fuzz
@given(st.one_of(json_texts, mutated(PLAN).map(dumps)))
def test_plan_json_text_gives_a_plan_or_an_input_error(text: str) -> None:
    typed(plan_from_json, text)


@fuzz
@given(st.one_of(mutated(PROFILE).map(dumps), json_texts))
def test_calibration_json_gives_a_profile_or_an_input_error(text: str) -> None:
    typed(calibration_from_json, text, origin="fuzz")


@fuzz
@given(st.one_of(mutated(PASSPORT, max_changes=2), json_values))
def test_passport_data_gives_a_passport_or_an_input_error(data: object) -> None:
    if isinstance(data, dict):
        typed(Passport.from_dict, data)


@fuzz
@given(
    st.one_of(json_values, st.lists(st.lists(st.one_of(st.floats(), st.integers())), max_size=4))
)
@example([[10**400]])  # an integer beyond any float
def test_expert_statistics_give_a_value_or_an_input_error(data: object) -> None:
    typed(expert_load_from_data, data)
    typed(coactivation_from_data, data)


_HOST = Passport.from_dict(PASSPORT)
EMPLOYMENT = json.loads(employment_to_json(plan_employment(_HOST.topology, _HOST.matrix, 10**10)))


@fuzz
@given(
    st.one_of(json_texts, strings, st.just(EMPLOYMENT), mutated(EMPLOYMENT)).map(
        lambda v: v if isinstance(v, str) else dumps(v)
    )
)
def test_employment_json_gives_a_plan_or_an_input_error(text: str) -> None:
    typed(employment_from_json, text)
