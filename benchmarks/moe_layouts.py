"""MoE layouts from published architecture numbers (each model's config.json).

Used by the expert-placement benchmark for what the known-model table lacks:
Kimi-K2 at a bits-per-weight other than its FP8 release.

* DeepSeek-V3 (the shapes of :func:`_deepseek_like`): 61 layers, first 3 dense
  (intermediate 18432), 256 routed experts top-8 + 1 shared, hidden 7168,
  moe_intermediate 2048 (44,040,192 parameters per expert), MLA attention
  (q_lora 1536, kv_lora 512, rope 64, 128 heads of 128+64 / 128), vocab
  129280, FP8 weights.
* Kimi-K2: the same shapes with 384 routed experts, 64 heads, 1 dense layer,
  vocab 163840, FP8 weights.
"""

from __future__ import annotations

from stowplan.model import ExpertLayout, ModelLayout


def _mla_params(hidden: int, heads: int) -> int:
    q_a, q_b = hidden * 1536, 1536 * heads * (128 + 64)
    kv_a, kv_b = hidden * (512 + 64), 512 * heads * (128 + 128)
    out = heads * 128 * hidden
    norms = 2 * hidden + 1536 + 512
    return q_a + q_b + kv_a + kv_b + out + norms


def _deepseek_like(
    name: str, *, experts: int, heads: int, dense: int, vocab: int, bytes_per_param: float
) -> ModelLayout:
    hidden, layers, moe_inter, dense_inter = 7168, 61, 2048, 18432
    expert = 3 * hidden * moe_inter
    attn = _mla_params(hidden, heads)
    dense_block = attn + 3 * hidden * dense_inter
    moe_block = attn + experts * hidden + expert + experts * expert

    def b(params: int) -> int:
        return round(params * bytes_per_param)

    sizes = [b(dense_block)] * dense + [b(moe_block)] * (layers - dense)
    reads = [b(dense_block)] * dense + [b(attn + experts * hidden + 9 * expert)] * (layers - dense)
    total = sum(sizes) / bytes_per_param + 2 * vocab * hidden
    return ModelLayout(
        name=name,
        num_blocks=layers,
        hidden_dim=hidden,
        bytes_per_activation_elem=2,
        block_params_bytes=round(sum(sizes) / layers),
        block_bytes=tuple(sizes),
        block_read_bytes=tuple(reads),
        head_params_bytes=b(vocab * hidden + hidden),
        embed_params_bytes=b(vocab * hidden),
        kv_bytes_per_token=(2 * (512 + 64),) * layers,
        experts=ExpertLayout(
            num_experts=experts,
            experts_per_token=8,
            expert_params_bytes=b(expert),
            moe_blocks=tuple(range(dense, layers)),
            num_shared_experts=1,
            shared_expert_params_bytes=b(expert),
        ),
        total_params=round(total),
        dtype="fp8" if bytes_per_param == 1 else f"{bytes_per_param * 8:g}-bit",
        family="deepseek_v3",
    )


def kimi_k2(bytes_per_param: float = 1.0) -> ModelLayout:
    return _deepseek_like(
        "kimi-k2", experts=384, heads=64, dense=1, vocab=163840, bytes_per_param=bytes_per_param
    )
