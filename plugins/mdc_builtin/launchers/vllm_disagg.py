"""vllm_disagg: vLLM prefill/decode disaggregation over NixlConnector, behind a proxy.

The core splits the job as for every disaggregated launcher (``plan.disagg``): from 3
nodes nodes 0..P-1 run the prefill servers and the rest the decode servers; on one or two
nodes the servers share the nodes' GPUs side by side (``CUDA_VISIBLE_DEVICES``). Either
way node 0 also runs the proxy, on no GPU and its own port, as vLLM's multi-node P/D
examples run it beside a server: the job asks the scheduler for the servers' nodes only.
From 3 nodes the proxy starts once every server answers ``GET /health``.

Every server is ``vllm serve MODEL`` with its role's ``--tensor-parallel-size``,
``--data-parallel-size`` and ``--enable-expert-parallel``, and ``--kv-transfer-config
{"kv_connector": "NixlConnector", "kv_role": "kv_both"}`` (vLLM's NixlConnector guide,
v0.11.0: the proxy, not kv_role, makes an instance prefill or decode). NIXL's handshake
listens on ``VLLM_NIXL_SIDE_CHANNEL_HOST``/``VLLM_NIXL_SIDE_CHANNEL_PORT`` (vllm/envs.py;
each data-parallel rank of a server on base + its rank); mdc gives server ``s`` the base
``side_channel_port + the job-wide index of s's first GPU``, so no two servers' ranges
meet even when a backend puts several nodes on one host. A server over several nodes is
data parallel as vLLM's "Data Parallel Deployment" runs it (``--data-parallel-size-local``,
``--data-parallel-address``, ``--data-parallel-rpc-port``, ``--headless
--data-parallel-start-rank`` on its later nodes).

The arguments are read as keys by the pipeline (``LauncherSpec.arguments``): a role's size
flags in its ``args`` are that role's keys, in ``[vllm_disagg] args`` the shared ones.

The arguments are read as keys by the pipeline (``LauncherSpec.arguments``): a role's size
flags in its ``args`` are that role's keys, in ``[vllm_disagg] args`` the shared ones.

The proxy is vLLM's documented ``toy_proxy_server.py`` (``--port``, ``--host``,
``--prefiller-hosts``/``--prefiller-ports``, ``--decoder-hosts``/``--decoder-ports``, each
one or more values; health at ``/healthcheck``); ``router_command`` names the program.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Iterator
from typing import Any

import attrs

import mdc
from mdc.api import (
    NODE_RANK,
    ONE_NODE_ROLE,
    Artifact,
    Endpoint,
    Finding,
    Launch,
    LauncherSpec,
    Plan,
    Role,
    ServingSetup,
    Severity,
    StepLimits,
    Word,
)
from mdc.api import Server as ApiServer
from mdc.api.files import read_schema
from mdc.api.flags import (
    PER_NODE,
    ArgPlace,
    FlagReading,
    FlagTable,
    KnownFlag,
    already_set,
    command_pointer,
    dashes,
    disagreeing,
    disagreement_text,
    drop_flags,
    plain_words,
)
from mdc.api.shell import out_file
from mdc_builtin.launchers import vllm
from mdc_builtin.launchers._addresses import ipv4_function, ready_functions, wait_line
from mdc_builtin.launchers._supervise import supervising_script

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
    places=(
        ArgPlace(pointer=f"/{NAME}/args", where=f"[{NAME}] args", table=f"/{NAME}"),
        *(
            ArgPlace(pointer=f"/{NAME}/{r}/args", where=f"[{NAME}.{r}] args", table=f"/{NAME}/{r}")
            for r in ROLES
        ),
    ),
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


def default_tp(plan: Plan, options: VllmDisaggOptions) -> int:
    """The option, else [parallelism] tp, else a node's GPUs (one node, shared by both
    roles: 1) -- the rule of sglang_disagg's tp_size."""
    if options.tensor_parallel_size is not None:
        return options.tensor_parallel_size
    if plan.sizes.tp > 1:
        return plan.sizes.tp
    return 1 if plan.nnodes == 1 else plan.nproc_per_node


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


