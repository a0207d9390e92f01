"""The subset programme's users bound (stowplan.serving.pipeline_bound): never below the
U* of any pipeline the independent referee tries on the nodes or a subset, on node sets
too large to try pipeline by pipeline; and what it makes of the certificate."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from stowplan import Constraints, ModelLayout, NodeDescriptor, Workload, serve
from stowplan.serving.exhaustive import EXHAUSTIVE_SHAPES, pipeline_count
from stowplan.serving.pipeline_bound import pipeline_rate_bound, pipeline_users_bound
from tests.common.serving_models import dense, fleets, loads, moe, serve_settings, workload
from tests.common.serving_referee import Load, Referee

GB = 10**9
SETTINGS = serve_settings(12)

models = st.one_of(
    st.builds(
        dense,
        st.integers(16, 20),
        st.integers(100, 1500),
        st.integers(1, 200_000),
        st.sampled_from([1024, 4096]),
        st.sampled_from([0, 8]),
    ),
    st.builds(
        moe, st.integers(16, 18), st.integers(10, 150), st.integers(1, 100_000), st.just(2048)
    ),
)


@SETTINGS
@given(models, fleets(3, 3, 24, priced=False), loads)
def test_the_bound_is_never_below_any_pipeline_of_the_nodes(
    model: ModelLayout, nodes: list[NodeDescriptor], load: Load
) -> None:
    assert pipeline_count(3, model.num_blocks) > EXHAUSTIVE_SHAPES  # not tried one by one
    ref = Referee(model, nodes, load)
    best = max(
        ref.best_replica(sub)[0] for k in (1, 2, 3) for sub in itertools.combinations(range(3), k)
    )
    most = 4 * best + 20
    got = pipeline_users_bound(model, nodes, workload(load), Constraints(), most)
    assert got is not None
    assert best <= got <= most
    fastest = max(
        ref.best_replica(sub)[1] for k in (1, 2, 3) for sub in itertools.combinations(range(3), k)
    )
    rate = pipeline_rate_bound(model, nodes, workload(load), Constraints(), math.inf)
    assert rate is not None
    assert rate >= fastest * (1 - 1e-9)
    assert (rate == 0) == (best == 0)
    # The cap is a cap: below the true optimum it is what comes back.
    if best > 1:
        assert pipeline_users_bound(model, nodes, workload(load), Constraints(), best - 1) == (
            best - 1
        )


def test_nodes_of_several_gpus_or_too_many_are_not_bounded() -> None:
    node = NodeDescriptor(id="a", gpu_name="RTX 4090", vram_bytes=24 * GB, num_gpus=2)
    w = Workload(prompt_tokens=512, output_tokens=128, ttft_s=1.0, tpot_s=0.05)
    assert pipeline_users_bound(dense(16, 500, 1000, 1024), [node], w, Constraints(), 10) is None
    many = [NodeDescriptor(id=f"n{i}", gpu_name="RTX 4090", vram_bytes=24 * GB) for i in range(9)]
    assert pipeline_users_bound(dense(16, 500, 1000, 1024), many, w, Constraints(), 10) is None


def test_a_fleet_of_two_node_replicas_gets_an_exact_certificate() -> None:
    """llama3.1:70b-q4 on the shipped consumer fleet (the README's example): replicas of
    one and two 24-32 GB cards, and three-card sets (too many pipelines to try one by
    one) bounded by the programme to no more than the pairs inside them serve, so the
    bound is the answer (gap 0)."""
    from stowplan.files.fleets import load_nodes
    from tests.common.paths import EXAMPLES

    nodes = load_nodes(EXAMPLES / "fleets" / "mixed-consumer.yaml")
    w = Workload(prompt_tokens=2048, output_tokens=256, ttft_s=3.0, tpot_s=0.1)
    sp = serve("llama3.1:70b-q4_0", nodes, w)
    assert sp.users == 6
    assert sp.certificate.bound == 6.0 and sp.certificate.exact
    assert "subset programme" in sp.certificate.method
    # The cheapest nodes for a rate: the programme bounds requests/s too.
    cheap = serve("llama3.1:70b-q4_0", nodes, replace(w, rate_per_s=0.2))
    assert cheap.rate_per_s >= 0.2
    assert cheap.certificate.exact and cheap.certificate.bound == cheap.price_per_hour
    assert "subset programme" in cheap.certificate.method
