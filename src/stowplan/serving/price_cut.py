"""For a target: which compositions cannot lower the price of the cheapest packing, and
need no replica planned.

A composition ``c`` planned gives at most one option: a replica on a sub-multiset ``s``
of its nodes (the planner may leave nodes out), or copies side by side on its one
node.  It costs ``price(s)`` and serves at most ``c``'s relaxation bound ``top(c)``
(:mod:`~stowplan.serving.bounds`, which holds on every subset), and, when ``c`` has
several nodes (a pipeline, never copies side by side), at most what ``s`` itself
allows: the requests its pooled memory holds beside one copy of the weights (the
memory term of that bound), and that bound on ``s``'s own nodes.
:func:`holding_front` lists the (price, most served) pairs of every ``s`` that holds
the weights and one request.

Every packing using that option serves the rest of the target, at least ``target −
value``, with other options: each is an option already planned (its own price and
value) or the option of a composition not planned, no cheaper and serving no more
than some pair of that composition's front.  Counting values in whole units rounded
up (the need rounded up too, as a sum of whole units) only lowers the least price of
covering the rest.

A packing takes an option at most as many times as the fleet holds disjoint copies of
its nodes: an option planned on ``n_k`` nodes of each class ``k`` at most ``min_k
⌊size_k / n_k⌋`` times, and the option of a composition not planned (on some of its
nodes, so on a node of one of its classes at least) at most ``max_k size_k`` times over
the classes the composition takes.  Each option of a packing is a different item of
the covering (an option planned stands for itself; one found later comes from a
composition of its own, planned once), so :meth:`PriceCut.rest_price` — a covering
over those pairs, each at most its count of times (several pairs of one composition's
front each at its count: more than any packing takes) — is at most the price of the
rest of every such packing.  Where every offer is a class of its own, the counts are
what stop the covering from taking the cheapest replica three times over.

Hence every packing through ``c`` costs at least the least, over ``c``'s front, of
``price + rest_price(target − value)``; when that is not below the price of a packing
already found among the options planned (the incumbent), ``c`` cannot make the answer
cheaper and is not planned.  The answer then costs no more than the one planning every
composition would find.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import product

from stowplan.quantities.limits import MAX_BATCH
from stowplan.serving.compositions import Composition

__all__ = [
    "COVER_STEPS",
    "ENUMERATE_LIMIT",
    "ROUNDING",
    "TIE",
    "ClassMemory",
    "Pair",
    "PriceCut",
    "front",
    "holding_front",
]

ENUMERATE_LIMIT = 4096
"""Up to this many sub-multisets a composition's front is exact; beyond, one pair: the
fractional covering of the memory (cheaper than any that holds the weights) and the
composition's bound."""

COVER_STEPS = 2000
"""The covering's dynamic programme counts in units of one user up to this many users;
beyond (and for requests/s) in units of the target over this many, each pair's value
rounded up to whole units (it then serves at least as much: the price stays a lower
bound)."""

ROUNDING = 1e-9
"""Units a quotient is moved towards the safe side before rounding (a value up, a need
down), so that floating-point division cannot make a bound too high."""

TIE = 1e-12
"""Relative slack when comparing a lower bound with the incumbent: sums of the same
prices in another order may differ by rounding; a composition whose packings cost the
incumbent's price up to that rounding improves nothing."""

Pair = tuple[float, float]
"""(price, most served)."""


@dataclass(frozen=True, slots=True)
class ClassMemory:
    """Per class of nodes, a node's price and usable bytes; what a replica needs."""

    prices: tuple[float, ...]
    usable: tuple[float, ...]
    weight_bytes: float
    kv_per_request: float

    def users(self, held: float) -> float:
        """Requests ``held`` usable bytes hold beside one copy of the weights."""
        room = held - self.weight_bytes
        if room < 0:
            return 0.0
        if self.kv_per_request <= 0:
            return float(MAX_BATCH)
        return float(min(MAX_BATCH, math.floor(room / self.kv_per_request)))


