"""Realise every replica of a serve plan on Ray: disjoint replicas, each as one plan is.

:func:`realise_serve_plan` checks that the replicas share no node and that the live
cluster holds every stage of every replica (:func:`~stowplan.cluster.realise.
unplaceable_stages`) before it creates anything, then realises the replicas one after
the other with :func:`~stowplan.cluster.realise.realise` — one pinned placement group
and one actor per stage — each stage's env the worker contract of its replica's plan
plus :data:`~stowplan.exports.replica_env.REPLICA_KEYS`.  If any replica fails, the
replicas already started are released before the error is raised: nothing is left
behind.  A serve plan is realised as planned (no replanning: another split of the
fleet would serve other numbers; run ``stowplan serve`` again on the nodes left).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stowplan.cluster.realise import Realisation, realise, unplaceable_stages
from stowplan.errors import InputError, ReplicaUnplaceable, StageUnplaceable
from stowplan.exports.replica_env import replica_keys
from stowplan.serve_plan import ServePlan

__all__ = ["ReplicaUnplaceable", "ServeRealisation", "check_disjoint", "realise_serve_plan"]


@dataclass(slots=True)
class ServeRealisation:
    """Running replicas of one serve plan, in the plan's order.  A runtime handle, not a
    value; ``release()`` releases every replica and is idempotent."""

    serve_plan: ServePlan
    replicas: list[Realisation]
    released: bool = field(default=False)

    def release(self) -> None:
        """Kill every stage actor and remove every placement group of every replica."""
        if self.released:
            return
        for r in self.replicas:
            r.release()
        self.released = True

    def __enter__(self) -> ServeRealisation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def check_disjoint(sp: ServePlan) -> None:
    """Raise :class:`InputError` when two replicas of ``sp`` share a GPU: replicas side by
    side on one node must name disjoint ``gpu_indices`` (a stage without indices takes
    the whole node)."""
    whole: dict[str, int] = {}
    gpus: dict[tuple[str, int], int] = {}
    for i, r in enumerate(sp.replicas):
        for a in r.plan.assignments:
            nid = a.node_id
            clash: list[int | None]
            if a.gpu_indices:
                clash = [whole.get(nid)]
                clash += [gpus.setdefault((nid, g), i) for g in a.gpu_indices]
            else:
                clash = [whole.setdefault(nid, i)]
                clash += [j for (n, _), j in gpus.items() if n == nid]
            j = next((j for j in clash if j is not None and j != i), None)
            if j is not None:
                raise InputError(
                    "serve_plan.replicas",
                    nid,
                    f"is a node of replicas {j} and {i} on the same GPUs: replicas must use "
                    "disjoint nodes, or disjoint GPUs of one node",
                )


def realise_serve_plan(
    sp: ServePlan,
    actor_class: Any,
    *,
    actor_args: Sequence[Any] = (),
    timeout_s: float = 30.0,
    start_timeout_s: float = 60.0,
    extra_env: Mapping[str, str] | None = None,
) -> ServeRealisation:
    """Start every replica of ``sp`` on the Ray cluster (see the module); each stage an
    ``actor_class`` actor as :func:`~stowplan.cluster.realise.realise` starts it, its
    env carrying the replica's keys after ``extra_env``.  ``timeout_s`` and
    ``start_timeout_s`` apply to each replica.

    Raises:
        InputError: two replicas share a node, or the plan has no replica.
        ReplicaUnplaceable: the cluster cannot hold a replica (a node gone or short of
            GPUs, checked for all before anything starts; or a group not placed in
            time).  Nothing is left behind.
        StageStartError: an actor failed in its constructor; nothing is left behind.
    """
    if not sp.replicas:
        raise InputError("serve_plan.replicas", [], "must hold at least one replica")
    check_disjoint(sp)
    n = len(sp.replicas)
    # Step 1: every replica's stages fit the live cluster, before anything is created.
    for i, r in enumerate(sp.replicas):
        failures = unplaceable_stages(r.plan)
        if failures:
            raise ReplicaUnplaceable(i, n, failures, 0.0)
    # Step 2: each replica as one plan; on a failure the started ones are released.
    started: list[Realisation] = []
    try:
        for i, r in enumerate(sp.replicas):
            env = {**(extra_env or {}), **replica_keys(sp, i)}
            try:
                started.append(
                    realise(
                        r.plan,
                        actor_class,
                        actor_args=actor_args,
                        timeout_s=timeout_s,
                        start_timeout_s=start_timeout_s,
                        extra_env=env,
                    )
                )
            except ReplicaUnplaceable:
                raise
            except StageUnplaceable as exc:
                raise ReplicaUnplaceable(i, n, exc.failures, exc.waited_s) from None
    except BaseException:
        for done in started:
            done.release()
        raise
    return ServeRealisation(serve_plan=sp, replicas=started)
