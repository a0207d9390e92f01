"""The cost model: stage times, hops, tokens/s, KV capacity and $, in one place.

Decode is memory-bound to first order: a token reads every weight it uses once.
A planning node is a whole node or a group of ``tp`` of its GPUs (``num_gpus`` of
the descriptor); its bandwidth and FLOPs are the sum of its GPUs'.  ``U``
(``Constraints.batch``) sequences are decoded concurrently; on ``S`` stages they
form ``m = min(U, S)`` microbatches of ``b = ⌈U / m⌉`` sequences
(:func:`microbatches`).  For a stage ``s`` on node ``d`` holding blocks
``[lo, hi)``, per microbatch::

    read(s)    = Σ block read bytes + head bytes if last + KV bytes of b sequences at the
                 read context + routed experts b tokens touch beyond k (MoE)
    compute(s) = 2 * params_read(s) * b / flops(d)
    AR(tp)     = 0 if tp == 1 else intra_latency + 2 (tp − 1) / tp · b · hidden · act_bytes
                                                    / intra_bw
    t(s)       = max(read(s) / bandwidth(d), compute(s)) + (hi − lo) · 2 · AR(tp)
                 + [s < N-1] · b · hidden · act_bytes / link(s → s+1)
    hops       = Σ_s latency(s → s+1 mod N)   (N > 1)

The link from a stage to the next (and the return from the last to the first) is
the GPUs' own link (NVLink/PCIe: ``intra_link_gbps``, ``intra_link_latency_us``)
when both stages are GPU groups of one node, else the sender's network link
(``link_mbps``, ``link_latency_ms``).  The embedding table is held by stage 0 but a
token reads one row of it, so it counts for memory only.  ``params_read`` converts
weight bytes to parameters with the layout's own ratio.

Two reads beyond the weights one token reads (they cost bandwidth, not compute):

* KV: memory holds ``context_tokens`` of KV for each of the U sequences, but a step
  reads each sequence's KV at its mean context, ``Constraints.kv_read_context``:
  half the reserve for a plain ``plan --context N`` (a sequence grows from 0 to N),
  ``C = P + O/2`` for a serving workload (prompt P, output O); a sliding-window
  block reads at most its window;
* experts: a MoE block read by the ``b`` tokens of a microbatch reads its dense part
  plus the ``E × (1 − (1 − k/E)^b)`` routed experts they touch (uniform routing,
  :mod:`stowplan.cost.touch`), ``k`` at ``b = 1``; its compute stays
  ``2 × active parameters × b``.

Prefill, time to first token and a serving replica's TPOT(U) are
:mod:`stowplan.cost.serving`.

* every sequence gets one token per cycle: ``cycle = max(Σ_s t(s) + hops, m · max_s t(s))``
  (the token's own trip through the pipeline, or the busiest stage serving all m
  microbatches); per-sequence time per token = cycle; tokens/s = U / cycle; at U = 1
  this is the single-stream ``Σ_s t(s) + hops``;
* memory holds the KV reserve of all U sequences; KV capacity = min over stages of
  (usable − weights) / KV bytes per token of the stage;
* $/hour counts each physical node once, however many of its GPU groups are stages.

Calibration (:mod:`stowplan.calibration.apply`) adds on top: a bandwidth fraction
and compute efficiency scaling the rates, a fixed cost per block, one per hop, the
part of a measured collective cost per block (tensor parallel) that 2·AR(tp) does not
already charge, and, for engines that run a
multi-GPU node as a pipeline over its GPUs, that node's in-host hops.  Inputs come
from the node descriptor when given and from :mod:`stowplan.gpus` and
:mod:`stowplan.gpus.interconnect` otherwise (:mod:`stowplan.cost.rates`); every value
taken from a table (or defaulted) is listed in ``assumed``.  The pipeline's
microbatches, cycle and tokens/s are :mod:`stowplan.cost.cycle`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from functools import lru_cache
from itertools import accumulate, chain
from operator import attrgetter, itemgetter
from typing import Any, TypeVar

from stowplan.calibration.apply import (
    NodeCalibration,
    bandwidth_is_measured,
    describe_calibration,
    node_calibration,
)
from stowplan.calibration.profile import Calibration
from stowplan.cost.cycle import Evaluation, microbatches, usd_per_million_tokens
from stowplan.cost.prefill_rates import prefill_rates
from stowplan.cost.rates import NodeRates, nodes_rates
from stowplan.cost.touch import expert_touch_bytes
from stowplan.errors import InputError
from stowplan.model import Constraints, ModelLayout, NodeDescriptor, gpu_group_id, node_kinds
from stowplan.moe.routing import nodes_in_order
from stowplan.plan import Plan, Prediction, StageAssignment

__all__ = ["CostModel", "kv_read_bytes", "most_within", "plan_cost_model"]
_BYTES_PER_PARAM = {"bf16": 2.0, "fp16": 2.0, "f16": 2.0, "fp32": 4.0, "f32": 4.0, "q4_0": 18 / 32}


_SLOWEST = 1e30
"""Seconds per byte of a node whose rate underflows to zero."""


def _params_per_byte(model: ModelLayout) -> float:
    read = sum(model.block_read_sizes()) + model.head_params_bytes + model.embed_params_bytes
    if model.active_params and read:
        return model.active_params / read
    if model.total_params and model.weight_bytes:
        return model.total_params / model.weight_bytes
    return 1.0 / _BYTES_PER_PARAM.get((model.dtype or "bf16").lower(), 2.0)


T = TypeVar("T")


class CostModel:
    """Precomputed prefix sums so any stage's time and memory cost O(1).

    Nodes are addressed by their index in ``nodes``; block ranges are half-open.
    """

    def __init__(
        self,
        model: ModelLayout,
        nodes: Sequence[NodeDescriptor],
        constraints: Constraints,
        calibration: Calibration | None = None,
        *,
        parents: Sequence[str] | None = None,
        microbatch: int | None = None,
    ) -> None:
        self.model = model
        self._constraints = constraints
        self._views: dict[int, CostModel] = {}
        self._root = self
        self._relaxed = False
        self._relaxed_root: CostModel | None = None
        self._windows_kept: list[int] | None = None
        self.nodes = tuple(nodes)
        ids = tuple(map(_ID, self.nodes))
        self.parent: tuple[str, ...] = ids if parents is None else tuple(parents)
        """Per node index, the physical node it is a GPU group of (its own id when whole)."""
        self.own_hosts = len(set(self.parent)) == len(self.nodes)
        """Whether no two nodes are GPU groups of one host (every hop is the network's)."""
        self.batch = constraints.batch
        """Concurrent sequences U: the KV reserve holds all of them."""
        self.microbatch = self.batch if microbatch is None else microbatch
        """Sequences a stage processes per step: the stage times, transfers and
        all-reduces of this model are for this many (:meth:`at_microbatch` gives the
        model of another size; :meth:`evaluate` picks the pipeline's own)."""
        if not 1 <= self.microbatch <= self.batch:
            raise InputError("microbatch", self.microbatch, f"must be within 1..{self.batch}")
        self.context_tokens = constraints.context_tokens
        # Nodes alike in every field but the id (GPU groups of identical nodes) have the
        # same figures: each is computed once per such kind and spread to the nodes at C
        # speed (a node's rates are its own: they name it).
        keys, self._node_reps, self._node_kind_of = node_kinds(self.nodes)
        spread_kinds = _expander(self._node_kind_of)
        rates_assumed = nodes_rates(self.nodes, keys, constraints.headroom)
        self.rates: tuple[NodeRates, ...] = tuple(map(_RATES, rates_assumed))
        self.node_assumed: tuple[tuple[str, ...], ...] = tuple(map(_ASSUMED, rates_assumed))
        self.assumed = tuple(chain.from_iterable(self.node_assumed))
        self.index = dict(zip(ids, range(len(ids)), strict=True))
        ctx = constraints.context_tokens or 0
        blocks = _block_figures(model, ctx, self.batch)
        self.uniform = blocks[0]
        """Every block has the same bytes, read bytes and KV figures."""
        self.has_kv_figure = blocks[1]
        self.mem_prefix = blocks[2]
        """Bytes held by blocks: weights plus the KV reserve of all U sequences."""
        self.kv_held_prefix, self.read_prefix, self.kv_token_prefix = blocks[3:]
        self.kv_read_tokens = constraints.kv_read_context
        """Context tokens of KV a step reads per sequence (half the reserve by default)."""
        self.head = model.head_params_bytes
        self.embed = model.embed_params_bytes
        self.num_blocks = model.num_blocks
        ppb = _params_per_byte(model)
        # Rates are capped at a finite (absurdly slow) value so 0 bytes always take 0 s.
        reps = self._node_reps
        rep_rates = [self.rates[d] for d in reps]
        inv_bw = [min(1.0 / r.bandwidth_bytes_per_s, _SLOWEST) for r in rep_rates]
        self.params_per_byte = ppb
        """Parameters per weight byte (the layout's own ratio)."""
        inv_flops = [min(1.0 / r.flops_per_s, _SLOWEST) for r in rep_rates]
        self.latency_s: tuple[float, ...] = spread_kinds([r.latency_s for r in rep_rates])
        self.intra_latency_s: tuple[float, ...] = spread_kinds(
            [r.intra_latency_s for r in rep_rates]
        )
        self.usable: tuple[int, ...] = spread_kinds([r.usable_bytes for r in rep_rates])
        n_nodes = len(self.nodes)
        self.calibration = calibration if calibration is not None else constraints.calibration
        layers = self.calibration is not None and self.calibration.engine.splits_layers
        rep_nodes = [self.nodes[d] for d in reps]
        rep_tp = [1 if layers else n.num_gpus for n in rep_nodes]
        self.tensor_parallel: tuple[int, ...] = spread_kinds(rep_tp)
        """GPUs that split every block of a stage on each node (1 when the engine runs a
        multi-GPU node as a pipeline over its GPUs instead)."""
        self.stage_s: tuple[float, ...] = (0.0,) * n_nodes
        """Fixed seconds a stage on each node adds whatever its blocks: the hops between
        the node's own GPUs when the engine splits layers across them."""
        # Calibration (None: first-order): bandwidth fraction and compute efficiency scale
        # the rates, the hop cost joins each outbound transfer, and the block and stage
        # costs are their own terms. A multi-GPU node is tensor parallel (bandwidths add
        # up, every block pays the collective) unless the engine splits layers over the
        # GPUs, as llama.cpp and an Accelerate device_map do: then one GPU streams at a
        # time and the token crosses num_gpus - 1 hops inside the node.
        self._cal: list[NodeCalibration] | None = None
        self._cal_single: list[NodeCalibration] | None = None
        self._spread: list[int] = []
        rep_cal: list[NodeCalibration | None] = [None] * len(reps)
        rep_single: list[NodeCalibration | None] = [None] * len(reps)
        rep_spread = [1] * len(reps)
        if self.calibration is not None:
            cal = self._kind_calibrations(layers)
            single = self._kind_calibrations(single_gpu=True)
            rep_cal, rep_single = list(cal), list(single)
            self._cal = list(spread_kinds(cal))
            self._cal_single = list(spread_kinds(single))
            rep_spread = [n.num_gpus if layers else 1 for n in rep_nodes]
            self._spread = list(spread_kinds(rep_spread))
            inv_bw = [
                min(v * g / c.bandwidth_fraction, _SLOWEST)
                for v, c, g in zip(inv_bw, cal, rep_spread, strict=True)
            ]
            inv_flops = [
                min(v * g / c.compute_efficiency, _SLOWEST)
                for v, c, g in zip(inv_flops, cal, rep_spread, strict=True)
            ]
            self.stage_s = spread_kinds(
                [(g - 1) * c.hop_overhead_s for c, g in zip(cal, rep_spread, strict=True)]
            )
        self.inv_bw: tuple[float, ...] = spread_kinds(inv_bw)
        self.inv_flops: tuple[float, ...] = spread_kinds(inv_flops)
        """Seconds per FLOP of each node (0 when its FLOPs are unknown: not counted)."""
        # The kinds of node the figures tell apart: nodes alike in the rates but for the id,
        # tensor parallel and calibration (kinds of descriptor merge here when they differ
        # only in what no figure reads), first seen first — as node by node, since the
        # kinds of descriptor are in the order of their first nodes.
        kinds: dict[tuple[object, ...], int] = {}
        merged: list[int] = []
        self._kind_reps: list[int] = []
        """One node index per kind of node: nodes alike in every input of the per-node
        figures (rates but for the id, tensor parallel, calibration), first seen first."""
        for j, d in enumerate(reps):
            key = (
                _rate_figures(rep_rates[j]),
                rep_tp[j],
                rep_cal[j],
                rep_single[j],
                rep_spread[j],
            )
            k = kinds.setdefault(key, len(kinds))
            if k == len(self._kind_reps):
                self._kind_reps.append(d)
            merged.append(k)
        of = list(map(merged.__getitem__, self._node_kind_of))
        self._kind_of = tuple(of)
        self._expand = _expander(of)
        """Per-kind values to per-node tuples: the figures are computed once per kind."""
        self._rate_arrays = (
            _rate_arrays(
                [self.rates[d] for d in self._kind_reps], self.tensor_parallel, self._kind_reps
            )
            if len(self._kind_reps) >= KIND_ARRAYS
            else None
        )
        """Per kind, the rates each microbatch's figures divide by, as arrays (many kinds
        of node; None otherwise)."""
        self._cal_arrays = (
            _calibration_arrays(
                self._rate_arrays[0],
                [self._cal[d] for d in self._kind_reps],
                [self._cal_single[d] for d in self._kind_reps],
                [self._spread[d] for d in self._kind_reps],
            )
            if self._rate_arrays is not None
            and self._cal is not None
            and self._cal_single is not None
            else None
        )
        """Per kind, the calibration figures each microbatch's figures take, as arrays
        (with :attr:`_rate_arrays`, calibrated; None otherwise)."""
        self._set_microbatch()
        prefill, sources = prefill_rates(
            rep_nodes, [r.flops_per_s for r in rep_rates], inv_flops, self.calibration, layers
        )
        self.inv_prefill_flops: tuple[float, ...] = spread_kinds(prefill)
        self.prefill_sources: tuple[str | None, ...] = spread_kinds(sources)
        """Seconds per FLOP of a prompt's prefill on each node: the calibrated prefill
        compute (:func:`~stowplan.calibration.prefill.prefill_efficiency`) where it
        applies, else :attr:`inv_flops`; and where each figure comes from."""

    def _set_microbatch(self) -> None:
        """The figures that depend on the microbatch: the reads beyond the weights, the
        compute per byte, the transfers and the all-reduces (calibrated when a profile
        applies)."""
        model, b = self.model, self.microbatch
        self._smallest_kept: tuple[int, float, int] | None = None
        """:meth:`smallest_block`, once asked (its KV read depends on the microbatch)."""
        tokens = self.kv_read_tokens
        self.kv_prefix = _step_reads(model, tokens, isinstance(tokens, int), b)
        """Bytes a step of one microbatch reads beyond the weights one token reads (which
        are also its compute): the KV of its b sequences at the read context, and the
        further routed experts b tokens touch in a MoE block (:mod:`stowplan.cost.touch`)."""
        ppb = self.params_per_byte
        act = b * model.hidden_dim * model.bytes_per_activation_elem
        reps, expand = self._kind_reps, self._expand
        cal, single = self._cal, self._cal_single
        if self._rate_arrays is not None:
            flop, xfer, intra, all_reduce, block = _figures_on_arrays(
                self._rate_arrays, 2.0 * ppb * b, act, self._cal_arrays
            )
        else:
            rates = [self.rates[d] for d in reps]
            flop = [min(2.0 * ppb * b / r.flops_per_s, _SLOWEST) for r in rates]
            xfer = [act / r.link_bytes_per_s for r in rates]
            intra = [act / r.intra_bytes_per_s for r in rates]
            all_reduce = [_all_reduce_s(self.tensor_parallel[d], act, self.rates[d]) for d in reps]
            block = [2 * ar for ar in all_reduce]
        if cal is not None and single is not None and self._rate_arrays is None:
            for k, d in enumerate(reps):
                c = cal[d]
                flop[k] = min(flop[k] * self._spread[d] / c.compute_efficiency, _SLOWEST)
                xfer[k] += c.hop_overhead_s
                intra[k] += c.hop_overhead_s
                # A profile's collective figure is the measured cost of a block's two
                # all-reduces; the first-order 2·AR(tp) already charges part of it, so
                # the calibration adds the rest: a block pays max(2·AR, collective).
                base = single[d].block_overhead_s
                block[k] = block[k] + base + max(0.0, c.block_overhead_s - base - block[k])
        self.flop_s_per_byte = expand(flop)
        self.xfer_s = expand(xfer)
        self.intra_xfer_s = expand(intra)
        """Seconds to pass the activations to a stage on another GPU group of the same node."""
        self.all_reduce_s = expand(all_reduce)
        """One all-reduce of the activations among the node's tensor-parallel GPUs."""
        self.block_s: tuple[float, ...] = expand(block)
        """Fixed seconds every block adds on each node: two all-reduces when the stage is
        tensor parallel, plus its calibrated block cost."""
        self._set_stage_classes()

    def _set_stage_classes(self) -> None:
        """:attr:`stage_class` and :attr:`gpu_class` from the figures as they now are."""
        # The figures are the same on every node of a kind: classes are found per kind
        # (first seen first, as node by node).
        classes: dict[tuple[float | int, ...], int] = {}
        gpus: dict[tuple[float | int, ...], int] = {}
        stage, gpu = [], []
        for d in self._kind_reps:
            figures = (self.inv_bw[d], self.flop_s_per_byte[d], self.block_s[d], self.stage_s[d])
            room = self.usable[d]
            stage.append(classes.setdefault((*figures, self.xfer_s[d], room), len(classes)))
            gpu.append(gpus.setdefault((*figures, room), len(gpus)))
        self.stage_class = self._expand(stage)
        """Per node index, its class: nodes alike in every figure a stage's time (without
        an in-host hop) and fit read — bandwidth, compute, block and stage costs, transfer
        and usable VRAM — share one."""
        self.gpu_class = self._expand(gpu)
        """Per node index, its GPU class: its :attr:`stage_class` but for the transfer out
        (nodes of one GPU and usable VRAM, each with a link of its own, share one)."""

    @property
    def constraints(self) -> Constraints:
        """The constraints this model was built for."""
        return self._constraints

    def _node_calibrations(self, single_gpu: bool) -> list[NodeCalibration]:
        """Each node's calibration factors, as tensor parallel over its GPUs unless
        ``single_gpu``."""
        return list(_expander(self._node_kind_of)(self._kind_calibrations(single_gpu)))

    def _kind_calibrations(self, single_gpu: bool) -> list[NodeCalibration]:
        """:meth:`_node_calibrations` of each kind of descriptor's first node."""
        # Nodes of one GPU kind, measurement and split share one lookup.
        known: dict[tuple[str, bool, int], NodeCalibration] = {}
        out = []
        for d in self._node_reps:
            n = self.nodes[d]
            key = (n.gpu_name, bandwidth_is_measured(n), 1 if single_gpu else n.num_gpus)
            if key not in known:
                known[key] = node_calibration(
                    self.calibration,
                    n.gpu_name,
                    self.model.dtype,
                    bandwidth_measured=key[1],
                    tensor_parallel=key[2],
                )
            out.append(known[key])
        return out

    def relax_groups(self) -> CostModel:
        """This model with every node as fast as any grouping of its GPUs could be (for
        bounds); this one is left as it is.

        Its full bandwidth and FLOPs with no all-reduce or collective (a tp-1 group pays
        none, and a smaller group never streams faster), no in-host hop, and the cheaper
        of its network and intra-node transfer and hop.  Its microbatch views are relaxed
        too.  Built once per model: every microbatch view relaxes the same root.
        """
        if self._relaxed:
            return self
        root = self._root
        if root._relaxed_root is None:
            relaxed = CostModel(
                root.model,
                root.nodes,
                root._constraints,
                root.calibration,
                parents=root.parent,
                microbatch=root.microbatch,
            )
            relaxed._relax()
            root._relaxed_root = relaxed
        return root._relaxed_root.at_microbatch(self.microbatch)

    def _relax(self) -> None:
        """The terms of :meth:`relax_groups`, set on a model just built (never one handed out)."""
        root = self._root
        if root is not self and root._relaxed:
            self.block_s = root.block_s  # a view of a relaxed model: the same block costs
        else:
            single = self._node_calibrations(single_gpu=True)
            self.block_s = tuple(c.block_overhead_s for c in single)
        self.stage_s = (0.0,) * len(self.nodes)
        self.xfer_s = tuple(map(min, self.xfer_s, self.intra_xfer_s))
        self.latency_s = tuple(map(min, self.latency_s, self.intra_latency_s))
        self._relaxed = True
        self._set_stage_classes()

    def at_microbatch(self, microbatch: int) -> CostModel:
        """This model with stages stepping ``microbatch`` sequences (the KV reserve still
        holds all U): the one a pipeline of ``S`` stages runs at is
        ``microbatches(U, S)[1]``.  Cached; relaxed when this one is."""
        if microbatch == self.microbatch:
            return self
        root = self._root
        if microbatch == root.microbatch:
            return root
        view = root._views.get(microbatch)
        if view is None:
            if not 1 <= microbatch <= root.batch:
                raise InputError("microbatch", microbatch, f"must be within 1..{root.batch}")
            # The root's figures that do not depend on the microbatch are shared (relaxed
            # ones are relaxed again, which changes nothing); the rest are computed anew.
            view = object.__new__(CostModel)
            view.__dict__.update(root.__dict__)
            view._views, view._root, view._relaxed = {}, root, False
            view._relaxed_root = None
            view.microbatch = microbatch
            view._set_microbatch()
            if root._relaxed:
                view._relax()
            root._views[microbatch] = view
        return view

    def for_stages(self, num_stages: int) -> CostModel:
        """The model a pipeline of ``num_stages`` stages steps at (its microbatch size)."""
        return self.at_microbatch(microbatches(self.batch, num_stages)[1])

    # -- one stage ------------------------------------------------------------------
    def stage_time(
        self, d: int, lo: int, hi: int, first: bool, last: bool, next_d: int | None = None
    ) -> float:
        """Seconds stage ``[lo, hi)`` on node ``d`` takes per step (with its outbound transfer).

        The transfer goes over the network unless ``next_d``, the next stage's node, is
        another GPU group of the same node (then over the GPUs' own link).
        """
        weights = self.read_prefix[hi] - self.read_prefix[lo] + (self.head if last else 0)
        read = weights + self.kv_prefix[hi] - self.kv_prefix[lo]
        t = max(read * self.inv_bw[d], weights * self.flop_s_per_byte[d])
        t += (hi - lo) * self.block_s[d] + self.stage_s[d]
        if last:
            return t
        return t + (self.intra_xfer_s[d] if self.same_node(d, next_d) else self.xfer_s[d])

    def same_node(self, d: int, e: int | None) -> bool:
        """Whether node indices ``d`` and ``e`` are GPU groups of one physical node."""
        return e is not None and e != d and self.parent[d] == self.parent[e]

    def hop_s(self, d: int, next_d: int) -> float:
        """Latency of the hop from a stage on ``d`` to the next one (or back to stage 0)."""
        return self.intra_latency_s[d] if self.same_node(d, next_d) else self.latency_s[d]

    def stage_bytes(self, lo: int, hi: int, first: bool, last: bool) -> int:
        """Weights + KV reserve the stage holds."""
        m = self.mem_prefix[hi] - self.mem_prefix[lo]
        return m + (self.embed if first else 0) + (self.head if last else 0)

    def fits(self, d: int, lo: int, hi: int, first: bool, last: bool) -> bool:
        return self.stage_bytes(lo, hi, first, last) <= self.usable[d]

    def fits_pipeline(self, order: Sequence[int], bounds: Sequence[int]) -> bool:
        """Every stage of nodes ``order`` with block boundaries ``bounds`` fits its node."""
        n = len(order)
        return all(
            self.fits(d, bounds[s], bounds[s + 1], s == 0, s == n - 1) for s, d in enumerate(order)
        )

    # -- one block (for the relaxations and surrogates) --------------------------------------
    def smallest_block(self) -> tuple[int, float, int]:
        """Weight read, KV read and memory (weights + KV) bytes of the smallest block.

        Each is its own minimum over the blocks: every block's figures when blocks are
        alike, a lower bound on any block's otherwise.
        """
        if self._smallest_kept is None:
            nb = self.num_blocks
            rp, kp, mp = self.read_prefix, self.kv_prefix, self.mem_prefix
            self._smallest_kept = (
                min(rp[i + 1] - rp[i] for i in range(nb)),
                min(kp[i + 1] - kp[i] for i in range(nb)),
                min(mp[i + 1] - mp[i] for i in range(nb)),
            )
        return self._smallest_kept

    def max_window(self) -> list[int]:
        """Per node: the most consecutive blocks (weights + KV) that fit its usable VRAM.

        The same for every view of a model (the memory does not depend on the microbatch
        or the relaxation): computed once per root, a fresh list each call."""
        root = self._root
        if root._windows_kept is None:
            root._windows_kept = self._windows()
        return list(root._windows_kept)

    def _windows(self) -> list[int]:
        return most_within(self.mem_prefix, range(self.num_blocks + 1), self.usable)

    def block_seconds(self, d: int, read: float, weights: float) -> float:
        """Seconds a block reading ``read`` bytes (``weights`` of them weights) adds to a
        stage on node ``d``, as :meth:`stage_time` counts it (its block cost included)."""
        return max(read * self.inv_bw[d], weights * self.flop_s_per_byte[d]) + self.block_s[d]

    # -- a pipeline -------------------------------------------------------------------
    def evaluate(self, order: Sequence[int], bounds: Sequence[int]) -> Evaluation:
        """Stage times and hops of nodes ``order`` with block boundaries ``bounds``, at the
        microbatch size U sequences take on ``len(order)`` stages."""
        m, b = microbatches(self.batch, len(order))
        return replace(self.at_microbatch(b).evaluate_here(order, bounds), num_microbatches=m)

    def evaluate_here(self, order: Sequence[int], bounds: Sequence[int]) -> Evaluation:
        """Stage times at this model's own microbatch, whatever the stage count, with one
        microbatch per cycle (so ``time_per_token_s`` is the trip Σ t + hops): what the
        searches that run on one microbatch size compare."""
        n = len(order)
        # Where no two stages share a host every transfer and hop goes over the network:
        # no next node to compare.
        after: list[int | None] = [None] * n if self.own_hosts else [*order[1:], None]
        times = tuple(
            self.stage_time(d, bounds[s], bounds[s + 1], s == 0, s == n - 1, after[s])
            for s, d in enumerate(order)
        )
        if n < 2:
            hops = 0.0
        elif self.own_hosts:
            hops = sum([self.latency_s[d] for d in order])
        else:
            hops = sum(self.hop_s(d, order[(s + 1) % n]) for s, d in enumerate(order))
        return Evaluation(
            stage_time_s=times, hops_s=hops, batch=self.batch, microbatch=self.microbatch
        )

    def kv_capacity_tokens(self, order: Sequence[int], bounds: Sequence[int]) -> int | None:
        """Tokens of KV cache the tightest stage can hold beside its weights (None: unknown)."""
        if not self.has_kv_figure:
            return None
        n = len(order)
        best: int | None = None
        for s, d in enumerate(order):
            lo, hi = bounds[s], bounds[s + 1]
            per_token = self.kv_token_prefix[hi] - self.kv_token_prefix[lo]
            if per_token == 0:
                continue
            weights = self.stage_bytes(lo, hi, s == 0, s == n - 1) - (
                self.kv_held_prefix[hi] - self.kv_held_prefix[lo]
            )
            cap = max(self.usable[d] - weights, 0) // per_token
            best = cap if best is None else min(best, cap)
        return best

    def cost_per_hour(self, order: Sequence[int]) -> float | None:
        """Rent of the physical nodes ``order`` runs on (a node split into stages counts once)."""
        once = {self.parent[d]: d for d in order}
        prices = [self.rates[d].price_per_hour for d in once.values()]
        if any(p is None for p in prices):
            return None
        return float(sum(p for p in prices if p is not None))

    def prediction(self, order: Sequence[int], bounds: Sequence[int]) -> Prediction:
        ev = self.evaluate(order, bounds)
        price = self.cost_per_hour(order)
        return Prediction(
            batch=self.batch,
            tokens_per_s=ev.tokens_per_s,
            time_per_token_s=ev.time_per_token_s,
            stage_time_s=ev.stage_time_s,
            bottleneck_stage=max(range(len(order)), key=lambda s: ev.stage_time_s[s]),
            kv_capacity_tokens=self.kv_capacity_tokens(order, bounds),
            cost_per_hour=price,
            usd_per_million_tokens=usd_per_million_tokens(price, ev.served_tokens_per_s),
            assumed=tuple(a for d in order for a in self.node_assumed[d]),
            calibration=(
                describe_calibration(
                    self.calibration,
                    [self.nodes[d].gpu_name for d in order],
                    self.model.dtype,
                    [bandwidth_is_measured(self.nodes[d]) for d in order],
                    [self.tensor_parallel[d] for d in order],
                )
                if self.calibration is not None
                else None
            ),
        )

    def planning_id(self, a: StageAssignment) -> str:
        """The id of the planning node stage ``a`` runs on (its node, or its GPU group)."""
        return _planning_id_of(self.index, a)

    def plan_order_bounds(self, plan: Plan) -> tuple[list[int], list[int]]:
        """Node indices in stage order and block bounds of ``plan`` (a stage on a GPU group
        of a node is the planning node :func:`~stowplan.model.gpu_group_id` names)."""
        order = [self.index[self.planning_id(a)] for a in plan.assignments]
        bounds = [a.block_range[0] for a in plan.assignments] + [
            plan.assignments[-1].block_range[1]
        ]
        return order, bounds


@lru_cache(maxsize=512)
def _step_reads(
    model: ModelLayout, tokens: float, whole: bool, microbatch: int
) -> tuple[float, ...]:
    """Prefix sums over the blocks of what a step of ``microbatch`` sequences reads beyond
    the weights (:attr:`CostModel.kv_prefix`): the same for every model of ``model`` at
    that read context, so computed once for all of them (their views, their relaxations,
    their GPU groups).  ``whole``: whether ``tokens`` is an int (an int and a float
    context that compare equal are kept apart: their arithmetic differs)."""
    touch = expert_touch_bytes(model, microbatch)
    return (
        0,
        *accumulate(
            kv_read_bytes(model, i, tokens, microbatch) + touch[i] for i in range(model.num_blocks)
        ),
    )


@lru_cache(maxsize=256, typed=True)
def _block_figures(
    model: ModelLayout, ctx: int, batch: int
) -> tuple[bool, bool, tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The figures of :class:`CostModel` that depend on the blocks alone (at ``ctx``
    context tokens of KV for ``batch`` sequences): whether the blocks are alike, whether
    the model has a KV figure, and the prefix sums of the memory held, the KV held, the
    weights read and the KV bytes per token.  The same for every model of ``model`` at
    that reserve (its GPU groups, its layouts, its relaxations): computed once for all."""
    per_block = zip(
        model.block_sizes(),
        model.block_read_sizes(),
        model.kv_bytes_per_token or (0,) * model.num_blocks,
        model.kv_window_tokens or (None,) * model.num_blocks,
        strict=True,
    )
    uniform = len(set(per_block)) == 1
    kv_held = [model.kv_bytes(i, ctx, batch) for i in range(model.num_blocks)]
    mem_prefix = (
        0,
        *accumulate(s + k for s, k in zip(model.block_sizes(), kv_held, strict=True)),
    )
    per_token = model.kv_bytes_per_token or (0,) * model.num_blocks
    return (
        uniform,
        model.kv_bytes_per_token is not None,
        mem_prefix,
        (0, *accumulate(kv_held)),
        (0, *accumulate(model.block_read_sizes())),
        (0, *accumulate(per_token)),
    )


def plan_cost_model(
    model: ModelLayout,
    plan: Plan,
    nodes: Sequence[NodeDescriptor],
    constraints: Constraints,
    calibration: Calibration | None = None,
    *,
    whole: Sequence[NodeDescriptor] | None = None,
) -> CostModel:
    """The cost model ``plan`` is predicted on: over ``whole`` (default ``nodes``) where
    every stage takes whole nodes; where some stage runs on part of its node's GPUs, over
    every stage's planning node (:func:`~stowplan.moe.routing.nodes_in_order`, a GPU group
    of its own), each with its physical node as parent."""
    units = nodes_in_order(plan, nodes)
    parents = [a.node_id for a in plan.assignments]
    if all(u.id == p for u, p in zip(units, parents, strict=True)):
        return CostModel(model, nodes if whole is None else whole, constraints, calibration)
    return CostModel(model, units, constraints, calibration, parents=parents)


def kv_read_bytes(model: ModelLayout, block: int, tokens: float, sequences: int) -> float:
    """KV bytes ``sequences`` sequences read in ``block`` at a context of ``tokens`` (a
    sliding-window block reads at most its window); 0 without a KV figure."""
    if model.kv_bytes_per_token is None:
        return 0.0
    window = model.kv_window_tokens[block] if model.kv_window_tokens is not None else None
    read = tokens if window is None else min(tokens, window)
    return model.kv_bytes_per_token[block] * read * sequences


def _planning_id_of(index: dict[str, int], a: StageAssignment) -> str:
    if a.node_id in index or not a.gpu_indices:
        return a.node_id
    return gpu_group_id(a.node_id, a.gpu_indices[0], len(a.gpu_indices))


_ID = attrgetter("id")
_RATES = itemgetter(0)
_ASSUMED = itemgetter(1)

_rate_figures = attrgetter(*(f.name for f in fields(NodeRates) if f.name != "node_id"))
"""A node's rates but for its id."""


def _expander(of: Sequence[int]) -> Callable[[Sequence[T]], tuple[T, ...]]:
    """``values → (values[of[0]], values[of[1]], …)``, at C speed."""
    if not of:
        return lambda values: ()
    if len(of) == 1:
        only = of[0]
        return lambda values: (values[only],)
    return itemgetter(*of)


KIND_ARRAYS = 64
"""From this many kinds of node, an uncalibrated model computes each microbatch's
per-kind figures on arrays (the same float operations in the same order)."""


def _rate_arrays(
    rates: Sequence[NodeRates], tensor_parallel: Sequence[int], reps: Sequence[int]
) -> tuple[Any, ...] | None:
    """The rates of :func:`_figures_on_arrays`, one entry per kind (None without numpy)."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        return None
    return (
        np,
        np.array([r.flops_per_s for r in rates], dtype=float),
        np.array([r.link_bytes_per_s for r in rates], dtype=float),
        np.array([r.intra_bytes_per_s for r in rates], dtype=float),
        np.array([r.intra_latency_s for r in rates], dtype=float),
        np.array([tensor_parallel[d] for d in reps], dtype=np.int64),
    )


def _calibration_arrays(
    np: Any,
    cal: Sequence[NodeCalibration],
    single: Sequence[NodeCalibration],
    spread: Sequence[int],
) -> tuple[Any, ...]:
    """Per kind, the calibration figures :func:`_figures_on_arrays` applies: GPUs a stage
    spreads over, compute efficiency, hop overhead, and the block overheads of the profile
    and of one GPU."""
    return (
        np.array(spread, dtype=np.int64),
        np.array([c.compute_efficiency for c in cal], dtype=float),
        np.array([c.hop_overhead_s for c in cal], dtype=float),
        np.array([c.block_overhead_s for c in cal], dtype=float),
        np.array([c.block_overhead_s for c in single], dtype=float),
    )


def _figures_on_arrays(
    arrays: tuple[Any, ...], work: float, act: float, calibration: tuple[Any, ...] | None = None
) -> tuple[list[float], list[float], list[float], list[float], list[float]]:
    """Per kind: compute seconds per byte (``work`` FLOPs per byte over the FLOPs),
    transfer, in-host transfer, all-reduce and block cost of ``act`` activation bytes,
    as the per-kind lists of :meth:`CostModel._set_microbatch` compute them (and
    :func:`_all_reduce_s`), value for value, with ``calibration``
    (:func:`_calibration_arrays`) applied as it applies them."""
    np, flops, link, intra_bw, intra_lat, tp = arrays
    with np.errstate(divide="ignore", invalid="ignore"):
        flop = np.minimum(work / flops, _SLOWEST)
        xfer = act / link
        intra = act / intra_bw
        ring = intra_lat + 2 * (tp - 1) / tp * act / intra_bw
    all_reduce = np.where(tp <= 1, 0.0, ring)
    block = 2 * all_reduce
    if calibration is not None:
        spread, efficiency, hop, overhead, base = calibration
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            flop = np.minimum(flop * spread / efficiency, _SLOWEST)
            xfer = xfer + hop
            intra = intra + hop
            # As max(0.0, rest): the rest where it is above zero, else zero.
            rest = overhead - base - block
            block = block + base + np.where(rest > 0.0, rest, 0.0)
    return (
        flop.tolist(),
        xfer.tolist(),
        intra.tolist(),
        all_reduce.tolist(),
        block.tolist(),
    )


def _all_reduce_s(tensor_parallel: int, act_bytes: float, rates: NodeRates) -> float:
    """AR(tp): one ring all-reduce of ``act_bytes`` over ``tp = tensor_parallel`` GPUs of
    one node.

    ``0`` for ``tp == 1``, else ``intra_latency + 2 (tp − 1) / tp × act_bytes / intra_bw``.
    """
    tp = tensor_parallel
    if tp <= 1:
        return 0.0
    return rates.intra_latency_s + 2 * (tp - 1) / tp * act_bytes / rates.intra_bytes_per_s


def most_within(mp: Sequence[int], counted: Sequence[int], rooms: Sequence[int]) -> list[int]:
    """Per room, the most blocks ``counted`` counts (a prefix count over the blocks) in
    any window of consecutive blocks whose memory (``mp``, a prefix sum) fits it; rooms
    alike (GPU groups of one kind) are counted once."""
    nb = len(mp) - 1
    by_room: dict[int, int] = {}
    for room in rooms:
        if room in by_room:
            continue
        best, lo = 0, 0
        for hi in range(1, nb + 1):
            while mp[hi] - mp[lo] > room:
                lo += 1
            best = max(best, counted[hi] - counted[lo])
        by_room[room] = best
    return [by_room[room] for room in rooms]
