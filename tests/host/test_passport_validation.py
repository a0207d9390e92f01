"""Passport validation at load: every bad field is an InputError naming field, value and rule;
the cache and the route treat an invalid passport as unusable; an explicit file is one line."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stowplan.circuits import HostTopology
from stowplan.cli import main
from stowplan.errors import InputError, StowplanError
from stowplan.host import route
from stowplan.host.passport import (
    Passport,
    PassportUnreadable,
    obtain_passport,
    read_passport,
    save_passport,
)
from tests.common.host import GIB, cap, fixture_topology, matrix

Damage = Callable[[dict[str, Any]], None]


def _passport(quick: bool = False) -> Passport:
    topo = fixture_topology("thamada_nvsim/RTX4090_smi_-a.txt")
    m = matrix(cap("gpu0", 900.0, upload_gbps=25.0), cap("cpu", 20.0))
    if quick:
        m = type(m)(entries=m.entries, quick=True)
    return Passport.create(topo, m)


def _circuit(d: dict[str, Any], cid: str) -> dict[str, Any]:
    return next(c for c in d["topology"]["circuits"] if c["id"] == cid)


def _entry(d: dict[str, Any], cid: str) -> dict[str, Any]:
    return next(e for e in d["matrix"]["entries"] if e["circuit"] == cid)


def _set(where: Callable[[dict[str, Any]], dict[str, Any]], key: str, value: object) -> Damage:
    def damage(d: dict[str, Any]) -> None:
        where(d)[key] = value

    return damage


def _dupe_circuit(d: dict[str, Any]) -> None:
    d["topology"]["circuits"].append(dict(_circuit(d, "gpu0")))


def _dupe_entry(d: dict[str, Any]) -> None:
    d["matrix"]["entries"].append(dict(_entry(d, "gpu0")))


CASES: list[tuple[str, Damage, str]] = [
    (
        "pool names a missing pool",
        _set(lambda d: _circuit(d, "gpu0"), "pool", "vram:gpu9"),
        "circuit gpu0.pool='vram:gpu9': must name a pool of the host ['system', 'vram:gpu0', "
        "'vram:gpu1', 'vram:gpu2', 'vram:gpu3', 'vram:gpu4', 'vram:gpu5', 'vram:gpu6', "
        "'vram:gpu7']",
    ),
    (
        "implausible GEMV time",
        _set(lambda d: _entry(d, "gpu0"), "ms_per_gemv", 1e-300),
        "gpu0.ms_per_gemv=1e-300: gives inf bytes/s for gemv_n=50000; "
        "a measured rate must be <= 1e+15 bytes/s",
    ),
    (
        "bool gemv_n",
        _set(lambda d: _entry(d, "gpu0"), "gemv_n", True),
        "matrix entry gpu0.gemv_n=True: must be an integer >= 1",
    ),
    (
        "negative capacity",
        _set(lambda d: d["topology"]["pools"][0], "capacity_bytes", -1),
        "pool system.capacity_bytes=-1: must be an integer >= 0",
    ),
    (
        "duplicate circuit",
        _dupe_circuit,
        "topology.circuits=['gpu0']: ids must be unique",
    ),
    (
        "duplicate matrix entry",
        _dupe_entry,
        "matrix.entries=['gpu0']: ids must be unique",
    ),
    (
        "entry naming no circuit",
        _set(lambda d: _entry(d, "gpu0"), "circuit", "gpu42"),
        "matrix entry gpu42.circuit='gpu42': must name a circuit of the topology ",
    ),
    (
        "string capacity",
        _set(lambda d: d["topology"]["pools"][0], "capacity_bytes", "64"),
        "pool system.capacity_bytes='64': must be an integer >= 0",
    ),
    (
        "missing kind",
        lambda d: _circuit(d, "cpu").pop("kind"),
        "circuit cpu.kind=None: is required",
    ),
]


def _write(tmp_path: Path, damage: Damage, passport: Passport | None = None) -> Path:
    d = json.loads((passport or _passport()).to_json())
    damage(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    return path


@pytest.mark.parametrize(("name", "damage", "message"), CASES, ids=[c[0] for c in CASES])
def test_every_invalid_field_is_named_with_its_value_and_rule(
    tmp_path: Path, name: str, damage: Damage, message: str
) -> None:
    path = _write(tmp_path, damage)
    with pytest.raises(PassportUnreadable) as info:
        read_passport(path)
    assert str(info.value).startswith(f"{path}: invalid: {message}")
    assert isinstance(info.value, StowplanError)


def test_ms_per_gemv_just_inside_the_plausible_rate_is_accepted() -> None:
    # 4 * 4096**2 bytes in 1e-4 ms is 6.7e14 bytes/s: under the 1e15 bound; 1e-5 ms is over.
    d = json.loads(_passport().to_json())
    _entry(d, "gpu0").update(gemv_n=4096, ms_per_gemv=1e-4)
    entry = Passport.from_dict(d).matrix.get("gpu0")
    assert entry is not None and entry.compute_bytes_per_s == pytest.approx(6.71e14, rel=1e-3)
    _entry(d, "gpu0").update(ms_per_gemv=1e-5)
    with pytest.raises(InputError, match=r"gpu0.ms_per_gemv=1e-05: gives 6.71e\+15 bytes/s"):
        Passport.from_dict(d)


@pytest.mark.parametrize(("name", "damage", "message"), CASES[:4], ids=[c[0] for c in CASES[:4]])
def test_residency_with_an_invalid_passport_file_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, damage: Damage, message: str
) -> None:
    path = _write(tmp_path, damage)
    assert main(["residency", "llama3.1:8b", "--passport", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"stowplan: error: --passport='{path}': {path}: invalid: {message}")
    assert err.count("\n") == 1


class _Prober:
    def __init__(self, quick: bool = False) -> None:
        self.calls = 0
        self.quick = quick

    def __call__(self, topo: HostTopology) -> Passport:
        self.calls += 1
        return _passport(self.quick)


@pytest.mark.parametrize(("name", "damage", "message"), CASES[:4], ids=[c[0] for c in CASES[:4]])
def test_the_cache_reprobes_over_an_invalid_passport(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, damage: Damage, message: str
) -> None:
    path = _write(tmp_path, damage)
    probe = _Prober()
    with caplog.at_level(logging.WARNING, logger="stowplan.host"):
        got, reused = obtain_passport(current=_passport().topology, probe=probe, path=path)
    assert (reused, probe.calls) == (False, 1)
    assert f"hardware passport ignored, will re-probe: {path}: invalid: {message}" in caplog.text
    assert read_passport(path) == got


def test_a_quick_passport_does_not_serve_a_full_request(tmp_path: Path) -> None:
    path = save_passport(_passport(quick=True), tmp_path / "p.json")
    topo = _passport().topology
    quick_probe, full_probe = _Prober(quick=True), _Prober()
    _, reused = obtain_passport(current=topo, probe=quick_probe, path=path, quick=True)
    assert (reused, quick_probe.calls) == (True, 0)
    got, reused = obtain_passport(current=topo, probe=full_probe, path=path, quick=False)
    assert (reused, full_probe.calls, got.matrix.quick) == (False, 1, False)
    # A full passport serves a later quick request.
    _, reused = obtain_passport(current=topo, probe=quick_probe, path=path, quick=True)
    assert (reused, quick_probe.calls) == (True, 0)


def test_an_unwritable_cache_fails_before_probing_naming_the_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    monkeypatch.setenv("STOWPLAN_CACHE_DIR", str(blocker))
    probe = _Prober()
    with pytest.raises(InputError) as info:
        obtain_passport(current=_passport().topology, probe=probe)
    assert probe.calls == 0
    assert str(info.value).startswith(
        f"passport='{blocker}/passport.json': cannot be written: its folder cannot be made ("
    )


def test_probe_into_an_unwritable_cache_is_one_line_exit_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    monkeypatch.setenv("STOWPLAN_CACHE_DIR", str(blocker))
    assert main(["probe", "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"stowplan: error: passport='{blocker}/passport.json': cannot be written")
    assert "STOWPLAN_CACHE_DIR" in err and err.count("\n") == 1


@pytest.fixture
def _route(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(route, "_last", None)
    monkeypatch.setattr(route, "_warned", set())


@pytest.mark.usefixtures("_route")
@pytest.mark.parametrize(("name", "damage", "message"), CASES[:4], ids=[c[0] for c in CASES[:4]])
def test_the_route_returns_none_over_an_invalid_passport_and_says_it_does_not_probe(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    name: str,
    damage: Damage,
    message: str,
) -> None:
    monkeypatch.setenv(route.ROUTE_ENV, "1")
    path = _write(tmp_path, damage)
    with caplog.at_level(logging.INFO, logger="stowplan.host"):
        assert route.route_employment_from_passport(GIB, path=path) is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == (
        "residency route: hardware passport unusable, not routing (the route never probes; "
        f"run `stowplan probe --refresh`): {path}: invalid: {message}" + line.split(message, 1)[1]
    )
    assert "will re-probe" not in caplog.text


@pytest.mark.usefixtures("_route")
def test_the_route_returns_none_when_the_model_cannot_be_placed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(route.ROUTE_ENV, "on")
    path = save_passport(_passport(), tmp_path / "p.json")
    huge = 10**15
    with caplog.at_level(logging.INFO, logger="stowplan.host"):
        assert route.route_employment_from_passport(huge, path=path) is None
        assert route.route_employment_from_passport(0, path=path) is None
    assert [r.getMessage().split(": ", 2)[:2] for r in caplog.records] == [
        ["residency route", "no plan, the load goes on unrouted"]
    ] * 2
    assert "model does not fit" in caplog.records[0].getMessage()
    assert route.last_employment_plan() is None


@pytest.mark.usefixtures("_route")
@pytest.mark.parametrize("value", ["2", "y", "enable", "ON please"])
def test_an_unknown_route_value_is_off_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, value: str
) -> None:
    monkeypatch.setenv(route.ROUTE_ENV, value)
    with caplog.at_level(logging.WARNING, logger="stowplan.host"):
        assert route.route_enabled() is False
        assert route.route_enabled() is False
    assert [r.getMessage() for r in caplog.records] == [
        f"STOWPLAN_ROUTE={value!r} is not understood; residency routing stays off "
        "(on: 1, true, yes, on; off: 0, false, no, off)"
    ]


@pytest.mark.usefixtures("_route")
@pytest.mark.parametrize(
    ("value", "enabled"),
    [(" Yes ", True), ("On", True), ("1", True), ("No", False), ("OFF", False), ("", False)],
)
def test_documented_route_spellings_are_silent(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, value: str, enabled: bool
) -> None:
    monkeypatch.setenv(route.ROUTE_ENV, value)
    with caplog.at_level(logging.WARNING, logger="stowplan.host"):
        assert route.route_enabled() is enabled
    assert caplog.records == []
