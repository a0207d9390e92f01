"""The interior stages of the throughput search's capacity test, counted by capacity.

A capacity test at a bottleneck ``T`` asks whether a first stage, a last stage and at
most ``k`` interior stages on distinct nodes hold every block.  The interior
capacities are kept by value (largest first) with their running counts and sums, so
the ``k`` largest sum and "how many are at least v" are two bisections, and a pair of
ends is tested by leaving its own two nodes out of the interior.  The pure path
(:mod:`~stowplan.planner.strategies.throughput`) and the array path
(:mod:`~stowplan.planner.strategies.capacity_arrays`) share it.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence

__all__ = ["Interior"]


class Interior:
    """Interior capacities by value: ``values`` descending, ``reach[j]`` how many are at
    least ``values[j]``, ``sums[j]`` their sum."""

    def __init__(self, values: Sequence[int], reach: Sequence[int], sums: Sequence[int]) -> None:
        self.values, self.reach, self.sums = list(values), list(reach), list(sums)
        self.size = self.reach[-1] if self.reach else 0
        self._descending = [-v for v in self.values]

    def top(self, k: int) -> int:
        """Sum of the ``k`` largest interior capacities."""
        if k <= 0:
            return 0
        reach, sums, values = self.reach, self.sums, self.values
        j = bisect_left(reach, k)
        if j >= len(values):
            return sums[-1] if sums else 0
        return (sums[j - 1] if j else 0) + (k - (reach[j - 1] if j else 0)) * values[j]

    def at_least(self, v: int) -> int:
        """How many interior capacities are ≥ v (v > 0)."""
        j = bisect_right(self._descending, -v)
        return self.reach[j - 1] if j else 0

    def pair_passes(
        self, first: int, last: int, mid_first: int, mid_last: int, k_inner: int, nb: int
    ) -> bool:
        """Whether ends of capacities ``first`` and ``last`` (whose nodes hold
        ``mid_first`` and ``mid_last`` as interior stages, left out of the interior)
        and the ``k_inner`` largest other interior capacities hold ``nb`` blocks."""
        removed = sorted((m for m in (mid_first, mid_last) if m > 0), reverse=True)
        positions = []
        for n_, v in enumerate(removed):
            same = sum(1 for w in removed[: n_ + 1] if w == v)
            positions.append((self.at_least(v) - same, v))
        end = min(k_inner, self.size)
        excluded = 0
        for pos, v in sorted(positions):
            if pos < end:
                excluded += v
                end = min(end + 1, self.size)
        return first + last + self.top(end) - excluded >= nb
