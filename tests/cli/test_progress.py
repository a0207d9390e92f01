"""The progress bar of long runs (``plan``, ``plan --target``, ``serve``): shown once the
clock passes one second, on a terminal only, with a count of work done where the search
gives one, and removed before the answer or a one-line error.  A fake clock and a forced
terminal drive it; nothing here waits on the wall clock."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from stowplan import NodeDescriptor, Workload, serve
from stowplan.cli import main, progress
from stowplan.cli.progress import SHOW_AFTER_S, run_progress, search_progress
from stowplan.planner.cheapest import MAX_PLANNED, SearchProgress

GB = 10**9
ERASE = "\x1b[2K"
"""What rich writes last when it removes a transient bar."""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _terminal(width: int = 80) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=width), buf


def test_the_bar_appears_once_the_clock_passes_one_second_with_its_count():
    console, buf = _terminal()
    clock = Clock()
    with run_progress(console, "planning replicas", clock=clock, poll_s=None) as bar:
        clock.now += SHOW_AFTER_S - 0.01
        bar.advance(1, 10)
        assert buf.getvalue() == "" and not bar.shown
        clock.now += 0.01
        bar.poll()
        assert bar.shown and "planning replicas" in buf.getvalue()
        assert "1/10" in buf.getvalue()
        bar.advance(7, 10)
        assert "7/10" in buf.getvalue()
    assert buf.getvalue().endswith(ERASE)  # removed at the end


def test_a_run_under_one_second_writes_nothing():
    console, buf = _terminal()
    clock = Clock()
    with run_progress(console, "planning", clock=clock, poll_s=None) as bar:
        clock.now += SHOW_AFTER_S / 2
        bar.advance(5, 9)
        bar.poll()
    assert buf.getvalue() == ""


def test_a_console_that_is_no_terminal_never_shows_the_bar():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, width=80)
    clock = Clock()
    with run_progress(console, "planning", clock=clock, poll_s=None) as bar:
        clock.now += 60
        bar.advance(3, 4)
        bar.poll()
    assert buf.getvalue() == "" and not bar.shown


def test_a_target_search_counts_node_sets_planned_of_its_budget_within_80_columns():
    from stowplan.planner import cheapest

    console, buf = _terminal(80)
    clock = Clock()
    with search_progress(console, 20.0, clock=clock, poll_s=None):
        clock.now += 2
        report = cheapest._PROGRESS.get()
        assert report is not None
        report(SearchProgress(planned=3, budget=MAX_PLANNED, bound=1.5, best=2.25))
    text = buf.getvalue()
    assert "cheapest set for 20 tok/s, none below $1.50/h, best $2.25/h" in text
    assert f"3/{MAX_PLANNED}" in text  # the whole count is on the line: it fits 80 columns


@pytest.fixture
def shown_at_once(monkeypatch) -> io.StringIO:
    """Every bar of a CLI run shows at once, on a forced terminal of 80 columns."""
    console, buf = _terminal(80)
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr("stowplan.cli.plan_cmd.err_console", console)
    monkeypatch.setattr("stowplan.cli.serve_cmd.err_console", console)
    return buf


def _fleet(tmp_path, rows: list[str]):
    path = tmp_path / "fleet.yaml"
    path.write_text("".join(f"- {{{r}}}\n" for r in rows))
    return path


def test_plan_target_cli_shows_sets_planned_then_the_answer(tmp_path, capsys, shown_at_once):
    fleet = _fleet(
        tmp_path,
        [
            "id: a, gpu_name: RTX 3090, vram_bytes: 24GiB, price_per_hour: 0.2",
            "id: b, gpu_name: RTX 4090, vram_bytes: 24GiB, price_per_hour: 0.4",
            "id: c, gpu_name: RTX 3060, vram_bytes: 12GiB, price_per_hour: 0.1",
        ],
    )
    args = ["plan", "llama3.1:8b", "--nodes", str(fleet), "--target", "20tok/s", "--json"]
    assert main(args) == 0
    text = shown_at_once.getvalue()
    counts = [int(n) for n in re.findall(rf"(\d+)/{MAX_PLANNED}", text)]
    assert counts and counts == sorted(counts) and counts[-1] >= 1
    assert text.endswith(ERASE)
    assert capsys.readouterr().out.startswith("{")  # the answer, untouched by the bar


def test_a_refusal_after_a_search_is_one_line_once_the_bar_is_gone(tmp_path, capsys, shown_at_once):
    fleet = _fleet(tmp_path, ["id: g, gpu_name: RTX 3090, vram_bytes: 24GiB, price_per_hour: 0.2"])
    assert main(["plan", "llama3.1:8b", "--nodes", str(fleet), "--target", "5000tok/s"]) == 2
    assert "cheapest set for 5000 tok/s" in shown_at_once.getvalue()
    assert shown_at_once.getvalue().endswith(ERASE)  # removed before the error is printed
    err = capsys.readouterr().err
    assert err.startswith("stowplan: error: ") and err.count("\n") == 1


def test_a_target_beyond_reach_is_refused_in_one_line_naming_the_reach(
    tmp_path, capsys, shown_at_once
):
    fleet = _fleet(tmp_path, ["id: g, gpu_name: RTX 3090, vram_bytes: 24GiB, price_per_hour: 0.2"])
    assert main(["plan", "llama3.1:8b", "--nodes", str(fleet), "--target", "5000tok/s"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "stowplan: error: constraints unsatisfiable: no node set reaches 5000 tokens/s "
        "(target_tokens_per_s): no pipeline of the one node serves more than "
    )
    assert "(predicted with " in err and err.count("\n") == 1


def test_a_batch_that_does_not_fit_is_refused_in_one_line_once_the_bar_is_gone(
    tmp_path, capsys, shown_at_once
):
    fleet = _fleet(tmp_path, ["id: g, gpu_name: RTX 3090, vram_bytes: 24GiB"])
    assert main(["plan", "llama3.1:8b", "--nodes", str(fleet), "--batch", "4096"]) == 2
    assert "planning" in shown_at_once.getvalue()
    assert shown_at_once.getvalue().endswith(ERASE)
    err = capsys.readouterr().err
    assert err.startswith("stowplan: error: constraints unsatisfiable: a context of 8,192 ")
    assert "sequences fit 8,192 tokens each (--batch)" in err and err.count("\n") == 1


def test_a_plain_plan_shows_a_bar_without_a_count(tmp_path, shown_at_once):
    fleet = _fleet(tmp_path, ["id: g, gpu_name: RTX 3090, vram_bytes: 24GiB"])
    assert main(["plan", "llama3.1:8b", "--nodes", str(fleet), "--json"]) == 0
    text = shown_at_once.getvalue()
    assert "planning" in text and not re.search(r"\d+/\d+", text)


UNLIKE = [
    NodeDescriptor(
        id=f"n{i}",
        gpu_name="RTX 4090",
        vram_bytes=24 * GB,
        mem_bandwidth_gbps=bw,
        flops_estimate=160.0,
        price_per_hour=0.4,
    )
    for i, bw in enumerate([1000.0, 900.0, 800.0])
]
WORKLOAD = Workload(prompt_tokens=512, output_tokens=128, ttft_s=2.0, tpot_s=0.1)


def test_serve_reports_every_composition_it_tries():
    calls: list[tuple[int, int]] = []
    serve("llama3.2:1b", UNLIKE, WORKLOAD, progress=lambda d, t: calls.append((d, t)))
    # Three unlike nodes: 2³ − 1 = 7 compositions, counted from 0 to all of them.
    assert {t for _, t in calls} == {7}
    done = [d for d, _ in calls]
    assert done == sorted(done) and done[0] == 0 and done[-1] == 7


def test_serve_cli_shows_its_compositions_done_of_all(tmp_path, capsys, shown_at_once):
    rows = [
        f"id: {n.id}, gpu_name: RTX 4090, vram_bytes: 24GB, mem_bandwidth_gbps: "
        f"{n.mem_bandwidth_gbps}, flops_estimate: 160, price_per_hour: 0.4"
        for n in UNLIKE
    ]
    fleet = _fleet(tmp_path, rows)
    args = ["serve", "llama3.2:1b", "--nodes", str(fleet), "--prompt", "512", "--output", "128"]
    assert main([*args, "--ttft", "2s", "--tpot", "100ms", "--json"]) == 0
    text = shown_at_once.getvalue()
    assert "planning replicas" in text and "7/7" in text
    assert text.endswith(ERASE)
    assert capsys.readouterr().out.startswith("{")
