"""The MILP over node sets: the cheapest nodes a pipeline meeting a rate could run on.

A pipeline on nodes ``S`` is described by which nodes are bought (``x_d``),
which holds the embed (``f_d``) and which the head (``l_d``), and how many
blocks each holds.  Its stage times are linear in what each node reads, so the
MILP states the cost model's own terms (:mod:`stowplan.cost`):

* a stage reads its blocks, their KV and the head if last, and takes the
  larger of read bytes / bandwidth and weights × compute seconds per byte,
  plus its fixed block and stage costs and, unless last, its outbound transfer;
* its blocks plus the anchors it holds fit its usable VRAM;
* U concurrent sequences get one token each per cycle, and a cycle is at least one
  trip through the pipeline (:mod:`stowplan.cost`), whose stage times only grow with
  the microbatch: at one sequence per step, the stage times and every node's hop
  latency add up to at most ``U / target`` (so does each stage).

With alike blocks (every dense model) the MILP is exact: it allows a set
exactly when a pipeline of its nodes meets the target (middle stages in any
order).  Nodes that differ only in price, link and memory share one block
count per kind (``K_g``, spread over them within their own capacities), which
removes the symmetry that makes the solver enumerate equivalent sets; and a
node is bought only if every node that dominates it is.  Blocks that differ
(MoE models with dense first blocks, sliding-window KV) give a relaxation:
each node's bytes lie between its block count times the smallest and the
largest block's and add up to the model's.  Prices are minimised; the search
(:mod:`stowplan.planner.cheapest`) checks each set with the planner.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stowplan.cost import CostModel
from stowplan.errors import DependencyError
from stowplan.planner.exact.highs import milp

__all__ = ["SetChoice", "SetMilp"]

_GB = 1e-9
_MS = 1e3
_SLACK = 1 + 1e-9
_TIME_LIMIT_S = 30.0

Row = tuple[dict[int, float], float, float]


@dataclass(frozen=True, slots=True, kw_only=True)
class SetChoice:
    """One MILP solution: the nodes to buy and what the solver proved about the price."""

    members: tuple[int, ...]
    price: float
    """Sum of the members' prices ($/hour)."""
    proven: bool
    """HiGHS proved no cheaper set satisfies the MILP (False: it stopped at its time limit)."""
    bound: float
    """A price no set satisfying the MILP goes below."""


def _larger(a: dict[int, float], b: dict[int, float]) -> dict[int, float] | None:
    """The one of two non-negative linear forms that is never below the other, if either."""
    cols = set(a) | set(b)
    if all(a.get(col, 0.0) >= b.get(col, 0.0) for col in cols):
        return a
    if all(b.get(col, 0.0) >= a.get(col, 0.0) for col in cols):
        return b
    return None


def _fit(left: float, seconds: float, cap: float, whole: bool) -> float:
    """Blocks of ``seconds`` each that fit in ``left`` seconds, at most ``cap`` (whole
    blocks, or as a fraction for a bound)."""
    if left < 0:
        return 0
    if seconds <= 0:
        return cap
    fit = left / seconds
    return min(cap, math.floor(fit) if whole else fit)


