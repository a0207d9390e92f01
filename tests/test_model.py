"""Construction-time validation of the input types: the exact messages users see."""

from __future__ import annotations

import math

import pytest

from stowplan import Constraints, InputError, ModelLayout, NodeDescriptor, plan

MODEL = {
    "name": "m",
    "num_blocks": 4,
    "hidden_dim": 64,
    "bytes_per_activation_elem": 2,
    "block_params_bytes": 100,
    "head_params_bytes": 10,
    "embed_params_bytes": 10,
}
NODE = {
    "id": "a",
    "gpu_name": "RTX 4090",
    "vram_bytes": 1000,
    "flops_estimate": 1.0,
    "link_mbps": 1.0,
}


@pytest.mark.parametrize(
    ("kind", "changes", "message"),
    [
        ("model", {"num_blocks": 0}, "num_blocks=0: must be an integer in [1, 4096]"),
        (
            "model",
            {"block_params_bytes": -1},
            f"block_params_bytes=-1: must be an integer in [0, {2**63 - 1}]",
        ),
        (
            "model",
            {"head_params_bytes": math.nan},
            f"head_params_bytes=nan: must be an integer in [0, {2**63 - 1}]",
        ),
        (
            "model",
            {"name": ""},
            "name='': must be printable text of 1 to 255 characters (no line breaks or other control characters)",
        ),
        (
            "model",
            {"block_bytes": (1, 2)},
            "block_bytes='<2 values>': must have num_blocks=4 values",
        ),
        (
            "model",
            {"block_bytes": (100, 100, 100, 120)},
            "block_params_bytes=100: must be the average of block_bytes (105)",
        ),
        ("node", {"vram_bytes": -5}, f"a.vram_bytes=-5: must be an integer in [0, {2**63 - 1}]"),
        (
            "node",
            {"flops_estimate": math.nan},
            "a.flops_estimate=nan: must be 0 (unknown) or a number in [9.76562e-10, 1e+18]",
        ),
        (
            "node",
            {"link_mbps": -1.0},
            "a.link_mbps=-1.0: must be 0 (unknown) or a number in [9.76562e-10, 1e+18]",
        ),
        (
            "node",
            {"id": ""},
            "id='': must be printable text of 1 to 255 characters (no line breaks or other control characters)",
        ),
        (
            "node",
            {"mem_bandwidth_gbps": 0.0},
            "a.mem_bandwidth_gbps=0.0: must be a finite number in [9.76562e-10, 1e+18]",
        ),
        ("constraints", {"min_stages": 0}, "min_stages=0: must be an integer in [1, 16777216]"),
        (
            "constraints",
            {"min_stages": 3, "max_stages": 2},
            "min_stages=3: must be <= max_stages (2)",
        ),
        (
            "constraints",
            {"vram_headroom_frac": 1.0},
            "vram_headroom_frac=1.0: must be a number in [0, 1)",
        ),
        (
            "constraints",
            {"vram_headroom_frac": -0.1},
            "vram_headroom_frac=-0.1: must be a number in [0, 1)",
        ),
        (
            "constraints",
            {"strategy": "fastest"},
            "strategy='fastest': must be one of balance-by-vram, latency, throughput, exact",
        ),
        ("constraints", {"batch": 0}, "batch=0: must be an integer in [1, 1048576]"),
        (
            "constraints",
            {"objective": "cost"},
            "target_tokens_per_s=None: is required with objective='cost' (e.g. 20)",
        ),
    ],
)
def test_bad_inputs_name_field_value_and_rule(kind: str, changes: dict, message: str) -> None:
    factory = {
        "model": (ModelLayout, MODEL),
        "node": (NodeDescriptor, NODE),
        "constraints": (Constraints, {}),
    }
    cls, base = factory[kind]
    with pytest.raises(InputError) as info:
        cls(**{**base, **changes})
    assert str(info.value) == message


def test_duplicate_node_ids_are_rejected_by_plan() -> None:
    nodes = [NodeDescriptor(**NODE), NodeDescriptor(**NODE)]
    with pytest.raises(InputError, match=r"^nodes\[\]\.id='a': node ids must be unique$"):
        plan(ModelLayout(**MODEL), nodes, Constraints())


def test_input_error_is_a_value_error_with_its_parts() -> None:
    with pytest.raises(ValueError) as info:
        Constraints(batch=-2)
    err = info.value
    assert isinstance(err, InputError)
    assert (err.field, err.value, err.rule) == ("batch", -2, "must be an integer in [1, 1048576]")


def test_default_strategy_follows_the_workload() -> None:
    assert Constraints().resolved_strategy() == "latency"
    assert Constraints(batch=8).resolved_strategy() == "throughput"
    assert Constraints(batch=8, strategy="balance-by-vram").resolved_strategy() == "balance-by-vram"


