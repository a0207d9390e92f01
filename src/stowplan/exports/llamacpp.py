"""llama.cpp: ``-ngl``, ``--tensor-split``, ``-ot``, ``-c`` and ``-np``; ``--rpc`` across hosts.

How llama.cpp places layers (``llama_model::load_tensors``): with ``-ngl k`` on an
``n``-block model, blocks below ``i_gpu_start`` stay on the CPU — ``max(n + 1 - k, 0)``
in some builds, ``max(n - k, 0)`` in others; the others and the output layer (index
``n``) go to GPU ``d`` where ``d`` is the first cumulative, normalised
``--tensor-split`` point above ``(il - i_gpu_start) / min(k, n + 1)``. The token
embedding always stays on the CPU. ``-ot REGEX=CPU`` then keeps matching tensors in
host memory.

The export therefore places blocks identically under both rules:

* ``-ngl n+1``, so ``i_gpu_start`` is 0 whichever rule the build follows;
* gives each GPU stage a ``--tensor-split`` proportion equal to its block count
  (the last GPU also counts the output layer; the blocks of a run of CPU stages
  are counted on the device before it, or the one after it when only that one is
  llama-server's own or none is before), so the split points fall exactly on the
  plan's boundaries;
* keeps every CPU-stage block (and the output matrix ``output.weight`` when the last
  stage is the CPU; ``output_norm`` stays with the last device) in host memory with
  ``-ot``, and a GPU block's routed experts with ``blk\\.N\\.ffn_.*_exps\\.=CPU``
  when the plan puts them on a CPU stage;
* says where the KV cache of those CPU blocks lives: llama.cpp keeps a layer's KV
  cache on the device its split share gives it, whatever ``-ot`` does to its
  weights (on another host's device when no device of llama-server's host is next
  to them);
* always gives ``-np`` (the plan's sequences): llama-server's default opens several
  slots sharing one KV pool.

Refused: routed experts of one block split between stages, or placed on a GPU
other than their block's or the CPU of another host (llama.cpp stores a block's
experts as one tensor, and ``-ot`` names llama-server's own memory).

GPUs of one multi-GPU node (a plan that lists GPUs): llama.cpp splits a model
either by whole layers (``-sm layer``: each GPU its share of ``--tensor-split``)
or every weight matrix by rows (``-sm row``: tensor parallel over all its GPUs),
one way for the whole model. So the export gives

* one stage on ``tp`` GPUs: ``-sm row --tensor-split 1,1,…`` (equal rows, as the
  plan divides the stage) with ``CUDA_VISIBLE_DEVICES`` the stage's GPUs;
* several stages of one GPU each (and CPU stages): ``-sm layer`` and the split
  above, with ``CUDA_VISIBLE_DEVICES`` listing the stages' GPUs in stage order, so
  the ``i``-th share is the ``i``-th GPU stage's;

and refuses a plan mixing the two (a stage on several GPUs among several stages),
naming the ``stowplan plan`` line that plans what llama.cpp runs.

Several hosts (a plan that lists GPUs of several nodes, or whose nodes' descriptors
are given): ``ggml-rpc-server`` for the stages of the other hosts and ``llama-server
--rpc …`` on the last stage's host, the split over the devices in stage order (how
llama.cpp orders RPC and local devices: :mod:`~stowplan.exports.llamacpp_rpc`).
"""

from __future__ import annotations

from collections.abc import Sequence

from stowplan.exports.common import (
    ONE_HOST,
    expert_owners,
    is_cpu_node,
    model_argument,
    nodes_by_id,
    replan_command,
    stage_of_block,
)
from stowplan.exports.context import context_of, sequences_of
from stowplan.exports.llamacpp_rpc import RpcLayout, RpcServer, rpc_layout, rpc_notes, rpc_servers
from stowplan.exports.result import Engine, EngineExport, UnsupportedByEngine, shell_line
from stowplan.model import ModelLayout, NodeDescriptor
from stowplan.plan import Plan, StageAssignment
from stowplan.stages.gpu_lists import stage_place_text, uses_gpu_lists, visible_devices
from stowplan.text.shell import shell_comment

