"""Serving capacity: serve() against the exact referee, and its speed.

python benchmarks/serving.py            # the README table (≈ 5 min on 2 shared cores)
python benchmarks/serving.py --quick    # smoke run
python benchmarks/serving.py --speed    # the timing table only
python benchmarks/serving.py --floors   # the price floors' table only

Part 1 draws random heterogeneous fleets of 2–6 single-GPU nodes (every figure explicit)
and small dense or MoE models, and scores serve() by the referee of
``tests/common/serving_referee.py`` (written from the stated formulas; brute force over
ordered node subsets, block splits, U and disjoint replicas): users served over the
optimum (median, p10, share of fleets at the optimum), the cheapest $/h for half the
optimum over the least there is, and the largest relative gap between a replica's
reported TTFT/TPOT and the formulas' for the plan it chose.  Part 2 times serve() on
8 mixed nodes, 64 single-GPU nodes and 100 vast.ai-style offers
(``benchmarks/offer_search.py``'s generator), and the cheapest of the 50 offers of
``examples/offers/market.json`` for 200 users of llama3.1:70b: the median of
``--repeat`` runs, wall and CPU time.  Part 3 (``--floors``, or with the rest) gives the
certificate of the cheapest nodes for a target on fleets too large to bound split by
split: the price found, the floor under it and the gap.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.common.serving_models import dense, moe, workload  # noqa: E402
from tests.common.serving_referee import Load, Referee  # noqa: E402

from stowplan import (  # noqa: E402
    Infeasible,
    ModelLayout,
    NodeDescriptor,
    Workload,
    serve,
)
from stowplan.files.fleets import load_offers  # noqa: E402

MB, GB = 10**6, 10**9


def _offer_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "offer_search", ROOT / "benchmarks" / "offer_search.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def toy_model(rng: random.Random) -> ModelLayout:
    """A dense model (7 in 10) or a MoE one, of the referee tests' shapes."""
    blocks, hidden, kv = rng.randint(2, 5), rng.choice([1024, 4096]), rng.randint(1, 200_000)
    if rng.random() < 0.7:
        return dense(blocks, rng.randint(200, 3000), kv, hidden)
    return moe(blocks, rng.randint(20, 300), kv, hidden)


def fleet(rng: random.Random) -> list[NodeDescriptor]:
    return [
        NodeDescriptor(
            id=f"n{i}",
            gpu_name="RTX 4090",
            vram_bytes=rng.randint(2, 48) * GB,
            mem_bandwidth_gbps=rng.uniform(200, 3000),
            flops_estimate=rng.uniform(20, 400),
            link_mbps=rng.uniform(1000, 100_000),
            link_latency_ms=rng.uniform(0, 20),
            price_per_hour=round(rng.uniform(0.1, 3.0), 2),
        )
        for i in range(rng.randint(2, 6))
    ]


def load(rng: random.Random) -> Load:
    return Load(
        prompt_tokens=rng.randint(64, 4096),
        output_tokens=rng.randint(16, 512),
        ttft_s=rng.uniform(0.2, 5.0),
        tpot_s=rng.uniform(0.02, 0.3),
    )


def formula_gap(ref: Referee, nodes: list[NodeDescriptor], got: object) -> float:
    index = {n.id: i for i, n in enumerate(nodes)}
    worst = 0.0
    for r in got.replicas:  # type: ignore[attr-defined]
        a = r.plan.assignments
        order = [index[s.node_id] for s in a]
        bounds = [s.block_range[0] for s in a] + [a[-1].block_range[1]]
        for mine, theirs in (
            (ref.ttft(order, bounds, r.users), r.ttft_s),
            (ref.tpot(order, bounds, r.users), r.tpot_s),
        ):
            worst = max(worst, abs(theirs - mine) / mine)
    return worst