def test_kv_bytes_respect_sliding_windows() -> None:
    m = ModelLayout(
        **{**MODEL, "kv_bytes_per_token": (10,) * 4, "kv_window_tokens": (128, None, 128, None)}
    )
    assert [m.kv_bytes(b, 1000, batch=2) for b in range(4)] == [2560, 20000, 2560, 20000]


def test_block_average_is_checked_in_integers_for_huge_blocks() -> None:
    # 2**62 + 3 is not a float: a float average would be 2**62, 3 bytes off.
    big = 2**62 + 3
    layout = ModelLayout(**{**MODEL, "block_params_bytes": big, "block_bytes": (big,) * 4})
    assert layout.block_sizes() == (big,) * 4
    with pytest.raises(InputError) as info:
        ModelLayout(**{**MODEL, "block_params_bytes": big - 2, "block_bytes": (big,) * 4})
    assert str(info.value) == (
        f"block_params_bytes={big - 2}: must be the average of block_bytes ({big})"
    )


def test_block_average_rounds_half_to_even() -> None:
    # mean 100.5 rounds to 100: 99 is within one byte, 102 is not.
    blocks = (100, 101, 100, 101)
    assert ModelLayout(**{**MODEL, "block_params_bytes": 99, "block_bytes": blocks})
    with pytest.raises(InputError):
        ModelLayout(**{**MODEL, "block_params_bytes": 102, "block_bytes": blocks})


BIG = 2**63
RATE_RULE = "must be 0 (unknown) or a number in [9.76562e-10, 1e+18]"


@pytest.mark.parametrize(
    ("kind", "changes", "message"),
    [
        ("model", {"num_blocks": 10**9}, "num_blocks=1000000000: must be an integer in [1, 4096]"),
        (
            "model",
            {"head_params_bytes": BIG},
            f"head_params_bytes={BIG}: must be an integer in [0, {BIG - 1}]",
        ),
        (
            "model",
            {"kv_window_tokens": (0, None, None, None)},
            "kv_window_tokens[]=0: must be an integer in [1, 1073741824]",
        ),
        (
            "model",
            {"block_bytes": "abcd"},
            "block_bytes='abcd': must be a list with one value per block",
        ),
        ("node", {"flops_estimate": 1e300}, f"a.flops_estimate=1e+300: {RATE_RULE}"),
        (
            "node",
            {"flops_estimate": 10**400},
            f"a.flops_estimate=<an integer of about 401 digits>: {RATE_RULE}",
        ),
        ("node", {"link_mbps": 5e-324}, f"a.link_mbps=5e-324: {RATE_RULE}"),
        (
            "node",
            {"link_mbps": "1e300Gbit"},
            "a.link_mbps='1e300Gbit': must be at most 1e+18",
        ),
        ("node", {"vram_bytes": "1e300GB"}, None),
        (
            "node",
            {"link_latency_ms": math.inf},
            "a.link_latency_ms=inf: must be a finite number in [0, 1e+18]",
        ),
        (
            "node",
            {"price_per_hour": 1e19},
            "a.price_per_hour=1e+19: must be a finite number in [0, 1e+18]",
        ),
        ("node", {"num_gpus": 1025}, "a.num_gpus=1025: must be an integer in [1, 1024]"),
        (
            "node",
            {"intra_link_gbps": 1e-300},
            "a.intra_link_gbps=1e-300: must be a finite number in [9.76562e-10, 1e+18]",
        ),
        (
            "node",
            {"labels": (("k", 1),)},
            "a.labels[]=('k', 1): must be (key, value) pairs of strings or a mapping of strings",
        ),
        (
            "node",
            {"id": "x" * 256},
            f"id='{'x' * 255}x': must be printable text of 1 to 255 characters (no line breaks or other control characters)",
        ),
        (
            "model",
            {"max_context_tokens": 0},
            "max_context_tokens=0: must be an integer in [1, 1073741824]",
        ),
        (
            "model",
            {"max_context_tokens": 2**31},
            f"max_context_tokens={2**31}: must be an integer in [1, 1073741824]",
        ),
        (
            "constraints",
            {"context_tokens": 2**40},
            f"context_tokens={2**40}: must be an integer in [0, 1073741824]",
        ),
        ("constraints", {"batch": 10**7}, "batch=10000000: must be an integer in [1, 1048576]"),
        (
            "constraints",
            {"tensor_parallel": 2048},
            "tensor_parallel=2048: must be an integer in [1, 1024]",
        ),
        (
            "constraints",
            {"objective": "cost", "target_tokens_per_s": math.inf},
            "target_tokens_per_s=inf: must be a finite number in [1e-06, 1e+18]",
        ),
    ],
)
def test_sizes_beyond_the_caps_are_refused_at_construction(
    kind: str, changes: dict, message: str | None
) -> None:
    factory = {
        "model": (ModelLayout, MODEL),
        "node": (NodeDescriptor, NODE),
        "constraints": (Constraints, {}),
    }
    cls, base = factory[kind]
    with pytest.raises(InputError) as info:
        cls(**{**base, **changes})
    if message is not None:
        assert str(info.value) == message


