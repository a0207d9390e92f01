"""A number per distinct value of a MoE block (its copies, loads or pairs), so that the
figures of blocks alike are worked out once."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ValueNumbers"]


class ValueNumbers:
    """A number per distinct value (a block's copies, loads or pairs): equal values, equal
    numbers, so that blocks alike are worked out once.

    An object is found by identity first (blocks alike often share one), by value
    otherwise; the objects numbered are kept, so that no other object takes their
    identity meanwhile, and must not change while they are numbered.
    """

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[object, int]] = {}
        self._by_value: dict[tuple[object, ...], int] = {}

    def __call__(self, x: Sequence[object]) -> int:
        """The number of ``tuple(x)``."""
        got = self._by_id.get(id(x))
        if got is not None and got[0] is x:
            return got[1]
        no = self.value(tuple(x))
        self._by_id[id(x)] = (x, no)
        return no

    def holders(self, x: Sequence[Sequence[int]]) -> int:
        """The number of a block's copies (``tuple(map(tuple, x))``)."""
        got = self._by_id.get(id(x))
        if got is not None and got[0] is x:
            return got[1]
        no = self.value(tuple(map(tuple, x)))
        self._by_id[id(x)] = (x, no)
        return no

    def value(self, x: tuple[object, ...]) -> int:
        """The number of a value."""
        return self._by_value.setdefault(x, len(self._by_value))
