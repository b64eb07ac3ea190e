"""The servers: one role's shape (its vLLM sizes and nodes), its command words, the
proxy's, where each server runs (over whole nodes, or side by side on one or two) and its
ports."""

from __future__ import annotations

import json
from typing import Any

import attrs

from mdc.api import NODE_RANK, Plan
from mdc.api import Server as ApiServer
from mdc.api.flags import PER_NODE, disagreeing, drop_flags
from mdc_builtin.launchers import vllm
from mdc_builtin.launchers._disagg import api_servers, default_tp, side_by_side, split_units
from mdc_builtin.launchers.vllm_disagg.options import (
    CONNECTOR,
    OWNED_FLAGS,
    PER_SERVER_DP,
    ROLES,
    RoleOptions,
    VllmDisaggOptions,
    role_values,
)


# only read, never compared or printed: no generated ==, hash or repr (start-up time)
@attrs.frozen(kw_only=True, eq=False, repr=False)
class Server:
    """What every server of one role is: its vLLM sizes and the nodes it spans."""

    role: str
    tp: int
    dp: int
    ep: bool
    #: the role's own arguments (after [vllm_disagg] args)
    args: tuple[str, ...]
    nproc_per_node: int

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    @property
    def nodes(self) -> int:
        """Nodes one server spans; a server never shares a node (3 nodes or more)."""
        return max(1, self.gpus // self.nproc_per_node)

    @property
    def expert_ranks(self) -> int:
        """The rank map's ep: the whole server with --enable-expert-parallel, else 1."""
        return self.gpus if self.ep else 1

    @property
    def local(self) -> int:
        """Data-parallel engines on each node of a server over several nodes."""
        return max(1, self.nproc_per_node // self.tp)

    def flags(self) -> list[str]:
        words = [vllm.TP_FLAG, str(self.tp)]
        if self.dp > 1:
            words += [vllm.DP_FLAG, str(self.dp)]
        if self.nodes > 1:
            words += [vllm.DP_LOCAL_FLAG, str(self.local)]
        if self.ep:
            words.append(vllm.EP_FLAG)
        return words


def server(plan: Plan, options: VllmDisaggOptions, role: str) -> Server:
    values = role_values(options, role)
    own: RoleOptions = getattr(options, role)
    tp = values.get("tensor_parallel_size")
    return Server(
        role=role,
        tp=tp if tp is not None else default_tp(plan, options.tensor_parallel_size),
        dp=values.get("data_parallel_size") or 1,
        ep=bool(values.get("enable_expert_parallel")),
        args=own.args,
        nproc_per_node=plan.nproc_per_node,
    )


def kv_transfer_config(options: VllmDisaggOptions) -> str:
    """--kv-transfer-config: KVTransferConfig's fields as JSON, keys sorted."""
    config: dict[str, Any] = {"kv_connector": CONNECTOR, "kv_role": "kv_both"}
    if options.kv_connector_extra_config:
        config["kv_connector_extra_config"] = options.kv_connector_extra_config
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def server_words(plan: Plan, options: VllmDisaggOptions, shape: Server) -> list[str]:
    """A role's server command, up to what its place adds (port, data-parallel address);
    a flag of the user's that says what mdc writes is written once, by mdc."""
    command = list(plan.job.argv)
    if tuple(command[:2]) == vllm.SERVE:
        words = [*command[:2], options.model, *command[2:]]
    else:
        words = [*command, "--model", options.model]
    mine = mdc_words(options, shape)

    def agreed(args: tuple[str, ...]) -> list[str]:
        return drop_flags(args, disagreeing(OWNED_FLAGS, args, mine)[0])

    return [*words, *_own_words(options, shape), *agreed(options.args), *agreed(shape.args)]


def _own_words(options: VllmDisaggOptions, shape: Server) -> list[str]:
    return [
        *shape.flags(),
        "--host",
        "0.0.0.0",
        "--kv-transfer-config",
        kv_transfer_config(options),
    ]


def mdc_words(options: VllmDisaggOptions, shape: Server) -> list[object]:
    """Every flag mdc writes for a role's servers, those of its place as per-node words."""
    mine: list[object] = ["--model", options.model, *_own_words(options, shape)]
    mine += ["--port", NODE_RANK]
    if shape.nodes > 1:
        for flag in PER_SERVER_DP:
            mine += [f"{flag}={PER_NODE}"] if flag == "--headless" else [flag, NODE_RANK]
    return mine


def router_words(options: VllmDisaggOptions) -> list[str]:
    """The proxy's command, up to its --prefiller-*/--decoder-* lists."""
    return [
        *options.router_command,
        "--host",
        "0.0.0.0",
        "--port",
        str(options.router_port),
        *options.router_args,
    ]


def port_base(plan: Plan, options: VllmDisaggOptions, role: str) -> int:
    """What a role's servers count their HTTP ports from: a server's place (its first node
    from 3 nodes, its index k on one or two) is added. With the role's own port its first
    server serves there; else every server on port + its place, apart across roles."""
    own: int | None = getattr(options, role).port
    split = plan.disagg
    if own is None or split is None:
        return options.port
    if split.unit == "nodes":
        return own - (0 if role == "prefill" else split.prefill)
    prefill = server(plan, options, "prefill")
    return own - (0 if role == "prefill" else split.prefill // prefill.gpus)


def side_port(plan: Plan, node: int, first_gpu: int, options: VllmDisaggOptions) -> int:
    """A server's NIXL side-channel base: side_channel_port + its first GPU's job index."""
    return options.side_channel_port + node * plan.nproc_per_node + first_gpu


# only read, never compared or printed: no generated ==, hash or repr (start-up time)
@attrs.frozen(kw_only=True, eq=False, repr=False)
class Placed:
    """A server of a job whose servers share the nodes: its shape, node, first GPU there,
    HTTP port and NIXL side-channel base port."""

    shape: Server
    node: int
    first_gpu: int
    port: int
    side: int


def shared_servers(plan: Plan, options: VllmDisaggOptions) -> list[Placed]:
    """One or two nodes: the prefill servers on the first GPUs (node 0 first), then the
    decode servers; server k serves HTTP on port + k."""
    placed: list[Placed] = []
    for shape, node, first in side_by_side(plan, lambda role: server(plan, options, role)):
        placed.append(
            Placed(
                shape=shape,
                node=node,
                first_gpu=first,
                port=port_base(plan, options, shape.role) + len(placed),
                side=side_port(plan, node, first, options),
            )
        )
    return placed


def servers(plan: Plan, options: VllmDisaggOptions) -> tuple[ApiServer, ...]:
    """The proxy on node 0 (no GPU, beside the first prefill server), then each prefill and
    decode server by its nodes."""
    return api_servers(
        plan,
        options.router_port,
        lambda: shared_servers(plan, options),
        lambda role: server(plan, options, role),
        lambda shape, start: port_base(plan, options, shape.role) + start,
    )


def server_units(plan: Plan, options: VllmDisaggOptions | None) -> tuple[int, int]:
    """Nodes (up to two nodes: GPUs) one prefill and one decode server take, for the split."""
    if options is None:
        return 1, 1
    prefill, decode = (server(plan, options, role) for role in ROLES)
    return split_units(plan.nnodes, prefill, decode)
