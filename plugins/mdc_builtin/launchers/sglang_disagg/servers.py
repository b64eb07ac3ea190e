"""The servers: one role's shape (its SGLang sizes and nodes), its command words, the
router's, where each server runs (over whole nodes, or side by side on one or two)."""

from __future__ import annotations

import attrs

from mdc.api import NODE_RANK, Plan
from mdc.api import Server as ApiServer
from mdc.api.flags import disagreeing, drop_flags
from mdc_builtin.launchers._disagg import (
    api_servers,
    side_by_side,
    split_units,
)
from mdc_builtin.launchers.sglang_disagg.options import (
    OWNED_FLAGS,
    PER_SERVER,
    ROUTERS,
    RoleOptions,
    SglangDisaggOptions,
    tp_size,
)


# only read, never compared or printed: no generated ==, hash or repr (start-up time)
@attrs.frozen(kw_only=True, eq=False, repr=False)
class Server:
    """What every server of one role is: its SGLang sizes and the nodes it spans."""

    role: str
    tp: int
    dp: int
    dp_attention: bool
    ep: int | None
    a2a: str | None
    args: tuple[str, ...]
    nproc_per_node: int

    @property
    def gpus(self) -> int:
        """DP attention splits attention inside the tp GPUs; plain dp replicates them."""
        return self.tp if self.dp_attention else self.tp * self.dp

    @property
    def nodes(self) -> int:
        """Nodes one server spans (SGLang's --nnodes); a server never shares a node."""
        return max(1, self.gpus // self.nproc_per_node)

    @property
    def expert_ranks(self) -> int:
        """The rank map's ep: --ep-size (1 when unset)."""
        return self.ep or 1

    def flags(self) -> list[str]:
        """SGLang's parallelism flags for this server (server_args.py ServerArgs)."""
        words = ["--tp-size", str(self.tp)]
        if self.dp > 1:
            words += ["--dp-size", str(self.dp)]
        if self.dp_attention:
            words.append("--enable-dp-attention")
        if self.ep is not None:
            words += ["--ep-size", str(self.ep)]
        if self.a2a is not None:
            words += ["--moe-a2a-backend", self.a2a]
        return words


def server(plan: Plan, options: SglangDisaggOptions, role: str) -> Server:
    """A role's servers: its table's keys, else [sglang_disagg]'s."""
    own: RoleOptions = getattr(options, role)
    return Server(
        role=role,
        tp=own.tp_size if own.tp_size is not None else tp_size(plan, options),
        dp=own.dp_size if own.dp_size is not None else options.dp_size or 1,
        dp_attention=(
            own.enable_dp_attention
            if own.enable_dp_attention is not None
            else options.enable_dp_attention
        ),
        ep=own.ep_size if own.ep_size is not None else options.ep_size,
        a2a=own.moe_a2a_backend if own.moe_a2a_backend is not None else options.moe_a2a_backend,
        args=own.args,
        nproc_per_node=plan.nproc_per_node,
    )


def server_words(options: SglangDisaggOptions, shape: Server) -> list[str]:
    """A role's server command after the interpreter, up to what its place adds (ports); a
    flag of the user's that says what mdc writes is written once, by mdc."""
    mine = mdc_words(options, shape)

    def agreed(words: tuple[str, ...]) -> list[str]:
        return drop_flags(words, disagreeing(OWNED_FLAGS, words, mine)[0])

    return [
        "-m",
        "sglang.launch_server",
        *_own_words(options, shape),
        *agreed(options.server_args),
        *agreed(shape.args),
    ]


def mdc_words(options: SglangDisaggOptions, shape: Server) -> list[object]:
    """Every flag mdc writes for a role's servers, those of its place as per-node words."""
    return [*_own_words(options, shape), *(w for f in PER_SERVER for w in (f, NODE_RANK))]


def _own_words(options: SglangDisaggOptions, shape: Server) -> list[str]:
    return [
        "--model-path",
        options.model_path,
        "--disaggregation-mode",
        shape.role,
        *shape.flags(),
        "--host",
        "0.0.0.0",
        "--disaggregation-transfer-backend",
        options.transfer_backend,
    ]


def router_words(options: SglangDisaggOptions) -> list[str]:
    """The router's command after the interpreter, up to its --prefill/--decode URLs."""
    words = [*ROUTERS[options.router], "--host", "0.0.0.0", "--port", str(options.router_port)]
    if options.policy is not None:
        words += ["--policy", options.policy]
    return words + list(options.router_args)


# only read, never compared or printed: no generated ==, hash or repr (start-up time)
@attrs.frozen(kw_only=True, eq=False, repr=False)
class Placed:
    """A server of a job whose servers share the nodes: its shape, its node, its first GPU
    there, its HTTP port and (prefill) KV bootstrap port."""

    shape: Server
    node: int
    first_gpu: int
    port: int
    bootstrap: int | None


def shared_servers(plan: Plan, options: SglangDisaggOptions) -> list[Placed]:
    """One or two nodes: the prefill servers on the first GPUs (node 0 first), then the
    decode servers; server k serves HTTP on port + k, prefill server k its KV bootstrap
    on bootstrap_port + k."""
    placed: list[Placed] = []
    for shape, node, first in side_by_side(plan, lambda role: server(plan, options, role)):
        index = len(placed)
        bootstrap = None
        if shape.role == "prefill":
            shared = options.router != "sglang_router"  # mini_lb: one fixed port
            bootstrap = options.bootstrap_port + (0 if shared else index)
        placed.append(
            Placed(
                shape=shape,
                node=node,
                first_gpu=first,
                port=options.port + index,
                bootstrap=bootstrap,
            )
        )
    return placed


def servers(plan: Plan, options: SglangDisaggOptions) -> tuple[ApiServer, ...]:
    """The router on node 0 (beside the first prefill server), then each prefill and
    decode server by its nodes."""
    return api_servers(
        plan,
        options.router_port,
        lambda: shared_servers(plan, options),
        lambda role: server(plan, options, role),
        lambda shape, start: options.port + start,
    )


def server_units(plan: Plan, options: SglangDisaggOptions | None) -> tuple[int, int]:
    """Nodes (up to two nodes: GPUs) one prefill and one decode server take, for the split."""
    if options is None:
        return 1, 1
    prefill, decode = (server(plan, options, role) for role in ("prefill", "decode"))
    return split_units(plan.nnodes, prefill, decode)
