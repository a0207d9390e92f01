"""Partial loading: a stage opens only its shards and reads exactly its tensors plus headers."""

from __future__ import annotations

import json

import pytest

import stowplan.runtime.checkpoint as checkpoint_module
from stowplan.errors import InputError
from stowplan.runtime.checkpoint import open_checkpoint, read_stage_tensors, stage_tensor_names
from tests.common.checkpoints import block_names, expected_reads, tiny_checkpoint

EMBED, NORM, HEAD = "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str]]]:
    """Every shard ``safe_open`` opens and the tensors taken from it."""
    import safetensors

    real = safetensors.safe_open
    log: list[tuple[str, list[str]]] = []

    class Spy:
        def __init__(self, path: str, **kw: object) -> None:
            self.inner = real(path, **kw)
            log.append((path.rsplit("/", 1)[-1], []))

        def __enter__(self) -> Spy:
            self.inner.__enter__()
            return self

        def __exit__(self, *exc: object) -> None:
            self.inner.__exit__(*exc)

        def get_tensor(self, name: str):  # type: ignore[no-untyped-def]
            log[-1][1].append(name)
            return self.inner.get_tensor(name)

    monkeypatch.setattr(safetensors, "safe_open", Spy)
    return log


@pytest.mark.parametrize(
    ("block_range", "embed", "head"),
    [((0, 1), True, False), ((1, 3), False, False), ((3, 4), False, True), ((0, 4), True, True)],
)
def test_a_stage_opens_only_its_shards_and_reads_exactly_its_tensors_plus_headers(
    checkpoints, opened, block_range, embed, head
) -> None:
    folder = checkpoints["llama"]
    ck = open_checkpoint(folder)
    want = block_names(folder, *block_range) | ({EMBED} if embed else set())
    want |= {NORM, HEAD} if head else set()
    names = stage_tensor_names(ck, block_range, embed, head)
    assert set(names) == want
    read = read_stage_tensors(ck, names)
    shards, header, data = expected_reads(folder, want)
    assert {s for s, _ in opened} == shards == set(read.shards)
    assert len(opened) == len(shards)  # each shard opened once
    assert sorted(n for _, got in opened for n in got) == sorted(want)
    assert (read.header_bytes, read.tensor_bytes) == (header, data)
    assert read.bytes_read == header + data
    all_shards = {p.name for p in folder.glob("*.safetensors")}
    if block_range != (0, 4):
        assert shards < all_shards


def test_the_checkpoint_is_sharded_so_the_index_is_used(checkpoints) -> None:
    index = json.loads((checkpoints["llama"] / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 4


def test_with_tied_embeddings_the_last_stage_reads_the_table_as_its_head(checkpoints) -> None:
    ck = open_checkpoint(checkpoints["qwen2-tied"])
    assert ck.tied
    names = stage_tensor_names(ck, (2, 3), False, True)
    assert EMBED in names and NORM in names and HEAD not in names
    both = stage_tensor_names(ck, (0, 3), True, True)
    assert both.count(EMBED) == 1


def test_a_single_file_checkpoint_is_read_by_its_header(tmp_path) -> None:
    folder = tiny_checkpoint(tmp_path / "one", "llama", layers=2)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(folder)).save_pretrained(
        str(tmp_path / "single"), max_shard_size="1GB"
    )
    ck = open_checkpoint(tmp_path / "single")
    assert set(ck.weight_map.values()) == {"model.safetensors"}
    read = read_stage_tensors(ck, stage_tensor_names(ck, (1, 2), False, True))
    _, header, data = expected_reads(tmp_path / "single", set(read.tensors))
    assert (read.header_bytes, read.tensor_bytes) == (header, data)


def test_a_folder_without_a_checkpoint_names_the_folder(tmp_path) -> None:
    with pytest.raises(InputError) as info:
        open_checkpoint(tmp_path / "absent")
    assert info.value.field == "CHECKPOINT" and "checkpoint folder" in str(info.value)
    assert checkpoint_module.EMBED == EMBED
