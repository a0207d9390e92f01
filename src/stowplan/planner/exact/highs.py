"""HiGHS through ``scipy.optimize.milp``, its native output kept off the standard output.

HiGHS writes some diagnostics from its C++ code straight to the process's standard
output, whatever its display options (``transformNewIntegerFeasibleSolution`` lines, on
some mixed-integer problems): a plan written there (``stowplan plan --json``) would no
longer parse.  :func:`milp` runs the solve with file descriptor 1 pointed at the
standard error, and restores it after.  SciPy is imported only when a MILP is solved
(the ``exact`` extra).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["milp", "native_output_to_stderr"]


@contextmanager
def native_output_to_stderr() -> Iterator[None]:
    """While the block runs, what native code writes to file descriptor 1 goes to file
    descriptor 2 (Python's own buffered output is flushed first, so it keeps its place).
    Where either descriptor cannot be duplicated the block runs as it is."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    try:
        saved = os.dup(1)
    except OSError:
        yield
        return
    try:
        os.dup2(2, 1)
    except OSError:
        os.close(saved)
        yield
        return
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def milp(*args: Any, **kwargs: Any) -> Any:
    """``scipy.optimize.milp(*args, **kwargs)``, its native output on the standard error.
    Raises ImportError without SciPy."""
    from scipy.optimize import milp as solve

    with native_output_to_stderr():
        return solve(*args, **kwargs)
