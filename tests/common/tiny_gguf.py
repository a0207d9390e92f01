"""A tiny Llama GGUF that llama.cpp loads and runs: random float32 weights, a byte-level
SentencePiece vocabulary, written with ``gguf.GGUFWriter``.

Used by the export tests (a plan made from a real ``.gguf`` file) and by
``benchmarks/e2e_llamacpp.py`` (the exported commands run for real).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

EMBED = 64
HEADS = 4
KV_HEADS = 2
FFN = 128
CONTEXT = 512


def _vocab() -> tuple[list[str], list[float], list[int]]:
    """``<unk> <s> </s>``, the 256 byte tokens, then ``▁`` and the printable ASCII."""
    import gguf

    kinds = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>"]
    types = [kinds.UNKNOWN, kinds.CONTROL, kinds.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [kinds.BYTE] * 256
    printable = ["▁", *(chr(c) for c in range(33, 127))]
    tokens += printable
    types += [kinds.NORMAL] * len(printable)
    scores = [0.0] * len(tokens)
    return tokens, scores, [int(t) for t in types]


def write_tiny_llama(path: Path, *, blocks: int = 6, seed: int = 0) -> Path:
    """Write a ``blocks``-block Llama of hidden size 64 to ``path``; return ``path``."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens, scores, types = _vocab()
    vocab = len(tokens)
    head_dim = EMBED // HEADS

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("stowplan-tiny-llama")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(EMBED)
    w.add_block_count(blocks)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_tensor("token_embd.weight", weight(vocab, EMBED))
    ones = np.ones((EMBED,), np.float32)
    for b in range(blocks):
        w.add_tensor(f"blk.{b}.attn_norm.weight", ones)
        w.add_tensor(f"blk.{b}.attn_q.weight", weight(EMBED, EMBED))
        w.add_tensor(f"blk.{b}.attn_k.weight", weight(KV_HEADS * head_dim, EMBED))
        w.add_tensor(f"blk.{b}.attn_v.weight", weight(KV_HEADS * head_dim, EMBED))
        w.add_tensor(f"blk.{b}.attn_output.weight", weight(EMBED, EMBED))
        w.add_tensor(f"blk.{b}.ffn_norm.weight", ones)
        w.add_tensor(f"blk.{b}.ffn_gate.weight", weight(FFN, EMBED))
        w.add_tensor(f"blk.{b}.ffn_up.weight", weight(FFN, EMBED))
        w.add_tensor(f"blk.{b}.ffn_down.weight", weight(EMBED, FFN))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", weight(vocab, EMBED))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
