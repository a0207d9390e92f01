"""Turn a first-order stage estimate into a calibrated one.

For a stage of ``num_blocks`` blocks that reads ``read_bytes`` and does
``2 * params * batch`` FLOPs per decode step on a device with
``bandwidth_gbps`` and ``tflops``::

    memory_s  = read_bytes / (bandwidth_gbps * 1e9 * f_dtype)
    compute_s = 2 * params * batch / (tflops * 1e12 * compute_efficiency)
    time_s    = max(memory_s, compute_s) + num_blocks * block_overhead_s
                + hops * hop_overhead_s
                + num_blocks * collective_overhead_s   (tensor parallel only)

``bandwidth_gbps`` and ``tflops`` are the stage's totals: a stage split over
``tensor_parallel`` GPUs streams its bytes through all of them at once, and
each of its blocks pays the all-reduces that join the GPUs' shares.

With no calibration, ``f_dtype = compute_efficiency = 1`` and both overheads
are 0: the first-order model.  The cost model (:mod:`stowplan.cost`) folds
:func:`node_calibration`'s factors into its per-node rates; :func:`stage_time_s`
gives one stage's time and :func:`calibrate_stage` its terms, for fits,
benchmarks and reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stowplan.calibration.order import ordered_entry
from stowplan.calibration.profile import Calibration, DeviceCalibration
from stowplan.errors import InputError
from stowplan.model import NodeDescriptor

__all__ = [
    "FIRST_ORDER_LABEL",
    "MEASURED_LABEL",
    "NodeCalibration",
    "StageEstimate",
    "bandwidth_is_measured",
    "calibrate_stage",
    "calibration_label",
    "describe_calibration",
    "node_calibration",
    "stage_time_s",
]


MEASURED_LABEL = "measured"
"""Node label listing, comma-separated, the figures measured on the node itself
(``bandwidth``, ``flops``); :func:`stowplan.host.node_from_passport` sets it."""


def bandwidth_is_measured(node: NodeDescriptor) -> bool:
    """Whether ``node.mem_bandwidth_gbps`` was measured on the node (label ``measured``
    lists ``bandwidth``), not taken from a datasheet."""
    return any(
        key == MEASURED_LABEL and "bandwidth" in (v.strip() for v in value.split(","))
        for key, value in node.labels
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeCalibration:
    """The factors a cost model applies to one node (identity: first-order)."""

    bandwidth_fraction: float = 1.0
    compute_efficiency: float = 1.0
    block_overhead_s: float = 0.0
    """Per block, including its all-reduces when the node is tensor parallel."""
    hop_overhead_s: float = 0.0
    device: str | None = None
    """The profile entry used (None: no calibration)."""


def node_calibration(
    calibration: Calibration | None,
    gpu_name: str,
    dtype: str | None,
    *,
    bandwidth_measured: bool = False,
    tensor_parallel: int = 1,
) -> NodeCalibration:
    """The factors for a node with ``gpu_name`` holding ``dtype`` weights.

    For cost models that precompute per-node rates: divide the bandwidth by
    ``bandwidth_fraction``-scaled peak, the FLOP/s by ``compute_efficiency``,
    add ``block_overhead_s`` per block and ``hop_overhead_s`` per outbound hop.
    A profile's bandwidth fraction derates a datasheet peak; a node whose
    bandwidth was measured (``bandwidth_measured``, see
    :func:`bandwidth_is_measured`) already streams at the achieved rate, so
    its fraction is 1.0.  A node of ``tensor_parallel`` > 1 GPUs adds the
    profile's collective cost to every block.  The entry's figures are held in
    datasheet order (:func:`~stowplan.calibration.order.ordered_entry`): a GPU that
    dominates another on the datasheet never gets figures that make it slower.
    """
    entry = ordered_entry(calibration, gpu_name) if calibration is not None else None
    if entry is None:
        return NodeCalibration()
    collective = entry.collective_overhead_s.value if tensor_parallel > 1 else 0.0
    return NodeCalibration(
        bandwidth_fraction=1.0 if bandwidth_measured else entry.fraction(dtype).value,
        compute_efficiency=entry.compute_efficiency.value,
        block_overhead_s=entry.block_overhead_s.value + collective,
        hop_overhead_s=entry.hop_overhead_s.value,
        device=entry.device,
    )


FIRST_ORDER_LABEL = "first-order model, uncalibrated"


def calibration_label(calibration: Calibration | None) -> str:
    """How a prediction names its model: ``engine generic, calibrated on 101 published runs``
    (``… and your fits`` when the user's fitted entries lead), ``engine vllm, calibration
    my-profile`` for a profile that records no runs, or ``first-order model, uncalibrated``."""
    if calibration is None:
        return FIRST_ORDER_LABEL
    engine = f"engine {calibration.engine.value}"
    n = len(calibration.fitted_runs)
    if n == 0:
        return f"{engine}, calibration {calibration.name}"
    runs = f"{n} published run{'s' * (n != 1)}"
    mine = " and your fits" if "+" in calibration.name else ""
    return f"{engine}, calibrated on {runs}{mine}"


def describe_calibration(
    calibration: Calibration,
    gpu_names: Sequence[str],
    dtype: str | None,
    bandwidth_measured: Sequence[bool] = (),
    tensor_parallel: Sequence[int] = (),
) -> str:
    """Name the profile and where each figure used came from, for a plan's rationale.

    ``engine llamacpp, calibrated on 35 published runs: llamacpp-default [rtx-4090:
    bandwidth fitted, block fitted, hop table, compute table]`` (the lead is
    :func:`calibration_label`; ``engine vllm`` alone for a profile without runs);
    ``bandwidth_measured[i]`` true (node ``i`` brought its own measured bandwidth, fraction
    1.0) reads ``bandwidth measured``; a node of ``tensor_parallel[i]`` > 1 GPUs adds
    where its collective cost came from.
    """
    parts = []
    seen: set[tuple[str, bool, bool]] = set()
    n = len(gpu_names)
    measured = list(bandwidth_measured) + [False] * (n - len(bandwidth_measured))
    split = [t > 1 for t in tensor_parallel] + [False] * (n - len(tensor_parallel))
    for name, own, tp in zip(gpu_names, measured, split, strict=True):
        entry = calibration.for_device(name)
        if entry is None or (entry.device, own, tp) in seen:
            continue
        seen.add((entry.device, own, tp))
        bandwidth = "measured" if own else entry.fraction(dtype).provenance.value
        collective = f", collective {entry.collective_overhead_s.provenance.value}" if tp else ""
        parts.append(
            f"{entry.device}: bandwidth {bandwidth}, "
            f"block {entry.block_overhead_s.provenance.value}, "
            f"hop {entry.hop_overhead_s.provenance.value}{collective}, "
            f"compute {entry.compute_efficiency.provenance.value}"
        )
    detail = "; ".join(parts) or "no matching device"
    lead = (
        calibration_label(calibration)
        if calibration.fitted_runs
        else "engine " + (calibration.engine.value)
    )
    return f"{lead}: {calibration.name} [{detail}]"


@dataclass(frozen=True, slots=True, kw_only=True)
class StageEstimate:
    """The terms of one stage's time per decode step, in seconds."""

    memory_s: float
    compute_s: float
    block_overhead_s: float
    hop_overhead_s: float
    bandwidth_fraction: float
    calibrated: bool

    @property
    def time_s(self) -> float:
        """max(memory, compute) plus the fixed costs."""
        return max(self.memory_s, self.compute_s) + self.block_overhead_s + self.hop_overhead_s

    @property
    def bound(self) -> str:
        """``memory`` or ``compute``: which roofline term dominates."""
        return "compute" if self.compute_s > self.memory_s else "memory"


def calibrate_stage(
    *,
    read_bytes: int,
    params: int,
    num_blocks: int,
    bandwidth_gbps: float,
    tflops: float,
    dtype: str | None = None,
    batch: int = 1,
    hops: int = 0,
    tensor_parallel: int = 1,
    device: DeviceCalibration | None = None,
) -> StageEstimate:
    """The calibrated terms of one stage (first-order when ``device`` is None).

    ``read_bytes``: bytes one decode step reads on this stage; ``params``:
    parameters it multiplies (FLOPs = 2 · params · batch); ``bandwidth_gbps``:
    peak memory bandwidth in GB/s; ``tflops``: peak dense TFLOP/s (0: unknown,
    compute ignored); ``hops``: stage hops this stage pays (usually 1, or 0 for
    a single stage); ``tensor_parallel``: GPUs the stage is split over (its
    bandwidth and FLOP/s are their totals).
    """
    if bandwidth_gbps <= 0:
        raise InputError("bandwidth_gbps", bandwidth_gbps, "must be > 0")
    for name, value, least in (
        ("read_bytes", read_bytes, 0),
        ("params", params, 0),
        ("num_blocks", num_blocks, 0),
        ("hops", hops, 0),
        ("tflops", tflops, 0),
        ("batch", batch, 1),
        ("tensor_parallel", tensor_parallel, 1),
    ):
        if value < least:
            raise InputError(name, value, f"must be >= {least}")
    if device is None:
        frac, eff, per_block, per_hop = 1.0, 1.0, 0.0, 0.0
    else:
        frac = device.fraction(dtype).value
        eff = device.compute_efficiency.value
        per_block = device.block_overhead_s.value
        if tensor_parallel > 1:
            per_block += device.collective_overhead_s.value
        per_hop = device.hop_overhead_s.value
    memory_s = read_bytes / (bandwidth_gbps * 1e9 * frac)
    compute_s = 2.0 * params * batch / (tflops * 1e12 * eff) if tflops > 0 else 0.0
    return StageEstimate(
        memory_s=memory_s,
        compute_s=compute_s,
        block_overhead_s=num_blocks * per_block,
        hop_overhead_s=hops * per_hop,
        bandwidth_fraction=frac,
        calibrated=device is not None,
    )


def stage_time_s(
    *,
    read_bytes: int,
    params: int,
    num_blocks: int,
    bandwidth_gbps: float,
    tflops: float,
    dtype: str | None = None,
    batch: int = 1,
    hops: int = 0,
    tensor_parallel: int = 1,
    device: DeviceCalibration | None = None,
) -> float:
    """Seconds one decode step spends on the stage (see :func:`calibrate_stage`)."""
    return calibrate_stage(
        read_bytes=read_bytes,
        params=params,
        num_blocks=num_blocks,
        bandwidth_gbps=bandwidth_gbps,
        tflops=tflops,
        dtype=dtype,
        batch=batch,
        hops=hops,
        tensor_parallel=tensor_parallel,
        device=device,
    ).time_s
