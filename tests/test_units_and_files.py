"""Human-written quantities, fleet files and vast.ai offer lists."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stowplan import InputError, load_nodes, load_offers
from stowplan.files.fleets import nodes_from_offers
from stowplan.quantities.units import format_bytes, parse_bytes, parse_link_mbps, parse_tokens_per_s
from tests.common.paths import EXAMPLES, FIXTURES


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24GiB", 24 * 2**30),
        ("24 GB", 24 * 10**9),
        ("512MiB", 512 * 2**20),
        (1000, 1000),
        ("1e9", 10**9),
        ("0.5TiB", 2**39),
    ],
)
def test_byte_sizes_parse(text: object, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["24 GiBs", "-1GB", "lots", True, -3, "24Gb"])
def test_bad_byte_sizes_are_refused(bad: object) -> None:
    with pytest.raises(InputError, match=r"^vram_bytes="):
        parse_bytes(bad, field="vram_bytes")


def test_rates_and_links_parse() -> None:
    assert parse_link_mbps("1Gbit") == 1000.0
    assert parse_link_mbps("100Mbps") == 100.0
    assert parse_link_mbps(250) == 250.0
    assert parse_tokens_per_s("20tok/s") == 20.0
    with pytest.raises(
        InputError, match=r"^target='fast': must be a rate such as 20 or '20tok/s'$"
    ):
        parse_tokens_per_s("fast")
    assert format_bytes(24 * 2**30) == "24.0 GiB"


@pytest.mark.parametrize("bad", ["1e400tok/s", 0, "0tok/s", -1.0, float("nan"), float("inf")])
def test_target_rates_out_of_range_state_the_rule_they_break(bad: object) -> None:
    with pytest.raises(InputError) as info:
        parse_tokens_per_s(bad, field="--target")
    assert str(info.value) == f"--target={bad!r}: must be a finite number > 0 tokens/s"


def test_vast_offer_units_are_converted() -> None:
    [node] = load_offers(FIXTURES / "vastai" / "offer_rtx4090_1x_2024_raw.json")
    assert node.id == "offer-11684738"
    assert node.gpu_name == "RTX 4090"
    assert node.vram_bytes == 24564 * 2**20  # gpu_total_ram is in MB as nvidia-smi prints (MiB)
    assert node.flops_estimate == pytest.approx(82.968576)
    assert node.link_mbps == pytest.approx(77.7)  # inet_up, Mbit/s
    assert node.price_per_hour == pytest.approx(0.2466759259259259)
    assert ("vast_gpu_mem_bw_gbps", "3108.4") in node.labels


def test_vast_bundles_api_object_is_accepted() -> None:
    [node] = load_offers(FIXTURES / "vastai" / "offer_rtx3090_1x_2022_bundles-api.json")
    assert node.gpu_name == "RTX 3090"
    assert node.vram_bytes == 24576 * 2**20
    assert node.price_per_hour == pytest.approx(0.3228, abs=1e-4)


def test_multi_gpu_offer_without_total_ram_multiplies_per_gpu(tmp_path: Path) -> None:
    offer = {
        "id": 7,
        "gpu_name": "RTX 3090",
        "gpu_ram": 24576,
        "num_gpus": 4,
        "total_flops": 142.0,
        "inet_up": 500,
        "dph_total": 1.2,
    }
    path = tmp_path / "offers.json"
    path.write_text(json.dumps({"offers": [offer]}))
    [node] = load_offers(path)
    assert node.vram_bytes == 4 * 24576 * 2**20 and node.num_gpus == 4


def test_fleet_file_counts_and_sizes(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "- {id: g, gpu_name: RTX 4090, vram_bytes: 24GiB, flops_estimate: 165, link_mbps: 1Gbit, count: 3}\n"
    )
    nodes = load_nodes(path)
    assert [n.id for n in nodes] == ["g-0", "g-1", "g-2"]
    assert nodes[0].vram_bytes == 24 * 2**30 and nodes[0].link_mbps == 1000.0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[]", r"^nodes=\[\]: must be a non-empty list of node objects$"),
        ('[{"id": "a", "gpu_name": "x"}]', r"^nodes\[0\]\.vram_bytes=None: is required$"),
        (
            '[{"id": "a", "gpu_name": "x", "vram_bytes": 1, "vram": 2}]',
            r"^nodes\[0\]\.vram=2: is not a node field",
        ),
        (
            '[{"id": "a", "gpu_name": "x", "vram_bytes": "big"}]',
            r"^nodes\[0\]\.vram_bytes='big': must be a byte count",
        ),
        ("{", r"^file='.*fleet\.json': is not valid JSON"),
    ],
)
def test_bad_fleet_files_name_the_field(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "fleet.json"
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        load_nodes(path)


@pytest.mark.parametrize("name", sorted(p.name for p in (EXAMPLES / "fleets").glob("*.yaml")))
def test_shipped_fleets_load(name: str) -> None:
    assert len(load_nodes(EXAMPLES / "fleets" / name)) >= 2


@pytest.mark.parametrize(
    ("offer", "message"),
    [
        ({"gpu_ram": "nan"}, "offers[0].gpu_ram='nan': must be a finite number"),
        ({"gpu_ram": "1e400"}, "offers[0].gpu_ram='1e400': must be a finite number"),
        ({"num_gpus": 1e400}, "offers[0].num_gpus=inf: must be a finite number"),
        ({"num_gpus": "nan"}, "offers[0].num_gpus='nan': must be a finite number"),
        ({"num_gpus": 1.5}, "offers[0].num_gpus=1.5: must be an integer >= 0"),
        ({"gpu_ram": -1}, "offers[0].gpu_ram=-1.0: must be >= 0 MB"),
    ],
)
def test_offers_with_non_finite_numbers_name_the_field(
    tmp_path: Path, offer: dict[str, object], message: str
) -> None:
    raw = {"id": 1, "gpu_name": "RTX 4090", "gpu_ram": 24564, **offer}
    with pytest.raises(InputError) as info:
        nodes_from_offers([raw])
    assert str(info.value) == message


def test_an_offer_file_writing_infinity_is_refused_as_not_json(tmp_path: Path) -> None:
    path = tmp_path / "offers.json"
    path.write_text(json.dumps([{"id": 1, "gpu_name": "RTX 4090", "gpu_ram": 1e400}]))
    with pytest.raises(InputError) as info:
        load_offers(path)
    assert str(info.value) == (
        f"file='{path}': holds Infinity, which is not JSON; use a finite number"
    )


def test_invalid_yaml_is_reported_on_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("nodes: [\n", encoding="utf-8")
    with pytest.raises(InputError) as info:
        load_nodes(path)
    # libyaml and the pure-Python parser word the problem differently; both say where.
    assert re.fullmatch(
        re.escape(f"file={str(path)!r}: is not valid YAML (")
        + r"(did not find expected node content|expected the node content, but found "
        r"'<stream end>') at line 2, column 1\)",
        str(info.value),
    )


def test_non_utf8_fleet_file_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InputError, match=r"is not UTF-8 text"):
        load_nodes(path)


def test_fleet_count_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(
        "- {id: a, gpu_name: x, vram_bytes: 24GiB, flops_estimate: 1, link_mbps: 1, "
        "count: 100000000}\n",
        encoding="utf-8",
    )
    with pytest.raises(InputError) as info:
        load_nodes(path)
    assert str(info.value) == "nodes[0].count=100000000: must be at most 4096"
    path.write_text(path.read_text().replace("100000000", "4096"), encoding="utf-8")
    assert len(load_nodes(path)) == 4096
