"""The price floor of fleets too large to bound composition by composition
(stowplan.serving.price_floor): never above the cheapest set of nodes the independent
referee finds for a users or a requests/s target, and what serve() reports with it."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import assume, given
from hypothesis import strategies as st

from stowplan import Constraints, Infeasible, ModelLayout, NodeDescriptor, Workload, serve
from stowplan.models import resolve_model
from stowplan.serving.bounds import FleetRates
from stowplan.serving.price_floor import price_floor
from tests.common.serving_models import (
    fleets,
    loads,
    mixed_fleets,
    models,
    serve_settings,
    workload,
)
from tests.common.serving_referee import Load, Referee, share_target

GB = 10**9
SETTINGS = serve_settings(20)


@SETTINGS
@given(models, fleets(2, 5), loads, st.floats(0.1, 1.0), st.booleans())
def test_the_floor_is_never_above_the_cheapest_nodes_reaching_the_target(
    model: ModelLayout, nodes: list[NodeDescriptor], load: Load, share: float, by_rate: bool
) -> None:
    ref = Referee(model, nodes, load)
    target, cheapest = share_target(ref, nodes, share, by_rate)
    rates = FleetRates.of(model, nodes, Constraints(), workload(load))
    prices = [n.price_per_hour or 0.0 for n in nodes]
    floor = price_floor(rates, prices, workload(load), target, by_rate=by_rate)
    assert floor is not None
    assert 0 < floor <= cheapest + 1e-9


def test_a_large_fleet_gets_a_price_floor() -> None:
    """Fourteen unlike single-GPU nodes (more compositions than are bounded one by one):
    the certificate's floor is the programme's, above zero and at most the price."""
    nodes = [
        NodeDescriptor(
            id=f"n{i:02d}",
            gpu_name=("RTX 3090", "RTX 4090", "A100 80GB PCIe")[i % 3],
            vram_bytes=(24, 24, 80)[i % 3] * GB,
            link_mbps=1000.0 + 37 * i,
            price_per_hour=(0.2, 0.35, 1.1)[i % 3] + 0.01 * i,
        )
        for i in range(14)
    ]
    w = Workload(prompt_tokens=1024, output_tokens=256, ttft_s=1.0, tpot_s=0.05, users=60)
    sp = serve("llama3.1:8b", nodes, w)
    c = sp.certificate
    assert "linear programme" in c.method
    assert 0 < c.bound <= sp.price_per_hour
    assert c.gap == (sp.price_per_hour - c.bound) / sp.price_per_hour
    assert sp.users >= 60


MIXED = Workload(prompt_tokens=512, output_tokens=128, ttft_s=2.0, tpot_s=0.1)


@SETTINGS
@given(models, mixed_fleets(), st.floats(0.2, 0.9), st.booleans())
def test_the_floor_is_never_above_an_exact_price_on_multi_gpu_nodes(
    model: ModelLayout, nodes: list[NodeDescriptor], share: float, by_rate: bool
) -> None:
    """Nodes of 1, 2 or 4 GPUs (replicas side by side on a node, leaders of any group
    size): below every price serve() proves optimal."""
    try:
        most = serve(model, nodes, MIXED)
    except Infeasible:
        assume(False)
        return
    target = (most.rate_per_s if by_rate else math.floor(most.users)) * share
    assume(target > 0 and (by_rate or target >= 1))
    w = replace(
        MIXED,
        users=None if by_rate else max(1, math.floor(target)),
        rate_per_s=target if by_rate else None,
    )
    sp = serve(model, nodes, w)
    assume(sp.certificate.exact)
    rates = FleetRates.of(model, nodes, Constraints(), w)
    prices = [n.price_per_hour or 0.0 for n in nodes]
    goal = target if by_rate else float(w.users or 0)
    floor = price_floor(rates, prices, w, goal, by_rate=by_rate)
    assert floor is not None
    assert floor <= sp.price_per_hour * (1 + 1e-9)


def test_a_replica_is_led_by_a_group_that_prefills_within_the_ttft() -> None:
    """Seven cheap cards too slow to prefill a prompt within the TTFT and one fast card:
    every replica needs the fast card, so the floor is at least its price, where the
    pooled bandwidth, prefill speed and memory alone would rent the cheap cards."""
    slow = [
        NodeDescriptor(
            id=f"slow{i}",
            gpu_name="L4",
            vram_bytes=24 * GB,
            mem_bandwidth_gbps=300.0,
            flops_estimate=30.0,
            link_mbps=10_000.0,
            price_per_hour=0.1,
        )
        for i in range(7)
    ]
    fast = NodeDescriptor(
        id="fast",
        gpu_name="H100",
        vram_bytes=80 * GB,
        mem_bandwidth_gbps=3000.0,
        flops_estimate=600.0,
        link_mbps=10_000.0,
        price_per_hour=3.0,
    )
    model = resolve_model("llama3.1:8b")
    w = Workload(prompt_tokens=2048, output_tokens=256, ttft_s=0.3, tpot_s=0.1, users=4)
    nodes = [*slow, fast]
    rates = FleetRates.of(model, nodes, Constraints(), w)
    leads = [rates.lead_floor(i)[0][1] for i in range(len(nodes))]
    assert all(lead > w.ttft_s for lead in leads[:-1]) and leads[-1] < w.ttft_s
    floor = price_floor(rates, [n.price_per_hour or 0.0 for n in nodes], w, 4.0, by_rate=False)
    assert floor is not None and floor >= 3.0
    sp = serve(model, nodes, w)
    assert "fast" in {n for r in sp.replicas for n in r.node_ids}
    assert floor <= sp.price_per_hour + 1e-9
