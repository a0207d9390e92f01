"""Placement groups that fail loudly and never leak.

Ray leaves an unsatisfiable placement group ``PENDING`` forever and never
collects one.  :func:`create_placement_group` wraps Ray's call with:

1. a pre-check of the cluster's *available* resources (custom ones included)
   that fails at once naming what is missing;
2. a bounded wait that logs the unplaced bundles periodically;
3. fail-fast when Ray marks the group ``INFEASIBLE`` for longer than a grace
   period (a node left, or no node is large enough);
4. removal of the group on every failure path, then a typed error
   (:mod:`stowplan.cluster.errors`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from stowplan.cluster.errors import (
    InsufficientResources,
    PlacementInfeasible,
    PlacementTimeout,
)
from stowplan.cluster.ray_runtime import require_ray
from stowplan.errors import InputError

__all__ = [
    "Bundle",
    "check_available",
    "create_placement_group",
    "live_groups",
    "remove_groups",
]

log = logging.getLogger("stowplan.cluster")

Bundle = Mapping[str, float]
"""One bundle: resource name → amount."""

_EPS = 1e-9
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_STATE_MEANING = {
    "INFEASIBLE": "no live node can ever hold it",
    "NO_RESOURCES": "the resources exist but are in use",
    "QUEUED": "waiting for the scheduler",
    "SCHEDULING": "being scheduled",
}


def _fmt(amount: float) -> str:
    return f"{amount:g}"


def _fmt_bundle(bundle: Bundle) -> str:
    return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in sorted(bundle.items())) + "}"


def _totals(bundles: Sequence[Bundle]) -> dict[str, float]:
    need: dict[str, float] = {}
    for bundle in bundles:
        for key, amount in bundle.items():
            need[key] = need.get(key, 0.0) + float(amount)
    return need


def check_available(bundles: Sequence[Bundle], what: str, settle_s: float = 2.0) -> None:
    """Raise :class:`InsufficientResources` when the cluster's available resources cannot
    cover the sum of ``bundles``, naming every short resource (and whether any node
    registered it at all).

    Ray's view of available resources lags a removal by up to about a second, so a
    shortfall is re-checked for ``settle_s`` seconds before it is reported.
    """
    ray = require_ray()
    need = _totals(bundles)
    deadline = time.monotonic() + settle_s
    while True:
        available = ray.available_resources()
        registered = ray.cluster_resources()
        short = any(n > float(available.get(k, 0.0)) + _EPS for k, n in need.items())
        if not short or time.monotonic() >= deadline:
            break
        if any(k not in registered for k in need):
            break  # nothing will settle into a resource no node has
        time.sleep(0.1)
    missing: dict[str, tuple[float, float]] = {}
    parts: list[str] = []
    for key, needed in sorted(need.items()):
        have = float(available.get(key, 0.0))
        if needed > have + _EPS:
            missing[key] = (needed, have)
            if key not in registered:
                parts.append(f"{key}={_fmt(needed)} (no live node registers {key!r})")
            else:
                parts.append(
                    f"{key}={_fmt(needed)} (available {_fmt(have)} of "
                    f"{_fmt(float(registered[key]))})"
                )
    if missing:
        raise InsufficientResources(what, missing, "needs " + ", ".join(parts))


def _check_selectors(selectors: Sequence[Mapping[str, str]] | None, n: int) -> None:
    if selectors is None:
        return
    if len(selectors) != n:
        raise InputError(
            "bundle_label_selector",
            f"<{len(selectors)} selectors>",
            f"must have one per bundle ({n})",
        )
    for selector in selectors:
        for key in selector:
            if not _LABEL_KEY.match(key):
                raise InputError(
                    "bundle_label_selector",
                    key,
                    "is not a valid label key ([prefix/]name of letters, digits, '-', '_', '.')",
                )


def _table(pg: Any) -> dict[str, Any]:
    from ray.util.placement_group import placement_group_table

    table: dict[str, Any] = placement_group_table(pg)
    return table


def _unplaced(table: Mapping[str, Any]) -> list[str]:
    bundles = table.get("bundles", {})
    where = table.get("bundles_to_node_id", {})
    return [f"{i} {_fmt_bundle(b)}" for i, b in sorted(bundles.items()) if not where.get(i)]


def remove_groups(groups: Sequence[Any], timeout_s: float = 5.0) -> None:
    """Remove ``groups`` and wait (bounded) until Ray reports each REMOVED."""
    from ray.util.placement_group import remove_placement_group

    for pg in groups:
        try:
            remove_placement_group(pg)
        except Exception as exc:  # a group already gone is fine
            log.debug("removing placement group %s: %s", pg.id.hex(), exc)
    deadline = time.monotonic() + timeout_s
    for pg in groups:
        while time.monotonic() < deadline:
            try:
                if _table(pg).get("state") == "REMOVED":
                    break
            except Exception:
                break
            time.sleep(0.05)


def live_groups() -> list[dict[str, Any]]:
    """Every placement group of the cluster that is not REMOVED (table records)."""
    from ray.util.placement_group import placement_group_table

    return [t for t in placement_group_table().values() if t.get("state") != "REMOVED"]


def create_placement_group(
    bundles: Sequence[Bundle],
    strategy: str,
    *,
    name: str = "",
    timeout_s: float = 60.0,
    bundle_label_selector: Sequence[Mapping[str, str]] | None = None,
    lifetime: str | None = None,
    precheck: bool = True,
    infeasible_grace_s: float | None = 1.0,
    log_every_s: float = 5.0,
    poll_s: float = 0.1,
) -> Any:
    """Create a Ray placement group and wait until it is ready; return it.

    ``timeout_s`` bounds the whole wait (seconds).  With ``infeasible_grace_s``
    set, a group Ray keeps marking ``INFEASIBLE`` for that long fails at once
    (None: wait for the timeout, e.g. when an autoscaler may add nodes).  Pending
    bundles are logged on ``stowplan.cluster`` every ``log_every_s`` seconds.

    Raises :class:`InsufficientResources` (pre-check), :class:`PlacementInfeasible`
    or :class:`PlacementTimeout`; the group is removed before any of them.
    """
    require_ray()
    from ray.util.placement_group import placement_group

    if not bundles:
        raise InputError("bundles", [], "must hold at least one bundle")
    _check_selectors(bundle_label_selector, len(bundles))
    what = f"placement group {name!r}" if name else "placement group"
    if precheck:
        check_available(bundles, what)
    kwargs: dict[str, Any] = {"strategy": strategy, "name": name, "lifetime": lifetime}
    if bundle_label_selector is not None:
        kwargs["bundle_label_selector"] = [dict(s) for s in bundle_label_selector]
    pg = placement_group([dict(b) for b in bundles], **kwargs)
    start = time.monotonic()
    deadline = start + timeout_s
    next_log = start + log_every_s
    infeasible_since: float | None = None
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if pg.wait(min(poll_s, remaining)):
                return pg
            table = _table(pg)
            state = table.get("stats", {}).get("scheduling_state", "")
            now = time.monotonic()
            if state == "INFEASIBLE":
                infeasible_since = infeasible_since if infeasible_since is not None else now
                if infeasible_grace_s is not None and now - infeasible_since >= infeasible_grace_s:
                    raise PlacementInfeasible(
                        name,
                        now - start,
                        f"{what} ({strategy}, {len(bundles)} bundles) is infeasible: "
                        f"{_STATE_MEANING['INFEASIBLE']}; unplaced bundles: "
                        f"{'; '.join(_unplaced(table))}; removed it after {now - start:.1f} s",
                    )
            else:
                infeasible_since = None
            if now >= next_log:
                log.warning(
                    "%s pending for %.1f s (%s: %s); unplaced bundles: %s",
                    what,
                    now - start,
                    state,
                    _STATE_MEANING.get(state, "pending"),
                    "; ".join(_unplaced(table)),
                )
                next_log = now + log_every_s
        table = _table(pg)
        state = table.get("stats", {}).get("scheduling_state", "")
        raise PlacementTimeout(
            name,
            timeout_s,
            f"{what} ({strategy}, {len(bundles)} bundles) not ready after {timeout_s:g} s "
            f"(state {table.get('state')}, {state}: {_STATE_MEANING.get(state, 'pending')}); "
            f"unplaced bundles: {'; '.join(_unplaced(table))}; removed it",
        )
    except BaseException:
        remove_groups([pg])
        raise
