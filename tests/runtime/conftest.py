"""Tiny checkpoints of every family, made once per session; the worker's tests skip
without the ``worker`` extra."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the runtime tests need the worker extra")
pytest.importorskip("transformers", reason="the runtime tests need the worker extra")

from tests.common.checkpoints import FAMILIES, tiny_checkpoint


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One checkpoint per family, plus ``qwen2-tied`` (tied embeddings)."""
    root = tmp_path_factory.mktemp("checkpoints")
    made = {f: tiny_checkpoint(root / f, f) for f in FAMILIES}
    made["qwen2-tied"] = tiny_checkpoint(root / "qwen2-tied", "qwen2", tied=True, layers=3)
    return made
