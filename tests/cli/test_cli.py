"""The CLI through its real entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stowplan import plan_from_json
from stowplan.cli import main
from tests.common.paths import EXAMPLES, FIXTURES

FLEET = str(EXAMPLES / "fleets" / "mixed-consumer.yaml")


def test_plan_json_is_a_valid_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "llama3.1:70b", "--nodes", FLEET, "--json"]) == 0
    p = plan_from_json(capsys.readouterr().out)
    assert p.num_blocks == 80 and p.model_name == "llama3.1:70b"


def test_plan_table_shows_every_stage(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "plan",
                "llama3.2:1b",
                "--nodes",
                str(EXAMPLES / "fleets" / "case-a.yaml"),
                "--min-stages",
                "2",
                "--strategy",
                "balance-by-vram",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "a0" in out and "a1" in out and "[0, 8)" in out


def test_plan_from_vast_offers(capsys: pytest.CaptureFixture[str]) -> None:
    offers = str(FIXTURES / "vastai" / "offer_rtx4090_1x_2024_raw.json")
    assert main(["plan", "llama3.1:8b", "--offers", offers, "--json"]) == 0
    p = plan_from_json(capsys.readouterr().out)
    assert [a.node_id for a in p.assignments] == ["offer-11684738"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["plan", "gpt-9", "--nodes", FLEET],
            "stowplan: error: MODEL='gpt-9': is not a known model; known: ",
        ),
        (
            ["plan", "llama3.1:8b"],
            "stowplan: error: --nodes=None: give a fleet file with --nodes or an offer list with --offers",
        ),
        (
            ["plan", "llama3.1:8b", "--nodes", FLEET, "--headroom", "1.5"],
            "stowplan: error: vram_headroom_frac=1.5: must be a number in [0, 1)",
        ),
        (
            ["plan", "llama3.1:405b", "--nodes", str(EXAMPLES / "fleets" / "case-d.yaml")],
            "stowplan: error: no node can hold the largest indivisible component (4202725376 bytes)",
        ),
        (
            ["plan", "llama3.1:8b", "--nodes", "/nonexistent.yaml"],
            "stowplan: error: file='/nonexistent.yaml': cannot be read (No such file or directory)",
        ),
        (
            ["plan", "llama3.1:8b", "--nodes", FLEET, "--min-stages", "x"],
            "stowplan: error: Invalid value for '--min-stages'",
        ),
        (
            ["stage-env", "/nonexistent.json"],
            "stowplan: error: PLAN='/nonexistent.json': cannot be read (No such file or directory)",
        ),
    ],
)
def test_errors_are_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert err.count("\n") == 1 and "Traceback" not in err


def test_stage_env_prints_each_stage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["plan", "llama3.1:70b", "--nodes", FLEET, "--json", "--strategy", "balance-by-vram"])
        == 0
    )
    path = tmp_path / "plan.json"
    path.write_text(capsys.readouterr().out)
    assert main(["stage-env", str(path), "--json"]) == 0
    envs = json.loads(capsys.readouterr().out)
    p = plan_from_json(path.read_text())
    assert [e["PLAN_STAGE_BLOCKS"] for e in envs] == [
        f"{a.block_range[0]},{a.block_range[1]}" for a in p.assignments
    ]


def test_models_lists_the_known_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["llama3.1:8b"]["params"] == 8_030_261_248


def test_console_script_exits_2_without_a_traceback() -> None:
    exe = Path(sys.executable).parent / "stowplan"
    proc = subprocess.run(
        [str(exe), "plan", "nope", "--nodes", FLEET], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.startswith("stowplan: error: MODEL='nope'") and "Traceback" not in proc.stderr
    )


def test_node_ids_with_brackets_are_printed_as_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = tmp_path / "fleet.json"
    fleet.write_text(
        json.dumps(
            [
                {"id": f"n[{tag}]{i}", "gpu_name": "RTX 4090", "vram_bytes": "24GiB"}
                for i, tag in enumerate(("red", "bold"))
            ]
        )
    )
    args = ["plan", "llama3.1:8b", "--nodes", str(fleet), "--min-stages", "2"]
    assert main([*args, "--strategy", "balance-by-vram"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("──"))
    stage_rows = [line.split() for line in lines[rule + 1 : rule + 3]]
    assert [c[0] for c in stage_rows] == ["0", "1"]
    assert [c[1] for c in stage_rows] == ["n[bold]1", "n[red]0"]
    bars = [line.split()[0] for line in lines if "█" in line and "GiB" in line]
    assert bars == ["n[bold]1", "n[red]0"]


def test_an_unwritable_html_path_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "missing-dir-is-a-file"
    target.write_text("")
    html = target / "report.html"
    assert main(["plan", "llama3.2:1b", "--nodes", FLEET, "--html", str(html)]) == 2
    assert capsys.readouterr().err == (
        f"stowplan: error: --html='{html}': cannot be written (File exists)\n"
    )


@pytest.mark.parametrize("argv", [[], ["cluster"]])
def test_no_command_prints_the_help_only_and_exits_0(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "Usage: stowplan" in out
    assert err == ""
