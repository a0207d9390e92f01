"""The price floor of fleets too large to bound composition by composition
(stowplan.serving.price_floor): never above the cheapest set of nodes the independent
referee finds for a users or a requests/s target, and what serve() reports with it."""

from __future__ import annotations

import math

from hypothesis import assume, given
from hypothesis import strategies as st

from stowplan import Constraints, ModelLayout, NodeDescriptor, Workload, serve
from stowplan.serving.bounds import FleetRates
from stowplan.serving.price_floor import price_floor
from tests.common.serving_models import fleets, loads, models, serve_settings, workload
from tests.common.serving_referee import Load, Referee

GB = 10**9
SETTINGS = serve_settings(20)


@SETTINGS
@given(models, fleets(2, 5), loads, st.floats(0.1, 1.0), st.booleans())
def test_the_floor_is_never_above_the_cheapest_nodes_reaching_the_target(
    model: ModelLayout, nodes: list[NodeDescriptor], load: Load, share: float, by_rate: bool
) -> None:
    ref = Referee(model, nodes, load)
    if by_rate:
        target = ref.fleet_rate() * share
        assume(target > 0)
        cheapest = min(
            sum(nodes[i].price_per_hour or 0.0 for i in range(len(nodes)) if mask >> i & 1)
            for mask in range(1, 1 << len(nodes))
            if ref.fleet_rate(mask) >= target
        )
    else:
        users = math.floor(ref.fleet_users() * share)
        assume(users >= 1)
        target = float(users)
        cheapest = ref.cheapest(users)
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
