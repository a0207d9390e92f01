"""The largest sizes stowplan accepts from a user, checked where the value is read.

Each cap is far above every real model and cluster and far below what makes
arithmetic overflow or a loop run for hours. A value beyond one is an
:class:`~stowplan.errors.InputError` naming the cap.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "MAX_BATCH",
    "MAX_BLOCKS",
    "MAX_BYTE_COUNT",
    "MAX_CONFIG_INT",
    "MAX_CONTEXT_TOKENS",
    "MAX_EXPERTS",
    "MAX_GPUS_PER_NODE",
    "MAX_NAME_CHARS",
    "MAX_NODES",
    "MAX_OWNED_EXPERTS",
    "MAX_RATE",
    "MIN_RATE",
    "MIN_SHARE_RATE",
]

MAX_BLOCKS: Final = 4096
"""Most transformer blocks (layers) of one model; the largest published has 126."""

MAX_EXPERTS: Final = 4096
"""Most routed experts per MoE block; the largest published has 384."""

MAX_CONFIG_INT: Final = 2**31 - 1
"""Largest dimension, head count, vocabulary or rank in a model config."""

MAX_BYTE_COUNT: Final = 2**63 - 1
"""Largest byte count (a signed 64-bit integer: 8 EiB)."""

MAX_RATE: Final = 1e18
"""Largest rate of any unit (Mbit/s, TFLOP/s, GB/s, $/hour, ms) given by a user."""

MIN_RATE: Final = 1e-6
"""Smallest non-zero rate of any unit: below it, times computed from it leave a float's range."""

MAX_NODES: Final = 16384
"""Most nodes in one fleet (after ``count`` copies)."""

MAX_GPUS_PER_NODE: Final = 1024
"""Most GPUs behind one node."""

MAX_NAME_CHARS: Final = 255
"""Longest node id, GPU name or model name (a file name's limit on most file systems)."""

MIN_SHARE_RATE: Final = MIN_RATE / MAX_GPUS_PER_NODE
"""Smallest non-zero rate a node descriptor holds: a user's smallest rate split over the
most GPUs (the planner describes one GPU group of a node by its share of the node's rates)."""

MAX_CONTEXT_TOKENS: Final = 2**30
"""Most tokens of context per sequence to budget KV cache for (about 1.07 billion)."""

MAX_BATCH: Final = 2**20
"""Most concurrent sequences in flight."""

MAX_OWNED_EXPERTS: Final = 2**20
"""Most (block, expert) ownerships in one plan, replicas included (the largest published
MoE model has 61 x 384 = 23,424 routed experts)."""
