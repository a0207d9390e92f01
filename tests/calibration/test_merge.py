"""A fit on top of an engine's profile, and new device entries merged into a profile file."""

from __future__ import annotations

from pathlib import Path

import pytest

from stowplan.calibration import (
    Calibration,
    DeviceCalibration,
    Engine,
    Figure,
    Measurement,
    Provenance,
    assumed,
    device_key,
    fit_on_profile,
    load_calibration_file,
    merge_entries,
    peak_bandwidth_gbps,
    save_entries,
    shipped_calibration,
    write_calibration,
)
from stowplan.errors import InputError

RTX4090_GBPS = 1008.0


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STOWPLAN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _no_note(text: str) -> None:
    raise AssertionError(f"unexpected note: {text}")


def _entry(key: str, fraction: float) -> DeviceCalibration:
    return DeviceCalibration(device=key, bandwidth_fraction={"default": Figure(value=fraction)})


def _run(read_bytes: int, blocks: int, *, tp: int = 1, coll_s: float = 0.0) -> Measurement:
    """CONSTRUCTED: a Q4_0 decode run at fraction 0.7 and 30 us per block on RTX 4090s."""
    t = read_bytes / (RTX4090_GBPS * 1e9 * tp * 0.7) + blocks * (30e-6 + coll_s)
    return Measurement(
        tokens_per_s=1 / t, read_bytes=read_bytes, num_blocks=blocks, dtype="Q4_0",
        tensor_parallel=tp, label=f"{read_bytes} B",
    )  # fmt: skip


def test_device_key_and_peak_come_from_the_name() -> None:
    assert device_key("NVIDIA GeForce RTX 4090") == "rtx-4090"
    assert device_key("Apple M2 Ultra") == "m2-ultra"
    assert device_key("???") == "device"
    assert peak_bandwidth_gbps("NVIDIA GeForce RTX 4080", None) == 716.8
    assert peak_bandwidth_gbps("Imaginary 9000", 123.0) == 123.0


def test_a_fit_keys_the_device_and_explains_its_runs(home: Path) -> None:
    notes: list[str] = []
    runs = [_run(3_800_000_000, 32), _run(7_400_000_000, 40)]
    fit = fit_on_profile(
        runs,
        device_name="NVIDIA GeForce RTX 4090",
        bandwidth_gbps=RTX4090_GBPS,
        engine=Engine.LLAMACPP,
        source="two sizes",
        on_note=notes.append,
    )
    d = fit.device
    assert (d.device, d.match) == ("rtx-4090", ("rtx", "4090"))
    q4 = d.fraction("Q4_0")
    assert (q4.provenance, q4.source) == (Provenance.FITTED, "two sizes")
    # The light pull towards the shipped prior (q4: 0.8925) keeps it a few per cent off 0.7.
    assert q4.value == pytest.approx(0.7, rel=0.05)
    assert max(abs(e) for e in fit.relative_errors) < 0.01
    assert notes == []


def test_the_prior_is_the_engines_profile_with_the_users_fitted_devices_first(
    home: Path,
) -> None:
    shipped = shipped_calibration("llamacpp").for_device("RTX 4090")
    assert shipped is not None and shipped.compute_efficiency.value != 0.33
    mine = DeviceCalibration(
        device="rtx-4090",
        bandwidth_fraction={"default": Figure(value=0.5)},
        compute_efficiency=Figure(value=0.33),
    )
    write_calibration(
        Calibration(name="mine", engine=Engine.LLAMACPP, devices=(mine,)),
        home / "calibration" / "llamacpp.json",
    )
    fit = fit_on_profile(
        [_run(3_800_000_000, 32)],
        device_name="RTX 4090",
        bandwidth_gbps=RTX4090_GBPS,
        engine=Engine.LLAMACPP,
        source="s",
        on_note=_no_note,
    )
    # Batch-1 decode cannot see the compute efficiency: it is the prior's, here the user's.
    assert fit.device.compute_efficiency.value == 0.33


def test_tensor_parallel_runs_keep_the_profiles_collective_and_say_so(home: Path) -> None:
    prior = shipped_calibration("llamacpp").for_device("RTX 4090")
    assert prior is not None
    coll = prior.collective_overhead_s.value
    notes: list[str] = []
    runs = [_run(3_800_000_000, 32, tp=2, coll_s=coll), _run(7_400_000_000, 40, tp=2, coll_s=coll)]
    fit = fit_on_profile(
        runs,
        device_name="RTX 4090",
        bandwidth_gbps=RTX4090_GBPS,
        engine=Engine.LLAMACPP,
        source="s",
        on_note=notes.append,
    )
    assert fit.device.collective_overhead_s == assumed(prior.collective_overhead_s)
    assert notes == [
        "every run is tensor parallel, so the collective cost cannot be told from the block "
        f"cost: it keeps the profile's {coll * 1e6:.1f} us per block and the block cost takes "
        "the rest (fit one-GPU runs too to split them)"
    ]


def test_a_gpu_never_streams_above_its_datasheet_peak(home: Path) -> None:
    fast = Measurement(tokens_per_s=400.0, read_bytes=3_800_000_000, num_blocks=32, dtype="Q4_0")
    fit = fit_on_profile(
        [fast],  # 1.52 TB/s of weights on a 1008 GB/s GPU
        device_name="RTX 4090",
        bandwidth_gbps=RTX4090_GBPS,
        engine=Engine.LLAMACPP,
        source="s",
        on_note=_no_note,
    )
    assert fit.device.fraction("q4").value == 1.0


def test_merging_into_nothing_makes_an_engine_fitted_profile() -> None:
    a, b = _entry("a", 0.5), _entry("b", 0.6)
    profile = merge_entries([a, b], Engine.VLLM, None)
    assert (profile.name, profile.engine) == ("vllm-fitted", Engine.VLLM)
    assert profile.devices == (a, b)


def test_merged_entries_go_first_and_replace_their_key_keeping_the_rest() -> None:
    old_a, old_b = _entry("a", 0.5), _entry("b", 0.6)
    existing = Calibration(
        name="kept", engine=Engine.SGLANG, devices=(old_a, old_b), description="d"
    )
    new_c, new_b = _entry("c", 0.7), _entry("b", 0.9)
    profile = merge_entries([new_c, new_b], Engine.SGLANG, existing)
    assert [(d.device, d.fraction(None).value) for d in profile.devices] == [
        ("c", 0.7),
        ("b", 0.9),
        ("a", 0.5),
    ]
    assert (profile.name, profile.description) == ("kept", "d")


def test_saving_merges_into_the_file_and_writes_it(tmp_path: Path) -> None:
    target = tmp_path / "new" / "profile.json"
    first = save_entries([_entry("a", 0.5)], Engine.TRTLLM, target)
    assert load_calibration_file(target) == first
    second = save_entries([_entry("b", 0.6), _entry("a", 0.8)], Engine.TRTLLM, target)
    assert load_calibration_file(target) == second
    assert second.name == "trtllm-fitted"
    assert [(d.device, d.fraction(None).value) for d in second.devices] == [
        ("b", 0.6),
        ("a", 0.8),
    ]


def test_a_target_that_cannot_be_written_is_an_out_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    target = tmp_path / "file" / "profile.json"
    with pytest.raises(InputError) as exc:
        save_entries([_entry("a", 0.5)], Engine.GENERIC, target)
    assert (exc.value.field, exc.value.value) == ("--out", str(target))
    assert exc.value.rule.startswith("cannot be written (")
