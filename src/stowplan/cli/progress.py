"""A progress bar for runs that take long (``plan``, ``plan --target``, ``serve``), shown
once a run passes one second, on a terminal only.

:func:`run_progress` yields a :class:`RunBar`: the search tells it how far it is
(:meth:`RunBar.advance`: work done and total, when the search can count them) and a
poller calls :meth:`RunBar.poll`, which shows the bar once the clock says
``show_after_s`` has passed.  The clock and the poller are parameters, so a test drives
both by hand.  The bar is transient: when the block ends it is removed, so what follows
— the answer, or a one-line error — is all that stays.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Column

from stowplan.planner.cheapest import SearchProgress, reporting_progress

__all__ = ["POLL_S", "SHOW_AFTER_S", "RunBar", "describe", "run_progress", "search_progress"]

SHOW_AFTER_S = 1.0
"""A run that takes longer than this shows its progress bar."""
POLL_S = 0.1
"""How often the poller looks at the clock and redraws the bar, seconds."""


class RunBar:
    """One run's bar: hidden until :meth:`poll` finds ``show_after_s`` passed (and the
    console is a terminal), then redrawn on every call.  Thread-safe."""

    def __init__(
        self,
        console: Console,
        label: str,
        *,
        show_after_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._start = clock()
        self._show_after_s = SHOW_AFTER_S if show_after_s is None else show_after_s
        self._enabled = console.is_interactive
        self._lock = threading.Lock()
        self._shown = False
        self._closed = False
        self._bar = Progress(
            SpinnerColumn(),
            # The description gives way first: the count and the time always show whole.
            TextColumn(
                "{task.description}",
                table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis"),
            ),
            BarColumn(bar_width=12),
            MofNCompleteColumn(table_column=Column(no_wrap=True, min_width=9)),
            TimeElapsedColumn(table_column=Column(no_wrap=True, min_width=7)),
            console=console,
            transient=True,
            auto_refresh=False,
        )
        self._task = self._bar.add_task(label, total=None)

    @property
    def shown(self) -> bool:
        """Whether the bar has been drawn."""
        return self._shown

    def advance(self, done: int, total: int | None = None, description: str | None = None) -> None:
        """The run has done ``done`` of ``total`` units of work (None: not known)."""
        with self._lock:
            if total is not None:
                self._bar.update(self._task, total=total)
            self._bar.update(self._task, completed=done)
            if description is not None:
                self._bar.update(self._task, description=description)
        self.poll()

    def poll(self) -> None:
        """Show the bar once ``show_after_s`` has passed; redraw it when shown."""
        with self._lock:
            if self._closed or not self._enabled:
                return
            if not self._shown:
                if self._clock() - self._start < self._show_after_s:
                    return
                self._bar.start()
                self._shown = True
            self._bar.refresh()

    def close(self) -> None:
        """Remove the bar (a bar never shown writes nothing)."""
        with self._lock:
            if self._shown and not self._closed:
                self._bar.stop()
            self._closed = True


@contextmanager
def run_progress(
    console: Console,
    label: str,
    *,
    show_after_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    poll_s: float | None = POLL_S,
) -> Iterator[RunBar]:
    """Within the block, a :class:`RunBar` labelled ``label`` on ``console`` (shown after
    ``show_after_s``, default :data:`SHOW_AFTER_S`); a poller
    thread calls :meth:`RunBar.poll` every ``poll_s`` seconds (None: no poller, the
    caller polls).  The bar is removed when the block ends, however it ends."""
    bar = RunBar(console, label, show_after_s=show_after_s, clock=clock)
    bar.poll()  # shows at once only when show_after_s is 0
    stop = threading.Event()
    poller: threading.Thread | None = None
    if poll_s is not None and console.is_interactive:
        interval = poll_s

        def loop() -> None:
            while not stop.wait(interval):
                bar.poll()

        poller = threading.Thread(target=loop, name="stowplan-progress", daemon=True)
        poller.start()
    try:
        yield bar
    finally:
        stop.set()
        if poller is not None:
            poller.join()
        bar.close()


def describe(target: float, p: SearchProgress) -> str:
    """One short line: the target, the price no set goes below and the best found (the
    bar's count is the node sets planned of the search's budget)."""
    parts = [f"cheapest set for {target:g} tok/s"]
    if p.bound is not None:
        parts.append(f"none below ${p.bound:.2f}/h")
    if p.best is not None:
        parts.append(f"best ${p.best:.2f}/h")
    return ", ".join(parts)


@contextmanager
def search_progress(
    console: Console,
    target: float | None,
    *,
    show_after_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    poll_s: float | None = POLL_S,
) -> Iterator[RunBar]:
    """:func:`run_progress` of a plan search: with a ``target`` (tokens/s) the node sets
    planned of the search's budget (:mod:`stowplan.planner.cheapest` reports them);
    without one, the time the search has taken."""
    label = "planning" if target is None else f"cheapest set for {target:g} tok/s"
    with run_progress(console, label, show_after_s=show_after_s, clock=clock, poll_s=poll_s) as bar:
        if target is None:
            yield bar
            return

        def report(p: SearchProgress) -> None:
            bar.advance(p.planned, p.budget, describe(target, p))

        with reporting_progress(report):
            yield bar
