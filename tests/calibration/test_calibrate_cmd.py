"""``stowplan calibrate`` through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stowplan.calibration import load_calibration_file, resolve_calibration
from stowplan.cli import main
from tests.common.paths import FIXTURES

LB = FIXTURES / "llama-bench"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STOWPLAN_HOME", str(tmp_path))
    return tmp_path


def test_fit_from_json_writes_the_profile_and_plans_reuse_it(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        [
            "calibrate",
            "--from-llama-bench",
            str(LB / "readme_rtx4080.json"),
            "--bandwidth-gbps",
            "716.8",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "key rtx-4080" in out
    assert "118.88" in out
    written = home / "calibration" / "llamacpp.json"
    cal = load_calibration_file(written)
    (entry,) = cal.devices
    assert entry.device == "rtx-4080"
    assert entry.fraction("Q4_K_M").provenance.value == "fitted"
    used = resolve_calibration("llamacpp").for_device("NVIDIA GeForce RTX 4080")
    assert used == entry


def test_second_device_is_merged_not_overwritten(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for args in (
        ["--from-llama-bench", str(LB / "readme_rtx4080.csv"), "--bandwidth-gbps", "716.8"],
        [
            "--from-llama-bench",
            str(LB / "pr4766_rtx4090_cuda.md"),
            "--device",
            "RTX 4090",
            "--bandwidth-gbps",
            "1008",
            "--blocks",
            "32",
        ],
    ):
        assert main(["calibrate", *args]) == 0
    capsys.readouterr()
    cal = load_calibration_file(home / "calibration" / "llamacpp.json")
    assert [d.device for d in cal.devices] == ["rtx-4090", "rtx-4080"]
    rtx = cal.devices[0]
    assert set(rtx.bandwidth_fraction) >= {"f16", "q8"}
    assert rtx.fraction("F16").value > rtx.fraction("Q8_0").value


def test_json_output_and_explicit_out(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "mine.json"
    rc = main(
        [
            "calibrate",
            "--from-llama-bench",
            str(LB / "pr2917_m2ultra_metal.md"),
            "--device",
            "Apple M2 Ultra",
            "--bandwidth-gbps",
            "800",
            "--out",
            str(target),
            "--json",
        ]
    )
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["devices"][0]["device"] == "m2-ultra"
    assert json.loads(target.read_text())["devices"] == printed["devices"]
    assert not (home / "calibration").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [],
            "stowplan: error: --from-llama-bench=None: give llama-bench output "
            "(or --from-probe) to fit from\n",
        ),
        (
            ["--from-llama-bench", str(LB / "pr4766_rtx4090_cuda.md")],
            "stowplan: error: --device=None: the llama-bench output does not name the GPU; "
            "pass e.g. --device 'RTX 4090'\n",
        ),
        (
            ["--from-llama-bench", str(LB / "readme_rtx4080.json"), "--engine", "ollama"],
            "stowplan: error: --engine='ollama': must be one of generic, llamacpp, vllm, trtllm, sglang, transformers\n",
        ),
        (
            ["--from-llama-bench", "/nonexistent/x.md"],
            "stowplan: error: --from-llama-bench='/nonexistent/x.md': cannot be read "
            "(No such file or directory)\n",
        ),
    ],
)
def test_usage_errors_are_one_line(
    home: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["calibrate", *args]) == 2
    assert capsys.readouterr().err == message


def test_from_probe_without_a_passport_says_to_probe_first(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STOWPLAN_CACHE_DIR", str(tmp_path / "empty-cache"))
    assert main(["calibrate", "--from-probe"]) == 2
    assert capsys.readouterr().err == (
        f"stowplan: error: --passport='{tmp_path}/empty-cache/passport.json': "
        "no hardware passport; run `stowplan probe` first\n"
    )


def test_from_probe_with_a_truncated_passport_is_one_line(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "truncated.json"
    bad.write_text('{"schema_version": 1, "topo')
    assert main(["calibrate", "--from-probe", "--passport", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"stowplan: error: --passport='{bad}': not valid JSON (")
    assert err.endswith("; run `stowplan probe --refresh`\n")
    assert err.count("\n") == 1 and "re-probe" not in err


def test_a_custom_out_path_says_to_pass_it_with_calibration(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "mine.json"
    args = ["--from-llama-bench", str(LB / "readme_rtx4080.json"), "--bandwidth-gbps", "716.8"]
    assert main(["calibrate", *args, "--out", str(target)]) == 0
    out = capsys.readouterr().out.replace("\n", "")
    assert f"wrote {target}; use it with `stowplan plan --calibration {target}`" in out
    assert "--engine" not in out.split("wrote", 1)[1]
    assert main(["calibrate", *args]) == 0
    assert "`stowplan plan --engine llamacpp` uses it" in capsys.readouterr().out


def test_from_probe_records_each_measured_circuit(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stowplan.host.passport import Passport, save_passport
    from tests.common.host import cap, fixture_topology, matrix

    topo = fixture_topology("thamada_nvsim/RTX4090_smi_-a.txt")
    m = matrix(cap("gpu0", 900.0, upload_gbps=25.0), cap("cpu", 20.0))
    path = save_passport(Passport.create(topo, m), tmp_path / "4090.json")
    assert main(["calibrate", "--from-probe", "--passport", str(path)]) == 0
    out = capsys.readouterr().out
    assert "rtx-4090: bandwidth fraction (f32) 0.893 measured" in out
    cal = resolve_calibration("llamacpp")
    gpu = cal.for_device("NVIDIA GeForce RTX 4090")
    assert gpu is not None and gpu.device == "rtx-4090"
    figure = gpu.fraction("f32")
    assert figure.provenance.value == "measured"
    assert figure.value == pytest.approx(900.0 / 1008, abs=1e-4)
    assert "/ spec 1008 GB/s" in figure.source
    # The shipped family figures for other dtypes keep their values, labelled assumed.
    assert gpu.fraction("q4_0").provenance.value == "assumed"
    assert "assumed (kept from the prior profile): bandwidth fraction (" in out
    assert "hop, collective, compute efficiency" in out


def test_cpu_and_partial_offload_rows_are_left_out_of_the_gpu_fit_with_a_note(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = (LB / "readme_cuda_tg_models.md").read_text().splitlines()
    # The 13B rows become a CPU run (ngl 0) and a partial offload (ngl 20 of 40 blocks).
    lines[7] = lines[7].replace("|  -1 |", "|   0 |")
    lines[8] = lines[8].replace("|  -1 |", "|  20 |")
    lines[9] = lines[9].replace("|  -1 |", "|  99 |")
    table = tmp_path / "mixed.md"
    table.write_text("\n".join(lines) + "\n")
    args = ["calibrate", "--from-llama-bench", str(table), "--device", "RTX 4090", "--json"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert captured.err == (
        "note: llama 13B mostly Q4_0 tg128 left out of the GPU fit (ngl 0: ran on the CPU); "
        "benchmark with -ngl 99 to fit the GPU\n"
        "note: llama 13B mostly Q4_0 tg256 left out of the GPU fit (ngl 20 < 40 layers: "
        "partial offload); benchmark with -ngl 99 to fit the GPU\n"
    )
    fitted = json.loads(captured.out)["devices"]
    entry = next(d for d in fitted if d["device"] == "rtx-4090")
    assert "fitted to 4 llama-bench runs" in entry["bandwidth_fraction"]["q4"]["source"]


def test_only_cpu_rows_is_an_error_not_a_gpu_fit(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (LB / "readme_cuda_tg_models.md").read_text().replace("|  -1 |", "|   0 |")
    table = tmp_path / "cpu.md"
    table.write_text(text)
    assert main(["calibrate", "--from-llama-bench", str(table), "--device", "RTX 4090"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 7 and all(line.startswith("note: ") for line in err[:6])
    assert err[6] == (
        f"stowplan: error: --from-llama-bench='{table}': has no full-GPU token-generation run "
        "(every one had ngl 0 or fewer GPU layers than the model's blocks); "
        "run llama-bench with -ngl 99"
    )


def test_the_rtx_4080_profile_has_a_spec_row_so_its_runs_fit_without_a_bandwidth(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stowplan.gpus import lookup_gpu

    spec = lookup_gpu("NVIDIA GeForce RTX 4080")
    assert spec is not None and spec.mem_bandwidth_gbps == 716.8 and "DBGG" in spec.source
    assert main(["calibrate", "--from-llama-bench", str(LB / "readme_rtx4080.json")]) == 0
    assert "peak bandwidth 716.8 GB/s" in capsys.readouterr().out


def test_from_probe_uses_the_decode_run_figures_when_the_passport_has_them(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dataclasses import replace

    from stowplan.host.passport import Passport, save_passport
    from tests.common.host import cap, fixture_topology, matrix

    topo = fixture_topology("thamada_nvsim/RTX4090_smi_-a.txt")
    gpu = replace(cap("gpu0", 900.0, upload_gbps=25.0), decode_gbps=806.4, decode_block_s=4e-5)
    path = save_passport(Passport.create(topo, matrix(gpu, cap("cpu", 20.0))), tmp_path / "p.json")
    assert main(["calibrate", "--from-probe", "--passport", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "rtx-4090: bandwidth fraction (f32) 0.893 measured, (f16 decode run) 0.800 measured, "
        "block 40.0 us measured" in out
    )
    entry = resolve_calibration("llamacpp").for_device("RTX 4090")
    assert entry is not None
    f16 = entry.fraction("bf16")
    assert (f16.value, f16.provenance.value) == (0.8, "measured")
    assert (entry.block_overhead_s.value, entry.block_overhead_s.provenance.value) == (
        4e-5,
        "measured",
    )
    assert "decode run" in entry.block_overhead_s.source


def test_one_decode_run_labels_each_figure_fitted_or_assumed(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One Q4 decode run on one GPU: the q4 fraction and the block cost are fitted; the
    f16, q8 and default fractions, the hop, collective and compute figures are assumed."""
    assert main(["calibrate", "--from-llama-bench", str(LB / "readme_rtx4080.json")]) == 0
    out = capsys.readouterr().out
    rows = {
        line.split("│")[1].strip(): line.split("│")[3].strip()
        for line in out.splitlines()
        if line.count("│") == 4
    }
    assert rows["bandwidth fraction (q4)"] == rows["block overhead"] == "fitted"
    for name in (
        "bandwidth fraction (f16)",
        "bandwidth fraction (q8)",
        "bandwidth fraction (default)",
        "hop overhead",
        "collective overhead (per block, tensor parallel)",
        "compute efficiency",
    ):
        assert rows[name] == "assumed", name
    doc = json.loads((home / "calibration" / "llamacpp.json").read_text())
    entry = doc["devices"][0]
    assert entry["hop_overhead_s"]["provenance"] == "assumed"
    assert entry["hop_overhead_s"]["source"].startswith("prior (")
