"""``stowplan plan --context``: KV cache for 8,192 tokens per sequence by default, ``max``
for the largest context that fits, 0 for none; a context that cannot fit is one line."""

from __future__ import annotations

import pytest

from stowplan import plan_from_json
from stowplan.cli import main
from tests.common.paths import EXAMPLES

CASE_C = str(EXAMPLES / "fleets" / "case-c.yaml")
MIXED = str(EXAMPLES / "fleets" / "mixed-consumer.yaml")
KV_PER_TOKEN = 327_680  # llama3.1:70b: 80 blocks × 2 × 8 KV heads × 128 × 2 bytes


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["plan", *args]) == 0
    return capsys.readouterr().out


def _reserve(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int | None, int]:
    p = plan_from_json(_run(capsys, "llama3.1:70b-q4", "--nodes", CASE_C, "--json", *args))
    return p.context_tokens, sum(a.kv_reserve_bytes for a in p.assignments)


def test_a_plan_reserves_kv_for_8192_tokens_per_sequence_by_default(capsys) -> None:
    assert _reserve(capsys) == (8192, 8192 * KV_PER_TOKEN)
    assert _reserve(capsys, "--batch", "3") == (8192, 3 * 8192 * KV_PER_TOKEN)
    out = _run(capsys, "llama3.1:70b-q4", "--nodes", CASE_C)
    assert "KV reserved for 8,192 tokens × 1 sequence (default; --context to change)\n" in out


def test_the_default_is_the_models_maximum_when_that_is_smaller(tmp_path, capsys) -> None:
    import json

    from tests.common.paths import FIXTURES

    cfg = json.loads((FIXTURES / "hf-configs" / "Llama-3.2-1B.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, "max_position_embeddings": 2048}))
    p = plan_from_json(_run(capsys, str(path), "--nodes", CASE_C, "--json", "--batch", "2"))
    assert p.context_tokens == 2048
    out = _run(capsys, str(path), "--nodes", CASE_C, "--batch", "2")
    assert "KV reserved for 2,048 tokens × 2 sequences (default; --context to change)\n" in out


def test_context_0_reserves_nothing(capsys) -> None:
    assert _reserve(capsys, "--context", "0") == (0, 0)
    out = _run(capsys, "llama3.1:70b-q4", "--nodes", CASE_C, "--context", "0")
    assert "KV cache: none reserved (--context 0); the engine gets what is left\n" in out


def test_context_max_plans_the_largest_context_that_fits_and_says_so(capsys) -> None:
    assert _reserve(capsys, "--context", "max") == (32710, 32710 * KV_PER_TOKEN)
    out = _run(capsys, "llama3.1:70b-q4", "--nodes", CASE_C, "--context", "MAX", "--batch", "2")
    assert (
        "KV reserved for 16,355 tokens × 2 sequences (the largest context that fits; "
        "--context max)\n"
    ) in out
    out = _run(capsys, "mixtral:8x7b", "--nodes", MIXED, "--context", "max")
    assert (
        "KV reserved for 32,768 tokens × 1 sequence (the model's maximum context; --context max)"
    ) in out


def test_an_explicit_context_is_stated_plainly(capsys) -> None:
    out = _run(capsys, "llama3.1:70b-q4", "--nodes", CASE_C, "--context", "4096", "--batch", "4")
    assert "KV reserved for 4,096 tokens × 4 sequences\n" in out


def test_a_context_that_cannot_fit_is_one_line_with_the_numbers(capsys) -> None:
    argv = ["plan", "llama3.1:70b-q4", "--nodes", CASE_C, "--context", "40000", "--batch", "2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        "stowplan: error: constraints unsatisfiable: a context of 40,000 tokens × 2 sequences "
        "does not fit: weights 37.2 GiB + KV 24.4 GiB (320.0 KiB/token × 40,000 tokens × 2 "
        "sequences) = 61.6 GiB against usable VRAM 47.7 GiB on 4 nodes (20% headroom kept "
        "free); the largest context that fits is 16,355 tokens (--context max); or add nodes\n"
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "abc",
            "--context='abc': must be a number of tokens in [0, 1073741824] (0: no KV reserve) "
            "or 'max' (the largest that fits)",
        ),
        (
            "-5",
            "--context='-5': must be a number of tokens in [0, 1073741824] (0: no KV reserve) "
            "or 'max' (the largest that fits)",
        ),
        (
            "9" * 5000,
            f"--context='{'9' * 259}…(5002 characters): must be a number of tokens in "
            "[0, 1073741824] (0: no KV reserve) or 'max' (the largest that fits)",
        ),
        (
            "200000",
            "context_tokens=200000: must be at most llama3.1:70b-q4_0's maximum context (131,072)",
        ),
    ],
)
def test_bad_contexts_are_one_line(value: str, message: str, capsys) -> None:
    assert main(["plan", "llama3.1:70b-q4", "--nodes", CASE_C, "--context", value]) == 2
    assert capsys.readouterr().err == f"stowplan: error: {message}\n"
