"""Parsing real llama-bench output (sources in tests/fixtures/llama-bench/SOURCES.md)."""

from __future__ import annotations

import pytest

from stowplan.calibration import estimate_num_blocks, parse_llama_bench
from stowplan.errors import InputError
from tests.common.paths import FIXTURES

LB = FIXTURES / "llama-bench"
GiB = 1024**3


def _parse(name: str):  # type: ignore[no-untyped-def]
    return parse_llama_bench((LB / name).read_text(encoding="utf-8"), origin=name)


def test_markdown_with_old_spelling_reads_every_tg_row() -> None:
    rs = _parse("readme_cuda_tg_models.md")
    assert [(r.test, r.n_gen, r.tokens_per_s) for r in rs[:3]] == [
        ("tg128", 128, 132.19),
        ("tg256", 256, 129.37),
        ("tg512", 512, 123.83),
    ]
    assert rs[3].model_type == "llama 13B mostly Q4_0"
    assert rs[3].size_bytes == round(6.86 * GiB)
    assert rs[3].n_params == 13_020_000_000
    assert rs[3].dtype == "Q4_0"
    assert rs[0].stddev_tokens_per_s == 0.55
    assert rs[0].n_gpu_layers == -1
    assert all(r.is_decode and r.backend == "CUDA" for r in rs)


def test_markdown_inside_a_pasted_log() -> None:
    rs = _parse("pr4766_rtx4090_cuda.md")
    assert [(r.dtype, r.test, r.tokens_per_s) for r in rs] == [
        ("F16", "pp512", 11048.22),
        ("F16", "tg128", 61.03),
        ("Q8_0", "pp512", 7664.00),
        ("Q8_0", "tg128", 98.13),
        ("Q4_0", "pp512", 7979.85),
    ]
    assert rs[1].size_bytes == round(12.55 * GiB)
    assert [r.is_decode for r in rs] == [False, True, False, True, False]


def test_markdown_mib_sizes_mixed_tests_and_threads_column() -> None:
    rs = _parse("geerlingguy48_m1ultra_metal.md")
    assert [r.test for r in rs] == ["pp512", "pp4096", "tg128", "pp4096+tg128"]
    mixed = rs[3]
    assert (mixed.n_prompt, mixed.n_gen, mixed.is_decode) == (4096, 128, False)
    assert rs[2].size_bytes == round(636.18 * 1024**2)
    assert rs[2].n_params == 1_100_000_000
    assert rs[2].dtype == "Q4_K_M"
    assert rs[2].backend == "Metal,BLAS"
    assert rs[2].n_gpu_layers is None


def test_markdown_with_extra_columns() -> None:
    rs = _parse("pr2917_m2ultra_metal.md")
    tg = [(r.dtype, r.tokens_per_s) for r in rs if r.is_decode]
    assert tg == [("Q8_0", 62.05), ("Q4_0", 88.54), ("Q4_1", 83.63)]
    assert rs[0].model_type == "LLaMA 7B mostly Q8_0"


@pytest.mark.parametrize(
    ("name", "tg_ts"),
    [
        ("readme_rtx4080.csv", 119.915244),
        ("readme_rtx4080.json", 118.881588),
        ("readme_rtx4080.jsonl", 118.881588),
    ],
)
def test_csv_json_jsonl_give_the_same_fields(name: str, tg_ts: float) -> None:
    rs = _parse(name)
    assert [r.test for r in rs] == ["pp512", "tg128"]
    tg = rs[1]
    assert tg.tokens_per_s == tg_ts
    assert tg.size_bytes == 4_677_120_000
    assert tg.n_params == 7_615_616_512
    assert tg.gpu_info == "NVIDIA GeForce RTX 4080"
    assert tg.backend == "CUDA"
    assert tg.dtype == "Q4_K_M"
    assert tg.n_gpu_layers == -1


def test_depth_tests_parse() -> None:
    text = (
        "| model | size | params | backend | ngl | test | t/s |\n"
        "| --- | ---: | ---: | --- | --: | ---: | ---: |\n"
        "| qwen2 7B Q4_K - Medium | 4.36 GiB | 7.62 B | CUDA | -1 | tg128 @ d512 | 116.71 ± 0.60 |\n"
    )
    (r,) = parse_llama_bench(text)
    assert (r.test, r.n_gen, r.n_depth, r.is_decode) == ("tg128@d512", 128, 512, True)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "nothing here\n",
            "out.txt='<13 chars>': contains no llama-bench results "
            "(expected its markdown table, CSV, JSON or JSONL)",
        ),
        (
            "[1, 2",
            "out.txt='<5 chars>': is not valid JSON (Expecting ',' delimiter: line 1 column 6 (char 5))",
        ),
        ('{"a": 1}\n', "out.txt:1=None: is not a llama-bench result ('avg_ts')"),
    ],
)
def test_unreadable_output_is_rejected_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(InputError) as exc:
        parse_llama_bench(text, origin="out.txt")
    assert str(exc.value) == message


