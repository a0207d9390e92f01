"""The route hook: off by default, plans from the passport when on, remembers the last plan."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from stowplan.host import route
from stowplan.host.passport import Passport, save_passport
from stowplan.planner.residency import ResidencyProtocol
from tests.common.host import GIB, cap, fixture_topology, matrix


@pytest.fixture(autouse=True)
def _fresh_route(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(route, "_last", None)
    monkeypatch.delenv(route.ROUTE_ENV, raising=False)


def _saved(tmp_path: Path) -> Path:
    topo = fixture_topology("thamada_nvsim/L4_smi_-a.txt")
    m = matrix(cap("gpu0", 250.0, upload_gbps=25.0), cap("cpu", 40.0))
    return save_passport(Passport.create(topo, m), tmp_path / "p.json")


@pytest.mark.parametrize(
    ("value", "enabled"),
    [("", False), ("0", False), ("false", False), ("1", True), ("TRUE", True), ("on", True)],
)
def test_route_enabled_reads_the_flag(
    monkeypatch: pytest.MonkeyPatch, value: str, enabled: bool
) -> None:
    monkeypatch.setenv("STOWPLAN_ROUTE", value)
    assert route.route_enabled() is enabled


def test_off_does_nothing_not_even_read_the_passport(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with caplog.at_level(logging.DEBUG, logger="stowplan.host"):
        assert route.route_employment_from_passport(GIB, path=broken) is None
        topo = fixture_topology("thamada_nvsim/L4_smi_-a.txt")
        assert route.route_employment_for_model(topo, matrix(cap("cpu", 1.0)), GIB) is None
    assert caplog.records == []
    assert route.last_employment_plan() is None


def test_on_plans_from_the_passport_and_records_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("STOWPLAN_ROUTE", "1")
    path = _saved(tmp_path)
    with caplog.at_level(logging.INFO, logger="stowplan.host"):
        plan = route.route_employment_from_passport(30 * GIB, path=path)
    assert plan is not None
    assert (
        plan.protocol is ResidencyProtocol.HETEROGENEOUS_OVERFLOW
    )  # 40 GB/s CPU beats 25 GB/s bus
    assert route.last_employment_plan() is plan
    assert "residency route: heterogeneous-overflow, primary gpu0" in caplog.text


def test_on_without_a_passport_notes_it_once_and_returns_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("STOWPLAN_ROUTE", "yes")
    with caplog.at_level(logging.INFO, logger="stowplan.host"):
        assert route.route_employment_from_passport(GIB, path=tmp_path / "none.json") is None
    assert [r.getMessage() for r in caplog.records] == [
        "residency route: no hardware passport yet; run `stowplan probe` to make one"
    ]
    assert route.last_employment_plan() is None


def test_plan_for_model_probes_this_host() -> None:
    plan = route.plan_for_model(2**20, quick=True)
    assert plan.protocol is ResidencyProtocol.RESIDENT
    assert plan.predicted_s_per_token > 0
