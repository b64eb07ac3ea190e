"""sglang_disagg: SGLang prefill/decode disaggregated serving, one SGLang server per node.

The core splits the nodes (nodes 0..P-1 prefill, the rest decode; ``plan.disagg``). Every
node runs ``sglang.launch_server`` with ``--disaggregation-mode prefill|decode``; node 0
also runs SGLang's router (``--pd-disaggregation``, every prefill and decode URL) beside
its prefill server, on no GPU and its own port, as SGLang's multi-node recipes place it,
so the job asks the scheduler for the servers' nodes only. The router starts once every
server answers ``GET /health``. The URLs are built on the node at run time
from ``$NODE_HOSTS`` (the host names the backend hands every node) by the helper
``launch/sglang_disagg.sh``, never from ``hostname``; it also exports madengine's
``POD_IP`` (this node's address) and ``SGLANG_NODE_IPS`` (every node's, commas).

Ports: node ``i`` serves HTTP on ``port + i`` and a prefill node's KV bootstrap server
listens on ``bootstrap_port + i``, so servers of different nodes never collide when a
backend puts several nodes on one host (local). The router listens on ``router_port``,
which no server port of node 0 may equal (MDC382).

Flag names are SGLang's: ``--model-path``, ``--tp-size``, ``--host``, ``--port``,
``--disaggregation-mode``, ``--disaggregation-transfer-backend``,
``--disaggregation-bootstrap-port`` (``ServerArgs`` in ``python/sglang/srt/server_args.py``,
default bootstrap port 8998), and ``python -m sglang_router.launch_router
--pd-disaggregation --prefill URL BOOTSTRAP_PORT ... --decode URL ... --host --port
[--policy]`` (SGLang's "PD Disaggregation" documentation). ``router = "mini_lb"`` uses
the older ``python -m sglang.srt.disaggregation.mini_lb --prefill URL ... --decode URL ...``
as madengine does (no bootstrap ports: every prefill server keeps one fixed bootstrap port).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Iterator

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
    ArgPlace,
    FlagReading,
    FlagTable,
    KnownFlag,
    disagreeing,
    disagreement_text,
    drop_flags,
    plain_words,
)
from mdc.api.shell import out_file
from mdc_builtin.launchers._addresses import ipv4_function, ready_functions, wait_line
from mdc_builtin.launchers._supervise import supervising_script

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
    places=(
        ArgPlace(
            pointer="/sglang_disagg/server_args",
            where="[sglang_disagg] server_args",
            table="/sglang_disagg",
        ),
        *(
            ArgPlace(
                pointer=f"/sglang_disagg/{role}/args",
                where=f"[sglang_disagg.{role}] args",
                table=f"/sglang_disagg/{role}",
            )
            for role in ("prefill", "decode")
        ),
    ),
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
    if options.tp_size is not None:
        return options.tp_size
    if plan.sizes.tp > 1:
        return plan.sizes.tp
    return 1 if plan.nnodes == 1 else plan.nproc_per_node


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


def helper_script(plan: Plan, options: SglangDisaggOptions) -> str:
    """The run-time half: URLs from $NODE_HOSTS, ports and server ranks from NODE_RANK, and
    on node 0 the router beside the first prefill server."""
    split = plan.disagg
    assert split is not None
    prefill = split.prefill
    bootstrap = options.router == "sglang_router"
    prefill_boot = (
        'server+=(--disaggregation-bootstrap-port "$((BOOTSTRAP_PORT + first))")'
        if bootstrap
        else 'server+=(--disaggregation-bootstrap-port "$BOOTSTRAP_PORT")'
    )
    router = " ".join(shlex.quote(w) for w in (*plan.job.argv, *router_words(options)))
    node_ipv4 = "\n".join(ipv4_function())
    comment = """# Generated by mdc (sglang_disagg launcher). Usage: sglang_disagg.sh prefill|decode CMD...
