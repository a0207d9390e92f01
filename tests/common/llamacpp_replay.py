"""llama.cpp's own layer placement, replayed from a ``llama-server`` argument list."""

from __future__ import annotations

import re

import numpy as np

# The two rules llama.cpp builds use for the first offloaded layer.
RULES = {
    "n_layer + 1 - ngl": lambda n_layer, ngl: max(n_layer + 1 - ngl, 0),
    "n_layer - ngl": lambda n_layer, ngl: max(n_layer - ngl, 0),
}


def llamacpp_devices(
    argv: list[str], n_layer: int, rule: str = "n_layer + 1 - ngl"
) -> dict[str, object]:
    """Where llama.cpp puts each tensor: its placement rule, then the -ot overrides.

    Returns ``{tensor name: "CPU" or device index}`` for the block, expert and output
    tensors; the index is into llama.cpp's device list (the RPC devices of ``--rpc``
    first, then the local GPUs), which ``--tensor-split`` follows. Follows
    ``llama_model::load_tensors`` (float32 split points, upper_bound).
    """
    ngl = int(argv[argv.index("-ngl") + 1])
    split = (
        [float(x) for x in argv[argv.index("--tensor-split") + 1].split(",")]
        if ("--tensor-split" in argv)
        else [1.0]
    )
    overrides = [argv[i + 1].rsplit("=", 1) for i, a in enumerate(argv) if a == "-ot"]
    points = np.cumsum(np.array(split, dtype=np.float32), dtype=np.float32)
    points = points / points[-1]
    i_gpu_start = RULES[rule](n_layer, ngl)
    act = min(ngl, n_layer + 1)

    def layer_device(il: int) -> object:
        if ngl == 0 or il < i_gpu_start or il - i_gpu_start >= act:
            return "CPU"
        f = np.float32(il - i_gpu_start) / np.float32(act)
        return int(np.searchsorted(points, f, side="right"))

    placed: dict[str, object] = {}
    names = [(f"blk.{i}.attn_q.weight", i) for i in range(n_layer)]
    names += [(f"blk.{i}.ffn_up_exps.weight", i) for i in range(n_layer)]
    names += [("output.weight", n_layer), ("output_norm.weight", n_layer)]
    for name, il in names:
        device = layer_device(il)
        for pattern, target in overrides:
            if re.search(pattern, name):
                device = target
                break
        placed[name] = device
    return placed