__all__ = ["EXPERT_TENSORS", "OUTPUT_TENSOR", "block_regex", "export_llamacpp"]

EXPERT_TENSORS = "ffn_.*_exps\\."
"""Regex tail of a block's routed-expert tensors (``ffn_up_exps``, ``ffn_down_exps`` …)."""
OUTPUT_TENSOR = "^output\\.weight$"
"""Regex of the output (head) matrix alone: not ``output_norm.weight``."""


def block_regex(blocks: Sequence[int], suffix: str = "") -> str:
    """``blk\\.(3|4|5)\\.`` (+ ``suffix``): matches the tensors of those blocks only."""
    alternatives = "|".join(str(b) for b in blocks)
    group = alternatives if len(blocks) == 1 else f"({alternatives})"
    return f"blk\\.{group}\\.{suffix}"


def _experts_to_cpu(
    plan: Plan, cpu: list[bool], experts_per_block: int | None, nodes_file: str | None = None
) -> list[int]:
    """Device blocks whose routed experts the plan keeps on a CPU stage of llama-server's
    host (``cpu``); refuse the rest, naming the ``--block-local`` replan."""
    replan = replan_command(plan, "llamacpp", nodes_file, "--block-local")
    out = []
    for block, per_stage in sorted(expert_owners(plan).items()):
        home = stage_of_block(plan, block).stage
        owners = sorted(per_stage)
        if owners == [home]:
            continue
        total = sum(per_stage.values())
        if len(owners) > 1 or (experts_per_block is not None and total < experts_per_block):
            raise UnsupportedByEngine(
                Engine.LLAMACPP,
                f"the routed experts of block {block} are split between stages "
                f"{sorted({home, *owners})}; llama.cpp stores a block's experts as one tensor, "
                "so they can only move together; replan with every expert beside its block: "
                + replan,
            )
        owner = owners[0]
        if not cpu[owner] or cpu[home]:
            raise UnsupportedByEngine(
                Engine.LLAMACPP,
                f"the routed experts of block {block} are on stage {owner} and the block on "
                f"stage {home}; the export moves experts only from a GPU block to the CPU of "
                "llama-server's host; replan with every expert beside its block: " + replan,
            )
        out.append(block)
    return out


def _split_mode(plan: Plan, gpu_stages: list[StageAssignment], nodes_file: str | None) -> str:
    """``row`` or ``layer`` for a plan that lists GPUs; refuse what llama.cpp cannot run."""
    hosts = list(dict.fromkeys(a.node_id for a in gpu_stages))
    if len(hosts) > 1:  # reached only when their descriptors give them one address
        raise UnsupportedByEngine(
            Engine.LLAMACPP,
            f"the plan uses GPUs of {len(hosts)} nodes ({', '.join(hosts)}) with one address; "
            "llama.cpp numbers the GPUs of one host once: give each node its own address "
            "label, or plan for one node: " + replan_command(plan, "llamacpp", "ONE_NODE_FLEET"),
        )
    wide = [a for a in gpu_stages if a.tensor_parallel > 1]
    if not wide:
        return "layer"
    if plan.num_stages == 1:
        return "row"
    a = wide[0]
    raise UnsupportedByEngine(
        Engine.LLAMACPP,
        f"stage {a.stage} splits its blocks over {a.tensor_parallel} GPUs "
        f"({stage_place_text(a)}) and the plan has {plan.num_stages} stages; llama.cpp "
        "splits the whole model either by rows over all its GPUs (-sm row) or by whole "
        "layers per GPU (-sm layer), not both; replan for it: "
        + replan_command(plan, "llamacpp", nodes_file),
    )


