"""Both views show the GPUs each stage runs on, and the terminal table fits 80 columns."""

from __future__ import annotations

from rich.console import Console

from stowplan import Constraints, load_nodes, lookup, plan
from stowplan.model import NodeDescriptor
from stowplan.report.html import render_html
from stowplan.report.segments import node_memory
from stowplan.report.terminal import render_plan, used_of
from tests.common.paths import EXAMPLES
from tests.common.plans import make_tp_plan
from tests.common.report_sample import sample_plan

TWO_H100 = EXAMPLES / "fleets" / "two-h100-nodes.yaml"
SPLIT = make_tp_plan([("n0", (0, 1, 2, 3), 20), ("n0", (4, 5, 6, 7), 10), ("n1", (0,), 2)])
SPLIT_FLEET = [
    NodeDescriptor(
        id=node_id,
        gpu_name="H100 SXM",
        vram_bytes=gpus * 80 * 10**9,
        flops_estimate=989.0 * gpus,
        link_mbps=400_000,
        num_gpus=gpus,
    )
    for node_id, gpus in (("n0", 8), ("n1", 2))
]


def _text(p, fleet, width: int = 80) -> str:  # type: ignore[no-untyped-def]
    console = Console(width=width, record=True, color_system=None)
    render_plan(p, fleet, console)
    return console.export_text()


def _table_rows(text: str, count: int) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("──")) + 1
    return lines[start : start + count]


def test_the_405b_stage_table_shows_each_stages_gpus_on_one_line_within_80_columns() -> None:
    fleet = load_nodes(TWO_H100)
    p = plan(lookup("llama3.1:405b"), fleet, Constraints())  # type: ignore[arg-type]
    text = _text(p, fleet)
    rows = _table_rows(text, 2)
    assert [r.split()[:4] for r in rows] == [
        ["0", "n0", "gpu0-7", "tp8"],
        ["1", "n1", "gpu0-7", "tp8"],
    ]
    header = text.splitlines()[1]
    assert header.split() == [
        "stage",
        "node",
        "gpu",
        "blocks",
        "anchors",
        "vram",
        "used/usable",
        "util",
    ]
    assert all(len(ln) <= 80 for ln in text.splitlines()[:4])


def test_a_split_node_has_one_row_and_one_bar_per_gpu_group() -> None:
    text = _text(SPLIT, SPLIT_FLEET)
    rows = _table_rows(text, 3)
    assert [" ".join(r.split()[1:4]) for r in rows] == [
        "n0 gpu0-3 tp4",
        "n0 gpu4-7 tp4",
        "n1 gpu0 H100",
    ]
    assert all(len(r) <= 80 for r in rows)
    bars = [ln.split()[:2] for ln in text.splitlines() if "█" in ln and "GiB/" in ln]
    assert bars == [["n0", "gpu0-3"], ["n0", "gpu4-7"], ["n1", "gpu0"]]
    # Each bar is the memory of the stage's GPUs: half of n0, half of n1.
    assert [m.capacity_bytes for m in node_memory(SPLIT, SPLIT_FLEET)] == [
        320 * 10**9,
        320 * 10**9,
        80 * 10**9,
    ]


def test_plans_of_single_gpu_nodes_keep_their_node_names_and_fit_80_columns() -> None:
    p, fleet = sample_plan()
    text = _text(p, fleet)
    rows = _table_rows(text, p.num_stages)
    assert [r.split()[1] for r in rows] == [a.node_id for a in p.assignments]
    assert all(len(r) <= 80 for r in rows)
    assert all(m.gpus == "" for m in node_memory(p, fleet))


def test_used_and_usable_share_one_unit_when_they_can() -> None:
    assert used_of(300 << 30, 476 << 30) == "300.0/476.0 GiB"
    assert used_of(900 << 20, 2 << 30) == "900.0 MiB/2.0 GiB"
    assert used_of(900 << 20, None) == "900.0 MiB"


def test_the_html_report_names_every_stages_gpus() -> None:
    page = render_html(SPLIT, SPLIT_FLEET)
    assert "<b>n0 gpu0-3</b><span>stage 0 · H100 SXM · tp4</span>" in page
    assert "<b>n1 gpu0</b><span>stage 2 · H100 SXM</span>" in page
    assert "pipeline n0 gpu0-3 tp4 → n0 gpu4-7 tp4 → n1 gpu0" in page
    assert "<title>stowplan · llama3.1:8b on 2 nodes (9 GPUs, 3 stages)</title>" in page
    assert "<div class='card'><b>9</b><span>GPUs</span></div>" in page


def test_unused_nodes_and_idle_gpus_are_listed() -> None:
    from stowplan import Constraints, NodeDescriptor, plan
    from stowplan.models.known import lookup
    from stowplan.report.terminal import idle_note

    model = lookup("llama3.1:8b")
    assert model is not None
    big = NodeDescriptor(
        id="big", gpu_name="H100 SXM", vram_bytes=3 * 80 * 10**9, link_mbps=1000, num_gpus=3
    )
    small = NodeDescriptor(id="small", gpu_name="RTX 3060", vram_bytes=2 * 10**9, link_mbps=1000)
    p = plan(model, [big, small], Constraints(tensor_parallel=2))
    note = idle_note(p, [big, small])
    assert note is not None
    assert note.startswith("unused: small, big GPU 2 (") and "with them" in note


def test_the_html_report_names_fields_for_people_with_their_units() -> None:
    from stowplan import Constraints, NodeDescriptor, plan
    from stowplan.models.known import lookup
    from stowplan.report.html import render_html

    model = lookup("llama3.1:8b")
    assert model is not None
    node = NodeDescriptor(id="a", gpu_name="RTX 4090", vram_bytes=24 * 2**30, link_mbps=1000)
    page = render_html(plan(model, [node], Constraints()), [node])
    assert "time per token (one stream)" in page and "gap to the bound" in page
    assert "time_per_token_s" not in page and "e-16" not in page
    assert "0.00%" in page