# Exports this node's address (POD_IP) and every node's (SGLANG_NODE_IPS), then appends
# what is known only on the node: this node's part of its server. A server spans
# PREFILL_SERVER_NODES (DECODE_SERVER_NODES) consecutive nodes, prefill from node 0, decode
# after; its first node serves HTTP on PORT + first and, for prefill, its KV bootstrap
# server on BOOTSTRAP_PORT + first; its nodes meet at the first node's address, port
# MASTER_PORT + first (--dist-init-addr). Node 0 also runs SGLang's router (no GPU) on
# its own port, started once every server answers GET /health."""
    body = f"""PREFILL_NODES={prefill}
PREFILL_SERVER_NODES={server(plan, options, "prefill").nodes}
DECODE_SERVER_NODES={server(plan, options, "decode").nodes}
TOTAL_NODES={plan.nnodes}
PORT={options.port}
BOOTSTRAP_PORT={options.bootstrap_port}
ROUTER=({router})
read -r -a hosts <<< "${{NODE_HOSTS:?NODE_HOSTS is not set}}"
if [ "${{#hosts[@]}}" -ne "$TOTAL_NODES" ]; then
  echo "sglang_disagg: NODE_HOSTS has ${{#hosts[@]}} hosts, expected $TOTAL_NODES" >&2
  exit 2
fi
: "${{NODE_RANK:?NODE_RANK is not set}}"
# madengine's names for the nodes' addresses: POD_IP (this node), SGLANG_NODE_IPS (every
# node in rank order, commas), each an IP as it is or a host name's first IPv4 address.
{node_ipv4}
ips=()
for host in "${{hosts[@]}}"; do
  ips+=("$(node_ipv4 "$host")")
done
POD_IP="${{ips[NODE_RANK]}}"
SGLANG_NODE_IPS="$(IFS=,; printf '%s' "${{ips[*]}}")"
export POD_IP SGLANG_NODE_IPS
url() {{
  local host="${{hosts[$1]}}"
  if [[ "$host" == *:* ]]; then host="[$host]"; fi
  printf 'http://%s:%s' "$host" "$((PORT + $1))"
}}
# server_flags FIRST_ROLE_NODE SERVER_NODES: this node's place in its server
server_flags() {{
  first=$(($1 + (NODE_RANK - $1) / $2 * $2))
  server=(--port "$((PORT + first))")
  if (($2 > 1)); then
    local head="${{ips[first]}}"
    if [[ "$head" == *:* ]]; then head="[$head]"; fi
    server+=(--nnodes "$2" --node-rank "$((NODE_RANK - first))")
    server+=(--dist-init-addr "$head:$((${{MASTER_PORT:?MASTER_PORT is not set}} + first))")
  fi
}}
{router_function(options)}
role="$1"
shift
case "$role" in
  prefill)
    server_flags 0 "$PREFILL_SERVER_NODES"
    {prefill_boot}
    if ((NODE_RANK != 0)); then exec "$@" "${{server[@]}}"; fi
    "$@" "${{server[@]}}" &
    pids+=("$!")
    router &
    pids+=("$!")
    ;;
  decode)
    server_flags "$PREFILL_NODES" "$DECODE_SERVER_NODES"
    exec "$@" "${{server[@]}}"
    ;;
  *)
    echo "sglang_disagg: unknown role $role" >&2
    exit 2
    ;;
esac"""
    return supervising_script(comment, body)


def router_function(options: SglangDisaggOptions) -> str:
    """Bash lines defining ``router``: every server's URL, then, once each answers GET
    /health, SGLang's router in its own role (node 0, beside its prefill server)."""
    bootstrap = options.router == "sglang_router"
    prefill_url = (
        'args+=(--prefill "$(url "$i")" "$((BOOTSTRAP_PORT + i))")'
        if bootstrap
        else 'args+=(--prefill "$(url "$i")")'
    )
    ready = "\n".join(ready_functions())
    return f"""{ready}
# router: every server's URL, once each answers; the router's own role in the env
router() {{
  local i args=() firsts=()
  for ((i = 0; i < PREFILL_NODES; i += PREFILL_SERVER_NODES)); do
    {prefill_url}
    firsts+=("$i")
  done
  for ((i = PREFILL_NODES; i < TOTAL_NODES; i += DECODE_SERVER_NODES)); do
    args+=(--decode "$(url "$i")")
    firsts+=("$i")
  done
  for i in "${{firsts[@]}}"; do
    wait_ready "${{hosts[i]}}" "$((PORT + i))" /health
  done
  exec env SGLANG_DISAGG_ROLE=proxy "${{ROUTER[@]}}" "${{args[@]}}"
}}"""


