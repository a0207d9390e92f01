"""``calibrate(request)``: one calibration run through the library, as ``stowplan calibrate`` makes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from stowplan.calibration import (
    CalibrationRequest,
    Engine,
    PassportReading,
    Provenance,
    assumed,
    calibrate,
    load_calibration_file,
    resolve_calibration,
    shipped_calibration,
)
from stowplan.errors import InputError
from tests.common.passports import Cap, passport

LB = Path(__file__).resolve().parent.parent / "fixtures" / "llama-bench"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STOWPLAN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_llama_bench_fit_is_saved_as_the_engines_profile_and_plans_read_it(home: Path) -> None:
    outcome = calibrate(CalibrationRequest(llama_bench=LB / "readme_rtx4080.json"))
    target = home / "calibration" / "llamacpp.json"
    assert (outcome.engine, outcome.target, outcome.default_target) == (
        Engine.LLAMACPP,
        target,
        True,
    )
    assert outcome.fit is not None and outcome.notes == ()
    assert (outcome.fit.device_name, outcome.fit.bandwidth_gbps) == (
        "NVIDIA GeForce RTX 4080",
        716.8,
    )
    (entry,) = outcome.entries
    assert entry == outcome.fit.result.device
    assert (outcome.profile.name, outcome.profile.devices) == ("llamacpp-fitted", (entry,))
    assert load_calibration_file(target) == outcome.profile
    assert resolve_calibration("llamacpp").for_device("NVIDIA GeForce RTX 4080") == entry
    # One Q4_K_M run of 4.68 GB at 118.88 tok/s, the run the shipped rtx-4080 entry is
    # fitted to: one run cannot tell streaming from the block cost, so the fit stays near
    # the shipped split (its block cost held in datasheet order with the other GPUs').
    shipped = shipped_calibration("llamacpp").for_device("RTX 4080")
    assert shipped is not None and entry.device == shipped.device == "rtx-4080"
    q4 = entry.fraction("Q4_K_M")
    assert q4.value == pytest.approx(shipped.fraction("Q4_K_M").value, rel=0.02)
    assert q4.value > 4_677_120_000 * 118.881588 / 716.8e9  # the blocks take some time
    assert q4.source == "fitted to 1 llama-bench runs in readme_rtx4080.json"
    assert outcome.fit.result.predicted_tokens_per_s[0] == pytest.approx(118.88, rel=1e-3)
    # What one Q4 run cannot see is the shipped entry's value, labelled assumed.
    for cls in ("default", "f16", "q8"):
        assert entry.bandwidth_fraction[cls] == assumed(shipped.bandwidth_fraction[cls])
        assert entry.bandwidth_fraction[cls].provenance is Provenance.ASSUMED
    assert entry.hop_overhead_s == assumed(shipped.hop_overhead_s)
    assert entry.collective_overhead_s == assumed(shipped.collective_overhead_s)
    assert entry.compute_efficiency == assumed(shipped.compute_efficiency)


def test_a_second_device_is_merged_in_front_of_the_first(home: Path) -> None:
    first = calibrate(CalibrationRequest(llama_bench=LB / "readme_rtx4080.json"))
    second = calibrate(
        CalibrationRequest(
            llama_bench=LB / "pr4766_rtx4090_cuda.md",
            device="RTX 4090",
            bandwidth_gbps=1008.0,
            blocks=32,
        )
    )
    assert [d.device for d in second.profile.devices] == ["rtx-4090", "rtx-4080"]
    assert second.profile.devices[1] == first.entries[0]
    rtx = second.entries[0]
    assert rtx.fraction("F16").value > rtx.fraction("Q8_0").value
    assert load_calibration_file(second.target) == second.profile


def test_notes_reach_the_sink_as_they_arise_and_the_outcome(tmp_path: Path) -> None:
    lines = (LB / "readme_cuda_tg_models.md").read_text().splitlines()
    lines[7] = lines[7].replace("|  -1 |", "|   0 |")
    table = tmp_path / "cpu-row.md"
    table.write_text("\n".join(lines) + "\n")
    seen: list[str] = []
    out = tmp_path / "mine.json"
    outcome = calibrate(
        CalibrationRequest(llama_bench=table, device="RTX 4090", out=out), on_note=seen.append
    )
    assert (
        outcome.notes
        == tuple(seen)
        == (
            "llama 13B mostly Q4_0 tg128 left out of the GPU fit (ngl 0: ran on the CPU); "
            "benchmark with -ngl 99 to fit the GPU",
        )
    )
    assert outcome.fit is not None and len(outcome.fit.measurements) == 5
    assert (outcome.target, outcome.default_target) == (out, False)
    assert load_calibration_file(out) == outcome.profile


def test_the_probe_reads_the_passport_it_is_given_and_measures_each_circuit(
    tmp_path: Path,
) -> None:
    asked: list[Path | None] = []

    def read(path: Path | None) -> PassportReading:
        asked.append(path)
        return passport(Cap("gpu0", 900.0), Cap("cpu", 20.0))

    request = CalibrationRequest(probe=True, passport=tmp_path / "p.json", engine="vllm")
    outcome = calibrate(request, read_passport=read)
    assert asked == [tmp_path / "p.json"]
    assert outcome.fit is None and outcome.engine is Engine.VLLM
    assert [(e.device, e.fraction("f32").value) for e in outcome.entries] == [
        ("rtx-4090", 0.8929),
        ("ryzen-9-7950x", 1.0),
    ]
    assert {e.fraction("f32").provenance for e in outcome.entries} == {Provenance.MEASURED}
    assert outcome.profile.name == "vllm-fitted"
    assert outcome.profile.devices == outcome.entries


def test_the_probe_without_a_passport_reader_says_so() -> None:
    with pytest.raises(InputError) as exc:
        calibrate(CalibrationRequest(probe=True))
    assert (exc.value.field, exc.value.value) == ("--from-probe", True)
    assert exc.value.rule.startswith("needs the host probe (stowplan.host)")


@pytest.mark.parametrize(
    ("fields", "field", "rule"),
    [
        ({"gpus": 0, "blocks": 0}, "--gpus", "must be >= 1"),
        ({"blocks": 0}, "--blocks", "must be >= 1"),
        ({"bandwidth_gbps": 0.0}, "--bandwidth-gbps", "must be a finite number > 0"),
        ({"out": Path("/")}, "--out", "is a folder; give a file name to write"),
        (
            {"llama_bench": Path("x.md"), "probe": True},
            "--from-llama-bench",
            "fit from one source at a time (not with --from-probe)",
        ),
        (
            {"serving_bench": Path("x.json"), "llama_bench": Path("x.md")},
            "--from-serving-bench",
            "fit from one source at a time (not with --from-llama-bench / --from-probe)",
        ),
    ],
)
def test_a_request_is_checked_when_built(fields: dict[str, object], field: str, rule: str) -> None:
    with pytest.raises(InputError) as exc:
        CalibrationRequest(**fields)  # type: ignore[arg-type]
    assert (exc.value.field, exc.value.rule) == (field, rule)
