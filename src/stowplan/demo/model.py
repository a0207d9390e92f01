"""A small transformer-shaped model in numpy, runnable one stage at a time.

Pure: imports numpy and the core types only.  The weights are random but
reproducible: block ``i`` is drawn from ``numpy.random.default_rng((seed, i))``
so a stage can build exactly its own blocks without touching the others.
Every block is pre-norm attention with a KV cache (causal, multi-head) plus a
SiLU MLP; the embedding adds a sinusoidal position code; the head is a final
RMS norm and an untied projection to the vocabulary.  Decoding is one token
per step, so a prompt is fed token by token (the prefill is a series of
steps too).  Everything is float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from stowplan.errors import InputError
from stowplan.model import ModelLayout
from stowplan.quantities.checks import check_int

__all__ = [
    "DemoConfig",
    "Generation",
    "StageModel",
    "demo_layout",
    "generate_local",
]

F32 = NDArray[np.float32]
_EMBED = 1_000_000
"""Stream index of the embedding weights (blocks use their own index)."""
_HEAD = 1_000_001


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoConfig:
    """Shape of the demo model. The defaults give about 7 MB of float32 weights."""

    num_blocks: int = 8
    hidden_dim: int = 128
    num_heads: int = 4
    mlp_dim: int = 512
    vocab_size: int = 512
    max_seq_len: int = 64
    """Longest sequence (prompt + generated tokens) the KV cache holds."""
    seed: int = 0

    def __post_init__(self) -> None:
        for name in (
            "num_blocks",
            "hidden_dim",
            "num_heads",
            "mlp_dim",
            "vocab_size",
            "max_seq_len",
        ):
            check_int(name, getattr(self, name), minimum=1)
        if self.hidden_dim % self.num_heads:
            raise InputError(
                "num_heads", self.num_heads, f"must divide hidden_dim={self.hidden_dim}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_dim // self.num_heads


def _normal(rng: np.random.Generator, rows: int, cols: int) -> F32:
    return (rng.standard_normal((rows, cols)) / math.sqrt(rows)).astype(np.float32)


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockWeights:
    """One transformer block's arrays."""

    attn_norm: F32
    wq: F32
    wk: F32
    wv: F32
    wo: F32
    mlp_norm: F32
    w_up: F32
    w_down: F32

    @property
    def nbytes(self) -> int:
        return sum(int(getattr(self, f).nbytes) for f in self.__dataclass_fields__)


def block_weights(config: DemoConfig, index: int) -> BlockWeights:
    """The weights of block ``index``, drawn from its own seeded stream."""
    rng = np.random.default_rng((config.seed, index))
    h, m = config.hidden_dim, config.mlp_dim
    return BlockWeights(
        attn_norm=(1.0 + 0.1 * rng.standard_normal(h)).astype(np.float32),
        wq=_normal(rng, h, h),
        wk=_normal(rng, h, h),
        wv=_normal(rng, h, h),
        wo=_normal(rng, h, h),
        mlp_norm=(1.0 + 0.1 * rng.standard_normal(h)).astype(np.float32),
        w_up=_normal(rng, h, m),
        w_down=_normal(rng, m, h),
    )


def embed_weights(config: DemoConfig) -> F32:
    """The token embedding table, ``(vocab_size, hidden_dim)``."""
    rng = np.random.default_rng((config.seed, _EMBED))
    return rng.standard_normal((config.vocab_size, config.hidden_dim)).astype(np.float32)


def head_weights(config: DemoConfig) -> tuple[F32, F32]:
    """The final norm ``(hidden_dim,)`` and the projection ``(hidden_dim, vocab_size)``."""
    rng = np.random.default_rng((config.seed, _HEAD))
    norm = (1.0 + 0.1 * rng.standard_normal(config.hidden_dim)).astype(np.float32)
    return norm, _normal(rng, config.hidden_dim, config.vocab_size)


def demo_layout(config: DemoConfig | None = None) -> ModelLayout:
    """The demo model as a :class:`ModelLayout` with its real byte sizes."""
    config = config or DemoConfig()
    h, m, v = config.hidden_dim, config.mlp_dim, config.vocab_size
    block = 4 * (4 * h * h + 2 * h * m + 2 * h)
    return ModelLayout(
        name="stowplan-demo",
        num_blocks=config.num_blocks,
        hidden_dim=h,
        bytes_per_activation_elem=4,
        block_params_bytes=block,
        head_params_bytes=4 * (h + h * v),
        embed_params_bytes=4 * v * h,
        kv_bytes_per_token=(2 * h * 4,) * config.num_blocks,
        max_context_tokens=config.max_seq_len,
        total_params=(config.num_blocks * block + 4 * (h + 2 * h * v)) // 4,
        dtype="f32",
        num_attention_heads=config.num_heads,
        num_kv_heads=config.num_heads,
        head_dim=h // config.num_heads,
        family="stowplan-demo",
    )


def _rms_norm(x: F32, weight: F32) -> F32:
    scale = np.float32(1.0) / np.sqrt(np.mean(x * x) + np.float32(1e-6))
    out: F32 = (x * scale * weight).astype(np.float32)
    return out


