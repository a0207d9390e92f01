"""Fuzz the parsers of text: units, nvidia-smi/rocm-smi output, fabric records, benchmark output."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from stowplan.calibration import parse_llama_bench, parse_serving_bench
from stowplan.host.fabric import node_domain, parse_fabric, parse_fabric_json_lines
from stowplan.host.nvidia_smi import (
    parse_nvidia_smi,
    parse_query_csv,
    parse_query_text,
    parse_query_xml,
    parse_summary_table,
)
from stowplan.host.nvidia_topo import parse_topo_matrix, probed_intra_link
from stowplan.host.rocm_smi import parse_rocm_smi
from stowplan.quantities.limits import MAX_BYTE_COUNT, MAX_RATE
from stowplan.quantities.units import format_bytes, parse_bytes, parse_link_mbps, parse_tokens_per_s
from tests.common.fuzz import floats, fuzz, ints, mutated_text, scalars, strings, typed
from tests.common.paths import FIXTURES

SMI = FIXTURES / "nvidia-smi"
SMI_TEXTS = [
    (SMI / "thamada_nvsim" / "H100SXMx8_smi_-a.txt").read_text(),
    (SMI / "thamada_nvsim" / "A40x10_smi.txt").read_text(),
    (SMI / "telegraf_xml" / "dual_a5000-v13.xml").read_text(),
    (SMI / "issue_excerpts" / "gb200_fabric_q_snippets.txt").read_text(),
]
ROCM = (SMI / "thamada_nvsim" / "MI300X_x4_smi.txt").read_text()
TOPO_TEXTS = [p.read_text() for p in sorted((SMI / "topo").iterdir())]
BENCH_TEXTS = [
    p.read_text()
    for p in sorted((FIXTURES / "llama-bench").iterdir())
    if p.suffix in {".md", ".csv", ".json", ".jsonl"} and p.name != "SOURCES.md"
]
SERVING_TEXTS = [
    p.read_text() for p in sorted((FIXTURES / "serving-bench").iterdir()) if p.suffix == ".jsonl"
]

size_texts = st.builds(
    lambda n, unit: f"{n}{unit}",
    st.one_of(
        st.integers(0, 10**25), st.floats(0, 1e30), st.sampled_from(["1e300", "1e-400", "0.5"])
    ),
    st.sampled_from(["", "B", "kB", "KiB", "kiB", "MiB", "GB", "GiB", "TiB", "Tb", " bytes", "x"]),
)


@fuzz
@given(st.one_of(scalars, size_texts))
@example("24kiB")
@example("1e300GB")
@example(10**5000)
def test_parse_bytes_gives_a_bounded_integer_or_an_input_error(value: object) -> None:
    n = typed(parse_bytes, value)
    if n is not None:
        assert isinstance(n, int) and 0 <= n <= MAX_BYTE_COUNT
        assert format_bytes(n)


@fuzz
@given(st.integers(0, 2**40), st.sampled_from([("GiB", 2**30), ("MB", 10**6), ("TiB", 2**40)]))
def test_whole_unit_sizes_are_exact_beyond_2_to_53(n: int, unit: tuple[str, int]) -> None:
    name, size = unit
    if n * size <= MAX_BYTE_COUNT:
        assert parse_bytes(f"{n}{name}") == n * size


@fuzz
@given(st.one_of(scalars, size_texts.map(lambda t: t.replace("B", "bit"))))
@example("1e308Tbit")
def test_link_and_token_rates_are_finite_and_bounded_or_an_input_error(value: object) -> None:
    for parse in (parse_link_mbps, parse_tokens_per_s):
        rate = typed(parse, value)
        if rate is not None:
            assert 0 <= rate <= MAX_RATE


@fuzz
@given(st.one_of(st.text(max_size=300), st.sampled_from(SMI_TEXTS).flatmap(mutated_text)))
@example('name\n"' + "a" * 200_000)  # a CSV field beyond the csv module's limit
def test_nvidia_smi_parsers_give_a_report_or_an_input_error(text: str) -> None:
    for parse in (
        parse_nvidia_smi,
        parse_query_xml,
        parse_query_text,
        parse_query_csv,
        parse_summary_table,
    ):
        report = typed(parse, text)
        for gpu in report.gpus if report is not None else ():
            assert gpu.memory_total_bytes is None or gpu.memory_total_bytes >= 0


@fuzz
@given(st.one_of(st.text(max_size=300), st.sampled_from(TOPO_TEXTS).flatmap(mutated_text)))
@example("\tGPU0\tGPU1\nGPU0\t X \tNV99999999999999999999\nGPU1\tNV1\t X \n")
def test_topo_matrix_gives_links_or_an_input_error(text: str) -> None:
    topology = typed(parse_topo_matrix, text)
    if topology is not None:
        link = probed_intra_link(topology)
        assert link is None or (link.gbps > 0 and link.latency_us > 0)


@fuzz
@given(st.one_of(st.text(max_size=300), mutated_text(ROCM)))
def test_rocm_smi_gives_gpus_or_an_input_error(text: str) -> None:
    typed(parse_rocm_smi, text)


@fuzz
@given(st.one_of(st.text(max_size=300), st.sampled_from(SMI_TEXTS).flatmap(mutated_text)))
def test_fabric_parsers_give_gpus_or_an_input_error(text: str) -> None:
    gpus = typed(parse_fabric, text)
    if gpus is not None:
        typed(node_domain, gpus)
    typed(parse_fabric_json_lines, text.splitlines())


@fuzz
@given(st.one_of(st.text(max_size=300), st.sampled_from(BENCH_TEXTS).flatmap(mutated_text)))
@example("model,avg_ts\nx\n")  # a one-field CSV row under a longer header
def test_llama_bench_output_gives_results_or_an_input_error(text: str) -> None:
    for r in typed(parse_llama_bench, text, origin="fuzz") or []:
        assert r.tokens_per_s >= 0


@fuzz
@given(st.one_of(st.text(max_size=300), st.sampled_from(SERVING_TEXTS).flatmap(mutated_text)))
def test_serving_bench_output_gives_runs_or_an_input_error(text: str) -> None:
    typed(parse_serving_bench, text, origin="fuzz")


@fuzz
@given(ints, floats, strings)
def test_scalars_of_every_kind_never_escape_the_unit_parsers(i: int, f: float, s: str) -> None:
    for value in (i, f, s):
        typed(parse_bytes, value)
        typed(parse_link_mbps, value)
        typed(parse_tokens_per_s, value)