def test_expert_layout_caps_experts_and_blocks() -> None:
    from stowplan import ExpertLayout

    base = {"num_experts": 8, "experts_per_token": 2, "expert_params_bytes": 1, "moe_blocks": (1,)}
    with pytest.raises(InputError, match=r"num_experts=5000: must be an integer in \[1, 4096\]"):
        ExpertLayout(**{**base, "num_experts": 5000})
    with pytest.raises(InputError, match=r"must hold at most 4096 block indices"):
        ExpertLayout(**{**base, "moe_blocks": range(5000)})
    with pytest.raises(InputError, match=r"moe_blocks\[\]='1': must be an integer"):
        ExpertLayout(**{**base, "moe_blocks": (0, "1")})
    with pytest.raises(InputError, match=r"must be strictly increasing"):
        ExpertLayout(**{**base, "moe_blocks": (2, 1)})


def test_node_descriptor_accepts_unit_strings_and_the_fleet_files_defaults() -> None:
    node = NodeDescriptor(id="a", gpu_name="RTX 4090", vram_bytes="24GiB", link_mbps="1Gbit")
    assert (node.vram_bytes, node.link_mbps, node.flops_estimate) == (24 * 2**30, 1000.0, 0.0)
    assert NodeDescriptor(id="b", gpu_name="RTX 4090", vram_bytes=1).link_mbps == 0.0


def test_node_descriptor_stores_a_label_mapping_as_sorted_pairs() -> None:
    node = NodeDescriptor(**{**NODE, "labels": {"z": "1", "a": "2"}})
    assert node.labels == (("a", "2"), ("z", "1"))


def test_node_descriptor_from_python_equals_the_fleet_files_node() -> None:
    from stowplan.files.fleets import nodes_from_data

    raw = {"id": "a", "gpu_name": "RTX 4090", "vram_bytes": "24GiB", "link_mbps": "1Gbit"}
    assert nodes_from_data([raw]) == [NodeDescriptor(**raw)]


def test_node_descriptor_keeps_the_intra_node_link_figures() -> None:
    node = NodeDescriptor(**{**NODE, "intra_link_gbps": 450.0, "intra_link_latency_us": 2.5})
    assert (node.intra_link_gbps, node.intra_link_latency_us) == (450.0, 2.5)


def test_check_unique_ids_names_the_first_fault_in_node_order() -> None:
    from stowplan.model import check_unique_ids

    a, b = NodeDescriptor(**NODE), NodeDescriptor(**{**NODE, "id": "b"})
    check_unique_ids([a, b])
    check_unique_ids([])
    with pytest.raises(InputError, match=r"^nodes\[\]\.id='b': node ids must be unique$"):
        check_unique_ids([a, b, b, "x"])  # type: ignore[list-item]
    with pytest.raises(InputError, match=r"^nodes\[\]='x': must be a NodeDescriptor$"):
        check_unique_ids([a, "x", b, b])  # type: ignore[list-item]


def test_node_kinds_tell_nodes_apart_by_every_field_but_the_id() -> None:
    from dataclasses import replace

    from stowplan import model as model_module
    from stowplan.model import node_kinds

    a = NodeDescriptor(**NODE)
    fleet = [a, replace(a, id="b"), replace(a, id="c", link_mbps=7.0), replace(a, id="d")]
    fleet.append(replace(a, id="e", labels={"rack": "1"}))
    numbers, reps, of = node_kinds(fleet)
    assert reps == [0, 2, 4] and of == (0, 0, 1, 0, 2)
    assert numbers[0] == numbers[1] == numbers[3] and len(set(numbers)) == 3
    # Met again, or as equal copies, the nodes keep their numbers; let go, they are
    # numbered anew, never as another kind.
    assert node_kinds(fleet) == (numbers, reps, of)
    copies = [replace(n, id=n.id) for n in fleet]
    assert node_kinds(copies) == (numbers, reps, of)
    model_module._kind_seen.clear()
    model_module._kind_number.clear()
    again, reps_again, of_again = node_kinds(copies)
    assert (reps_again, of_again) == (reps, of)
    assert not set(again) & set(numbers)
