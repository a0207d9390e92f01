"""Bisection over the integers: the largest value a monotone test admits."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["last_true"]


def last_true(test: Callable[[int], bool], lo: int, hi: int) -> int:
    """The largest ``x`` in ``[lo, hi]`` for which ``test`` holds, ``test(lo)`` holding (or
    taken to) and ``test`` false above some point."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if test(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
