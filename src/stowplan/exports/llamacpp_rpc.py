"""llama.cpp across hosts: ``ggml-rpc-server`` on the other hosts, ``llama-server --rpc``
on one.

How llama.cpp orders its devices (``llama_model_load_from_file_impl`` in
``src/llama.cpp``): without ``--device``, the model's device list is every RPC
device first, in ``--rpc`` order ("add RPC servers at the front of the list to
minimize network transfers"), then the local GPUs in the backend's order.
``--tensor-split`` gives one share per device of that list, and the layers fill
the devices in that order, the output layer on the last. So the export runs
``llama-server`` on the host of the plan's *last* stages (its local GPUs come
last), gives every earlier stage an RPC server listed in stage order, and the
shares stay the stages' block counts in stage order: the split points fall on the
plan's stage boundaries exactly as on one host.

Each of those stages gets an RPC server of its own (``ggml-rpc-server``, called
``rpc-server`` in builds before the rename) on a port no other server of the export
uses (50052, 50053 … in stage order: servers whose nodes turn out to be one machine
never collide), seeing only the stage's GPU (``CUDA_VISIBLE_DEVICES``) when the plan lists
it, so every server adds one RPC device whichever version runs (recent ones expose
every visible device, older ones the first); a CPU stage's server serves the CPU
(``--device CPU``). A stage on ``llama-server``'s own host that comes before
another host's stage is served the same way on ``127.0.0.1``.

Hosts: a node's host is its descriptor's ``address`` label (or ``host``), else the
node itself; its address is that label, else the placeholder ``<host-of-NODE>``
that the notes ask to replace. ``ggml-rpc-server -H`` binds an IPv4 address only (it
rejects names), so a server binds its node's address when that is one, else
``0.0.0.0``. A CPU node without such a label is the CPU of ``llama-server``'s host
(``-ot …=CPU``, as on one host). A plan of whole nodes exported without
descriptors reads its nodes as devices of one host, as before.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from stowplan.exports.common import ADDRESS_LABELS, node_address, replan_command, stage_degree
from stowplan.exports.result import Engine, UnsupportedByEngine, shell_line
from stowplan.model import NodeDescriptor
from stowplan.plan import Plan, StageAssignment
from stowplan.stages.gpu_lists import stage_place_text, visible_devices

__all__ = [
    "ADDRESS_LABELS",
    "RPC_PORT",
    "RPC_SERVER",
    "RpcLayout",
    "RpcServer",
    "node_address",
    "rpc_layout",
    "rpc_notes",
    "rpc_servers",
]

RPC_PORT = 50052
"""The RPC server's default port; the export's further servers take the next ones."""
RPC_SERVER = "ggml-rpc-server"
"""llama.cpp's RPC server binary (``rpc-server`` in builds before the rename)."""
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, slots=True, kw_only=True)
class RpcLayout:
    """Where each stage runs when the plan spans several hosts."""

    hosts: tuple[str | None, ...]
    """Per stage, its host (None: a CPU stage of ``llama-server``'s host)."""
    main: str
    """The host running ``llama-server``: the last stage's."""
    local: tuple[bool, ...]
    """Per stage, whether ``llama-server`` runs it itself (its GPUs, or its CPU with
    ``-ot``) rather than an RPC server."""

    def main_node(self, plan: Plan) -> str:
        """The node id shown for ``llama-server``'s host (its last GPU stage's node)."""
        mine = [a for a, h in zip(plan.assignments, self.hosts, strict=True) if h == self.main]
        return mine[-1].node_id


def rpc_layout(
    plan: Plan, nodes: dict[str, NodeDescriptor], cpu: Sequence[bool], lists: bool
) -> RpcLayout | None:
    """The hosts of ``plan``'s stages, or None when it runs on one host."""
    if not lists and not nodes:
        return None
    hosts: list[str | None] = []
    for a, is_cpu in zip(plan.assignments, cpu, strict=True):
        address = node_address(nodes.get(a.node_id))
        hosts.append(None if is_cpu and address is None else address or a.node_id)
    named = [h for h in hosts if h is not None]
    if len(set(named)) <= 1:
        return None
    main = named[-1]
    start = len(hosts)
    while start > 0 and hosts[start - 1] in (None, main):
        start -= 1
    local = tuple(
        h is None or (h == main and (i >= start or is_cpu))
        for i, (h, is_cpu) in enumerate(zip(hosts, cpu, strict=True))
    )
    return RpcLayout(hosts=tuple(hosts), main=main, local=local)


