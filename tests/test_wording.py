"""Counts read as English: one node, two nodes."""

from __future__ import annotations

import pytest

from stowplan.text.wording import plural


@pytest.mark.parametrize(
    ("count", "noun", "many", "text"),
    [
        (1, "node", None, "1 node"),
        (0, "node", None, "0 nodes"),
        (2, "GPU", None, "2 GPUs"),
        (3, "entry", "entries", "3 entries"),
        (1, "entry", "entries", "1 entry"),
    ],
)
def test_the_noun_is_plural_unless_the_count_is_one(
    count: int, noun: str, many: str | None, text: str
) -> None:
    assert plural(count, noun, many) == text


def test_a_one_node_fleet_is_not_called_1_nodes() -> None:
    import contextlib
    import io

    from stowplan.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["validate", "--role", "inference", "--nodes", "1", "--gpus-per-node", "1"])
    assert code == 0
    assert "1 node ×" in out.getvalue() and "1 nodes" not in out.getvalue()


def test_ray_node_ids_are_shortened_for_display_and_other_ids_kept() -> None:
    from stowplan.text.wording import short_node_id

    ray_id = "3f2a9c1b" + "0" * 48
    assert short_node_id(ray_id) == "3f2a9c1b…"
    assert short_node_id("offer-123") == "offer-123"
    assert short_node_id("X" * 56) == "X" * 56
