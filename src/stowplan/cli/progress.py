"""A progress bar for cheapest-set searches (``plan --target``), shown once one runs long."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from stowplan.planner.cheapest import SearchProgress, reporting_progress

__all__ = ["SHOW_AFTER_S", "search_progress"]

SHOW_AFTER_S = 1.0
"""A search that takes longer than this shows its progress bar."""


def describe(target: float, p: SearchProgress) -> str:
    """One line: sets planned, the price no set goes below and the best price found."""
    parts = [f"cheapest node set for {target:g} tokens/s: {p.planned} set(s) planned"]
    if p.bound is not None:
        parts.append(f"none below ${p.bound:.2f}/h")
    if p.best is not None:
        parts.append(f"best ${p.best:.2f}/h")
    return ", ".join(parts)


@contextmanager
def search_progress(
    console: Console, target: float | None, *, show_after_s: float = SHOW_AFTER_S
) -> Iterator[None]:
    """Within the block, a search for ``target`` tokens/s past ``show_after_s`` shows a bar
    on ``console`` (removed when it ends).  Without a target nothing is shown."""
    if target is None:
        yield
        return
    bar = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    task = bar.add_task(f"cheapest node set for {target:g} tokens/s", total=None)
    lock = threading.Lock()
    done = False

    def show() -> None:
        with lock:
            if not done:
                bar.start()

    timer = threading.Timer(show_after_s, show)
    timer.daemon = True
    timer.start()
    try:
        with reporting_progress(lambda p: bar.update(task, description=describe(target, p))):
            yield
    finally:
        timer.cancel()
        with lock:
            done = True
            bar.stop()