def _position_code(pos: int, dim: int) -> F32:
    i = np.arange(dim // 2, dtype=np.float64)
    angle = pos / np.power(10_000.0, 2 * i / dim)
    code = np.empty(dim, dtype=np.float64)
    code[0::2] = np.sin(angle)
    code[1::2] = np.cos(angle)
    return code.astype(np.float32)


@dataclass(slots=True, kw_only=True)
class StageModel:
    """The blocks ``[lo, hi)`` (and the embed/head when owned) plus their KV cache.

    Runtime state, not a value: ``step`` appends to the cache.  A stage that
    owns the embed takes a token id; others take the previous stage's
    activation vector ``(hidden_dim,)``.  A stage that owns the head returns
    logits ``(vocab_size,)``; others return the activation vector.
    """

    config: DemoConfig
    block_range: tuple[int, int]
    owns_embed: bool
    owns_head: bool
    blocks: list[BlockWeights] = field(default_factory=list)
    embed: F32 | None = None
    head: tuple[F32, F32] | None = None
    cache_k: F32 = field(default_factory=lambda: np.zeros(0, np.float32))
    cache_v: F32 = field(default_factory=lambda: np.zeros(0, np.float32))
    length: int = 0
    """Tokens already in the KV cache."""

    @classmethod
    def load(
        cls, config: DemoConfig, block_range: tuple[int, int], owns_embed: bool, owns_head: bool
    ) -> StageModel:
        """Build only what the stage owns: its blocks, and the embed/head if it holds them."""
        lo, hi = block_range
        if not 0 <= lo <= hi <= config.num_blocks:
            raise InputError(
                "block_range", block_range, f"must satisfy 0 <= lo <= hi <= {config.num_blocks}"
            )
        shape = (hi - lo, config.max_seq_len, config.hidden_dim)
        return cls(
            config=config,
            block_range=(lo, hi),
            owns_embed=owns_embed,
            owns_head=owns_head,
            blocks=[block_weights(config, i) for i in range(lo, hi)],
            embed=embed_weights(config) if owns_embed else None,
            head=head_weights(config) if owns_head else None,
            cache_k=np.zeros(shape, np.float32),
            cache_v=np.zeros(shape, np.float32),
        )

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights this stage holds."""
        total = sum(b.nbytes for b in self.blocks)
        if self.embed is not None:
            total += int(self.embed.nbytes)
        if self.head is not None:
            total += int(self.head[0].nbytes + self.head[1].nbytes)
        return total

    def reset(self) -> None:
        """Forget the KV cache."""
        self.length = 0

    def step(self, x: int | F32) -> F32:
        """Run one position through the stage; see the class docstring for shapes."""
        pos = self.length
        if pos >= self.config.max_seq_len:
            raise InputError("position", pos, f"must be < max_seq_len={self.config.max_seq_len}")
        if self.owns_embed:
            assert self.embed is not None
            token = int(x)
            if not 0 <= token < self.config.vocab_size:
                raise InputError("token", token, f"must be in [0, {self.config.vocab_size})")
            h: F32 = self.embed[token] + _position_code(pos, self.config.hidden_dim)
        else:
            h = np.asarray(x, dtype=np.float32)
        for j, w in enumerate(self.blocks):
            h = self._block(j, w, h, pos)
        self.length = pos + 1
        if self.owns_head:
            assert self.head is not None
            norm, proj = self.head
            logits: F32 = (_rms_norm(h, norm) @ proj).astype(np.float32)
            return logits
        return h

    def _block(self, j: int, w: BlockWeights, h: F32, pos: int) -> F32:
        cfg = self.config
        x = _rms_norm(h, w.attn_norm)
        q, k, v = x @ w.wq, x @ w.wk, x @ w.wv
        self.cache_k[j, pos] = k
        self.cache_v[j, pos] = v
        heads, d = cfg.num_heads, cfg.head_dim
        keys = self.cache_k[j, : pos + 1].reshape(pos + 1, heads, d)
        values = self.cache_v[j, : pos + 1].reshape(pos + 1, heads, d)
        scores = np.einsum("hd,thd->ht", q.reshape(heads, d), keys) / np.float32(math.sqrt(d))
        scores = scores - scores.max(axis=1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=1, keepdims=True)
        attn = np.einsum("ht,thd->hd", probs, values).reshape(cfg.hidden_dim)
        h = h + attn @ w.wo
        x = _rms_norm(h, w.mlp_norm)
        up = x @ w.w_up
        act = up / (np.float32(1.0) + np.exp(-up))
        out: F32 = (h + act @ w.w_down).astype(np.float32)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Generation:
    """Greedy generation: the new tokens and the logits that chose each of them."""

    tokens: tuple[int, ...]
    logits: F32
    """``(len(tokens), vocab_size)``: row i is the distribution token i was taken from."""


def check_request(config: DemoConfig, prompt: Sequence[int], num_tokens: int) -> None:
    """Raise :class:`InputError` when the prompt or the token count cannot be run."""
    if not prompt:
        raise InputError("prompt", list(prompt), "must hold at least one token id")
    for t in prompt:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < config.vocab_size:
            raise InputError("prompt[]", t, f"must be a token id in [0, {config.vocab_size})")
    if num_tokens < 1:
        raise InputError("num_tokens", num_tokens, "must be an integer >= 1")
    if len(prompt) + num_tokens - 1 > config.max_seq_len:
        raise InputError(
            "num_tokens",
            num_tokens,
            f"prompt ({len(prompt)}) + num_tokens - 1 must be <= max_seq_len={config.max_seq_len}",
        )


def generate_local(config: DemoConfig, prompt: Sequence[int], num_tokens: int) -> Generation:
    """The single-process reference: the whole model in one stage, greedy decoding."""
    check_request(config, prompt, num_tokens)
    stage = StageModel.load(config, (0, config.num_blocks), True, True)
    for t in prompt[:-1]:
        stage.step(t)
    token = prompt[-1]
    tokens: list[int] = []
    rows: list[F32] = []
    for _ in range(num_tokens):
        logits = stage.step(token)
        token = int(np.argmax(logits))
        tokens.append(token)
        rows.append(logits)
    return Generation(tokens=tuple(tokens), logits=np.stack(rows))
