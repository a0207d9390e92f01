"""The tensors a family's modelling code creates, from its config (names and shapes only).

Hugging Face names and shapes, without any weight: attention (grouped-query or
multi-head latent), MLP, routed and shared experts, norms, the embedding table,
the head and DeepSeek's multi-token-prediction layers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from stowplan.models.hf_config import Config, config_int, first_int, head_dim, int_list, tied

__all__ = ["ConfigTensor", "config_tensors", "is_moe_layer"]


@dataclass(frozen=True, slots=True)
class ConfigTensor:
    """A tensor the modelling code creates: name, shape, role (for pricing)."""

    name: str
    shape: tuple[int, ...]
    role: str
    """``linear``, ``expert``, ``router``, ``small`` (norms, biases), ``table``, ``buffer``."""
    count: int = 1
    """Identical copies: the routed experts ``experts.*`` of one block."""


def is_moe_layer(cfg: Config, mt: str, i: int) -> bool:
    """Whether block ``i`` of a ``model_type`` ``mt`` model is a MoE block."""
    if mt in ("mixtral", "gpt_oss"):
        return True
    if mt in ("qwen2_moe", "qwen3_moe"):
        step = config_int(cfg, "decoder_sparse_step", 1) or 1
        only = int_list(cfg, "mlp_only_layers")
        return first_int(cfg, ("num_experts",), 0) > 0 and i not in only and (i + 1) % step == 0
    if mt in ("deepseek_v3", "kimi_k2"):
        freq = config_int(cfg, "moe_layer_freq", 1) or 1
        return (
            first_int(cfg, ("n_routed_experts",), 0) > 0
            and i >= config_int(cfg, "first_k_dense_replace", 0)
            and i % freq == 0
        )
    return False


def _mlp(p: str, h: int, inter: int, bias: bool = False) -> Iterator[ConfigTensor]:
    for proj, shape in (
        ("gate_proj", (inter, h)),
        ("up_proj", (inter, h)),
        ("down_proj", (h, inter)),
    ):
        yield ConfigTensor(f"{p}.{proj}.weight", shape, "linear")
        if bias:
            yield ConfigTensor(f"{p}.{proj}.bias", (shape[0],), "small")


def _gqa(cfg: Config, mt: str, p: str) -> Iterator[ConfigTensor]:
    h, hd = config_int(cfg, "hidden_size"), head_dim(cfg)
    heads = config_int(cfg, "num_attention_heads")
    kv = config_int(cfg, "num_key_value_heads", heads)
    qkv_bias = mt == "qwen2" or bool(cfg.get("attention_bias", False))
    o_bias = bool(cfg.get("attention_bias", False)) and mt != "qwen2"
    for proj, out in (("q_proj", heads * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
        yield ConfigTensor(f"{p}.{proj}.weight", (out, h), "linear")
        if qkv_bias:
            yield ConfigTensor(f"{p}.{proj}.bias", (out,), "small")
    yield ConfigTensor(f"{p}.o_proj.weight", (h, heads * hd), "linear")
    if o_bias:
        yield ConfigTensor(f"{p}.o_proj.bias", (h,), "small")
    if mt in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text"):
        yield ConfigTensor(f"{p}.q_norm.weight", (hd,), "small")
        yield ConfigTensor(f"{p}.k_norm.weight", (hd,), "small")
    if mt == "gpt_oss":
        yield ConfigTensor(f"{p}.sinks", (heads,), "small")


def _mla(cfg: Config, p: str) -> Iterator[ConfigTensor]:
    h, heads = config_int(cfg, "hidden_size"), config_int(cfg, "num_attention_heads")
    nope, rope = config_int(cfg, "qk_nope_head_dim"), config_int(cfg, "qk_rope_head_dim")
    v, kv_rank = config_int(cfg, "v_head_dim"), config_int(cfg, "kv_lora_rank")
    q_rank = config_int(cfg, "q_lora_rank", 0)
    if q_rank:
        yield ConfigTensor(f"{p}.q_a_proj.weight", (q_rank, h), "linear")
        yield ConfigTensor(f"{p}.q_a_layernorm.weight", (q_rank,), "small")
        yield ConfigTensor(f"{p}.q_b_proj.weight", (heads * (nope + rope), q_rank), "linear")
    else:
        yield ConfigTensor(f"{p}.q_proj.weight", (heads * (nope + rope), h), "linear")
    yield ConfigTensor(f"{p}.kv_a_proj_with_mqa.weight", (kv_rank + rope, h), "linear")
    yield ConfigTensor(f"{p}.kv_a_layernorm.weight", (kv_rank,), "small")
    yield ConfigTensor(f"{p}.kv_b_proj.weight", (heads * (nope + v), kv_rank), "linear")
    yield ConfigTensor(f"{p}.o_proj.weight", (h, heads * v), "linear")


def _moe(cfg: Config, mt: str, p: str) -> Iterator[ConfigTensor]:
    h = config_int(cfg, "hidden_size")
    if mt == "mixtral":
        e, inter = config_int(cfg, "num_local_experts"), config_int(cfg, "intermediate_size")
        yield ConfigTensor(f"{p}.block_sparse_moe.gate.weight", (e, h), "router")
        q = f"{p}.block_sparse_moe.experts.*"
        yield ConfigTensor(f"{q}.w1.weight", (inter, h), "expert", e)
        yield ConfigTensor(f"{q}.w2.weight", (h, inter), "expert", e)
        yield ConfigTensor(f"{q}.w3.weight", (inter, h), "expert", e)
        return
    if mt == "gpt_oss":
        e, inter = (
            first_int(cfg, ("num_local_experts", "num_experts")),
            config_int(cfg, "intermediate_size"),
        )
        yield ConfigTensor(f"{p}.mlp.router.weight", (e, h), "router")
        yield ConfigTensor(f"{p}.mlp.router.bias", (e,), "small")
        yield ConfigTensor(f"{p}.mlp.experts.gate_up_proj", (e, h, 2 * inter), "expert")
        yield ConfigTensor(f"{p}.mlp.experts.gate_up_proj_bias", (e, 2 * inter), "small")
        yield ConfigTensor(f"{p}.mlp.experts.down_proj", (e, inter, h), "expert")
        yield ConfigTensor(f"{p}.mlp.experts.down_proj_bias", (e, h), "small")
        return
    inter = config_int(cfg, "moe_intermediate_size")
    if mt in ("deepseek_v3", "kimi_k2"):
        e = config_int(cfg, "n_routed_experts")
        shared = config_int(cfg, "n_shared_experts", 0)
    else:
        e = config_int(cfg, "num_experts")
        shared = 0
    yield ConfigTensor(f"{p}.mlp.gate.weight", (e, h), "router")
    if mt in ("deepseek_v3", "kimi_k2") and cfg.get("topk_method", "noaux_tc") == "noaux_tc":
        yield ConfigTensor(f"{p}.mlp.gate.e_score_correction_bias", (e,), "buffer")
    for t in _mlp(f"{p}.mlp.experts.*", h, inter):
        yield ConfigTensor(t.name, t.shape, "expert", e)
    if shared:
        yield from _mlp(f"{p}.mlp.shared_experts", h, inter * shared)
    if mt == "qwen2_moe":
        s_inter = config_int(cfg, "shared_expert_intermediate_size", 0)
        if s_inter:
            yield from _mlp(f"{p}.mlp.shared_expert", h, s_inter)
            yield ConfigTensor(f"{p}.mlp.shared_expert_gate.weight", (1, h), "router")


def _layer(cfg: Config, mt: str, i: int) -> Iterator[ConfigTensor]:
    p = f"model.layers.{i}"
    h = config_int(cfg, "hidden_size")
    if mt in ("deepseek_v3", "kimi_k2"):
        yield from _mla(cfg, f"{p}.self_attn")
    else:
        yield from _gqa(cfg, mt, f"{p}.self_attn")
    yield ConfigTensor(f"{p}.input_layernorm.weight", (h,), "small")
    yield ConfigTensor(f"{p}.post_attention_layernorm.weight", (h,), "small")
    if mt.startswith("gemma") and mt != "gemma":
        yield ConfigTensor(f"{p}.pre_feedforward_layernorm.weight", (h,), "small")
        yield ConfigTensor(f"{p}.post_feedforward_layernorm.weight", (h,), "small")
    if is_moe_layer(cfg, mt, i):
        yield from _moe(cfg, mt, p)
    else:
        yield from _mlp(
            f"{p}.mlp", h, config_int(cfg, "intermediate_size"), bool(cfg.get("mlp_bias"))
        )


def config_tensors(cfg: Config, mt: str, *, with_mtp: bool) -> Iterator[ConfigTensor]:
    """Every tensor the family's modelling code creates, in order (MTP layers with ``with_mtp``)."""
    h, vocab, n = (
        config_int(cfg, "hidden_size"),
        config_int(cfg, "vocab_size"),
        config_int(cfg, "num_hidden_layers"),
    )
    yield ConfigTensor("model.embed_tokens.weight", (vocab, h), "table")
    for i in range(n):
        yield from _layer(cfg, mt, i)
    yield ConfigTensor("model.norm.weight", (h,), "small")
    if not tied(cfg, mt):
        yield ConfigTensor("lm_head.weight", (vocab, h), "table")
    if with_mtp and mt in ("deepseek_v3", "kimi_k2"):
        for i in range(n, n + config_int(cfg, "num_nextn_predict_layers", 0)):
            p = f"model.layers.{i}"
            yield from _layer(cfg, mt, max(i, config_int(cfg, "first_k_dense_replace", 0)))
            yield ConfigTensor(f"{p}.enorm.weight", (h,), "small")
            yield ConfigTensor(f"{p}.hnorm.weight", (h,), "small")
            yield ConfigTensor(f"{p}.eh_proj.weight", (h, 2 * h), "linear")
            yield ConfigTensor(f"{p}.embed_tokens.weight", (vocab, h), "table")
            yield ConfigTensor(f"{p}.shared_head.norm.weight", (h,), "small")
            yield ConfigTensor(f"{p}.shared_head.head.weight", (vocab, h), "table")
