"""Offer files wherever a fleet file goes, and the offer table."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from stowplan.cli import main
from stowplan.files.fleets import load_nodes, load_offers
from tests.common.paths import ROOT

REAL_OFFER = ROOT / "tests" / "fixtures" / "vastai" / "offer_rtx4090_1x_2024_raw.json"


def _offers(tmp_path: Path) -> Path:
    [real] = json.loads(REAL_OFFER.read_text())
    four = {**real, "id": 99000001, "num_gpus": 4, "gpu_total_ram": 4 * real["gpu_ram"]}
    four["dph_total"] = 4 * real["dph_total"]
    path = tmp_path / "offers.json"
    path.write_text(json.dumps([real, four]))
    return path


def test_a_fleet_file_option_takes_an_offer_file(tmp_path):
    path = _offers(tmp_path)
    assert load_nodes(path) == load_offers(path)
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"offers": json.loads(path.read_text())}))
    assert load_nodes(wrapped) == load_offers(path)


def test_export_takes_the_offer_file_the_plan_was_made_from(tmp_path, capsys):
    offers = _offers(tmp_path)
    assert main(["plan", "llama3.1:70b-q4_0", "--offers", str(offers), "--json"]) == 0
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(capsys.readouterr().out)
    assert main(["export", str(plan_path), "--to", "vllm", "--nodes", str(offers), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "vllm"
    assert main(["plan", "llama3.1:70b-q4_0", "--nodes", str(offers), "--json"]) == 0
    assert capsys.readouterr().out == plan_path.read_text()


def test_the_plan_table_shows_an_offer_s_gpu_count_and_whole_id(tmp_path, capsys):
    from stowplan.plan import plan_from_json
    from stowplan.report.terminal import render_plan

    offers = _offers(tmp_path)
    args = ["plan", "llama3.1:70b-q4_0", "--offers", str(offers), "--min-stages", "2", "--json"]
    assert main(args) == 0
    p = plan_from_json(capsys.readouterr().out)
    for width in (160, 80):
        console = Console(file=io.StringIO(), width=width, highlight=False)
        render_plan(p, load_offers(offers), console)
        table = console.file.getvalue().split("\n\n")[0]  # type: ignore[attr-defined]
        assert max(len(line) for line in table.splitlines()) <= width
        flat = "".join(table.split())  # a folded id's lines joined
        assert "offer-99000001" in flat and "offer-11684738" in flat, table
        assert "tp4" in table, table  # the offer's 4 GPUs, one tensor-parallel stage