class SetMilp:
    """The MILP for ``cm``'s nodes and ``target`` tokens/s; :meth:`cut` removes sets."""

    def __init__(
        self,
        cm: CostModel,
        prices: Sequence[float],
        target: float,
        *,
        min_stages: int,
        max_stages: int,
        stages_per_node: Sequence[int] | None = None,
        split_block_s: Sequence[float] | None = None,
        dominance: CostModel | None = None,
    ) -> None:
        """``stages_per_node``: most stages each node can run (its GPUs when the planner may
        split it into GPU groups; ``cm`` must then be as fast as any grouping, see
        :meth:`~stowplan.cost.CostModel.relax_groups`).  ``split_block_s``: for such a
        node, the least seconds one (smallest) block costs it on any of its groups, one
        sequence per step.  ``dominance``: the cost model whose terms decide which node
        dominates which (default ``cm``)."""
        try:
            import scipy.optimize  # noqa: F401
        except ImportError:
            raise DependencyError("scipy", "exact") from None
        self.n = n = len(prices)
        self.stages = list(stages_per_node) if stages_per_node is not None else [1] * n
        self.split = [g > 1 for g in self.stages]
        """Nodes that may run several stages: bounds, not exact figures, for them."""
        self.split_block_s = list(split_block_s) if split_block_s is not None else [0.0] * n
        self.prices = [float(p) for p in prices]
        self._rows: list[Row] = []
        self._integer: list[bool] = []
        self._upper: list[float] = []
        self._cost: list[float] = []
        # Binary per node: bought, holds the embed, holds the head.
        self.x = [self._var(1.0, cost=self.prices[d]) for d in range(n)]
        self.f = [self._var(1.0) for _ in range(n)]
        self.last = [self._var(1.0) for _ in range(n)]
        self.budget_s = cm.batch / target * _SLACK
        cm = cm.at_microbatch(1)
        dominance = None if dominance is None else dominance.at_microbatch(1)
        self._shape(cm, min_stages, max_stages)
        if not (cm.uniform and self._pooled(cm)):
            self._per_node(cm)
        self._dominance(dominance or cm)

    # -- variables and rows -------------------------------------------------------------
    def _var(self, upper: float, *, integer: bool = True, cost: float = 0.0) -> int:
        self._integer.append(integer)
        self._upper.append(upper)
        self._cost.append(cost)
        return len(self._cost) - 1

    def _row(self, coeffs: dict[int, float], lo: float, hi: float) -> None:
        self._rows.append((coeffs, lo, hi))

    # -- the pipeline's shape and the blocks each node can hold -------------------------------
    def _shape(self, cm: CostModel, lo_n: int, hi_n: int) -> None:
        n, nb = self.n, cm.num_blocks
        rp, kp, mp = cm.read_prefix, cm.kv_prefix, cm.mem_prefix
        self.reads = [rp[i + 1] - rp[i] + kp[i + 1] - kp[i] for i in range(nb)]
        self.weights = [rp[i + 1] - rp[i] for i in range(nb)]
        self.mems = [mp[i + 1] - mp[i] for i in range(nb)]
        # Blocks a node can hold in each role: the longest run that fits beside its anchors
        # (alike blocks: exactly its usable bytes over one block's); none when even one
        # block on it takes longer than the whole budget.
        window = [min(w, nb) for w in cm.max_window()]
        self.cap: list[tuple[float, float, float]] = []
        for d in range(n):
            one = cm.block_seconds(d, min(self.reads), min(self.weights))
            if not one <= self.budget_s:
                self.cap.append((0, 0, 0))
                continue
            if cm.uniform:
                mb = self.mems[0]
                room = [max(cm.usable[d] - a, 0) for a in (0, cm.embed, cm.head)]
                # Whole blocks per stage; a node split into groups holds at most its bytes'
                # worth (its groups' floors add up to no more).
                per = [r / mb if self.split[d] else r // mb for r in room] if mb else [nb] * 3
                self.cap.append((min(nb, per[0]), min(nb, per[1]), min(nb, per[2])))
            else:
                self.cap.append((window[d], window[d], window[d]))
        # Sets of two nodes or more (one node alone is checked outright), each running at
        # least one stage and a split node up to one per GPU.
        self._row({self.x[d]: 1.0 for d in range(n)}, 2, hi_n)
        if lo_n > 2:
            self._row({self.x[d]: float(self.stages[d]) for d in range(n)}, lo_n, math.inf)
        self._row({self.f[d]: 1.0 for d in range(n)}, 1, 1)
        self._row({self.last[d]: 1.0 for d in range(n)}, 1, 1)
        for d in range(n):
            if self.split[d]:  # its groups may hold both ends
                self._row({self.f[d]: 1.0, self.x[d]: -1.0}, -math.inf, 0.0)
                self._row({self.last[d]: 1.0, self.x[d]: -1.0}, -math.inf, 0.0)
            else:
                self._row({self.f[d]: 1.0, self.last[d]: 1.0, self.x[d]: -1.0}, -math.inf, 0.0)

    def _roles_that_fit(self, d: int, caps: tuple[float, float, float]) -> None:
        """Node ``d`` takes no role in which it cannot hold one block (caps: mid, first, last)."""
        mid, first, last = caps
        if first < 1:
            self._upper[self.f[d]] = 0.0
        if last < 1:
            self._upper[self.last[d]] = 0.0
        if mid < 1:
            # bought only as the first or the last stage
            self._row({self.x[d]: 1.0, self.f[d]: -1.0, self.last[d]: -1.0}, -math.inf, 0.0)
        if max(caps) < 1:
            self._upper[self.x[d]] = 0.0

    def _stage_fixed(self, cm: CostModel, d: int) -> dict[int, float]:
        """A stage's seconds (ms) that do not grow with its blocks: stage cost, transfer."""
        return {
            self.x[d]: (cm.stage_s[d] + cm.xfer_s[d]) * _MS,
            self.last[d]: -cm.xfer_s[d] * _MS,
        }

    def _pooled(self, cm: CostModel) -> bool:
        """Alike blocks, every node memory- or compute-bound throughout: one block count per
        kind of node.  False (nothing added) when some node is neither."""
        n, nb = self.n, cm.num_blocks
        rb, wb = self.reads[0], self.weights[0]
        per_block: list[float] = []
        head_s: list[float] = []
        for d in range(n):
            by_memory = {0: rb * cm.inv_bw[d], 1: cm.head * cm.inv_bw[d]}
            by_compute = {0: wb * cm.flop_s_per_byte[d], 1: cm.head * cm.flop_s_per_byte[d]}
            larger = _larger(by_memory, by_compute)
            if larger is None:
                return False
            seconds = larger[0] + cm.block_s[d]
            per_block.append(max(seconds, self.split_block_s[d]) if self.split[d] else seconds)
            head_s.append(larger[1])
        kinds: dict[float, list[int]] = {}
        for d in range(n):
            kinds.setdefault(per_block[d], []).append(d)
        pool: dict[int, float] = {}
        pipeline: dict[int, float] = {}
        for seconds, members in kinds.items():
            k = self._var(float(nb))
            pool[k] = 1.0
            pipeline[k] = seconds * _MS
            # Every bought node holds at least one block and at most what fits it (and,
            # above batch 1, what its stage can read within batch/target): blocks spread
            # freely within a kind, so the kind holds up to the sum over its bought nodes.
            self._row({k: 1.0, **{self.x[d]: -1.0 for d in members}}, 0.0, math.inf)
            room: dict[int, float] = {k: 1.0}
            for d in members:
                caps = self._time_caps(cm, d, seconds, head_s[d])
                self._roles_that_fit(d, caps)
                mid, first, last = (max(c, 1.0) for c in caps)
                room[self.x[d]] = -float(mid)
                room[self.f[d]] = float(mid - first)
                room[self.last[d]] = float(mid - last)
            self._row(room, -math.inf, 0.0)
        self._row(pool, nb, nb)
        for d in range(n):
            for col, v in self._stage_fixed(cm, d).items():
                pipeline[col] = pipeline.get(col, 0.0) + v
            pipeline[self.x[d]] += cm.latency_s[d] * _MS
            pipeline[self.last[d]] = pipeline.get(self.last[d], 0.0) + head_s[d] * _MS
        self._row(pipeline, -math.inf, self.budget_s * _MS)
        return True

    def _time_caps(
        self, cm: CostModel, d: int, seconds: float, head_s: float
    ) -> tuple[float, float, float]:
        """Blocks node ``d`` holds (mid, first, last) within memory and batch/target."""
        mid_left = self.budget_s - cm.stage_s[d] - cm.xfer_s[d]
        last_left = self.budget_s - cm.stage_s[d] - head_s
        whole = not self.split[d]
        mid = _fit(mid_left, seconds, self.cap[d][0], whole)
        return (mid, min(mid, self.cap[d][1]), _fit(last_left, seconds, self.cap[d][2], whole))

    # -- the general form: a block count and byte totals per node ---------------------------
    def _per_node(self, cm: CostModel) -> None:
        n, nb = self.n, cm.num_blocks
        head, embed = cm.head * _GB, cm.embed * _GB
        k = [self._var(float(self.cap[d][0])) for d in range(n)]
        for d in range(n):
            self._roles_that_fit(d, self.cap[d])
        self._row({k[d]: 1.0 for d in range(n)}, nb, nb)
        per: dict[str, tuple[Sequence[float], float]] = {
            "read": (self.reads, head),
            "weight": (self.weights, head),
            "memory": (self.mems, 0.0),
        }
        totals: dict[str, list[int]] = {}
        for name, (per_block, anchor) in per.items():
            cols = [self._var(math.inf, integer=False) for _ in range(n)]
            totals[name] = cols
            everything = sum(per_block) * _GB + anchor
            self._row({cols[d]: 1.0 for d in range(n)}, everything, everything)
            lo_b, hi_b = min(per_block) * _GB, max(per_block) * _GB
            for d in range(n):
                own = {self.last[d]: -anchor} if anchor else {}
                self._row({cols[d]: 1.0, k[d]: -lo_b, **own}, 0.0, math.inf)
                self._row({cols[d]: 1.0, k[d]: -hi_b, **own}, -math.inf, 0.0)
        stage_ms: list[dict[int, float]] = []
        for d in range(n):
            self._row({k[d]: 1.0, self.x[d]: -float(self.cap[d][0])}, -math.inf, 0.0)
            self._row({self.x[d]: 1.0, k[d]: -1.0}, -math.inf, 0.0)
            self._row(
                {
                    totals["memory"][d]: 1.0,
                    self.f[d]: embed,
                    self.last[d]: head,
                    self.x[d]: -cm.usable[d] * _GB,
                },
                -math.inf,
                0.0,
            )
            t = self._var(math.inf, integer=False)
            self._row({t: 1.0, totals["read"][d]: -cm.inv_bw[d] / _GB * _MS}, 0.0, math.inf)
            self._row(
                {t: 1.0, totals["weight"][d]: -cm.flop_s_per_byte[d] / _GB * _MS}, 0.0, math.inf
            )
            if self.split[d]:
                # each block at least as long as on its node's best group
                self._row({t: 1.0, k[d]: -self.split_block_s[d] * _MS}, 0.0, math.inf)
            stage = {t: 1.0, k[d]: cm.block_s[d] * _MS, **self._stage_fixed(cm, d)}
            stage_ms.append(stage)
        pipeline: dict[int, float] = {}
        for d in range(n):
            for col, v in stage_ms[d].items():
                pipeline[col] = pipeline.get(col, 0.0) + v
            pipeline[self.x[d]] += cm.latency_s[d] * _MS
            self._row(stage_ms[d], -math.inf, self.budget_s * _MS)
        self._row(pipeline, -math.inf, self.budget_s * _MS)

    # -- dominance and cuts -------------------------------------------------------------
    def _dominance(self, cm: CostModel) -> None:
        """A node is bought only if every node that dominates it is.

        ``d`` dominates ``e`` when it costs no more, has as many GPUs to split and is no
        worse in any term of the cost model (bandwidth, compute, fixed block and stage
        costs, transfers and hop latencies, usable memory), ties going to the lower
        index: ``e``'s stages can move to ``d`` unchanged or faster, so some cheapest set
        is closed under dominance.
        """
        n = self.n
        terms = [
            (
                self.prices[d],
                cm.inv_bw[d],
                cm.flop_s_per_byte[d],
                cm.block_s[d],
                cm.stage_s[d],
                cm.xfer_s[d],
                cm.latency_s[d],
                cm.intra_xfer_s[d],
                cm.intra_latency_s[d],
                -cm.usable[d],
                self.stages[d],  # as many GPUs to split, no more and no fewer
                -self.stages[d],
            )
            for d in range(n)
        ]
        above: list[set[int]] = [
            {
                d
                for d in range(n)
                if d != e
                and all(a <= b for a, b in zip(terms[d], terms[e], strict=True))
                and (terms[d] != terms[e] or d < e)
            }
            for e in range(n)
        ]
        # Only the nearest dominators: the others follow through them.
        for e in range(n):
            implied: set[int] = set().union(*(above[d] for d in above[e]))
            for d in sorted(above[e] - implied):
                self._row({self.x[e]: 1.0, self.x[d]: -1.0}, -math.inf, 0.0)

    def cut(self, members: Sequence[int]) -> None:
        """Exclude ``members`` and every set within it: a later set has a node outside."""
        inside = set(members)
        self._row({self.x[d]: 1.0 for d in range(self.n) if d not in inside}, 1.0, math.inf)

    def solve(self) -> SetChoice | None:
        """The cheapest set the MILP allows (None: no set can meet the target)."""
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint
        from scipy.sparse import coo_array

        data: list[float] = []
        rows: list[int] = []
        cols: list[int] = []
        lower, upper = [], []
        for i, (coeffs, lo, hi) in enumerate(self._rows):
            for col, v in coeffs.items():
                rows.append(i)
                cols.append(col)
                data.append(v)
            lower.append(lo)
            upper.append(hi)
        nv = len(self._cost)
        matrix = coo_array((data, (rows, cols)), shape=(len(self._rows), nv)).tocsr()
        res: Any = milp(
            np.array(self._cost),
            integrality=np.array(self._integer, dtype=int),
            bounds=Bounds(np.zeros(nv), np.array(self._upper)),
            constraints=LinearConstraint(matrix, np.array(lower), np.array(upper)),
            options={"time_limit": _TIME_LIMIT_S},
        )
        if res.x is None:
            return None
        members = tuple(d for d in range(self.n) if res.x[self.x[d]] > 0.5)
        proven = res.status == 0
        bound = float(res.fun) if proven else float(getattr(res, "mip_dual_bound", 0.0) or 0.0)
        return SetChoice(
            members=members,
            price=sum(self.prices[d] for d in members),
            proven=proven,
            bound=bound,
        )
