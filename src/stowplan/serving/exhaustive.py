"""The exact best replica of a node set small enough to try every pipeline: single-GPU
nodes with at most :data:`EXHAUSTIVE_SHAPES` pipelines (every order of every subset,
every block split, each scored at its own U*) — one or two nodes of any model, more of
a model of few blocks.

The certificate (:mod:`stowplan.serving`) replaces such a composition's relaxation bound
by this value, which makes the bound exact on fleets whose replicas are that small.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from itertools import combinations, permutations
from math import comb, perm

from stowplan.cost import CostModel
from stowplan.cost.serving import ReplicaServing, pipeline_serving, serving_constraints
from stowplan.model import Constraints, ModelLayout, NodeDescriptor
from stowplan.quantities.limits import MAX_BATCH
from stowplan.workload import Workload

__all__ = ["EXHAUSTIVE_SHAPES", "best_pipeline", "best_replica_value", "pipeline_count"]

EXHAUSTIVE_SHAPES = 600
"""Node sets of single-GPU nodes with at most this many pipelines are tried pipeline by
pipeline (two nodes and 126 blocks make 252)."""


def pipeline_count(nodes: int, blocks: int, lo: int = 1, hi: int | None = None) -> int:
    """Pipelines of ``lo``..``hi`` stages on ``nodes`` nodes: ordered node choices times
    block splits."""
    top = min(nodes, blocks) if hi is None else min(hi, nodes, blocks)
    return sum(perm(nodes, k) * comb(blocks - 1, k - 1) for k in range(lo, top + 1))


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
    than :data:`EXHAUSTIVE_SHAPES` pipelines, or a node of several GPUs)."""
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
    nb = model.num_blocks
    lo_stages = max(1, c.min_stages or 1)
    hi_stages = min(len(nodes), c.max_stages or len(nodes))
    if any(n.num_gpus != 1 for n in nodes):
        return None
    if pipeline_count(len(nodes), nb, lo_stages, hi_stages) > EXHAUSTIVE_SHAPES:
        return None
    base = serving_constraints(w, c)
    fits = CostModel(model, nodes, replace(base, batch=1))
    # The views of U requests pipeline_serving asks for all come from one root.
    score = CostModel(model, nodes, replace(base, batch=MAX_BATCH))
    best: tuple[tuple[float, float, int], list[int], list[int], ReplicaServing] | None = None
    for size in range(lo_stages, hi_stages + 1):
        for order in permutations(range(len(nodes)), size):
            for cut in combinations(range(1, nb), size - 1):
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