def server(plan: Plan, options: VllmDisaggOptions, role: str) -> Server:
    values = role_values(options, role)
    own: RoleOptions = getattr(options, role)
    tp = values.get("tensor_parallel_size")
    return Server(
        role=role,
        tp=tp if tp is not None else default_tp(plan, options),
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


#: bash lines defining ``proxy`` (node 0, beside its prefill server): every server's address
#: and port, then, once each answers GET /health, the proxy in its own role
PROXY_FUNCTION = (
    "\n".join(ready_functions())
    + """
# proxy: every server's address and port, once each answers; its own role in the env
proxy() {
  local i prefill_hosts=() prefill_ports=() decode_hosts=() decode_ports=()
  for ((i = 0; i < PREFILL_NODES; i += PREFILL_SERVER_NODES)); do
    prefill_hosts+=("$(address "$i")")
    prefill_ports+=("$((PREFILL_PORT + i))")
    wait_ready "${hosts[i]}" "$((PREFILL_PORT + i))" /health
  done
  for ((i = PREFILL_NODES; i < TOTAL_NODES; i += DECODE_SERVER_NODES)); do
    decode_hosts+=("$(address "$i")")
    decode_ports+=("$((DECODE_PORT + i))")
    wait_ready "${hosts[i]}" "$((DECODE_PORT + i))" /health
  done
  exec env VLLM_DISAGG_ROLE=proxy "${PROXY[@]}" \\
    --prefiller-hosts "${prefill_hosts[@]}" --prefiller-ports "${prefill_ports[@]}" \\
    --decoder-hosts "${decode_hosts[@]}" --decoder-ports "${decode_ports[@]}"
}"""
)


def helper_script(plan: Plan, options: VllmDisaggOptions) -> str:
    """From 3 nodes: each server node's place at run time, and on node 0 the proxy beside
    the first prefill server, with every server's address and port."""
    split = plan.disagg
    assert split is not None
    prefill, decode = (server(plan, options, role) for role in ROLES)
    node_ipv4 = "\n".join(ipv4_function())
    comment = """# Generated by mdc (vllm_disagg launcher). Usage: vllm_disagg.sh prefill|decode CMD...
# A server node gets its place: a server spans PREFILL_SERVER_NODES (DECODE_SERVER_NODES)
# consecutive nodes, prefill from node 0 and decode after; its first node serves HTTP on
# PREFILL_PORT (DECODE_PORT) + first, its NIXL side channel listens from
# SIDE_CHANNEL_PORT + first * GPUS_PER_NODE (one port per data-parallel rank), and the
# nodes of a server over several nodes meet at the first node's address, port
# MASTER_PORT + first (--data-parallel-rpc-port); its later nodes run headless engines.
# Node 0 also runs the proxy (no GPU) on its own port with every server's address and
# port, started once every server answers GET /health."""
    body = f"""PREFILL_NODES={split.prefill}
PREFILL_SERVER_NODES={prefill.nodes}
DECODE_SERVER_NODES={decode.nodes}
PREFILL_LOCAL={prefill.local}
DECODE_LOCAL={decode.local}
GPUS_PER_NODE={plan.nproc_per_node}
TOTAL_NODES={plan.nnodes}
PREFILL_PORT={port_base(plan, options, "prefill")}
DECODE_PORT={port_base(plan, options, "decode")}
PREFILL_HEAD_ARGS=({_bash_words(options.prefill.head_args)})
DECODE_HEAD_ARGS=({_bash_words(options.decode.head_args)})
SIDE_CHANNEL_PORT={options.side_channel_port}
PROXY=({_bash_words(tuple(router_words(options)))})
read -r -a hosts <<< "${{NODE_HOSTS:?NODE_HOSTS is not set}}"
if [ "${{#hosts[@]}}" -ne "$TOTAL_NODES" ]; then
  echo "vllm_disagg: NODE_HOSTS has ${{#hosts[@]}} hosts, expected $TOTAL_NODES" >&2
  exit 2
fi
: "${{NODE_RANK:?NODE_RANK is not set}}"
{node_ipv4}
# address NODE: the node's address as the proxy writes it into a URL
address() {{
  local ip
  ip="$(node_ipv4 "${{hosts[$1]}}")"
  if [[ "$ip" == *:* ]]; then ip="[$ip]"; fi
  printf '%s' "$ip"
}}
# server_flags FIRST_ROLE_NODE SERVER_NODES LOCAL_ENGINES PORT: this node's place in its
# server (its first node, the API server, also gets the role's head arguments after)
server_flags() {{
  local ip
  first=$(($1 + (NODE_RANK - $1) / $2 * $2))
  ip="$(node_ipv4 "${{hosts[NODE_RANK]}}")"
  export VLLM_HOST_IP="$ip" {SIDE_HOST}="$ip"
  export {SIDE_PORT}="$((SIDE_CHANNEL_PORT + first * GPUS_PER_NODE))"
  server=(--port "$(($4 + first))")
  if (($2 > 1)); then
    server+=(--data-parallel-address "$(node_ipv4 "${{hosts[first]}}")")
    server+=(--data-parallel-rpc-port "$((${{MASTER_PORT:?MASTER_PORT is not set}} + first))")
    if ((NODE_RANK > first)); then
      server+=(--headless --data-parallel-start-rank "$(((NODE_RANK - first) * $3))")
    fi
  fi
}}
{PROXY_FUNCTION}
role="$1"
shift
case "$role" in
  prefill)
    server_flags 0 "$PREFILL_SERVER_NODES" "$PREFILL_LOCAL" "$PREFILL_PORT"
    if ((NODE_RANK == first)); then server+=(${{PREFILL_HEAD_ARGS[@]+"${{PREFILL_HEAD_ARGS[@]}}"}}); fi
    if ((NODE_RANK != 0)); then exec "$@" "${{server[@]}}"; fi
    "$@" "${{server[@]}}" &
    pids+=("$!")
    proxy &
    pids+=("$!")
    ;;
  decode)
    server_flags "$PREFILL_NODES" "$DECODE_SERVER_NODES" "$DECODE_LOCAL" "$DECODE_PORT"
    if ((NODE_RANK == first)); then server+=(${{DECODE_HEAD_ARGS[@]+"${{DECODE_HEAD_ARGS[@]}}"}}); fi
    exec "$@" "${{server[@]}}"
    ;;
  *)
    echo "vllm_disagg: unknown role $role" >&2
    exit 2
    ;;
esac"""
    return supervising_script(comment, body)


def _bash_words(words: tuple[str, ...]) -> str:
    return " ".join(shlex.quote(w) for w in words)


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
    split = plan.disagg
    assert split is not None
    placed: list[Placed] = []
    gpu = 0  # over the job's GPUs: node 0's, then node 1's
    for role, gpus in (("prefill", split.prefill), ("decode", split.decode)):
        shape = server(plan, options, role)
        base = port_base(plan, options, role)
        for _ in range(gpus // shape.gpus):
            node, first = divmod(gpu, plan.nproc_per_node)
            placed.append(
                Placed(
                    shape=shape,
                    node=node,
                    first_gpu=first,
                    port=base + len(placed),
                    side=side_port(plan, node, first, options),
                )
            )
            gpu += shape.gpus
    return placed


#: where the proxy of a one-node job reaches the servers (vLLM's single-host example)
LOOPBACK = "127.0.0.1"


def _start(env: list[str], words: list[str]) -> str:
    """Start one process in the background (its words already shell-quoted)."""
    return f'{" ".join(env)} "$@" {" ".join(words)} &\npids+=("$!")'


def shared_script(plan: Plan, options: VllmDisaggOptions) -> str:
    """One or two nodes: each node starts its servers on their GPUs, node 0 also the
    proxy, then waits."""
    placed = shared_servers(plan, options)
    one = plan.nnodes == 1
    starts: dict[int, list[str]] = {node: [] for node in range(plan.nnodes)}
    hosts: dict[str, list[str]] = {"prefill": [], "decode": []}
    ports: dict[str, list[str]] = {"prefill": [], "decode": []}
    for item in placed:
        shape = item.shape
        devices = ",".join(str(g) for g in range(item.first_gpu, item.first_gpu + shape.gpus))
        env = [f"CUDA_VISIBLE_DEVICES={devices}", f"{SIDE_PORT}={item.side}"]
        if not one:
            env.append(f'{SIDE_HOST}="$self"')
        env.append(f"VLLM_DISAGG_ROLE={shape.role}")
        own: RoleOptions = getattr(options, shape.role)
        env += [f"{k}={shlex.quote(v)}" for k, v in sorted(own.env.items())]
        words = [*server_words(plan, options, shape)[len(plan.job.argv) :]]
        words += ["--port", str(item.port), *own.head_args]
        starts[item.node].append(_start(env, [shlex.quote(w) for w in words]))
        hosts[shape.role].append(LOOPBACK if one else f'"$(address {item.node})"')
        ports[shape.role].append(str(item.port))
    proxy = [shlex.quote(w) for w in router_words(options)]
    proxy += ["--prefiller-hosts", *hosts["prefill"], "--prefiller-ports", *ports["prefill"]]
    proxy += ["--decoder-hosts", *hosts["decode"], "--decoder-ports", *ports["decode"]]
    probes = [wait_line(None if one else p.node, p.port) for p in placed]
    # once every server answers; through env: the router's program is a word of the
    # user's, never shell syntax
    starts[0].append(
        "proxy() {\n"
        + "".join(f"{line}\n" for line in probes)
        + f"  exec env VLLM_DISAGG_ROLE=proxy {' '.join(proxy)}\n}}\n"
        + 'proxy &\npids+=("$!")'
    )
    ready = "\n".join(ready_functions()) + "\n"
    if one:
        body, preamble = "\n".join(starts[0]), ""
    else:
        cases = "\n".join(
            f"  {node})\n"
            + "".join(f"    {line}\n" for part in lines for line in part.split("\n"))
            + "    ;;"
            for node, lines in starts.items()
        )
        body = f'case "$NODE_RANK" in\n{cases}\nesac'
        preamble = "\n".join(
            [
                'read -r -a hosts <<< "${NODE_HOSTS:?NODE_HOSTS is not set}"',
                *ipv4_function(),
                "# address NODE: the node's address as the proxy writes it into a URL",
                "address() {",
                "  local ip",
                '  ip="$(node_ipv4 "${hosts[$1]}")"',
                '  if [[ "$ip" == *:* ]]; then ip="[$ip]"; fi',
                "  printf '%s' \"$ip\"",
                "}",
                'self="$(node_ipv4 "${hosts[${NODE_RANK:?NODE_RANK is not set}]}")"',
                "",
            ]
        )
    prefill = len(hosts["prefill"])
    where = "one node" if one else f"{plan.nnodes} nodes"
    comment = f"""# Generated by mdc (vllm_disagg launcher), {where}. Usage: vllm_disagg.sh CMD...
# Starts {prefill} prefill and {len(placed) - prefill} decode vLLM server(s) (CMD, the job's
# command) on disjoint GPUs of {where} (CUDA_VISIBLE_DEVICES), each with its own NIXL side
# channel port, and on node 0 the proxy in front of them once every server answers GET
# /health. A node's part ends when one of its processes fails (the others are stopped) or
# when all have ended."""
    return supervising_script(comment, ready + preamble + body)


def _env(plan: Plan, options: VllmDisaggOptions, role: str) -> dict[str, Word]:
    split = plan.disagg
    assert split is not None
    return {
        "VLLM_DISAGG_ROLE": role,
        "VLLM_DISAGG_PREFILL": str(split.prefill),
        "VLLM_DISAGG_DECODE": str(split.decode),
        "VLLM_DISAGG_UNIT": split.unit,
        "MODEL": options.model,
        "NODE_RANK": NODE_RANK,
    }


def _meaning(plan: Plan, options: VllmDisaggOptions, role: str) -> dict[str, str]:
    split = plan.disagg
    assert split is not None
    last = plan.nnodes - 1
    meaning = {k: v for k, v in _env(plan, options, role).items() if isinstance(v, str)}
    meaning["NODE_RANK"] = (
        "0 (the only node)" if last == 0 else f"the backend's node index, 0..{last}"
    )
    if split.unit == "gpus":
        meaning["VLLM_DISAGG_ROLE"] = f"proxy, prefill or decode: each process its own ({HELPER})"
        meaning["CUDA_VISIBLE_DEVICES"] = f"a server's GPUs on its node (set by {HELPER})"
    else:
        meaning["VLLM_DISAGG_ROLE"] = (
            f"prefill (nodes 0..{split.prefill - 1}), decode (nodes {split.prefill}..{last}); "
            "proxy for the proxy beside node 0's prefill server"
        )
        meaning["VLLM_HOST_IP"] = f"this node's IPv4 address from NODE_HOSTS (set by {HELPER})"
    meaning[SIDE_PORT] = (
        f"a server's NIXL handshake port base: {options.side_channel_port} + the job-wide "
        f"index of its first GPU (set by {HELPER})"
    )
    if plan.nnodes > 1:
        meaning[SIDE_HOST] = f"this node's IPv4 address from NODE_HOSTS (set by {HELPER})"
    return dict(sorted(meaning.items()))


def emit(plan: Plan, options: VllmDisaggOptions | None) -> Launch:
    if options is None or plan.disagg is None:  # check() / the core reported it
        raise ValueError("the vllm_disagg launcher needs [vllm_disagg] and a split")
    helper: tuple[Word, ...] = ("bash", out_file(HELPER))
    endpoint = Endpoint(port=options.router_port, health_path=PROXY_HEALTH)
    if plan.disagg.unit == "gpus":
        env = _env(plan, options, "")
        env.pop("VLLM_DISAGG_ROLE")
        return Launch(
            roles=(Role(name=ONE_NODE_ROLE, argv=(*helper, *plan.job.argv), env=env),),
            files=(Artifact.text(HELPER, shared_script(plan, options), executable=True),),
            worker_env=_meaning(plan, options, ""),
            endpoint=endpoint,
            servers=servers(plan, options),
        )
    roles = []
    for role in ROLES:
        words = server_words(plan, options, server(plan, options, role))
        env = {**_env(plan, options, role), **getattr(options, role).env}
        roles.append(Role(name=role, argv=(*helper, role, *words), env=env))
    return Launch(
        roles=tuple(roles),
        files=(Artifact.text(HELPER, helper_script(plan, options), executable=True),),
        worker_env=_meaning(plan, options, "prefill"),
        endpoint=endpoint,
        servers=servers(plan, options),
    )


def _api_server(shape: Server, nodes: tuple[int, ...], port: int, first_gpu: int) -> ApiServer:
    return ApiServer(
        role=shape.role,
        nodes=nodes,
        gpus=shape.gpus,
        tp=shape.tp,
        dp=shape.dp,
        ep=shape.gpus if shape.ep else 1,
        port=port,
        first_gpu=first_gpu,
    )


def servers(plan: Plan, options: VllmDisaggOptions) -> tuple[ApiServer, ...]:
    """The proxy on node 0 (no GPU, beside the first prefill server), then each prefill and
    decode server by its nodes."""
    split = plan.disagg
    assert split is not None
    found = [ApiServer(role="router", nodes=(0,), gpus=0, port=options.router_port)]
    if split.unit == "gpus":
        for item in shared_servers(plan, options):
            found.append(_api_server(item.shape, (item.node,), item.port, item.first_gpu))
        return tuple(found)
    first = 0
    for role, count in (("prefill", split.prefill), ("decode", split.decode)):
        shape = server(plan, options, role)
        for start in range(first, first + count, shape.nodes):
            nodes = tuple(range(start, min(start + shape.nodes, first + count)))
            found.append(_api_server(shape, nodes, port_base(plan, options, role) + start, 0))
        first += count
    return tuple(found)


def server_units(plan: Plan, options: VllmDisaggOptions | None) -> tuple[int, int]:
    """Nodes (up to two nodes: GPUs) one prefill and one decode server take, for the split."""
    if options is None:
        return 1, 1
    prefill, decode = (server(plan, options, role) for role in ROLES)
    if plan.nnodes == 1:
        return prefill.gpus, decode.gpus
    if plan.nnodes == 2:
        # side by side over both nodes: decode starts where prefill ends, which must be a
        # multiple of its size too to keep each server inside a node
        return math.lcm(prefill.gpus, decode.gpus), decode.gpus
    return prefill.nodes, decode.nodes


def _role_pointer(options: VllmDisaggOptions, role: str, key: str) -> str:
    own: RoleOptions = getattr(options, role)
    return f"/{NAME}/{role}/{key}" if getattr(own, key) is not None else f"/{NAME}/{key}"


def _shape_findings(plan: Plan, options: VllmDisaggOptions, shape: Server) -> Iterator[Finding]:
    """A server's engines inside a node (MDC721): vLLM's tensor-parallel group without
    Ray stays on one node, and a server over nodes holds whole nodes of engines."""
    gpus, where = plan.nproc_per_node, _role_pointer(options, shape.role, "tensor_parallel_size")
    if shape.tp > gpus:
        yield Finding(
            code="MDC721",
            pointer=where,
            message=f"a {shape.role} engine of tensor_parallel_size {shape.tp} spans nodes of "
            f"{gpus} GPUs; vLLM's multiprocessing executor keeps an engine on one node",
            hint=f"set tensor_parallel_size to at most {gpus} and scale with "
            "data_parallel_size (data-parallel engines over several nodes)",
        )
    elif shape.gpus > gpus and (shape.gpus % gpus or gpus % shape.tp):
        yield Finding(
            code="MDC721",
            pointer=_role_pointer(options, shape.role, "data_parallel_size"),
            message=f"a {shape.role} server of tp {shape.tp} x dp {shape.dp} = {shape.gpus} "
            f"GPUs spans nodes of {gpus}: it must hold whole nodes of whole engines",
            hint=f"make tp x dp a multiple of {gpus} with tp dividing {gpus}, or at most {gpus}",
        )


def _count_findings(plan: Plan, shape: Server) -> Iterator[Finding]:
    """A role's nodes (GPUs) hold whole servers (MDC722); shared nodes keep each server
    inside one node (MDC721)."""
    split, gpus = plan.disagg, plan.nproc_per_node
    if split is None:
        return
    count: int = getattr(split, shape.role)
    unit = split.unit
    size = shape.gpus if unit == "gpus" else shape.nodes
    if count % size or count < size:
        yield Finding(
            code="MDC722",
            pointer=f"/distributed/{shape.role}_{unit}",
            message=f"a {shape.role} server takes {size} {unit[:-1]}(s), so the {count} "
            f"{shape.role} {unit} do not hold whole servers",
            hint=f"set {shape.role}_{unit} to a multiple of {size} (and the other role's so "
            "that both add up to the job's), or change the role's sizes",
        )
        return
    if unit == "gpus" and shape.gpus > gpus:
        yield Finding(
            code="MDC721",
            pointer=f"/{NAME}",
            message=f"on {plan.nnodes} node(s) the servers share the nodes; a {shape.role} "
            f"server of {shape.gpus} GPUs is wider than a node ({gpus})",
            hint="use 3 or more nodes (servers over whole nodes)",
        )
    elif unit == "gpus":
        first = 0 if shape.role == "prefill" else split.prefill
        for start in range(first, first + count, shape.gpus):
            if start // gpus != (start + shape.gpus - 1) // gpus:
                yield Finding(
                    code="MDC721",
                    pointer=f"/distributed/{shape.role}_gpus",
                    message=f"a {shape.role} server of {shape.gpus} GPUs starting at GPU "
                    f"{start % gpus} of node {start // gpus} would cross into the next node",
                    hint=f"give the servers a size dividing nproc_per_node ({gpus}) and "
                    "prefill_gpus a multiple of the decode servers' size",
                )
                break


def _heads_findings(plan: Plan, options: VllmDisaggOptions, shape: Server) -> Iterator[Finding]:
    """vLLM's own refusal (ModelConfig.verify_with_parallel_config): the attention heads of
    [model] split evenly over an engine's tensor-parallel ranks (MDC730)."""
    heads = plan.model.num_attention_heads if plan.model is not None else None
    if not heads or heads % shape.tp == 0:
        return
    fits = [tp for tp in range(1, plan.nproc_per_node + 1) if heads % tp == 0]
    yield Finding(
        code="MDC730",
        pointer=_role_pointer(options, shape.role, "tensor_parallel_size"),
        message=f"vLLM refuses a {shape.role} engine of tensor_parallel_size {shape.tp}: the "
        f"model's {heads} attention heads must be divisible by it",
        hint=f"set the {shape.role} tensor_parallel_size to one of {fits}",
    )


def _arg_findings(plan: Plan, options: VllmDisaggOptions) -> Iterator[Finding]:
    """The job's command passes no flag mdc writes (MDC728); the arguments pass none with
    another value than mdc writes for a server they reach (their keyed flags were read into
    the spec, a disagreeing one refused there)."""
    yield from already_set(
        OWNED_FLAGS.find(plan.job.argv),
        code="MDC728",
        launcher=NAME,
        where="the job's command",
        pointer=lambda i: command_pointer(plan.job.command, i),
    )
    for place in READING.places:
        own_table = place.table.rsplit("/", 1)[1]
        roles = (own_table,) if own_table in ROLES else ROLES
        words = options.args if own_table == NAME else getattr(options, own_table).args
        seen: set[int] = set()
        for role in roles:
            mine = mdc_words(options, server(plan, options, role))
            emitted = plain_words(mine)
            for use, own in disagreeing(OWNED_FLAGS, words, mine)[1]:
                if use.index in seen:
                    continue
                seen.add(use.index)
                message, hint = disagreement_text("vLLM", place.where, words, use, emitted, own)
                yield Finding(
                    code="MDC728",
                    pointer=f"{place.pointer}/{use.index}",
                    message=message,
                    hint=hint,
                )


def _head_only_findings(plan: Plan, options: VllmDisaggOptions) -> Iterator[Finding]:
    """vLLM refuses --api-server-count on --headless nodes (ServeSubcommand.cmd): for a role
    whose servers span nodes it belongs in that role's head_args (MDC731)."""
    for role in ROLES:
        if server(plan, options, role).nodes == 1:
            continue
        for pointer, words in (
            (f"/{NAME}/args", options.args),
            (f"/{NAME}/{role}/args", getattr(options, role).args),
        ):
            for use in vllm.HEAD_ONLY_FLAGS.find(words):
                yield Finding(
                    code="MDC731",
                    pointer=f"{pointer}/{use.index}",
                    message=f"{use.spelled} reaches every node of a {role} server, which spans "
                    "nodes, and vLLM refuses it on the --headless ones",
                    hint=f"move it to [{NAME}.{role}] head_args (the server's first node only)",
                )


def _port_findings(plan: Plan, options: VllmDisaggOptions) -> Iterator[Finding]:
    """Every HTTP port, the proxy's and the NIXL side-channel ranges inside 1..65535 and
    apart (MDC726, MDC727): a backend may put several nodes on one host."""
    split = plan.disagg
    if split is None:
        return
    if split.unit == "gpus":
        http = [p.port for p in shared_servers(plan, options)]
    else:
        http = [s.port for s in servers(plan, options)[1:]]
    world = plan.nnodes * plan.nproc_per_node
    side = range(options.side_channel_port, options.side_channel_port + world)
    top = max([*http, side.stop - 1, options.router_port])
    if top > MAX_PORT:
        yield Finding(
            code="MDC726",
            pointer=f"/{NAME}/side_channel_port" if side.stop - 1 == top else f"/{NAME}/port",
            message=f"the servers' ports reach {top}, above {MAX_PORT} (HTTP: port + the "
            f"server's place; NIXL: side_channel_port + a GPU's job-wide index, up to {world})",
            hint="keep port, side_channel_port and router_port at their defaults "
            "(8100, 5600, 8000)",
        )
        return
    taken = [options.router_port, *http]
    clashes = sorted({p for p in taken if taken.count(p) > 1 or p in side})
    if clashes:
        yield Finding(
            code="MDC727",
            pointer=f"/{NAME}/port",
            message=f"the proxy's port, the servers' HTTP ports and the NIXL side-channel "
            f"ports {side.start}..{side.stop - 1} share {clashes}",
            hint="keep them apart, e.g. router_port = 8000, port = 8100, side_channel_port = 5600",
        )


def check(plan: Plan, options: VllmDisaggOptions | None) -> Iterator[Finding]:
    if options is None:
        yield Finding(
            code="MDC720",
            pointer="/distributed/launcher",
            message="the vllm_disagg launcher needs a [vllm_disagg] table with model (the "
            "model every prefill and decode server loads)",
            hint='add [vllm_disagg] model = "meta-llama/Llama-3.3-70B-Instruct"',
        )
        return
    yield from _arg_findings(plan, options)
    yield from _head_only_findings(plan, options)
    for role in ROLES:
        shape = server(plan, options, role)
        shape_findings = list(_shape_findings(plan, options, shape))
        yield from shape_findings
        yield from _heads_findings(plan, options, shape)
        if not shape_findings:
            yield from _count_findings(plan, shape)
    if plan.sizes.pp != 1 or plan.sizes.cp != 1:
        yield Finding(
            code="MDC723",
            pointer="/parallelism",
            message=f"vllm_disagg servers are tensor and data parallel; pp = {plan.sizes.pp} "
            f"and cp = {plan.sizes.cp} must be 1",
            hint="remove pp and cp from [parallelism]",
        )
    if plan.elastic:
        yield Finding(
            code="MDC724",
            pointer="/distributed/min_nnodes",
            message=f"the prefill/decode split is fixed at compile time; it cannot run "
            f"elastic (min_nnodes {plan.min_nnodes} < nnodes {plan.nnodes})",
            hint=f"remove min_nnodes, or set it to nnodes ({plan.nnodes})",
        )
    argv = plan.job.argv
    if tuple(argv[:2]) != vllm.SERVE and not any("vllm.entrypoints" in w for w in argv):
        yield Finding(
            code="MDC725",
            pointer="/job/command",
            severity=Severity.WARNING,
            message=f"the command {' '.join(argv)!r} does not look like a vLLM server; every "
            "prefill and decode server runs it with the model and vLLM's flags appended",
            hint='use command = ["vllm", "serve"]',
        )
    yield from _port_findings(plan, options)
    yield from _step_limit_findings(options)


def _step_limit_findings(options: VllmDisaggOptions) -> Iterator[Finding]:
    """vLLM's step budget against its request cap in each role's engines ([vllm_disagg]
    args, then the role's own), once per place."""
    shared = list(options.args)
    found: dict[tuple[str, str], Finding] = {}
    for role in ("prefill", "decode"):

        def pointer(i: int, role: str = role) -> str:
            if i < len(shared):
                return f"/vllm_disagg/args/{i}"
            return f"/vllm_disagg/{role}/args/{i - len(shared)}"

        words = [*shared, *getattr(options, role).args]
        for finding in vllm.step_limit_findings(words, pointer):
            found.setdefault((finding.pointer, finding.message), finding)
    yield from found.values()


def serving(plan: Plan, options: VllmDisaggOptions | None) -> ServingSetup | None:
    """The tighter role's engine for the memory check: the smaller tensor-parallel size
    holds the larger share of the weights on each GPU (decode on a tie)."""
    if options is None or plan.disagg is None:
        return None
    shapes = [server(plan, options, role) for role in ("decode", "prefill")]
    shape = min(shapes, key=lambda s: s.tp)
    values, _ = vllm.MEMORY_FLAGS.read([*plan.job.argv, *options.args, *shape.args])
    roles = {}
    for each in shapes:  # each role's engines' per-step limits
        own, _ = vllm.MEMORY_FLAGS.read([*plan.job.argv, *options.args, *each.args])
        roles[each.role] = StepLimits(
            max_batch=own.get("max_batch"), step_tokens=own.get("step_tokens")
        )
    share = values.get("share")
    # vLLM's expert-parallel group is tp x dp of one server; each engine holds its share
    ep = shape.gpus if shape.ep else 1
    return ServingSetup(
        engine=f"vLLM ({shape.role})",
        tp=shape.tp,
        ep=ep,
        etp=1 if shape.ep else shape.tp,
        share=share if share is not None else 0.9,
        share_source="--gpu-memory-utilization"
        if share is not None
        else "vLLM's default --gpu-memory-utilization",
        kv_dtype=values.get("kv_dtype", "auto"),
        max_len=values.get("max_len"),
        roles=roles,
        profiled_tokens=values.get("step_tokens", vllm.DEFAULT_STEP_TOKENS),
    )


@mdc.hookimpl
def mdc_register_launchers() -> list[LauncherSpec]:
    return [
        LauncherSpec(
            name=NAME,
            description="vLLM prefill/decode disaggregation over NixlConnector: prefill servers "
            "on nodes 0..P-1, decode servers on the rest, the proxy beside node 0's",
            parallelism="data",
            disaggregated=True,
            workload="serving",
            emit=emit,
            check=check,
            server_units=server_units,
            serving=serving,
            schema=read_schema("mdc_schemas", f"plugins/{NAME}.v1.schema.json"),
            options_type=VllmDisaggOptions,
            arguments=READING,
        )
    ]