def _context_args(plan: Plan, notes: list[str]) -> list[str]:
    """``-c`` and ``-np`` for the plan's context and sequences; a note of how llama.cpp
    counts them.

    llama-server's ``-c`` is the KV cache of all its slots together; with ``-np N`` each
    slot gets ``-c / N``.  So ``U`` sequences of ``C`` tokens are ``-c C·U -np U``;
    ``-np`` is always given, since llama-server's own default opens several slots
    sharing one KV pool.
    """
    context, seqs = context_of(plan), sequences_of(plan)
    if context is None:
        notes.append("the plan reserves no KV cache: llama.cpp uses the model's trained context")
        return ["-np", str(seqs)]
    if seqs == 1:
        return ["-c", str(context), "-np", "1"]
    notes.append(
        f"-c {context * seqs} is the KV cache of all {seqs} slots (-np {seqs}) together: "
        f"llama-server gives each slot -c / -np = {context} tokens"
    )
    return ["-c", str(context * seqs), "-np", str(seqs)]


def _gguf_argument(plan: Plan, model: str | None) -> tuple[str, list[str]]:
    """``-m``'s value: ``model``, else the plan's own GGUF file, else a stand-in (noted)."""
    model_arg, _ = model_argument(plan, model)
    if model or model_arg.lower().endswith(".gguf"):
        return model_arg, []
    stand_in = f"<GGUF-of-{model_arg}>"
    return stand_in, [f"replace {stand_in} after -m with the path of {model_arg}'s GGUF file"]


def _row_split(
    plan: Plan, a: StageAssignment, n: int, model_arg: str, notes: list[str]
) -> EngineExport:
    """One stage on ``tp`` GPUs: every weight matrix split by rows over them."""
    tp = a.tensor_parallel
    env = (("CUDA_VISIBLE_DEVICES", visible_devices(a.gpu_indices)),) if a.gpu_indices else ()
    args = ["-m", model_arg, "-ngl", str(n + 1), "-sm", "row", "--tensor-split"]
    args.append(",".join(["1"] * tp))
    notes = [
        *notes,
        f"-sm row splits every weight matrix by rows over the {tp} GPUs of {stage_place_text(a)}"
        ", in equal shares as the plan does",
        "llama.cpp keeps the KV cache and the intermediate results on the main GPU (-mg 0, "
        f"the first listed); the plan divides the KV cache over all {tp}",
    ]
    args += _context_args(plan, notes)
    notes.append("llama.cpp keeps the token embedding table in host memory, not on stage 0")
    return EngineExport(
        engine=Engine.LLAMACPP,
        block_counts=plan.block_counts(),
        env=env,
        args=tuple(args),
        commands=(shell_line(env, ["llama-server", *args]),),
        notes=tuple(notes),
    )


