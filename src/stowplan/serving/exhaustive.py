"""The exact best replica of a node set small enough to try every pipeline: one or two
single-GPU nodes (every order, every block split, each scored at its own U*).

The certificate (:mod:`stowplan.serving`) replaces such a composition's relaxation bound
by this value, which makes the bound exact on fleets whose replicas are that small.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from itertools import permutations

from stowplan.cost import CostModel
from stowplan.cost.serving import ReplicaServing, pipeline_serving, serving_constraints
from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.quantities.limits import MAX_BATCH
from stowplan.workload import Workload

__all__ = ["EXHAUSTIVE_NODES", "best_pipeline", "best_replica_value"]

EXHAUSTIVE_NODES = 2
"""Node sets of up to this many single-GPU nodes are tried pipeline by pipeline."""


def best_replica_value(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    w: Workload,
    c: Constraints,
    *,
    by_rate: bool,
) -> float | None:
    """The most users (requests/s with ``by_rate``) any replica on ``nodes`` or a subset
    of them serves: every pipeline tried; None when the set is too large for that (more
    than :data:`EXHAUSTIVE_NODES` nodes, or a node of several GPUs)."""
    found = best_pipeline(model, nodes, w, c, by_rate=by_rate)
    if found is None:
        return None
    return 0.0 if found[2] is None else _value(found[2], by_rate)


def best_pipeline(
    model: ModelLayout,
    nodes: Sequence[NodeDescriptor],
    w: Workload,
    c: Constraints,
    *,
    by_rate: bool,
) -> tuple[list[int], list[int], ReplicaServing | None] | None:
    """The pipeline (indices of ``nodes`` in stage order, block bounds) serving the most
    users (requests/s with ``by_rate``; then the lower TPOT, fewer stages) of every one
    on ``nodes`` or a subset, and what it serves (None: no pipeline serves a request);
    None when the set is too large to try them all (see :func:`best_replica_value`)."""
    if len(nodes) > EXHAUSTIVE_NODES or any(n.num_gpus != 1 for n in nodes):
        return None
    base = serving_constraints(w, c)
    fits = CostModel(model, nodes, replace(base, batch=1))
    # The views of U requests pipeline_serving asks for all come from one root.
    score = CostModel(model, nodes, replace(base, batch=MAX_BATCH))
    nb = model.num_blocks
    lo_stages = max(1, c.min_stages or 1)
    hi_stages = min(len(nodes), c.max_stages or len(nodes))
    best: tuple[tuple[float, float, int], list[int], list[int], ReplicaServing] | None = None
    for size in range(lo_stages, hi_stages + 1):
        for order in permutations(range(len(nodes)), size):
            cuts: Sequence[Sequence[int]] = [[]] if size == 1 else [[k] for k in range(1, nb)]
            for cut in cuts:
                bounds = [0, *cut, nb]
                if not fits.fits_pipeline(list(order), bounds):
                    continue
                got = pipeline_serving(score, list(order), bounds, w)
                if got.users < 1:
                    continue
                key = (_value(got, by_rate), -got.tpot_s, -size)
                if best is None or key > best[0]:
                    best = (key, list(order), bounds, got)
    if best is None:
        return [], [], None
    return best[1], best[2], best[3]


def _value(s: ReplicaServing, by_rate: bool) -> float:
    return s.requests_per_s if by_rate else float(s.users)
