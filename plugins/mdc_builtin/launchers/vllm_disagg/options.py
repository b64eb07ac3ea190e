"""The ``[vllm_disagg]`` table: its options, the server flags mdc writes (read from the
users' arguments, MDC728) and each role's size keys."""

from __future__ import annotations

from typing import Any

import attrs

from mdc.api.flags import FlagReading, FlagTable, KnownFlag, dashes
from mdc_builtin.launchers import vllm
from mdc_builtin.launchers._disagg import arg_places

NAME = "vllm_disagg"
HELPER = "launch/vllm_disagg.sh"
MAX_PORT = 65535
ROLES = ("prefill", "decode")
#: vLLM's NixlConnector (vllm/distributed/kv_transfer/kv_connector/factory.py)
CONNECTOR = "NixlConnector"
#: the toy proxy answers GET /healthcheck (not /health)
PROXY_HEALTH = "/healthcheck"
DEFAULT_ROUTER = ("python3", "toy_proxy_server.py")
SIDE_HOST = "VLLM_NIXL_SIDE_CHANNEL_HOST"
SIDE_PORT = "VLLM_NIXL_SIDE_CHANNEL_PORT"
#: what the helper adds on each node of a server over several nodes
PER_SERVER_DP = (
    "--data-parallel-start-rank",
    "--data-parallel-address",
    "--data-parallel-rpc-port",
    "--headless",
)


def _keyed(flag: str, key: str, *aliases: str, convert: Any = None) -> KnownFlag:
    """A server flag that stands for a key: the arguments' table's (a role's, or
    [vllm_disagg]'s) when relative, else that key; a switch without ``convert``."""
    if convert is None:
        return KnownFlag(name=flag, source=key, spec_key=key, aliases=aliases)
    return KnownFlag(name=flag, source=key, spec_key=key, nargs=1, convert=convert, aliases=aliases)


#: the flags mdc writes on a server's command line, as vLLM's parser spells them
#: (vllm/engine/arg_utils.py): a role's sizes and the model are read as their keys (the
#: pipeline reads the arguments, a value that disagrees with a key written is refused);
#: the others are compared with what mdc writes for the server. vLLM's FlexibleArgumentParser
#: reads --a_b as --a-b, and (argparse's default) takes an unambiguous prefix of a long option
OWNED_FLAGS = FlagTable(
    [
        _keyed("--model", "/vllm_disagg/model"),
        _keyed(vllm.TP_FLAG, "tensor_parallel_size", "-tp", convert=int),
        _keyed(vllm.DP_FLAG, "data_parallel_size", "-dp", convert=int),
        _keyed(vllm.EP_FLAG, "enable_expert_parallel", "-ep"),
        KnownFlag(name="--host", source="mdc (0.0.0.0)", nargs=1),
        KnownFlag(name="--port", source="port (port + the server's place)", nargs=1),
        KnownFlag(name="--kv-transfer-config", source="kv_connector_extra_config", nargs=1),
        KnownFlag(name=vllm.PP_FLAG, source="1 (no pipeline parallel)", nargs=1, aliases=("-pp",)),
        *(
            flag
            for flag in vllm.OWNED_FLAGS.flags
            if flag.name
            in (
                vllm.DP_LOCAL_FLAG,
                *PER_SERVER_DP,
                vllm.DP_BACKEND_FLAG,
                vllm.EXECUTOR_FLAG,
            )
        ),
    ],
    normalize=dashes,
    abbreviations=True,
)

#: where a user passes server flags: every server's, then a role's (vLLM keeps the last)
READING = FlagReading(
    table=OWNED_FLAGS,
    places=arg_places(NAME, "args"),
    code="MDC728",
    refused_code="MDC729",
    framework="vLLM",
)


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class RoleOptions:
    """``[vllm_disagg.prefill]`` / ``[vllm_disagg.decode]``: one role's servers."""

    tensor_parallel_size: int | None = None
    data_parallel_size: int | None = None
    enable_expert_parallel: bool | None = None
    #: the HTTP port of the role's first server (the next ones count up from it)
    port: int | None = None
    args: tuple[str, ...] = ()
    #: arguments for the first node of each server only (the API server), e.g.
    #: --api-server-count, which vLLM refuses on --headless nodes
    head_args: tuple[str, ...] = ()
    #: variables of this role's servers (e.g. VLLM_ALL2ALL_BACKEND)
    env: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class VllmDisaggOptions:
    """The ``[vllm_disagg]`` table."""

    model: str
    tensor_parallel_size: int | None = None
    data_parallel_size: int | None = None
    enable_expert_parallel: bool = False
    prefill: RoleOptions = RoleOptions()
    decode: RoleOptions = RoleOptions()
    port: int = 8100
    router_port: int = 8000
    side_channel_port: int = 5600
    kv_connector_extra_config: dict[str, Any] | None = None
    args: tuple[str, ...] = ()
    router_command: tuple[str, ...] = DEFAULT_ROUTER
    router_args: tuple[str, ...] = ()


def role_values(options: VllmDisaggOptions, role: str) -> dict[str, Any]:
    """A role's size keys: its table's over [vllm_disagg]'s (the size flags of the
    arguments were read into them)."""
    own: RoleOptions = getattr(options, role)
    values: dict[str, Any] = {
        "data_parallel_size": options.data_parallel_size,
        "enable_expert_parallel": options.enable_expert_parallel,
    }
    for key in ("tensor_parallel_size", "data_parallel_size", "enable_expert_parallel"):
        if getattr(own, key) is not None:
            values[key] = getattr(own, key)
    return values
