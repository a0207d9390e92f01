"""Expert placement benchmark: speed, balance and traffic against the EPLB rule; a WAN case.

Run: ``.venv/bin/python benchmarks/experts.py`` (prints Markdown tables).

Part 1 — DeepSeek-V3 (58 MoE blocks × 256), Kimi-K2 (60 × 384) and
Qwen3-235B-A22B (94 × 128), from the known-model table, on 16 and 64 heterogeneous nodes (half H100 80 GB
at 3350 GB/s, half A100 80 GB at 2039 GB/s), Zipf(0.6) load per block, one
pipeline stage per node (61-block models use 61 of the 64).  Both placements
get the same backbone plan, the same free slots and the same replica cap; the
EPLB rule runs hierarchically (8 groups, hosts of 8 nodes) where it can.
Placement time is the median CPU time of 3 runs of ``place_experts``.  The
co-activation table routes half the tokens to whole clusters of 8 experts
(:func:`clustered_routing`) and compares the three placements on it.

Part 2 — a Kimi-class MoE (Kimi-K2 at 4.5 bits per weight, from
``moe_layouts.py``: the table has no 4-bit Kimi) on a pool of 64
rented consumer GPUs (RTX 3090/4090/5090) over WAN links of 100–1000 Mbit/s
and 10–60 ms, one request in flight.  Time per token is the design's
first-order model: per stage, weight reads at the GPU's bandwidth plus the hop
(latency + activation over the link); for the expert-parallel plan the routed
experts' reads are replaced by :func:`expert_stage_times` (slowest holder +
all-to-all). Three rows: block-local (``ExpertPlacement.BLOCK_LOCAL``), expert-parallel
forced (``ExpertPlacement.EXPERT_PARALLEL``) and the automatic choice (``plan``'s
default, which picks the placement the cost model predicts faster).
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from moe_layouts import kimi_k2
from stowplan import Constraints, ModelLayout, NodeDescriptor, Plan, lookup, plan
from stowplan.cost import predict
from stowplan.moe.stats import CoActivation, ExpertLoad, zipf_load
from stowplan.planner import plan_blocks
from stowplan.planner.baselines.eplb import eplb_place
from stowplan.planner.experts import (
    ExpertInputs,
    ExpertPlacement,
    backbone_layout,
    expert_stage_times,
    expert_summary,
    place_experts,
)

GIB = 2**30


def datacenter(n: int) -> list[NodeDescriptor]:
    out = []
    for i in range(n):
        fast = i % 2 == 1
        out.append(
            NodeDescriptor(
                id=f"{'h100' if fast else 'a100'}-{i:02d}",
                gpu_name="H100 80GB" if fast else "A100 80GB",
                vram_bytes=80 * GIB,
                flops_estimate=989.0 if fast else 312.0,
                link_mbps=400_000.0 if fast else 200_000.0,
                mem_bandwidth_gbps=3350.0 if fast else 2039.0,
                link_latency_ms=0.01,
            )
        )
    return out


def clustered_routing(
    model: ModelLayout, load: ExpertLoad, *, mix: float = 0.5, seed: int = 2
) -> tuple[ExpertLoad, CoActivation]:
    """Expected statistics of 10,000 tokens per block routed by a two-mode model.

    With probability ``mix`` a token selects one whole random cluster of k
    experts (a cluster chosen in proportion to its members' load); otherwise
    it selects k experts at chance, in proportion to ``load``.  Returns the
    matching load and the in-cluster pair counts (other pairs are at chance).
    """
    ex = model.experts
    assert ex is not None
    k, tokens = ex.experts_per_token, 10_000.0
    rng = random.Random(seed)
    loads, rows = [], []
    for base_row in load.per_block(ex):
        base = [k * x / sum(base_row) for x in base_row]
        order = list(range(ex.num_experts))
        rng.shuffle(order)
        groups = [sorted(order[c : c + k]) for c in range(0, ex.num_experts, k)]
        p_group = [sum(base[e] for e in g) / k for g in groups]
        p = [(1 - mix) * x for x in base]
        row = []
        for g, pg in zip(groups, p_group, strict=True):
            for i, e in enumerate(g):
                p[e] += mix * pg
                for f in g[i + 1 :]:
                    pair = mix * pg + (1 - mix) * base[e] * base[f] * (k - 1) / k
                    row.append((e, f, pair * tokens))
        loads.append(tuple(x * tokens for x in p))
        rows.append(tuple(row))
    return ExpertLoad(rows=tuple(loads)), CoActivation(rows=tuple(rows))


def part1() -> None:
    print(
        "| model | nodes (stages) | placement CPU s (median of 3) | imbalance ours "
        "| imbalance EPLB "
        "rule | transfers/token ours | EPLB rule | replicas ours / EPLB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    co_rows = []
    for name in ("deepseek-v3", "kimi-k2", "qwen3:235b-a22b"):
        model = lookup(name)
        assert model is not None
        ex = model.experts
        assert ex is not None
        load = zipf_load(len(ex.moe_blocks), ex.num_experts, exponent=0.6, seed=1)
        for n in (16, 64):
            nodes = datacenter(n)
            cons = Constraints(strategy="balance-by-vram", min_stages=min(n, model.num_blocks))
            base = plan_blocks(backbone_layout(model), nodes, cons)
            times = []
            ours: Plan | None = None
            for _ in range(3):
                t = time.process_time()
                ours = place_experts(base, model, nodes, cons, load)
                times.append(time.process_time() - t)
            assert ours is not None
            rule = eplb_place(base, model, nodes, cons, load, num_groups=8, gpus_per_host=8)
            a = expert_summary(ours, model, nodes, load)
            b = expert_summary(rule, model, nodes, load)
            print(
                f"| {model.name} | {n} ({base.num_stages}) | {statistics.median(times):.2f} | "
                f"{a.imbalance_mean:.3f} (worst {a.imbalance_max:.3f}) | "
                f"{b.imbalance_mean:.3f} (worst {b.imbalance_max:.3f}) | "
                f"{a.transfers_per_token:.0f} | {b.transfers_per_token:.0f} | "
                f"{a.num_replicas} / {b.num_replicas} |"
            )
            if n == 16:
                c_load, co = clustered_routing(model, load)
                with_co = place_experts(base, model, nodes, cons, c_load, co)
                plain = place_experts(base, model, nodes, cons, c_load)
                c_eplb = eplb_place(base, model, nodes, cons, c_load, num_groups=8, gpus_per_host=8)
                c_rule = expert_summary(c_eplb, model, nodes, c_load, co)
                c_plain = expert_summary(plain, model, nodes, c_load, co)
                c_ours = expert_summary(with_co, model, nodes, c_load, co)
                loose = place_experts(base, model, nodes, cons, c_load, co, locality_tolerance=0.15)
                c_loose = expert_summary(loose, model, nodes, c_load, co)
                co_rows.append(
                    f"| {model.name} | 16 | {c_rule.transfers_per_token:.0f} | "
                    f"{c_plain.transfers_per_token:.0f} | {c_ours.transfers_per_token:.0f} | "
                    f"{c_ours.imbalance_mean:.3f} | {c_loose.transfers_per_token:.0f} | "
                    f"{c_loose.imbalance_mean:.3f} |"
                )
    print()
    print("With co-activation (half the tokens select a whole cluster of 8; transfers per token):")
    print()
    print(
        "| model | nodes | EPLB rule | ours, load only | ours, co-activation (5 %) | imbalance "
        "| ours, co-activation (15 %) | imbalance |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in co_rows:
        print(row)


# -- part 2: consumer GPUs over WAN --------------------------------------------------------

_CONSUMER = (
    ("RTX 3090", 24, 936.0, 71.0, 0.20),
    ("RTX 4090", 24, 1008.0, 165.2, 0.35),
    ("RTX 5090", 32, 1792.0, 209.5, 0.62),
)


def consumer_pool(n: int, seed: int) -> list[NodeDescriptor]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        name, gb, bw, tf, price = _CONSUMER[rng.randrange(len(_CONSUMER))]
        out.append(
            NodeDescriptor(
                id=f"gpu-{i:02d}",
                gpu_name=name,
                vram_bytes=gb * 10**9,
                flops_estimate=tf,
                link_mbps=float(rng.choice((100, 200, 300, 500, 1000))),
                mem_bandwidth_gbps=bw,
                link_latency_ms=float(rng.randrange(10, 61, 5)),
                price_per_hour=price,
            )
        )
    return out


def _pipeline_time(
    p: Plan, model: ModelLayout, reads: tuple[int, ...], nodes: list[NodeDescriptor]
) -> tuple[float, float]:
    """Weight-read and hop seconds per token, single stream.

    The embed lookup reads one row (negligible); the head reads all of its bytes.
    """
    by_id = {n.id: n for n in nodes}
    read_s = hop_s = 0.0
    act_bits = model.hidden_dim * model.bytes_per_activation_elem * 8
    for a in p.assignments:
        node = by_id[a.node_id]
        w = sum(reads[a.block_range[0] : a.block_range[1]])
        w += model.head_params_bytes if a.owns_head else 0
        assert node.mem_bandwidth_gbps is not None
        read_s += w / (node.mem_bandwidth_gbps * 1e9)
        hop_s += node.link_latency_ms / 1e3 + act_bits / (node.link_mbps * 1e6)
    return read_s, hop_s


def part2() -> None:
    model = kimi_k2(bytes_per_param=4.5 / 8)
    pool = consumer_pool(64, seed=5)
    cons = Constraints()  # batch 1: the latency strategy
    print()
    print(
        f"Kimi-K2 at 4.5 bits/weight ({model.weight_bytes / 1e9:.0f} GB) on a pool of 64 "
        "consumer GPUs over WAN, one request in flight (cost model, latency strategy):"
    )
    print()
    print(
        "| plan | GPUs | tokens/s | $/hour | weight reads s | hops s | expert all-to-all s "
        "| bound |"
    )
    print("|---|---|---|---|---|---|---|---|")
    local = plan(model, pool, cons, experts=ExpertInputs(placement=ExpertPlacement.BLOCK_LOCAL))
    ep = plan(model, pool, cons, experts=ExpertInputs(placement=ExpertPlacement.EXPERT_PARALLEL))
    auto = plan(model, pool, cons)
    chose = (
        "block-local"
        if auto.assignments == local.assignments
        else "expert-parallel"
        if auto.assignments == ep.assignments
        else "other"
    )

    def accounting(p: Plan, expert_parallel: bool) -> tuple[tuple[int, ...], float, float]:
        """Per-block reads, and the expert compute and all-to-all seconds (0 when block-local)."""
        if not expert_parallel:
            return model.block_read_sizes(), 0.0, 0.0
        times = expert_stage_times(p, model, pool)
        return (
            backbone_layout(model).block_read_sizes(),
            sum(t.compute_s for t in times),
            sum(t.transfer_s for t in times),
        )

    rows = [
        ("block-local (experts with their blocks)", local, False),
        ("expert-parallel (forced: --expert-parallel)", ep, True),
        (f"automatic (chose {chose})", auto, chose != "block-local"),
    ]
    for label, p, expert_parallel in rows:
        reads, comp, xfer = accounting(p, expert_parallel)
        pred = predict(model, pool, cons, p)
        r, h = _pipeline_time(p, model, reads, pool)
        parts = {"hop latency": h, "weight reads": r + comp, "expert all-to-all": xfer}
        bound = max(parts, key=lambda k: parts[k])
        total = sum(parts.values())
        print(
            f"| {label} | {p.num_stages} | {1 / pred.time_per_token_s:.2f} | "
            f"{pred.cost_per_hour:.2f} | {r + comp:.3f} | {h:.3f} | {xfer:.3f} | "
            f"{bound} ({parts[bound] / total:.0%}) |"
        )


if __name__ == "__main__":
    part1()
    part2()