@pytest.mark.parametrize(
    ("params", "blocks"),
    [(6_740_000_000, 32), (13_020_000_000, 40), (1_100_000_000, 22), (70_550_000_000, 80)],
)
def test_block_estimates_for_common_sizes(params: int, blocks: int) -> None:
    assert estimate_num_blocks(params) == blocks


def test_partial_offload_names_cpu_and_split_runs_only() -> None:
    from dataclasses import replace

    from stowplan.calibration import partial_offload

    (r, *_) = parse_llama_bench((LB / "readme_cuda_tg_models.md").read_text())
    assert r.n_gpu_layers == -1 and partial_offload(r, 32) is None
    assert partial_offload(replace(r, n_gpu_layers=0), 32) == "ngl 0: ran on the CPU"
    assert partial_offload(replace(r, n_gpu_layers=31), 32) == (
        "ngl 31 < 32 layers: partial offload"
    )
    assert partial_offload(replace(r, n_gpu_layers=32), 32) is None
    assert partial_offload(replace(r, n_gpu_layers=None), 32) is None
    metal = replace(r, n_gpu_layers=1, backend="Metal")
    assert partial_offload(metal, 32) is None
    assert partial_offload(replace(metal, n_gpu_layers=0), 32) == "ngl 0: ran on the CPU"


def test_markdown_with_fa_and_mmap_columns_reads_the_70b_decode_row() -> None:
    rs = _parse("beowulf17_mac_studio_70b_metal.md")
    assert [(r.test, r.tokens_per_s) for r in rs] == [
        ("pp512", 162.30),
        ("pp4096", 156.67),
        ("tg128", 14.41),
        ("pp4096+tg128", 119.34),
    ]
    tg = rs[2]
    assert tg.is_decode and tg.n_gen == 128
    assert tg.size_bytes == round(39.59 * GiB)
    assert tg.n_params == 70_550_000_000
    assert tg.dtype == "Q4_K_M"
    assert tg.stddev_tokens_per_s == 0.02
    assert estimate_num_blocks(tg.n_params) == 80


def test_the_split_mode_and_gpu_list_give_the_runs_layout() -> None:
    import json

    base = json.loads((LB / "readme_rtx4080.json").read_text(encoding="utf-8"))[0]
    one = parse_llama_bench(json.dumps([base]))[0]
    assert one.gpu_names == ("NVIDIA GeForce RTX 4080",)
    assert one.layout() == (0, 1)
    # The same record as a three-GPU run (llama-bench lists the devices comma-separated).
    three = dict(base, gpu_info="Tesla P40, Tesla P40, Tesla P40")
    for mode, layout in (("layer", (2, 1)), ("row", (0, 3)), ("none", (0, 1))):
        (r,) = parse_llama_bench(json.dumps([dict(three, split_mode=mode)]))
        assert r.split_mode == mode
        assert r.layout() == layout
    # No split mode printed: llama.cpp's default, layer.
    assert parse_llama_bench(json.dumps([three]))[0].layout() == (2, 1)
    # A markdown table has no device list: the caller says how many GPUs.
    md = (
        "| model | size | params | backend | ngl | sm | test | t/s |\n"
        "| --- | ---: | ---: | --- | --: | --- | --: | ---: |\n"
        "| llama 7B Q4_0 | 3.56 GiB | 6.74 B | CUDA | 99 | row | tg 128 | 40.00 ± 0.10 |\n"
    )
    (r,) = parse_llama_bench(md)
    assert r.split_mode == "row" and r.gpu_names == ()
    assert r.layout() == (0, 1)
    assert r.layout(2) == (0, 2)


def test_an_unknown_split_mode_is_refused_by_name() -> None:
    import json

    from stowplan.errors import InputError

    base = json.loads((LB / "readme_rtx4080.json").read_text(encoding="utf-8"))[0]
    (r,) = parse_llama_bench(json.dumps([dict(base, split_mode="graph")]))
    with pytest.raises(InputError) as exc:
        r.layout(2)
    assert str(exc.value) == "split_mode='graph': must be one of layer, row, none"