def export_llamacpp(
    plan: Plan,
    *,
    nodes: Sequence[NodeDescriptor] | None = None,
    model: str | None = None,
    layout: ModelLayout | None = None,
    nodes_file: str | None = None,
) -> EngineExport:
    """``llama-server`` arguments reproducing the plan's blocks per device: of one host,
    or across hosts with a ``ggml-rpc-server`` per stage on the others
    (:mod:`~stowplan.exports.llamacpp_rpc`).

    CPU stages are recognised by :func:`~stowplan.exports.common.is_cpu_node`.
    Raises :class:`UnsupportedByEngine` for expert placements llama.cpp cannot express,
    and for GPU lists it cannot run (see the module notes), naming the ``stowplan plan``
    line (fleet ``nodes_file``) that plans what it runs.
    """
    by_id = nodes_by_id(nodes)
    n = plan.num_blocks if plan.num_blocks is not None else plan.assignments[-1].block_range[1]
    cpu = [is_cpu_node(a.node_id, by_id) for a in plan.assignments]
    model_arg, notes = _gguf_argument(plan, model)
    lists = uses_gpu_lists(plan)
    rpc = rpc_layout(plan, by_id, cpu, lists)
    servers: list[RpcServer] = []
    if rpc is None:
        gpu_stages = [a for a, c in zip(plan.assignments, cpu, strict=True) if not c]
        mode = _split_mode(plan, gpu_stages, nodes_file) if lists else None
        if mode == "row":
            return _row_split(plan, plan.assignments[0], n, model_arg, notes)
        local_cpu = cpu
    else:
        servers = rpc_servers(plan, rpc, by_id, cpu, nodes_file)
        mode = "layer" if lists else None
        local_cpu = [c and here for c, here in zip(cpu, rpc.local, strict=True)]
    experts_per_block = plan.topology.experts_per_block or (
        layout.experts.num_experts if layout is not None and layout.experts is not None else None
    )
    exps_on_cpu = _experts_to_cpu(plan, local_cpu, experts_per_block, nodes_file)
    args: list[str] = ["-m", model_arg]
    if servers:
        args += ["--rpc", ",".join(s.endpoint for s in servers)]
    env = _layer_split(plan, n, local_cpu, mode, rpc, args, notes)
    if exps_on_cpu:
        args += ["-ot", block_regex(exps_on_cpu, EXPERT_TENSORS) + "=CPU"]
    args += _context_args(plan, notes)
    if plan.num_stages > 1 and not lists and rpc is None:
        notes.append(ONE_HOST)
    if plan.assignments[0].owns_embed and not cpu[0]:
        where = "" if rpc is None else f" of {rpc.main_node(plan)}"
        notes.append(
            f"llama.cpp keeps the token embedding table in host memory{where}, not on stage 0"
        )
    server_line = shell_line(env, ["llama-server", *args])
    commands = [server_line]
    data: dict[str, object] = {}
    if rpc is not None:
        notes += rpc_notes(plan, rpc, servers)
        commands = []
        for s in servers:
            commands += [shell_comment(f"on {s.stage.node_id} (stage {s.stage.stage})"), s.command]
        mine = [a.stage for a, here in zip(plan.assignments, rpc.local, strict=True) if here]
        commands += [shell_comment(f"on {rpc.main_node(plan)} ({_stages_text(mine)})"), server_line]
        data = {
            "rpc_servers": [
                {"node": s.stage.node_id, "stage": s.stage.stage, "endpoint": s.endpoint}
                for s in servers
            ],
            "llama_server_node": rpc.main_node(plan),
        }
    return EngineExport(
        engine=Engine.LLAMACPP,
        block_counts=plan.block_counts(),
        env=env,
        args=tuple(args),
        commands=tuple(commands),
        notes=tuple(notes),
        data=data,
    )


def _stages_text(stages: list[int]) -> str:
    """``stage 3`` or ``stages 3, 4``."""
    return f"stage {stages[0]}" if len(stages) == 1 else f"stages {', '.join(map(str, stages))}"


def _layer_split(
    plan: Plan,
    n: int,
    cpu: list[bool],
    mode: str | None,
    rpc: RpcLayout | None,
    args: list[str],
    notes: list[str],
) -> tuple[tuple[str, str], ...]:
    """Append ``-ngl``, ``-sm``, ``--tensor-split`` and the CPU overrides to ``args`` for
    a plan whose devices are its stages not on llama-server's CPU (``cpu``), in stage
    order; return llama-server's environment."""
    devices = [a for a, c in zip(plan.assignments, cpu, strict=True) if not c]
    if not devices:
        args += ["-ngl", "0"]
        return ()
    # Step 1: -ngl n+1 puts every block and the output layer in the GPU range under
    # either rule llama.cpp builds use for i_gpu_start (n + 1 - ngl, or n - ngl): both
    # give 0, and the split is taken over all n + 1 layers.
    args += ["-ngl", str(n + 1)]
    if mode == "layer":
        args += ["-sm", "layer"]
    # Step 2: one proportion per device (RPC devices first, then local GPUs: stage order,
    # see llamacpp_rpc); the blocks of a run of CPU stages count on a device next to it,
    # so split points fall on the plan's stage boundaries (step 4 says which).
    shares = {a.stage: a.num_blocks for a in devices}
    holders = _cpu_run_holders(plan, cpu, rpc)
    cpu_blocks: list[int] = []
    for a, c in zip(plan.assignments, cpu, strict=True):
        if c:
            shares[holders[a.stage].stage] += a.num_blocks
            cpu_blocks += range(*a.block_range)
    shares[devices[-1].stage] += 1  # the output layer
    if len(devices) > 1:
        args += ["--tensor-split", ",".join(str(shares[a.stage]) for a in devices)]
    env = _local_gpu_order(plan, devices, mode, rpc, notes)
    # Step 3: -ot keeps every CPU-stage tensor (and the output matrix on a CPU tail) in
    # host memory; output_norm (one vector) stays with the last device's layers.
    if cpu_blocks:
        args += ["-ot", f"{block_regex(cpu_blocks)}=CPU"]
    if cpu[-1]:
        args += ["-ot", OUTPUT_TENSOR + "=CPU"]
    # Step 4: llama.cpp keeps a layer's KV cache on the device its split share gives it,
    # also for a layer whose weights -ot keeps on the CPU: say where.
    notes += _cpu_kv_notes(plan, cpu, holders, rpc)
    return env


