"""Random checkpoints of every family the worker runs, with a tokenizer, made locally.

``python -m stowplan.runtime.make_checkpoint DIR --family llama --params 100M``
writes a randomly initialised model of about that many parameters
(``config.json``, sharded ``*.safetensors`` with ``model.safetensors.index.json``)
and a word-level tokenizer trained on a few sentences (``tokenizer.json``), nothing
downloaded.  Tests use :func:`make_checkpoint` with tiny sizes.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from stowplan.errors import InputError
from stowplan.quantities.checks import check_int
from stowplan.quantities.units import parse_bytes
from stowplan.runtime.families import Family

__all__ = ["SENTENCES", "make_checkpoint", "make_tokenizer", "tiny_config"]

SENTENCES = (
    "stowplan decides where every byte of a large language model lives",
    "each stage reads only its own blocks from the checkpoint on local disk",
    "the last stage samples the next token and sends it back to the first stage",
    "hidden states travel from one stage to the next through the cluster",
    "a plan names the node of every stage and the blocks it holds",
    "the worker runs prefill and decode with a cache of keys and values",
)
"""The text the tokenizer is trained on (and prompts of the tests are drawn from)."""


def make_tokenizer(folder: Path) -> int:
    """A word-level tokenizer of :data:`SENTENCES` saved into ``folder``; its vocabulary size."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(SENTENCES, trainer=trainer)
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(str(folder))
    return int(tok.get_vocab_size())


def tiny_config(
    family: Family | str,
    *,
    vocab_size: int,
    hidden: int = 32,
    layers: int = 4,
    tied: bool = False,
    **extra: Any,
) -> Any:
    """A small ``transformers`` config of ``family`` (float32)."""
    from transformers import AutoConfig

    family = Family(family)
    kw: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "tie_word_embeddings": tied,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": None,
    }
    if family is Family.QWEN3:
        kw["head_dim"] = hidden // 4
    if family is Family.MIXTRAL:
        kw |= {"num_local_experts": 4, "num_experts_per_tok": 2}
    if family is Family.MISTRAL:
        kw["sliding_window"] = 64
    return AutoConfig.for_model(family.value, **(kw | extra))


def _sized(family: Family, params: int, vocab_size: int) -> dict[str, Any]:
    """Hidden size and layers for about ``params`` parameters (9·h² per layer: attention with
    half as many KV heads as heads, 3h², an MLP of width 2h, 6h²; plus the embeddings)."""
    for hidden in (256, 384, 512, 640, 768, 896, 1024, 1280, 1536, 2048):
        per_layer = 9 * hidden * hidden
        layers = max(2, (params - 2 * vocab_size * hidden) // per_layer)
        if layers <= 2 * hidden // 64:
            break
    return {"hidden": hidden, "layers": int(layers)}


def make_checkpoint(
    folder: str | Path,
    family: Family | str,
    *,
    config: Any = None,
    params: int | None = None,
    seed: int = 0,
    max_shard_bytes: int = 50_000,
) -> Path:
    """Write a random ``family`` checkpoint and its tokenizer into ``folder``.

    ``config`` (from :func:`tiny_config`) or ``params`` (about how many) sets its size;
    the weights are saved in shards of at most ``max_shard_bytes`` (so the index is
    used) in float32.
    """
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    vocab = make_tokenizer(path)
    fam = Family(family)
    if config is None:
        if params is None:
            raise InputError("params", None, "is needed when no config is given")
        check_int("params", params, minimum=1)
        config = tiny_config(fam, vocab_size=vocab, **_sized(fam, params, vocab))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(str(path), max_shard_size=max_shard_bytes)
    return path


def main(argv: list[str] | None = None) -> None:
    """The command line of this module (see the module notes)."""
    parser = argparse.ArgumentParser(prog="python -m stowplan.runtime.make_checkpoint")
    parser.add_argument("folder")
    parser.add_argument("--family", default="llama", choices=[f.value for f in Family])
    parser.add_argument("--params", default="100M", help="about how many parameters: 100M, 1.5M")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    raw = args.params.strip().upper().removesuffix("B")
    scale = {"K": 1e3, "M": 1e6, "G": 1e9}.get(raw[-1:], 1.0)
    try:
        params = int(float(raw.rstrip("KMG")) * scale)
    except ValueError:
        raise SystemExit(f"--params={args.params!r}: must be a count like 100M") from None
    path = make_checkpoint(
        args.folder,
        args.family,
        params=params,
        seed=args.seed,
        max_shard_bytes=int(parse_bytes("100MB")),
    )
    total = sum(p.stat().st_size for p in path.glob("*.safetensors"))
    print(f"wrote {path}: {args.family}, {total / 4e6:.0f} M parameters in float32")


if __name__ == "__main__":
    main()
