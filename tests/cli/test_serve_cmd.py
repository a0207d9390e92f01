"""``stowplan serve``: the table at 80 columns, --json = the library's ServePlan, errors."""

from __future__ import annotations

import pytest

from stowplan import Constraints, ServePlan, Workload, load_nodes, resolve_model, serve
from stowplan.cli import main
from stowplan.cli.calibration_opts import cli_calibration
from tests.common.paths import EXAMPLES

FLEET = str(EXAMPLES / "fleets" / "mixed-consumer.yaml")
ARGS = ["llama3.1:8b", "--nodes", FLEET, "--prompt", "2048", "--output", "256", "--ttft", "1s"]


def test_the_cli_gives_the_librarys_answer(capsys):
    assert main(["serve", *ARGS, "--tpot", "20tok/s", "--json"]) == 0
    printed = ServePlan.from_json(capsys.readouterr().out)
    w = Workload(prompt_tokens=2048, output_tokens=256, ttft_s=1.0, tpot_s=0.05)
    c = Constraints(calibration=cli_calibration(None, None))
    lib = serve(resolve_model("llama3.1:8b"), load_nodes(FLEET), w, c)
    assert printed == lib
    assert printed.users == sum(r.users for r in printed.replicas) > 0


def test_the_table_fits_80_columns_and_shows_every_replica(capsys):
    assert main(["serve", *ARGS, "--tpot", "50ms"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    c = Constraints(calibration=cli_calibration(None, None))
    w = Workload(prompt_tokens=2048, output_tokens=256, ttft_s=1.0, tpot_s=0.05)
    lib = serve("llama3.1:8b", load_nodes(FLEET), w, c)
    for r in lib.replicas:
        row = next(line for line in out.splitlines() if f" {r.node_ids[0]} " in line)
        assert f" {r.users:,} " in row and r.binding.value in row
    assert f"total: {lib.users:,} users" in out
    assert "certificate (users):" in out


def test_a_users_target_prints_the_cheapest_nodes(capsys):
    assert main(["serve", *ARGS, "--users", "40", "--json"]) == 0
    sp = ServePlan.from_json(capsys.readouterr().out)
    assert sp.users >= 40 and sp.certificate.objective.value == "price"
    assert sp.certificate.bound <= sp.price_per_hour


def test_a_rate_target_reads_requests_per_second(capsys):
    assert main(["serve", *ARGS, "--rate", "120/min", "--json"]) == 0
    sp = ServePlan.from_json(capsys.readouterr().out)
    assert sp.rate_per_s >= 2.0 and sp.workload.rate_per_s == 2.0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--tpot", "fast"], "--tpot='fast': must be a time per token > 0"),
        (["--ttft", "0s"], "--ttft='0s': must be a time > 0"),
        (["--rate", "5/s", "--users", "3"], "rate_per_s=5.0: cannot be set with users=3"),
        (["--prompt", "0"], "prompt_tokens=0: must be an integer"),
        (["--ttft", "1ms"], "no replica of the nodes serves one request"),
        (["--users", "100000"], "the nodes serve at most"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(extra, message, capsys):
    assert main(["serve", *ARGS, *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_export_of_a_serve_plan_sizes_every_replica(tmp_path, capsys):
    assert main(["serve", *ARGS, "--json"]) == 0
    path = tmp_path / "serve.json"
    path.write_text(capsys.readouterr().out)
    sp = ServePlan.from_json(path.read_text())
    assert main(["export", str(path), "--to", "vllm"]) == 0
    out = capsys.readouterr().out
    for i, r in enumerate(sp.replicas):
        assert f"# replica {i} on {' '.join(r.node_ids)}" in out
        assert f"--max-num-seqs {r.users}" in out
    assert main(["export", str(path), "--to", "vllm", "--json"]) == 0
    assert '"replicas"' in capsys.readouterr().out