def holding_front(
    combo: Composition,
    memory: ClassMemory,
    top: float,
    *,
    users: bool,
    cap: Callable[[Composition], float] | None = None,
) -> list[Pair]:
    """(price, most served) of the sub-multisets of ``combo`` that hold the weights and
    one request's KV, only pairs no other beats in both; empty when none holds them.

    The served is ``top`` (users, or requests/s); for a composition of several nodes (a
    pipeline on a sub-multiset, never copies side by side) also at most what the
    sub-multiset holds: its memory's requests (``users``) and ``cap(sub)`` when given
    (a relaxation bound of the sub-multiset's own nodes).  One node: its own price and
    ``top``."""
    usable, prices = memory.usable, memory.prices
    if sum(combo) == 1:  # one node: its copies side by side are bounded by ``top`` alone
        return [(sum(c * p for c, p in zip(combo, prices, strict=True)), top)]
    need = memory.weight_bytes + memory.kv_per_request
    if sum(c * u for c, u in zip(combo, usable, strict=True)) < need:
        return []
    if math.prod(c + 1 for c in combo) > ENUMERATE_LIMIT:
        return [(_fractional_price(combo, memory, need), top)]
    pairs = []
    for sub in product(*(range(c + 1) for c in combo)):
        held = sum(s * u for s, u in zip(sub, usable, strict=True))
        if held < need:
            continue
        served = min(top, memory.users(held)) if users else top
        if cap is not None and served > 0:
            served = min(served, cap(sub))
        pairs.append((sum(s * p for s, p in zip(sub, prices, strict=True)), served))
    return front(pairs)


def _fractional_price(combo: Composition, memory: ClassMemory, need: float) -> float:
    """The least price of ``need`` bytes out of ``combo``'s nodes taken fractionally,
    cheapest bytes first: at most the price of any sub-multiset holding them."""
    left, paid = need, 0.0
    usable, prices = memory.usable, memory.prices
    for k in sorted(
        (k for k, c in enumerate(combo) if c > 0 and usable[k] > 0),
        key=lambda k: prices[k] / usable[k],
    ):
        take = min(float(combo[k]), left / usable[k])
        paid += take * prices[k]
        left -= take * usable[k]
        if left <= 0:
            break
    return paid


