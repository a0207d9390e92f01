"""A probed host as a node of the cluster planner: ``node_from_passport``."""

from __future__ import annotations

from stowplan.calibration.apply import MEASURED_LABEL
from stowplan.circuits import CircuitKind
from stowplan.cost import CostModel
from stowplan.errors import InputError
from stowplan.host.passport import Passport
from stowplan.model import Constraints, ModelLayout, NodeDescriptor

__all__ = ["node_from_passport", "whole_model_seconds"]


def node_from_passport(
    passport: Passport, *, node_id: str | None = None, circuit: str | None = None
) -> NodeDescriptor:
    """A :class:`NodeDescriptor` for one circuit of a probed host (default: the best-ranked).

    ``vram_bytes`` is the capacity of the circuit's pool; ``mem_bandwidth_gbps``
    its measured GEMV throughput in GB/s; ``flops_estimate`` is left 0, so the
    cost model takes the GPU's datasheet figure (listed as assumed) or, for a
    CPU or an unknown GPU, counts no compute time: the probe's f32 GEMV
    measures bandwidth, and its flop rate (half its bytes/s) is a lower bound
    that would make decode look compute-bound at twice its memory time;
    ``link_mbps`` the fastest network interface discovery saw;
    ``intra_link_gbps`` / ``intra_link_latency_us`` the host's probed GPU-to-GPU
    link when discovery read one (``nvidia-smi topo -m``; the ``measured`` label
    then lists ``intra_link`` and the label ``intra_link`` says how).
    """
    matrix = passport.matrix
    cid = circuit if circuit is not None else (matrix.order[0] if matrix.order else None)
    entry = matrix.get(cid) if cid is not None else None
    if entry is None:
        raise InputError("circuit", circuit, f"must be one of the measured circuits {matrix.order}")
    topo = passport.topology
    c = topo.circuit(entry.circuit)
    pool = topo.pool(c.pool)
    bytes_per_s = entry.compute_bytes_per_s
    measured = "bandwidth"
    probed: tuple[tuple[str, str], ...] = ()
    if topo.intra_link_gbps is not None:
        measured += ",intra_link"
        probed = (("intra_link", topo.intra_link_source or "probed"),)
    return NodeDescriptor(
        id=node_id or f"{topo.hostname}:{c.id}",
        gpu_name=c.name,
        vram_bytes=pool.capacity_bytes,
        flops_estimate=0.0,
        link_mbps=topo.link_mbps,
        mem_bandwidth_gbps=bytes_per_s / 1e9,
        labels=(
            ("source", "passport"),
            (MEASURED_LABEL, measured),
            ("fingerprint", passport.fingerprint[:12]),
            ("circuit", c.id),
            *((("kind", "cpu"),) if c.kind is CircuitKind.CPU else ()),
            *probed,
        ),
        intra_link_gbps=topo.intra_link_gbps,
        intra_link_latency_us=topo.intra_link_latency_us,
    )


def whole_model_seconds(
    passport: Passport, model: ModelLayout, constraints: Constraints
) -> dict[str, float]:
    """Per measured circuit, the seconds one token takes with all of ``model`` on it, as
    ``plan`` predicts a one-stage plan on :func:`node_from_passport`'s node (same cost
    model, same ``constraints.calibration``, context and sequences): what
    :func:`stowplan.planner.residency.plan_residency` scales by each segment's share."""
    out = {}
    for cid in passport.matrix.order:
        node = node_from_passport(passport, circuit=cid)
        cost = CostModel(model, [node], constraints, constraints.calibration)
        out[cid] = cost.evaluate([0], [0, model.num_blocks]).time_per_token_s
    return out