def quality(examples: int, seed: int) -> None:
    rng = random.Random(seed)
    ratios, prices, gaps, misses = [], [], [], []
    drawn = 0
    while len(ratios) < examples:
        drawn += 1
        model, nodes, ld = toy_model(rng), fleet(rng), load(rng)
        ref = Referee(model, nodes, ld)
        best = ref.fleet_users()
        if best == 0:
            continue
        got = serve(model, nodes, workload(ld))
        ratios.append(got.users / best)
        gaps.append(formula_gap(ref, nodes, got))
        if got.users < best:
            misses.append((drawn, got.users, best))
        target = max(1, best // 2)
        cheap = serve(model, nodes, workload(ld, users=target))
        prices.append(cheap.price_per_hour / ref.cheapest(target))
    ratios.sort()
    p10 = ratios[max(0, math.ceil(0.1 * len(ratios)) - 1)]
    within = sum(p <= 1.01 for p in prices) / len(prices)
    print(f"{examples} feasible fleets of 2-6 nodes ({drawn} drawn), seed {seed}")
    print(
        "| users / optimum: median | p10 | min | at optimum | cheapest within 1 % | TTFT/TPOT gap |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    print(
        f"| {statistics.median(ratios):.3f} | {p10:.3f} | {ratios[0]:.3f} "
        f"| {sum(r >= 1 for r in ratios)}/{len(ratios)} | {within:.0%} "
        f"| {max(gaps):.1e} |"
    )
    for drawn_at, users, best in misses:
        print(f"  miss: example {drawn_at}: {users} of {best} users ({users / best:.3f})")


def timed(label: str, model: str, nodes: list[NodeDescriptor], w: Workload, repeat: int) -> None:
    import stowplan.planner as planner

    plan_blocks = planner.plan_blocks
    calls = [0]

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return plan_blocks(*args, **kwargs)

    times, cpu, users = [], [], 0
    planner.plan_blocks = counted  # type: ignore[assignment]
    try:
        for _ in range(repeat):
            calls[0] = 0
            t, c = time.perf_counter(), time.process_time()
            try:
                users = serve(model, nodes, w).users
            except Infeasible as exc:
                print(f"| {label} | infeasible: {exc} |")
                return
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
    finally:
        planner.plan_blocks = plan_blocks
    print(
        f"| {label} | {model} | {users} | {calls[0]} | {statistics.median(times):.2f} s "
        f"| {statistics.median(cpu):.2f} s |"
    )


def speed(repeat: int) -> None:
    offers = _offer_module().offers
    w = Workload(prompt_tokens=2048, output_tokens=256, ttft_s=1.0, tpot_s=0.05)
    # A 70B prompt of 2,048 tokens takes ~1.7 s on one consumer card: 3 s, 10 tokens/s.
    consumer = Workload(prompt_tokens=2048, output_tokens=256, ttft_s=3.0, tpot_s=0.1)
    mixed = offers(8, 1)
    single = offers(64, 2, consumer=True)
    many = offers(100, 3)
    print("| fleet | model | users | planner calls | serve() median | CPU median |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    timed("8 mixed offers", "llama3.1:8b", mixed, w, repeat)
    timed("64 single-GPU offers", "llama3.1:70b-q4", single, consumer, repeat)
    timed("100 offers", "llama3.1:70b", many, w, repeat)
    market = load_offers(ROOT / "examples" / "offers" / "market.json")
    timed("50 market offers, 200 users", "llama3.1:70b", market, replace(w, users=200), repeat)


def floors() -> None:
    offers = _offer_module().offers
    w = Workload(prompt_tokens=2048, output_tokens=256, ttft_s=1.0, tpot_s=0.05)
    consumer = Workload(prompt_tokens=2048, output_tokens=256, ttft_s=3.0, tpot_s=0.1)
    single = offers(64, 2, consumer=True)
    many = offers(100, 3)
    market = load_offers(ROOT / "examples" / "offers" / "market.json")
    cases = [
        (
            "64 single-GPU offers",
            "65 users",
            "llama3.1:70b-q4",
            single,
            replace(consumer, users=65),
        ),
        ("100 offers", "300 users", "llama3.1:70b", many, replace(w, users=300)),
        ("100 offers", "20 requests/s", "llama3.1:70b", many, replace(w, rate_per_s=20.0)),
        ("50 market offers", "200 users", "llama3.1:70b", market, replace(w, users=200)),
    ]
    print("| fleet | target | model | $/h | floor | gap | CPU |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for label, goal, model, nodes, load in cases:
        c = time.process_time()
        sp = serve(model, nodes, load)
        cpu = time.process_time() - c
        cert = sp.certificate
        print(
            f"| {label} | {goal} | {model} | {sp.price_per_hour:.2f} | {cert.bound:.2f} "
            f"| {cert.gap:.1%} | {cpu:.2f} s |"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--speed", action="store_true", help="only the timing table")
    ap.add_argument("--floors", action="store_true", help="only the price floors' table")
    args = ap.parse_args()
    if args.floors:
        floors()
        return
    if not args.speed:
        quality(8 if args.quick else args.examples, args.seed)
    speed(1 if args.quick else args.repeat)
    if not args.speed:
        floors()


if __name__ == "__main__":
    main()
