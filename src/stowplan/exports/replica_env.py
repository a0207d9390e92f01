"""Every replica's stage environments: the worker contract, once per replica of a serve plan.

Each stage of replica ``i`` receives what a stage of a single plan receives
(:func:`stowplan.stages.worker.stage_env` of the replica's own plan: its ``PLAN_JSON``,
``STAGE``, ``NUM_STAGES``, blocks, embed/head, ``PLAN_TP_SIZE``, GPUs) and, for the
serving engine it hosts, :data:`REPLICA_KEYS`:

* ``STOWPLAN_REPLICA``: ``i``, counting from 0;
* ``STOWPLAN_NUM_REPLICAS``: the replicas of the serve plan;
* ``STOWPLAN_MAX_REQUESTS``: U*, the requests the replica serves at once;
* ``STOWPLAN_REQUEST_TOKENS``: P + O, the KV tokens one request holds.
"""

from __future__ import annotations

from stowplan.serve_plan import ServePlan
from stowplan.stages.worker import stage_env

__all__ = ["REPLICA_KEYS", "replica_keys", "replica_stage_env"]

REPLICA_KEYS = (
    "STOWPLAN_REPLICA",
    "STOWPLAN_NUM_REPLICAS",
    "STOWPLAN_MAX_REQUESTS",
    "STOWPLAN_REQUEST_TOKENS",
)
"""The variables a replica's stage receives beside the worker contract."""


def replica_keys(sp: ServePlan, replica: int) -> dict[str, str]:
    """:data:`REPLICA_KEYS` of replica ``replica`` of ``sp``."""
    r = sp.replicas[replica]
    return {
        "STOWPLAN_REPLICA": str(replica),
        "STOWPLAN_NUM_REPLICAS": str(len(sp.replicas)),
        "STOWPLAN_MAX_REQUESTS": str(r.users),
        "STOWPLAN_REQUEST_TOKENS": str(sp.workload.context_tokens),
    }


def replica_stage_env(sp: ServePlan) -> list[list[dict[str, str]]]:
    """Per replica of ``sp``, in order, the environment of each of its stages, in stage
    order (see the module)."""
    return [
        [{**env, **replica_keys(sp, i)} for env in stage_env(r.plan)]
        for i, r in enumerate(sp.replicas)
    ]
