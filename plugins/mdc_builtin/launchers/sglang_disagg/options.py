"""The ``[sglang_disagg]`` table: its options, the server flags mdc writes (read from the
users' arguments, MDC389) and the servers' tensor parallel size."""

from __future__ import annotations

import re

import attrs

from mdc.api import Plan
from mdc.api.flags import FlagReading, FlagTable, KnownFlag
from mdc_builtin.launchers._disagg import arg_places, default_tp

HELPER = "launch/sglang_disagg.sh"
#: SGLang's DISAGG_TRANSFER_BACKEND_CHOICES (server_args.py)
TRANSFER_BACKENDS = ("ascend", "fake", "mooncake", "mooncake_tcp", "mori", "nixl")
ROUTERS = {
    "sglang_router": ("-m", "sglang_router.launch_router", "--pd-disaggregation"),
    "mini_lb": ("-m", "sglang.srt.disaggregation.mini_lb"),
}
MAX_PORT = 65535


def _keyed(name: str, key: str, *aliases: str, nargs: int = 1, convert: type = str) -> KnownFlag:
    """A server flag that stands for a key: of the arguments' table (a role's, or
    [sglang_disagg]'s) when relative, else that key."""
    return KnownFlag(
        name=name,
        source=key,
        spec_key=key,
        nargs=1 if nargs else 0,
        convert=convert,
        aliases=aliases,
    )


#: the server flags mdc writes, with SGLang's aliases and types (server_args.py): those of
#: a key are read as that key, the others compared with what mdc writes
OWNED_FLAGS = FlagTable(
    [
        _keyed("--model-path", "/sglang_disagg/model_path", "--model"),
        _keyed("--tp-size", "tp_size", "--tensor-parallel-size", convert=int),
        _keyed("--dp-size", "dp_size", "--data-parallel-size", convert=int),
        _keyed("--enable-dp-attention", "enable_dp_attention", nargs=0),
        _keyed("--ep-size", "ep_size", "--expert-parallel-size", convert=int),
        _keyed("--moe-a2a-backend", "moe_a2a_backend"),
        KnownFlag(
            name="--nnodes",
            source="the server's nodes (tp_size / nproc_per_node)",
            nargs=1,
            convert=int,
        ),
        KnownFlag(
            name="--node-rank", source="the node's place in its server", nargs=1, convert=int
        ),
        KnownFlag(
            name="--dist-init-addr",
            source="the server's first node",
            nargs=1,
            aliases=("--nccl-init-addr",),
        ),
        KnownFlag(name="--host", source="mdc (0.0.0.0)", nargs=1),
        KnownFlag(
            name="--port", source="port (port + the server's first node)", nargs=1, convert=int
        ),
        KnownFlag(name="--disaggregation-mode", source="the node's role", nargs=1),
        _keyed("--disaggregation-transfer-backend", "/sglang_disagg/transfer_backend"),
        KnownFlag(
            name="--disaggregation-bootstrap-port", source="bootstrap_port", nargs=1, convert=int
        ),
    ],
    abbreviations=True,  # SGLang's parser takes an unambiguous prefix of a long option
)
#: where a user passes server flags: every server, then a role's
READING = FlagReading(
    table=OWNED_FLAGS,
    places=arg_places("sglang_disagg", "server_args"),
    code="MDC389",
    framework="SGLang",
)
#: flags mdc writes for each server from its place (its nodes and ports)
PER_SERVER = (
    "--port",
    "--nnodes",
    "--node-rank",
    "--dist-init-addr",
    "--disaggregation-bootstrap-port",
)
PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class RoleOptions:
    """``[sglang_disagg.prefill]`` / ``[sglang_disagg.decode]``: one role's servers."""

    tp_size: int | None = None
    dp_size: int | None = None
    enable_dp_attention: bool | None = None
    ep_size: int | None = None
    moe_a2a_backend: str | None = None
    args: tuple[str, ...] = ()


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class SglangDisaggOptions:
    """The ``[sglang_disagg]`` table."""

    model_path: str
    tp_size: int | None = None
    dp_size: int | None = None
    enable_dp_attention: bool = False
    ep_size: int | None = None
    moe_a2a_backend: str | None = None
    prefill: RoleOptions = RoleOptions()
    decode: RoleOptions = RoleOptions()
    port: int = 30000
    bootstrap_port: int = 8998
    router_port: int = 8000
    transfer_backend: str = "mooncake"
    router: str = "sglang_router"
    policy: str | None = None
    server_args: tuple[str, ...] = ()
    router_args: tuple[str, ...] = ()


def tp_size(plan: Plan, options: SglangDisaggOptions) -> int:
    """The servers' tensor parallel size: the option, else [parallelism] tp, else a node's
    GPUs (one node, where the roles share the GPUs: 1)."""
    return default_tp(plan, options.tp_size)
