"""serve(): disjoint replicas, Σ U*, the cheapest nodes for a target, the certificate, JSON."""

from __future__ import annotations

import contextlib
from itertools import combinations

import pytest

from stowplan import (
    Constraints,
    Infeasible,
    InputError,
    ServeObjective,
    ServePlan,
    Workload,
    serve,
)
from stowplan.serving.bounds import FleetRates, users_bound
from stowplan.serving.candidates import replica_of
from tests.common.replica_check import recomputed
from tests.common.toy import TOY_MODEL, toy_node

GB = 10**9
WORK = Workload(prompt_tokens=100, output_tokens=100, ttft_s=1.0, tpot_s=0.1)


def _node(i: int, **kw: object):
    base: dict[str, object] = dict(flops_estimate=1.0, price_per_hour=1.0)
    base.update(kw)
    return toy_node(i, **base)


FLEET = [
    _node(0),
    _node(1, mem_bandwidth_gbps=200.0, flops_estimate=2.0, price_per_hour=3.0),
    _node(2, vram_bytes=4 * GB, price_per_hour=0.5),  # too small alone
    _node(3, vram_bytes=4 * GB, price_per_hour=0.5),
]


def _recomputed(replica, nodes):
    """The replica's U*, TTFT, TPOT from its plan's pipeline, by the public function."""
    return recomputed(TOY_MODEL, replica, nodes, WORK)


def test_the_fleet_is_split_into_disjoint_replicas_and_users_are_their_sum():
    sp = serve(TOY_MODEL, FLEET, WORK)
    used = [nid for r in sp.replicas for nid in r.node_ids]
    assert len(used) == len(set(used))
    assert sorted(used + list(sp.unused_nodes)) == sorted(n.id for n in FLEET)
    assert sp.users == sum(r.users for r in sp.replicas) > 0
    assert sp.rate_per_s == pytest.approx(sum(r.requests_per_s for r in sp.replicas))
    for r in sp.replicas:
        again = _recomputed(r, FLEET)
        assert (r.users, r.binding) == (again.users, again.binding)
        assert r.ttft_s == pytest.approx(again.ttft_s, rel=1e-12)
        assert r.tpot_s == pytest.approx(again.tpot_s, rel=1e-12)
        assert r.ttft_s <= WORK.ttft_s and r.tpot_s <= WORK.tpot_s
        assert r.requests_per_s == pytest.approx(r.users / (100 * r.tpot_s))
    assert sp.price_per_hour == pytest.approx(sum(r.price_per_hour or 0 for r in sp.replicas))
    assert sp.certificate.objective is ServeObjective.USERS
    assert sp.certificate.bound >= sp.users


def test_no_split_of_the_fleet_serves_more_users_than_serve_finds():
    """Brute force over every partition of the 4 nodes into replicas, each replica the
    best the planner finds on its subset (replica_of)."""
    sp = serve(TOY_MODEL, FLEET, WORK)
    rates = FleetRates.of(TOY_MODEL, FLEET, Constraints(), WORK)
    best_of: dict[frozenset[int], int] = {}
    for size in range(1, 5):
        for subset in combinations(range(4), size):
            nodes = [FLEET[i] for i in subset]
            got = replica_of(TOY_MODEL, nodes, WORK, Constraints(), 2000)
            best_of[frozenset(subset)] = got.serving.users if got else 0
            assert best_of[frozenset(subset)] <= users_bound(rates, list(subset), WORK)

    def partitions(items):
        if not items:
            yield []
            return
        first, rest = items[0], items[1:]
        for k in range(len(rest) + 1):
            for others in combinations(rest, k):
                left = [x for x in rest if x not in others]
                for tail in partitions(left):
                    yield [frozenset((first, *others)), *tail]
                    yield tail  # the first node's group unused

    most = max(sum(best_of[g] for g in p) for p in partitions(list(range(4))))
    assert sp.users == most
    assert sp.certificate.bound >= most