def _cpu_run_holders(
    plan: Plan, cpu: list[bool], rpc: RpcLayout | None
) -> dict[int, StageAssignment]:
    """For every CPU stage, the device stage its blocks count on: of the devices before
    and after its run of CPU stages, the one on llama-server's own host (the one before
    when both or neither are), so that their KV cache stays on that host when it can."""
    stages = plan.assignments
    out: dict[int, StageAssignment] = {}
    i = 0
    while i < len(stages):
        if not cpu[i]:
            i += 1
            continue
        j = i
        while j < len(stages) and cpu[j]:
            j += 1
        before = stages[i - 1] if i > 0 else None
        after = stages[j] if j < len(stages) else None

        def local(a: StageAssignment | None) -> bool:
            return a is not None and (rpc is None or rpc.local[a.stage])

        pick = before if before is not None and (local(before) or not local(after)) else after
        assert pick is not None  # some stage is a device (the caller checked)
        for k in range(i, j):
            out[k] = pick
        i = j
    return out


def _cpu_kv_notes(
    plan: Plan, cpu: list[bool], holders: dict[int, StageAssignment], rpc: RpcLayout | None
) -> list[str]:
    """Where the KV cache of the blocks kept on the CPU lives, per holding device."""
    by_holder: dict[int, list[StageAssignment]] = {}
    for stage, holder in holders.items():
        by_holder.setdefault(holder.stage, []).append(plan.assignments[stage])
    notes = []
    for holder_stage, kept in sorted(by_holder.items()):
        holder = plan.assignments[holder_stage]
        ranges = [a.block_range for a in kept if a.num_blocks]
        if not ranges:
            continue
        one = len(ranges) == 1 and ranges[0][1] == ranges[0][0] + 1
        blocks = ("block " if one else "blocks ") + ", ".join(
            str(lo) if hi == lo + 1 else f"{lo}-{hi - 1}" for lo, hi in ranges
        )
        remote = rpc is not None and not rpc.local[holder_stage]
        where = f"{stage_place_text(holder)} (stage {holder_stage})"
        text = (
            f"the KV cache of {blocks}, kept on the CPU with -ot, lives on {where}: "
            "llama.cpp keeps a layer's KV cache on the device its --tensor-split share gives it"
        )
        if remote:
            text += (
                "; that device is another host's, so each step moves those layers' attention "
                "data over the network (--no-kv-offload keeps every layer's KV cache in host "
                "memory instead)"
            )
        notes.append(text)
    return notes


def _local_gpu_order(
    plan: Plan,
    devices: list[StageAssignment],
    mode: str | None,
    rpc: RpcLayout | None,
    notes: list[str],
) -> tuple[tuple[str, str], ...]:
    """``CUDA_VISIBLE_DEVICES`` for llama-server's own GPUs in stage order, or a note."""
    local = [a for a in devices if rpc is None or rpc.local[a.stage]]
    if mode == "layer" and local and all(a.gpu_indices for a in local):
        order = ", ".join(f"{stage_place_text(a)} (stage {a.stage})" for a in local)
        notes.append(f"CUDA_VISIBLE_DEVICES lists the stages' GPUs in stage order: {order}")
        return (("CUDA_VISIBLE_DEVICES", visible_devices([a.gpu_indices[0] for a in local])),)
    if len(local) > 1:
        order = ", ".join(f"{a.node_id} (stage {a.stage})" for a in local)
        notes.append(
            f"--tensor-split follows llama.cpp's GPU order: make it list exactly {order} "
            "in this order (CUDA_VISIBLE_DEVICES or --device)"
        )
    return ()