class PriceCut:
    """The lower bound of the module on every packing through a composition, against the
    incumbent's price (see the module); the caller gives the pairs the rest of a packing
    may take (:meth:`update`) and the packings it finds (:meth:`found`)."""

    def __init__(self, target: float, *, integral: bool) -> None:
        self._target = target
        self._incumbent = math.inf
        self._rest: list[float] = [0.0]
        exact = integral and target <= COVER_STEPS
        self._unit = 1.0 if exact else max(target, 1e-300) / COVER_STEPS
        self._steps = math.ceil(target) if exact else COVER_STEPS

    @property
    def incumbent(self) -> float:
        """The price of the cheapest packing found so far (inf before one)."""
        return self._incumbent

    def found(self, price: float) -> None:
        """A packing reaching the target at ``price`` exists among the options planned."""
        self._incumbent = min(self._incumbent, price)

    def update(self, pairs: Iterable[Pair], limits: Sequence[int] | None = None) -> None:
        """The pairs the rest of a packing may take changed: cover the target again;
        with ``limits``, pair ``i`` at most ``limits[i]`` times (see the module)."""
        self._rest = self._covering(pairs, limits)

    def _covering(self, pairs: Iterable[Pair], limits: Sequence[int] | None) -> list[float]:
        if limits is None:
            units = [(p, self._units(v)) for p, v in front(pairs)]
            return _cover(units, self._steps)
        counted: dict[tuple[float, int], int] = {}
        for (p, v), most in zip(pairs, limits, strict=True):
            if v > 0 and most > 0:
                key = (p, self._units(v))
                counted[key] = counted.get(key, 0) + most
        return _cover_limited([(p, u, most) for (p, u), most in counted.items()], self._steps)

    def rest_price(self, need: float) -> float:
        """At most the price of any options serving ``need`` more (users, or requests/s):
        of every packing of them, whose values in whole units (rounded up) reach the
        need in whole units (rounded up, as their sum is a whole number)."""
        if need <= 0:
            return 0.0
        if self._unit == 1.0:
            steps = math.ceil(need)
        else:
            steps = max(0, math.ceil(need / self._unit - ROUNDING))
        return self._rest[min(len(self._rest) - 1, steps)]

    def _units(self, value: float) -> int:
        """``value`` in whole units, rounded up."""
        if self._unit == 1.0:
            return math.ceil(value)
        return math.ceil(value / self._unit + ROUNDING)

    def floor(self, pairs: Sequence[Pair]) -> float:
        """The least price of a packing through a composition whose options are no
        cheaper and serve no more than some pair of ``pairs`` (its
        :func:`holding_front`); inf without pairs."""
        return min(
            (p + self.rest_price(self._target - v) for p, v in pairs),
            default=math.inf,
        )

    def beats(self, floor: float) -> bool:
        """Whether packings costing at least ``floor`` are no cheaper than the incumbent."""
        return math.isfinite(self._incumbent) and floor >= self._incumbent * (1 - TIE)

    def cuts(self, pairs: Sequence[Pair]) -> bool:
        """Whether a composition of front ``pairs`` cannot give a packing cheaper than the
        incumbent: then it is not planned."""
        return self.beats(self.floor(pairs))

    def least_cover(self, pairs: Iterable[Pair], limits: Sequence[int] | None = None) -> float:
        """At most the price of any packing of options no better than ``pairs`` reaching
        the target (below the price of the cheapest packing of them, which a packing
        programme would make the incumbent); with ``limits``, pair ``i`` taken at most
        ``limits[i]`` times."""
        return self._covering(pairs, limits)[-1]


def front(pairs: Iterable[Pair]) -> list[Pair]:
    """The pairs no other beats in both price and served (cheaper first); pairs serving
    nothing are dropped."""
    out: list[Pair] = []
    for price, value in sorted((p, -v) for p, v in pairs if v > 0):
        if not out or -value > out[-1][1]:
            out.append((price, -value))
    return out


def _cover(units: Sequence[tuple[float, int]], steps: int) -> list[float]:
    """``out[u]``: the least price of copies of ``units`` ((price, whole units served),
    any number of each) serving at least ``u`` units, for ``u`` in ``0 … steps``."""
    out = [0.0] + [math.inf] * steps
    for u in range(1, steps + 1):
        best = math.inf
        for price, value in units:
            got = price + out[max(0, u - value)]
            if got < best:
                best = got
        out[u] = best
    return out


def _cover_limited(items: Sequence[tuple[float, int, int]], steps: int) -> list[float]:
    """``out[u]``: the least price of copies of ``items`` ((price, whole units served, most
    copies)) serving at least ``u`` units, for ``u`` in ``0 … steps``: a bounded covering,
    each item's copies split into bundles of 1, 2, 4, … copies taken at most once."""
    bundles: list[tuple[float, int]] = []
    for price, value, most in items:
        if value <= 0:
            continue
        left = min(most, -(-steps // value))  # more copies never cover more
        size = 1
        while left > 0:
            take = min(size, left)
            bundles.append((price * take, min(steps, value * take)))
            left -= take
            size *= 2
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with the exact extra
        out = [0.0] + [math.inf] * steps
        for price, value in bundles:
            for u in range(steps, 0, -1):
                got = price + out[max(0, u - value)]
                if got < out[u]:
                    out[u] = got
        return out
    table = np.full(steps + 1, math.inf)
    table[0] = 0.0
    for price, value in bundles:
        shifted = np.empty_like(table)
        shifted[:value] = 0.0
        shifted[value:] = table[: steps + 1 - value]
        np.minimum(table, shifted + price, out=table)
    return [float(x) for x in table]
