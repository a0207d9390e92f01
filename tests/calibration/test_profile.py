"""Profile JSON: round trip, shipped defaults, device matching, malformed files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stowplan.calibration import (
    Calibration,
    DeviceCalibration,
    Engine,
    Figure,
    Provenance,
    calibration_from_json,
    calibration_to_json,
    dtype_class,
    load_calibration_file,
    shipped_calibration,
)
from stowplan.errors import InputError


def _entry(device: str = "rtx-4090", **kw: object) -> DeviceCalibration:
    return DeviceCalibration(
        device=device,
        bandwidth_fraction={
            "default": Figure(value=0.8, source="s1"),
            "q4": Figure(value=0.65, provenance=Provenance.FITTED, source="fit"),
        },
        block_overhead_s=Figure(value=5e-5, source="s2"),
        hop_overhead_s=Figure(value=1e-5, source="s3"),
        compute_efficiency=Figure(value=0.83, provenance=Provenance.MEASURED, source="probe"),
        **kw,  # type: ignore[arg-type]
    )


def test_round_trip_is_exact_and_canonical() -> None:
    cal = Calibration(
        name="mine", engine=Engine.LLAMACPP, devices=(_entry(), _entry("*")), description="d"
    )
    text = calibration_to_json(cal)
    back = calibration_from_json(text)
    assert back == cal
    assert calibration_to_json(back) == text


@pytest.mark.parametrize("engine", list(Engine))
def test_shipped_profiles_load_and_every_figure_cites_a_source(engine: Engine) -> None:
    cal = shipped_calibration(engine)
    assert cal.engine is engine
    assert cal.for_device("some unknown accelerator") is not None
    for d in cal.devices:
        figures = [*d.bandwidth_fraction.values(), d.block_overhead_s, d.hop_overhead_s]
        figures += [d.collective_overhead_s, d.compute_efficiency]
        for f in figures:
            assert len(f.source) > 20, (d.device, f)


def test_llamacpp_profile_has_family_entries_that_match_real_names() -> None:
    cal = shipped_calibration("llamacpp")
    picks = {
        "NVIDIA GeForce RTX 4090": "rtx-4090",
        "NVIDIA GeForce RTX 3090": "rtx-3090",
        "Tesla P40": "tesla-p40",
        "Apple M2 Ultra": "apple-m2-ultra",
        "Apple M3 Ultra": "apple-m3-ultra",
        "NVIDIA GeForce RTX 3080 Ti": "rtx-3080-ti",
        "NVIDIA RTX A4000": "rtx-a4000",
        "NVIDIA GeForce RTX 3080": "*",
        "NVIDIA H100 80GB HBM3": "*",
    }
    for name, key in picks.items():
        entry = cal.for_device(name)
        assert entry is not None and entry.device == key, name
    # Datacenter families match nvidia-smi's spellings; a PCIe entry needs the word.
    assert (cal.for_device("NVIDIA A100-SXM4-80GB") or cal.devices[0]).device == "a100-80gb"
    assert (cal.for_device("NVIDIA A100 80GB PCIe") or cal.devices[0]).device == "a100-80gb"
    assert (cal.for_device("NVIDIA H100 PCIe") or cal.devices[0]).device == "h100-pcie"
    assert (cal.for_device("NVIDIA A100-SXM4-40GB") or cal.devices[0]).device == "*"
    trt = shipped_calibration("trtllm")
    assert (trt.for_device("NVIDIA B200") or trt.devices[0]).device == "b200"
    assert (trt.for_device("NVIDIA GB200") or trt.devices[0]).device == "*"  # not a B200
    assert (trt.for_device("NVIDIA H100 80GB HBM3") or trt.devices[0]).device == "h100-sxm"
    # The RTX 3090's F16 and Q4_0 runs come from one build and one table (pull request
    # #4766), so their fractions compare like with like: the quantised GEMV reaches less.
    rtx = cal.for_device("RTX 3090")
    assert rtx is not None
    assert rtx.fraction("Q4_K_M").value < rtx.fraction("F16").value


@pytest.mark.parametrize(
    ("dtype", "cls"),
    [
        ("bf16", "f16"),
        ("F16", "f16"),
        ("Q4_K - Medium", "q4"),
        ("mostly Q4_0", "q4"),
        ("Q8_0", "q8"),
        ("fp8", "fp8"),
        ("awq", "q4"),
        ("bf16+mxfp4", "q4"),
        (None, "default"),
        ("weird", "default"),
    ],
)
def test_dtype_classes(dtype: str | None, cls: str) -> None:
    assert dtype_class(dtype) == cls


def test_a_profile_without_a_collective_cost_charges_none_and_round_trips() -> None:
    doc = {
        "schema_version": 1,
        "name": "old",
        "engine": "vllm",
        "devices": [{"device": "*", "bandwidth_fraction": {"default": {"value": 0.8}}}],
    }
    cal = calibration_from_json(json.dumps(doc))
    assert cal.devices[0].collective_overhead_s.value == 0.0
    with_tp = Calibration(
        name="tp",
        engine=Engine.VLLM,
        devices=(_entry(collective_overhead_s=Figure(value=7e-6, source="all-reduce")),),
    )
    text = calibration_to_json(with_tp)
    assert '"collective_overhead_s"' in text
    assert calibration_from_json(text) == with_tp


def _doc(**over: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "schema_version": 1,
        "name": "x",
        "engine": "vllm",
        "devices": [{"device": "*", "bandwidth_fraction": {"default": {"value": 0.8}}}],
    }
    doc.update(over)
    return doc


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (_doc(schema_version=2), "schema_version=2: only version 1 is supported"),
        (
            _doc(engine="ollama"),
            "engine='ollama': must be one of generic, llamacpp, vllm, trtllm, sglang, transformers",
        ),
        (_doc(devices=[]), "devices=[]: must be a non-empty list of device objects"),
        (
            _doc(extra=1),
            "calibration.extra=1: unknown key; allowed: "
            "['description', 'devices', 'engine', 'name', 'runs', 'schema_version']",
        ),
        (
            _doc(devices=[{"device": "*", "bandwidth_fraction": {}}]),
            "devices['*'].bandwidth_fraction=[]: must have a 'default' entry",
        ),
        (
            _doc(devices=[{"device": "*", "bandwidth_fraction": {"default": {"value": 5.0}}}]),
            "devices['*'].bandwidth_fraction.default=5.0: must be a finite number in [0, 4.0]",
        ),
        (
            _doc(devices=[{"device": "*", "bandwidth_fraction": {"default": {"value": "fast"}}}]),
            "devices[0].bandwidth_fraction.default.value='fast': must be a finite number",
        ),
        (
            _doc(
                devices=[
                    {
                        "device": "*",
                        "bandwidth_fraction": {"default": {"value": 0.8}},
                        "block_overhead_s": {"value": -1},
                    }
                ]
            ),
            "devices[0].block_overhead_s.value=-1: must be a finite number >= 0",
        ),
        (
            _doc(
                devices=[
                    {
                        "device": "*",
                        "bandwidth_fraction": {"default": {"value": 0.8, "provenance": "guess"}},
                    }
                ]
            ),
            "provenance='guess': must be one of table, fitted, measured, assumed",
        ),
        (
            _doc(
                devices=[
                    {"device": "a", "bandwidth_fraction": {"default": {"value": 0.8}}},
                    {"device": "a", "bandwidth_fraction": {"default": {"value": 0.7}}},
                ]
            ),
            "devices[].device='a': device keys must be unique",
        ),
        (_doc(devices=[{"bandwidth_fraction": {}}]), "devices[0].device=None: is required"),
    ],
)
def test_malformed_profiles_are_rejected_with_clear_messages(
    doc: dict[str, object], message: str
) -> None:
    with pytest.raises(InputError) as exc:
        calibration_from_json(json.dumps(doc))
    assert str(exc.value) == message


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "cal.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(InputError, match=r"cal.json='<9 bytes>': is not valid JSON"):
        load_calibration_file(bad)
    bad.write_text(json.dumps(_doc(engine="ollama")), encoding="utf-8")
    with pytest.raises(InputError) as exc:
        load_calibration_file(bad)
    assert str(exc.value).startswith(f"{bad}: engine='ollama': must be one of")
    with pytest.raises(InputError, match="cannot be read"):
        load_calibration_file(tmp_path / "missing.json")