@dataclass(frozen=True, slots=True, kw_only=True)
class RpcServer:
    """One ``ggml-rpc-server`` serving one stage."""

    stage: StageAssignment
    endpoint: str
    """``host:port`` as ``--rpc`` lists it."""
    command: str


def _check_one_gpu(
    plan: Plan,
    layout: RpcLayout,
    nodes: dict[str, NodeDescriptor],
    cpu: Sequence[bool],
    nodes_file: str | None,
) -> None:
    """Refuse a GPU stage on several GPUs: each stage is one device of llama.cpp's list."""
    for a, is_cpu in zip(plan.assignments, cpu, strict=True):
        degree = 1 if is_cpu else stage_degree(a, nodes)
        if degree > 1:
            raise UnsupportedByEngine(
                Engine.LLAMACPP,
                f"stage {a.stage} splits its blocks over {degree} GPUs ({stage_place_text(a)}) "
                f"and the plan spans {len(set(filter(None, layout.hosts)))} hosts; across hosts "
                "llama.cpp gives each GPU whole layers (-sm layer), one GPU per stage; "
                "replan for it: " + replan_command(plan, "llamacpp", nodes_file),
            )


def rpc_servers(
    plan: Plan,
    layout: RpcLayout,
    nodes: dict[str, NodeDescriptor],
    cpu: Sequence[bool],
    nodes_file: str | None = None,
) -> list[RpcServer]:
    """One ``ggml-rpc-server`` per stage that ``llama-server`` does not run, in stage order
    (the order of ``--rpc``); refuse a stage on several GPUs."""
    _check_one_gpu(plan, layout, nodes, cpu, nodes_file)
    port = RPC_PORT
    out = []
    for a, local, host, is_cpu in zip(
        plan.assignments, layout.local, layout.hosts, cpu, strict=True
    ):
        if local or host is None:
            continue
        address = node_address(nodes.get(a.node_id))
        if host == layout.main:
            bind = reach = LOOPBACK
        else:
            reach = address or f"<host-of-{a.node_id}>"
            bind = address if address is not None and _is_ipv4(address) else "0.0.0.0"
        env = (("CUDA_VISIBLE_DEVICES", visible_devices(a.gpu_indices)),) if a.gpu_indices else ()
        argv = [RPC_SERVER, *(["--device", "CPU"] if is_cpu else []), "-H", bind]
        argv += ["-p", str(port)]
        out.append(RpcServer(stage=a, endpoint=f"{reach}:{port}", command=shell_line(env, argv)))
        port += 1
    return out


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def rpc_notes(plan: Plan, layout: RpcLayout, servers: Sequence[RpcServer]) -> list[str]:
    """How the hosts fit together: the order kept, the addresses to fill in, the warnings."""
    main_node = layout.main_node(plan)
    order = ", ".join(f"{s.stage.node_id} (stage {s.stage.stage})" for s in servers)
    notes = [
        f"llama.cpp lists RPC devices (in --rpc order) before its own GPUs, so llama-server "
        f"runs on {main_node}, the host of the last stage, and --rpc lists {order} in stage "
        "order; --tensor-split gives every device its stage's blocks in that order",
    ]
    missing = list(dict.fromkeys(s.stage.node_id for s in servers if s.endpoint.startswith("<")))
    if missing:
        notes.append(
            "replace <host-of-NODE> after --rpc with the address of "
            + ", ".join(missing)
            + " (or give the node a label address=IP in the fleet file)"
        )
    notes += [
        f"start every {RPC_SERVER} before llama-server; llama-server alone reads the model "
        f"file and sends each server its layers ({RPC_SERVER} -c caches them for the next "
        "start)",
        f"llama.cpp builds before the rename name {RPC_SERVER} rpc-server (same flags)",
        f"every {RPC_SERVER} has a port of its own, so servers of nodes that share a machine "
        "do not collide",
        f"{RPC_SERVER} has no authentication: keep its port on a private network",
    ]
    return notes