def _env(plan: Plan, options: SglangDisaggOptions, role: str) -> dict[str, Word]:
    split = plan.disagg
    assert split is not None
    tp = str(tp_size(plan, options))
    return {
        "SGLANG_DISAGG_MODE": "enabled",
        "SGLANG_DISAGG_ROLE": role,
        "SGLANG_DISAGG_PREFILL_NODES": str(split.prefill),
        "SGLANG_DISAGG_DECODE_NODES": str(split.decode),
        "SGLANG_DISAGG_TOTAL_NODES": str(plan.nnodes),
        "SGLANG_DISAGG_TRANSFER_BACKEND": options.transfer_backend,
        "SGLANG_TP_SIZE": tp,
        "SGLANG_NODE_RANK": NODE_RANK,
        "MODEL_PATH": options.model_path,
        # madengine's Kubernetes names for the same facts
        "POD_INDEX": NODE_RANK,
        "TOTAL_PODS": str(plan.nnodes),
        "PREFILL_COUNT": str(split.prefill),
        "DECODE_COUNT": str(split.decode),
        "TP_SIZE": tp,
    }


def _worker_env(plan: Plan, options: SglangDisaggOptions) -> dict[str, str]:
    split = plan.disagg
    assert split is not None
    last = plan.nnodes - 1
    meaning = {k: v for k, v in _env(plan, options, "prefill").items() if isinstance(v, str)}
    meaning.update(
        {
            "SGLANG_DISAGG_ROLE": f"prefill (nodes 0..{split.prefill - 1}), decode (nodes "
            f"{split.prefill}..{last}); proxy for the router beside node 0's prefill server",
            "SGLANG_NODE_RANK": f"the backend's node index, 0..{last}",
            "POD_INDEX": f"the backend's node index, 0..{last}",
            "POD_IP": f"this node's IPv4 address from NODE_HOSTS (set by {HELPER})",
            "SGLANG_NODE_IPS": f"every node's address from NODE_HOSTS in node-rank order, "
            f"separated by commas (set by {HELPER}, as POD_IP)",
        }
    )
    return dict(sorted(meaning.items()))


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
    split = plan.disagg
    assert split is not None
    placed: list[Placed] = []
    gpu = 0  # over the job's GPUs: node 0's, then node 1's
    for role, gpus in (("prefill", split.prefill), ("decode", split.decode)):
        shape = server(plan, options, role)
        for _ in range(gpus // shape.gpus):
            index = len(placed)
            bootstrap = None
            if role == "prefill":
                shared = options.router != "sglang_router"  # mini_lb: one fixed port
                bootstrap = options.bootstrap_port + (0 if shared else index)
            node, first = divmod(gpu, plan.nproc_per_node)
            placed.append(
                Placed(
                    shape=shape,
                    node=node,
                    first_gpu=first,
                    port=options.port + index,
                    bootstrap=bootstrap,
                )
            )
            gpu += shape.gpus
    return placed


def shared_script(plan: Plan, options: SglangDisaggOptions) -> str:
    """The helper when the servers share the nodes: each node starts its servers on their
    GPUs, node 0 also the router, then waits."""
    placed = shared_servers(plan, options)
    one = plan.nnodes == 1
    starts: dict[int, list[str]] = {node: [] for node in range(plan.nnodes)}
    router = [shlex.quote(w) for w in router_words(options)]
    for server_ in placed:
        words = [
            *server_words(options, server_.shape),
            "--port",
            str(server_.port),
            "--base-gpu-id",
            str(server_.first_gpu),
        ]
        # one node: the router reaches the servers at 127.0.0.1 (SGLang's single-node
        # example); two: at the node's name, which the other node's servers reach too
        url = (
            f"http://{LOOPBACK}:{server_.port}"
            if one
            else f'"$(url {server_.node} {server_.port})"'
        )
        if server_.bootstrap is not None:
            words += ["--disaggregation-bootstrap-port", str(server_.bootstrap)]
            router += ["--prefill", url]
            if options.router == "sglang_router":
                router.append(str(server_.bootstrap))
        else:
            router += ["--decode", url]
        starts[server_.node].append(_start(server_.shape.role, [shlex.quote(w) for w in words]))
    probes = [wait_line(None if one else p.node, p.port) for p in placed]
    # the router starts once every server answers, so it never fails on one still loading
    starts[0].append(
        "router() {\n"
        + "".join(f"{line}\n" for line in probes)
        + f'  SGLANG_DISAGG_ROLE=proxy exec "$@" {" ".join(router)}\n}}\n'
        + 'router "$@" &\npids+=("$!")'
    )
    prefill = sum(1 for s in placed if s.shape.role == "prefill")
    ready = "\n".join(ready_functions()) + "\n"
    if one:
        body = "\n".join(starts[0])
        hosts = ""
    else:
        cases = "\n".join(
            f"  {node})\n"
            + "".join(f"    {line}\n" for part in lines for line in part.split("\n"))
            + "    ;;"
            for node, lines in starts.items()
        )
        body = f'case "${{NODE_RANK:?NODE_RANK is not set}}" in\n{cases}\nesac'
        hosts = """read -r -a hosts <<< "${NODE_HOSTS:?NODE_HOSTS is not set}"
# url NODE PORT: a server's URL by its node's name in NODE_HOSTS
url() {
  local host="${hosts[$1]}"
  if [[ "$host" == *:* ]]; then host="[$host]"; fi
  printf 'http://%s:%s' "$host" "$2"
}
"""
    where = "one node" if one else f"{plan.nnodes} nodes"
    comment = f"""# Generated by mdc (sglang_disagg launcher), {where}. Usage: sglang_disagg.sh PYTHON...
# Starts {prefill} prefill and {len(placed) - prefill} decode server(s) on disjoint GPUs of
# {where} (--base-gpu-id) and, on node 0, SGLang's router in front of them once every
# server answers GET /health, each with PYTHON (the job's command) and SGLANG_DISAGG_ROLE
# set to its role. A node's part ends
# when one of its processes fails (the others are stopped) or when all have ended."""
    return supervising_script(comment, ready + hosts + body)


def _start(role: str, words: list[str]) -> str:
    """Start one process in the background (its words already shell-quoted)."""
    return f'SGLANG_DISAGG_ROLE={role} "$@" {" ".join(words)} &\npids+=("$!")'


#: where the router of a one-node job reaches the servers
LOOPBACK = "127.0.0.1"


def _emit_shared(plan: Plan, options: SglangDisaggOptions) -> Launch:
    env = {k: v for k, v in _env(plan, options, "").items() if k in ONE_NODE_ENV}
    argv: tuple[Word, ...] = ("bash", out_file(HELPER), *plan.job.argv)
    meaning = {k: v for k, v in env.items() if isinstance(v, str)}
    rank = "0 (the only node)" if plan.nnodes == 1 else "the backend's node index, 0..1"
    meaning.update(
        {
            "SGLANG_DISAGG_ROLE": f"proxy (the router), prefill or decode: each process its "
            f"own (set by {HELPER})",
            "SGLANG_NODE_RANK": rank,
            "POD_INDEX": rank,
        }
    )
    return Launch(
        roles=(Role(name=ONE_NODE_ROLE, argv=argv, env=env),),
        files=(Artifact.text(HELPER, shared_script(plan, options), executable=True),),
        worker_env=dict(sorted(meaning.items())),
        endpoint=Endpoint(port=options.router_port),
        servers=servers(plan, options),
    )


#: the variables of the multi-node layout that still mean something on one node
ONE_NODE_ENV = (
    "SGLANG_DISAGG_MODE",
    "SGLANG_DISAGG_TRANSFER_BACKEND",
    "SGLANG_TP_SIZE",
    "SGLANG_NODE_RANK",
    "MODEL_PATH",
    "POD_INDEX",
    "TOTAL_PODS",
    "TP_SIZE",
)


def emit(plan: Plan, options: SglangDisaggOptions | None) -> Launch:
    if options is None or plan.disagg is None:  # check() / the core reported it
        raise ValueError("the sglang_disagg launcher needs [sglang_disagg] and a split")
    if plan.disagg.unit == "gpus":
        return _emit_shared(plan, options)
    python = tuple(plan.job.argv)
    helper: tuple[Word, ...] = ("bash", out_file(HELPER))
    roles = []
    for mode in ("prefill", "decode"):
        shape = server(plan, options, mode)
        argv: list[Word] = [*helper, mode, *python, *server_words(options, shape)]
        roles.append(Role(name=mode, argv=tuple(argv), env=_env(plan, options, mode)))
    return Launch(
        roles=tuple(roles),
        files=(Artifact.text(HELPER, helper_script(plan, options), executable=True),),
        worker_env=_worker_env(plan, options),
        endpoint=Endpoint(port=options.router_port),
        servers=servers(plan, options),
    )


def servers(plan: Plan, options: SglangDisaggOptions) -> tuple[ApiServer, ...]:
    """The router on node 0 (beside the first prefill server), then each prefill and
    decode server by its nodes."""
    split = plan.disagg
    assert split is not None
    found = [ApiServer(role="router", nodes=(0,), gpus=0, port=options.router_port)]
    if split.unit == "gpus":
        for placed in shared_servers(plan, options):
            shape = placed.shape
            found.append(
                ApiServer(
                    role=shape.role,
                    nodes=(placed.node,),
                    gpus=shape.gpus,
                    tp=shape.tp,
                    dp=shape.dp,
                    ep=shape.ep or 1,
                    port=placed.port,
                    first_gpu=placed.first_gpu,
                )
            )
        return tuple(found)
    first = 0
    for role, count in (("prefill", split.prefill), ("decode", split.decode)):
        shape = server(plan, options, role)
        for start in range(first, first + count, shape.nodes):
            found.append(
                ApiServer(
                    role=role,
                    nodes=tuple(range(start, min(start + shape.nodes, first + count))),
                    gpus=shape.gpus,
                    tp=shape.tp,
                    dp=shape.dp,
                    ep=shape.ep or 1,
                    port=options.port + start,
                )
            )
        first += count
    return tuple(found)


def _shared_port_findings(plan: Plan, options: SglangDisaggOptions) -> Iterator[Finding]:
    """Servers sharing the nodes: every server's HTTP and bootstrap port and the router's
    differ (so that two nodes on one host, the local backend, never collide either)."""
    placed = shared_servers(plan, options)
    # mini_lb's prefill servers share one bootstrap port: count each bootstrap port once
    boots = sorted({s.bootstrap for s in placed if s.bootstrap is not None})
    ports = [options.router_port, *(s.port for s in placed), *boots]
    if max(ports) > MAX_PORT:
        yield Finding(
            code="MDC381",
            pointer="/sglang_disagg/port",
            message=f"server k serves on port + k and prefill server k bootstraps on "
            f"bootstrap_port + k; the highest, {max(ports)}, exceeds {MAX_PORT}",
            hint="keep port and bootstrap_port at their defaults (30000, 8998)",
        )
    clashes = sorted({p for p in ports if ports.count(p) > 1})
    if clashes:
        yield Finding(
            code="MDC382",
            pointer="/sglang_disagg/port",
            message=f"on one node the router, the servers' HTTP ports (port + k) and the "
            f"prefill servers' bootstrap ports (bootstrap_port + k) share {clashes}",
            hint="keep them apart, e.g. port = 30000, bootstrap_port = 8998, router_port = 8000",
        )


def _port_findings(plan: Plan, options: SglangDisaggOptions) -> Iterator[Finding]:
    if plan.disagg is not None and plan.disagg.unit == "gpus":
        yield from _shared_port_findings(plan, options)
        return
    last = plan.nnodes - 1
    if options.port + last > MAX_PORT:
        yield Finding(
            code="MDC381",
            pointer="/sglang_disagg/port",
            message=f"node i serves on port + i: port {options.port} + {last} "
            f"(the last node) = {options.port + last} exceeds {MAX_PORT}",
            hint=f"set port to at most {MAX_PORT - last}, e.g. 30000",
        )
    split = plan.disagg
    if split is None:
        return
    last_prefill = split.prefill - 1 if options.router == "sglang_router" else 0
    top = options.bootstrap_port + last_prefill
    if top > MAX_PORT:
        yield Finding(
            code="MDC381",
            pointer="/sglang_disagg/bootstrap_port",
            message=f"prefill node i's bootstrap server listens on bootstrap_port + "
            f"i: {options.bootstrap_port} + {last_prefill} = {top} exceeds "
            f"{MAX_PORT}",
            hint="set bootstrap_port to 8998 (SGLang's default)",
        )
    http = range(options.port, options.port + plan.nnodes)
    boot = (
        range(options.bootstrap_port, options.bootstrap_port + split.prefill)
        if options.router == "sglang_router"
        else range(options.bootstrap_port, options.bootstrap_port + 1)
    )
    if set(http) & set(boot):
        yield Finding(
            code="MDC382",
            pointer="/sglang_disagg/bootstrap_port",
            message=f"HTTP ports {http.start}..{http.stop - 1} and bootstrap ports "
            f"{boot.start}..{boot.stop - 1} overlap",
            hint="keep them apart, e.g. port = 30000 and bootstrap_port = 8998",
        )
    if options.router_port in http or options.router_port in boot:
        yield Finding(
            code="MDC382",
            pointer="/sglang_disagg/router_port",
            message=f"router_port {options.router_port} is also a server port on node 0, "
            f"where the router runs beside the first prefill server (HTTP "
            f"{http.start}..{http.stop - 1}, bootstrap {boot.start}..{boot.stop - 1})",
            hint="set router_port outside those ranges, e.g. 8000",
        )


def _server_findings(plan: Plan, options: SglangDisaggOptions) -> Iterator[Finding]:
    """Servers of whole nodes, roles of whole servers (MDC383, MDC387), flags mdc sets (MDC389)."""
    split = plan.disagg
    gpus = plan.nproc_per_node
    for role in ("prefill", "decode"):
        shape = server(plan, options, role)
        own: RoleOptions = getattr(options, role)
        where = f"/sglang_disagg/{role}" if own.tp_size is not None else "/sglang_disagg"
        if split is not None and split.unit == "gpus":
            yield from _shared_role_findings(plan, shape, getattr(split, role), where)
            continue
        if shape.gpus > gpus and shape.gpus % gpus:
            # SGLang spreads a server's tp_size GPUs evenly over its --nnodes nodes
            yield Finding(
                code="MDC383",
                pointer=f"{where}/tp_size",
                message=f"a {role} server uses {shape.gpus} GPUs, which is more than one node "
                f"({gpus}) but not a whole number of nodes",
                hint=f"make it a multiple of nproc_per_node ({gpus}) or at most {gpus}",
            )
            continue
        count = split.prefill if (split and role == "prefill") else split.decode if split else 0
        if split is not None and count % shape.nodes:
            below = max(shape.nodes, count // shape.nodes * shape.nodes)
            yield Finding(
                code="MDC387",
                pointer=f"/distributed/{role}_nodes",
                message=f"a {role} server spans {shape.nodes} nodes ({shape.gpus} GPUs), so "
                f"the {count} {role} nodes do not hold whole servers",
                hint=f"set {role}_nodes to a multiple of {shape.nodes}, e.g. {below} (and the "
                "other role's count so that both add up to nnodes)",
            )
    yield from _clash_findings(plan, options)


def _clash_findings(plan: Plan, options: SglangDisaggOptions) -> Iterator[Finding]:
    """A flag mdc writes from no key of its own (the role, the host, the server's nodes and
    ports) passed with another value than mdc writes for a server it reaches (the keyed
    flags were read into the spec, a disagreeing one refused there)."""
    for place in READING.places:
        words = _words_of(options, place.pointer)
        own_table = place.table.rsplit("/", 1)[1]
        roles = (own_table,) if own_table in ("prefill", "decode") else ("prefill", "decode")
        seen: set[int] = set()
        for role in roles:
            mine = mdc_words(options, server(plan, options, role))
            emitted = plain_words(mine)
            for use, own in disagreeing(OWNED_FLAGS, words, mine)[1]:
                if use.index in seen:
                    continue
                seen.add(use.index)
                message, hint = disagreement_text("SGLang", place.where, words, use, emitted, own)
                pointer = f"{place.pointer}/{use.index}"
                yield Finding(code="MDC389", pointer=pointer, message=message, hint=hint)


def _words_of(options: SglangDisaggOptions, pointer: str) -> tuple[str, ...]:
    if pointer == "/sglang_disagg/server_args":
        return options.server_args
    role: RoleOptions = getattr(options, pointer.split("/")[2])
    return role.args


def _shared_role_findings(plan: Plan, shape: Server, count: int, where: str) -> Iterator[Finding]:
    """Servers sharing one or two nodes: a role's GPUs hold whole servers of that role
    (MDC387), each server inside one node (MDC383)."""
    role, gpus, split = shape.role, plan.nproc_per_node, plan.disagg
    total = gpus * plan.nnodes
    if shape.gpus > count:
        yield Finding(
            code="MDC383",
            pointer=f"{where}/tp_size",
            message=f"a {role} server uses {shape.gpus} GPUs, but the split gives {role} "
            f"{count} of the {total}",
            hint=f"set prefill_gpus and decode_gpus in [distributed] so that {role} gets "
            f"{shape.gpus} or a multiple, or a smaller tp_size for {role}",
        )
    elif count % shape.gpus:
        yield Finding(
            code="MDC387",
            pointer=f"/distributed/{role}_gpus",
            message=f"a {role} server uses {shape.gpus} GPUs, so the {count} {role} GPUs do "
            "not hold whole servers",
            hint=f"set {role}_gpus to a multiple of {shape.gpus} (and the other role's so "
            f"that both add up to the job's {total} GPUs)",
        )
    elif plan.nnodes > 1 and split is not None:
        # servers side by side from GPU 0 of node 0: one crosses into node 1 unless it
        # starts and ends inside a node (a server over nodes needs the 3-node layout)
        first = 0 if role == "prefill" else split.prefill
        crossing = [
            start
            for start in range(first, first + count, shape.gpus)
            if start // gpus != (start + shape.gpus - 1) // gpus
        ]
        if crossing:
            yield Finding(
                code="MDC383",
                pointer=f"/distributed/{role}_gpus"
                if split.origin == "spec"
                else f"{where}/tp_size",
                message=f"on {plan.nnodes} nodes the servers share the nodes, side by side: a "
                f"{role} server of {shape.gpus} GPUs starting at GPU {crossing[0] % gpus} of "
                f"node {crossing[0] // gpus} would cross into the next node",
                hint=f"give the servers a size dividing nproc_per_node ({gpus}) and prefill_gpus "
                f"a multiple of the decode servers' size, or use 3 or more nodes (servers over "
                "whole nodes)",
            )


def server_units(plan: Plan, options: SglangDisaggOptions | None) -> tuple[int, int]:
    """Nodes (up to two nodes: GPUs) one prefill and one decode server take, for the split."""
    if options is None:
        return 1, 1
    prefill, decode = (server(plan, options, role) for role in ("prefill", "decode"))
    if plan.nnodes == 1:
        return prefill.gpus, decode.gpus
    if plan.nnodes == 2:
        # servers side by side over both nodes: the decode servers start where prefill
        # ends, which must be a multiple of theirs too to keep each inside a node
        return math.lcm(prefill.gpus, decode.gpus), decode.gpus
    return prefill.nodes, decode.nodes


def check(plan: Plan, options: SglangDisaggOptions | None) -> Iterator[Finding]:
    if options is None:
        yield Finding(
            code="MDC380",
            pointer="/distributed/launcher",
            message="the sglang_disagg launcher needs a [sglang_disagg] table with "
            "model_path (the model every prefill and decode server loads)",
            hint='add [sglang_disagg] model_path = "meta-llama/Llama-3.1-8B-Instruct"',
        )
        return
    yield from _server_findings(plan, options)
    if plan.sizes.pp != 1 or plan.sizes.cp != 1:
        yield Finding(
            code="MDC383",
            pointer="/parallelism",
            message=f"sglang_disagg servers use tensor parallelism only, one server "
            f"per node; pp = {plan.sizes.pp} and cp = {plan.sizes.cp} must "
            "be 1",
            hint="remove pp and cp from [parallelism]",
        )
    if plan.elastic:
        yield Finding(
            code="MDC385",
            pointer="/distributed/min_nnodes",
            message=f"the prefill/decode split is fixed at compile time; it cannot "
            f"run elastic (min_nnodes {plan.min_nnodes} < nnodes "
            f"{plan.nnodes})",
            hint=f"remove min_nnodes, or set it to nnodes ({plan.nnodes})",
        )
    argv = plan.job.argv
    if len(argv) != 1 or not PYTHON.match(argv[0].rsplit("/", 1)[-1]):
        yield Finding(
            code="MDC384",
            pointer="/job/command",
            severity=Severity.WARNING,
            message=f"the command {' '.join(argv)!r} is used as the Python "
            "interpreter: every node runs it followed by -m "
            "sglang.launch_server (or the router module)",
            hint='set command = "python3" (or the path of the Python that has sglang installed)',
        )
    if options.router == "mini_lb":
        yield Finding(
            code="MDC386",
            pointer="/sglang_disagg/router",
            severity=Severity.WARNING,
            message=f"mini_lb takes no bootstrap ports, so every prefill server "
            f"keeps bootstrap_port {options.bootstrap_port}; nodes that share "
            "a host (the local backend) collide",
            hint='use router = "sglang_router" (pip install sglang-router)',
        )
    yield from _port_findings(plan, options)


#: the engine settings the serving memory check reads from the servers' arguments
MEMORY_FLAGS = FlagTable(
    [
        KnownFlag(
            name="--mem-fraction-static",
            source="server_args",
            key="share",
            nargs=1,
            convert=float,
        ),
        KnownFlag(name="--kv-cache-dtype", source="server_args", key="kv_dtype", nargs=1),
        KnownFlag(
            name="--context-length", source="server_args", key="max_len", nargs=1, convert=int
        ),
        KnownFlag(
            name="--max-running-requests",
            source="server_args",
            key="max_batch",
            nargs=1,
            convert=int,
        ),
        KnownFlag(
            name="--chunked-prefill-size",
            source="server_args",
            key="step_tokens",
            nargs=1,
            convert=int,
        ),
    ]
)


def step_limits(options: SglangDisaggOptions, shape: Server) -> StepLimits:
    """One role's per-step limits per DP attention rank: with DP attention SGLang divides
    --max-running-requests and --chunked-prefill-size by --dp-size (server_args.py)."""
    values, _ = MEMORY_FLAGS.read([*options.server_args, *shape.args])
    ranks = shape.dp if shape.dp_attention else 1

    def per_rank(key: str) -> int | None:
        value = values.get(key)
        return None if value is None else max(1, value // ranks)

    return StepLimits(max_batch=per_rank("max_batch"), step_tokens=per_rank("step_tokens"))


def serving(plan: Plan, options: SglangDisaggOptions | None) -> ServingSetup | None:
    """The tighter role's servers (fewer GPUs; decode on a tie) for the memory check."""
    if options is None or plan.disagg is None:
        return None
    shapes = [server(plan, options, role) for role in ("decode", "prefill")]
    shape = min(shapes, key=lambda s: s.gpus)
    values, _ = MEMORY_FLAGS.read([*options.server_args, *shape.args])
    share = values.get("share")
    ep = shape.ep or 1
    return ServingSetup(
        engine=f"SGLang ({shape.role})",
        tp=shape.tp,
        ep=ep,
        etp=max(1, shape.tp // ep),
        share=share if share is not None else ASSUMED_SHARE,
        share_source="--mem-fraction-static"
        if share is not None
        else "assumed; SGLang sizes --mem-fraction-static itself",
        kv_dtype=values.get("kv_dtype", "auto"),
        max_len=values.get("max_len"),
        roles={each.role: step_limits(options, each) for each in shapes},
    )


#: SGLang sizes --mem-fraction-static from the GPU when it is not given; the check then
#: assumes this share
ASSUMED_SHARE = 0.9


@mdc.hookimpl
def mdc_register_launchers() -> list[LauncherSpec]:
    return [
        LauncherSpec(
            name="sglang_disagg",
            description="SGLang prefill/decode disaggregation: prefill servers on nodes 0..P-1, "
            "decode servers on the rest, the router beside node 0's, URLs from $NODE_HOSTS",
            parallelism="data",
            disaggregated=True,
            workload="serving",
            emit=emit,
            check=check,
            server_units=server_units,
            serving=serving,
            schema=read_schema("mdc_schemas", "plugins/sglang_disagg.v1.schema.json"),
            options_type=SglangDisaggOptions,
            arguments=READING,
        )
    ]