def test_a_user_target_gets_the_cheapest_nodes_that_serve_it():
    one = serve(TOY_MODEL, [FLEET[0]], WORK).users  # what the $1 node serves alone
    sp = serve(TOY_MODEL, FLEET, Workload(**_work(users=one)))
    assert sp.users >= one
    assert sp.certificate.objective is ServeObjective.PRICE
    assert sp.price_per_hour <= 1.0  # node 0 alone does it for $1/h
    assert sp.certificate.bound <= sp.price_per_hour
    # Every cheaper node set serves fewer (brute force over the subsets under $1/h).
    for size in range(1, 5):
        for subset in combinations(FLEET, size):
            price = sum(n.price_per_hour for n in subset)
            if price < sp.price_per_hour - 1e-12:
                with contextlib.suppress(Infeasible):
                    assert serve(TOY_MODEL, list(subset), WORK).users < one


def test_a_rate_target_counts_requests_per_second():
    most = serve(TOY_MODEL, FLEET, WORK)
    target = most.rate_per_s / 2
    sp = serve(TOY_MODEL, FLEET, Workload(**_work(rate_per_s=target)))
    assert sp.rate_per_s >= target
    assert sp.price_per_hour <= most.price_per_hour


def test_an_unreachable_target_says_what_the_fleet_serves_at_most():
    most = serve(TOY_MODEL, FLEET, WORK).users
    with pytest.raises(Infeasible) as err:
        serve(TOY_MODEL, FLEET, Workload(**_work(users=most + 1)))
    assert f"the nodes serve at most {most} users within the limits; {most + 1} asked" in str(
        err.value
    )


def test_limits_no_replica_meets_are_infeasible_and_say_what_rules_them_out():
    w = Workload(prompt_tokens=100, output_tokens=100, ttft_s=0.01, tpot_s=0.1)
    with pytest.raises(Infeasible, match="no replica of the nodes serves one request") as err:
        serve(TOY_MODEL, FLEET, w)
    # The fastest node (2 TFLOPs, 200 GB/s) still takes 0.2 s to prefill 100 tokens.
    rates = FleetRates.of(TOY_MODEL, FLEET, Constraints(), w)
    least = min(rates.ttft0_floor([i]) + rates.cycle_floor([i]) for i in range(len(FLEET)))
    assert str(err.value).endswith(
        f": one prompt's prefill and a decode step take at least {least:.3g} s on the "
        "fastest node (TTFT 0.01 s)"
    )
    small = [_node(i, vram_bytes=2 * GB) for i in range(2)]
    with pytest.raises(Infeasible, match=r": the weights and one request's KV need [\d.]+ GB"):
        serve(TOY_MODEL, small, WORK)


def test_a_target_needs_a_price_on_every_node():
    fleet = [*FLEET[:3], _node(9, price_per_hour=None)]
    with pytest.raises(InputError) as err:
        serve(TOY_MODEL, fleet, Workload(**_work(users=1)))
    assert str(err.value).startswith("n9.price_per_hour=None: is needed")


def test_identical_nodes_serve_identical_replicas():
    fleet = [_node(i) for i in range(5)]
    sp = serve(TOY_MODEL, fleet, WORK)
    alone = serve(TOY_MODEL, fleet[:1], WORK).users
    assert len(sp.replicas) == 5 and sp.users == 5 * alone
    assert sorted(nid for r in sp.replicas for nid in r.node_ids) == [n.id for n in fleet]
    assert len({r.plan.assignments[0].block_range for r in sp.replicas}) == 1


def test_a_known_model_name_is_resolved():
    sp = serve("llama3.2:1b", [_node(0, vram_bytes=24 * GB)], WORK)
    assert sp.model_name == "llama3.2:1b" and sp.users >= 1


def test_the_serve_plan_survives_its_json():
    sp = serve(TOY_MODEL, FLEET, WORK)
    text = sp.to_json()
    back = ServePlan.from_json(text)
    assert back == sp
    assert back.to_json() == text
    assert '"schema_version": 1' in text


def test_a_serve_plan_of_another_schema_is_refused():
    text = (
        serve(TOY_MODEL, FLEET[:1], WORK)
        .to_json()
        .replace('"schema_version": 1,\n  "tokens', '"schema_version": 9,\n  "tokens')
    )
    with pytest.raises(InputError, match="schema_version=9: must be 1"):
        ServePlan.from_json(text)


def test_the_same_input_gives_the_same_plan():
    assert serve(TOY_MODEL, FLEET, WORK).to_json() == serve(TOY_MODEL, FLEET, WORK).to_json()


def _work(**kw: object) -> dict[str, object]:
    base: dict[str, object] = dict(prompt_tokens=100, output_tokens=100, ttft_s=1.0, tpot_s=0.1)
    base.update(kw)
    return base
