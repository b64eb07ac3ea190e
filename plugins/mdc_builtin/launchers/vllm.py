"""vllm: an OpenAI-compatible vLLM server (``vllm serve``) over the plan's GPUs.

The job's command is the server program (``vllm serve``, or ``python -m
vllm.entrypoints.openai.api_server``) with any arguments of the user's own; mdc
appends the model (positional after ``vllm serve``, else ``--model``),
``--tensor-parallel-size``, ``--pipeline-parallel-size``, ``--host``, ``--port``
and then ``[vllm] args``.

One node: that command, on the node. Several nodes, ``mode = "ray"`` (the
default): one server spans every node; each node runs ``launch/vllm-node.sh``,
which starts Ray (the head on node 0 at MASTER_PORT, the others join it and
block), and node 0 waits, bounded, until Ray reports every GPU, then execs the
server with ``--distributed-executor-backend ray``. ``mode = "replicas"``: each
node runs its own independent server (data-parallel replicas), so tp * pp must
divide the GPUs of one node (several engines per node: ``--data-parallel-size``).

Data parallel (``mode = "dp"``, the default over several nodes when tp * pp * dp =
world with dp > 1): one API endpoint on node 0 over dp engines of tp * pp GPUs, as
vLLM's "Data Parallel Deployment" documentation runs it. Every node gets
``--data-parallel-size dp --data-parallel-size-local L`` (L engines per node) and,
from ``launch/vllm-node.sh``, ``--data-parallel-address`` (node 0's IPv4 address) and
``--data-parallel-rpc-port`` (MASTER_PORT); nodes after 0 add ``--headless
--data-parallel-start-rank node * L``. ``[parallelism] ep`` above 1 adds
``--enable-expert-parallel``; vLLM's expert-parallel group is then tp * dp of one server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import attrs

import mdc
from mdc.api import (
    MASTER_ADDR,
    MASTER_PORT,
    NODE_RANK,
    Artifact,
    Endpoint,
    Finding,
    Launch,
    LauncherSpec,
    Plan,
    Role,
    Server,
    ServingSetup,
    Severity,
    Word,
)
from mdc.api.files import read_schema
from mdc.api.flags import (
    PER_NODE,
    ArgPlace,
    FlagReading,
    FlagTable,
    KnownFlag,
    command_pointer,
    dashes,
    disagreeing,
    disagreement_text,
    drop_flags,
    flag_names,
    plain_words,
)
from mdc.api.shell import out_file, shell_word
from mdc_builtin.launchers._addresses import ipv4_function

NODE_SCRIPT = "launch/vllm-node.sh"
DEFAULT_PORT = 8000
DEFAULT_HOST = "0.0.0.0"
DEFAULT_RAY_WAIT = 600
#: seconds between node 0's looks at the GPUs Ray has
POLL_SECONDS = 5
#: how ``vllm serve`` is spelled; after it the model is positional
SERVE = ("vllm", "serve")
#: the flags mdc writes; a user's own copy of one is a finding (the CLI keeps the last)
TP_FLAG = "--tensor-parallel-size"
PP_FLAG = "--pipeline-parallel-size"
DP_FLAG = "--data-parallel-size"
DP_LOCAL_FLAG = "--data-parallel-size-local"
EP_FLAG = "--enable-expert-parallel"
EXECUTOR_FLAG = "--distributed-executor-backend"
DP_BACKEND_FLAG = "--data-parallel-backend"
#: vLLM places a data-parallel rank wider than a node through Ray with this packing
#: (docs/serving/data_parallel_deployment.md, "Internal Load Balancing")
PACK_STRATEGY = "VLLM_RAY_DP_PACK_STRATEGY"
#: flag -> (vLLM's aliases, where mdc takes the value from); vllm/engine/arg_utils.py
#: (ParallelConfig group) and vllm/entrypoints/openai/cli_args.py
OWNED: dict[str, tuple[tuple[str, ...], str]] = {
    TP_FLAG: (("-tp",), "[parallelism] tp"),
    PP_FLAG: (("-pp",), "[parallelism] pp"),
    DP_FLAG: (("-dp",), "[parallelism] dp"),
    DP_LOCAL_FLAG: (("-dpl",), "nproc_per_node / (tp x pp)"),
    "--data-parallel-start-rank": (("-dpr",), "the node's rank"),
    "--data-parallel-address": (("-dpa",), "node 0's address"),
    "--data-parallel-rpc-port": (("-dpp",), "[distributed] master_port"),
    "--headless": ((), "the node's rank"),
    EP_FLAG: (("-ep",), "[parallelism] ep (= tp x dp of one server)"),
    "--host": ((), "[vllm] host"),
    "--port": ((), "[vllm] port"),
    "--model": ((), "[vllm] model"),
    EXECUTOR_FLAG: ((), "[vllm] mode"),
    DP_BACKEND_FLAG: (("-dpb",), "the layout (ray when an engine spans nodes)"),
}
#: vLLM refuses these with --headless (ServeSubcommand.cmd, vllm/entrypoints/cli/serve.py)
HEAD_ONLY = ("--api-server-count", "-asc")


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class VllmOptions:
    """The ``[vllm]`` table."""

    model: str | None = None
    port: int | None = None
    host: str | None = None
    mode: Literal["ray", "replicas", "dp"] | None = None
    args: tuple[str, ...] = ()
    #: arguments for node 0 only (the API server), e.g. --api-server-count
    head_args: tuple[str, ...] = ()
    ray_wait_seconds: int | None = None


def _opts(options: VllmOptions | None) -> VllmOptions:
    return options if options is not None else VllmOptions()


def mode(plan: Plan, options: VllmOptions | None) -> str:
    """ "single" (one node), "ray" (one server over every node), "dp" (one endpoint over
    data-parallel engines on every node) or "replicas" (a server per node)."""
    if plan.nnodes == 1:
        return "single"
    return _opts(options).mode or ("dp" if plan.sizes.dp > 1 else "ray")


def server_dp(plan: Plan, options: VllmOptions | None) -> int:
    """Data-parallel engines of one server (each node's share in replicas mode)."""
    how = mode(plan, options)
    if how == "replicas":
        return max(1, plan.sizes.dp // plan.nnodes)
    return 1 if how == "ray" else plan.sizes.dp


def engines_span_nodes(plan: Plan, options: VllmOptions | None) -> bool:
    """Data parallel with engines of whole nodes (tp x pp a multiple of a node's GPUs):
    vLLM places them through Ray (--data-parallel-backend ray, VLLM_RAY_DP_PACK_STRATEGY
    span, where --data-parallel-size-local is ignored)."""
    engine, gpus = plan.sizes.tp * plan.sizes.pp, plan.nproc_per_node
    return mode(plan, options) == "dp" and engine > gpus and engine % gpus == 0


def local_engines(plan: Plan) -> int:
    """--data-parallel-size-local: the engines (of tp x pp GPUs) one node holds."""
    return max(1, plan.nproc_per_node // (plan.sizes.tp * plan.sizes.pp))


def serve_argv(plan: Plan, options: VllmOptions | None) -> list[str]:
    """The server's command line, identical on every node that runs it: the command, mdc's
    flags, then args (and head_args where node 0 alone runs it); a flag of the user's that
    says what mdc writes is written once, by mdc."""
    opts = _opts(options)
    mine = _own_argv(plan, opts)

    def agreed(words: Sequence[str]) -> list[str]:
        return drop_flags(words, disagreeing(OWNED_FLAGS, words, mine)[0])

    command = agreed(plan.job.argv)
    model = opts.model or ""
    if tuple(command[:2]) == SERVE:
        argv = [*command[:2], model, *command[2:]]
    else:
        argv = [*command, "--model", model]
    argv += mine + agreed(opts.args)
    if mode(plan, options) != "dp" or engines_span_nodes(plan, options):  # only node 0 serves
        argv += agreed(opts.head_args)
    return argv


def _own_argv(plan: Plan, options: VllmOptions | None) -> list[str]:
    """The flags mdc writes after the command and the model."""
    opts = _opts(options)
    argv = [
        TP_FLAG,
        str(plan.sizes.tp),
        PP_FLAG,
        str(plan.sizes.pp),
        "--host",
        opts.host or DEFAULT_HOST,
        "--port",
        str(opts.port or DEFAULT_PORT),
    ]
    how = mode(plan, options)
    dp = server_dp(plan, options)
    if dp > 1:
        argv += [DP_FLAG, str(dp)]
    spans = engines_span_nodes(plan, options)
    if spans:
        argv += [DP_BACKEND_FLAG, "ray"]
    elif how == "dp":
        argv += [DP_LOCAL_FLAG, str(local_engines(plan))]
    if plan.sizes.ep > 1:
        argv.append(EP_FLAG)
    if how == "ray":
        argv += [EXECUTOR_FLAG, "ray"]
    return argv


def dp_node_script(plan: Plan, options: VllmOptions | None) -> str:
    """launch/vllm-node.sh in dp mode: node 0 serves, the others run headless engines."""
    opts = _opts(options)
    local = local_engines(plan)
    head_args = "".join(" " + shell_word(a) for a in opts.head_args)
    return "\n".join(
        [
            "#!/usr/bin/env bash",
            (
                f"# One node of vLLM job {plan.job.name!r}, data parallel: {plan.sizes.dp} engines "
                f"of tp {plan.sizes.tp} x pp {plan.sizes.pp}, {local} per node."
            ),
            "# launch/worker.sh runs it with NODE_RANK, MASTER_ADDR, MASTER_PORT and NODE_HOSTS",
            "# set and the server's command as its arguments. Node 0 runs the API server and its",
            "# engines; the others run headless engines that connect to node 0's address at",
            "# MASTER_PORT (--data-parallel-rpc-port).",
            "set -euo pipefail",
            ': "${NODE_RANK:?NODE_RANK must be set by the backend}"',
            ': "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"',
            ': "${MASTER_PORT:?MASTER_PORT must be set by the backend}"',
            ': "${NODE_HOSTS:?NODE_HOSTS must be set by the backend}"',
            *ipv4_function(),
            'read -r -a hosts <<< "$NODE_HOSTS"',
            'self="${hosts[NODE_RANK]:?NODE_HOSTS names no host for this node}"',
            'VLLM_HOST_IP="$(node_ipv4 "$self")"',
            "export VLLM_HOST_IP",
            'head="$(node_ipv4 "$MASTER_ADDR")"',
            'dp_args=(--data-parallel-address "$head" --data-parallel-rpc-port "$MASTER_PORT")',
            "if ((NODE_RANK > 0)); then",
            f'  exec "$@" --headless --data-parallel-start-rank "$((NODE_RANK * {local}))" '
            '"${dp_args[@]}"',
            "fi",
            f'exec "$@" "${{dp_args[@]}}"{head_args}',
        ]
    )


def node_script(plan: Plan, options: VllmOptions | None) -> str:
    """launch/vllm-node.sh: Ray on this node, and on node 0 the server once Ray has every GPU."""
    gpus = plan.nproc_per_node
    total = plan.nnodes * gpus
    wait = _opts(options).ray_wait_seconds or DEFAULT_RAY_WAIT
    count = (
        'import ray; ray.init(address="auto", logging_level="ERROR"); '
        'print(int(ray.cluster_resources().get("GPU", 0)))'
    )
    return "\n".join(
        [
            "#!/usr/bin/env bash",
            (
                f"# One node of vLLM job {plan.job.name!r} over Ray: {plan.nnodes} nodes x "
                f"{gpus} GPUs, tensor parallel {plan.sizes.tp}, pipeline parallel {plan.sizes.pp}."
            ),
            "# launch/worker.sh runs it with NODE_RANK, MASTER_ADDR, MASTER_PORT and NODE_HOSTS",
            "# set and the server's command as its arguments. Node 0 starts the Ray head at",
            f"# MASTER_PORT, waits until Ray reports {total} GPUs (at most {wait} s), then runs",
            "# the server; the other nodes join the head and block until Ray stops.",
            "set -euo pipefail",
            ': "${NODE_RANK:?NODE_RANK must be set by the backend}"',
            ': "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"',
            ': "${MASTER_PORT:?MASTER_PORT must be set by the backend}"',
            ': "${NODE_HOSTS:?NODE_HOSTS must be set by the backend}"',
            *ipv4_function(),
            'read -r -a hosts <<< "$NODE_HOSTS"',
            "# vLLM and Ray need this node's IP address as the other nodes reach it.",
            'self="${hosts[NODE_RANK]:?NODE_HOSTS names no host for this node}"',
            'ip="$(node_ipv4 "$self")"',
            'export VLLM_HOST_IP="$ip"',
            "if ((NODE_RANK == 0)); then",
            f'  ray start --head --node-ip-address="$ip" --port="$MASTER_PORT" --num-gpus={gpus}',
            "  # However this node's part ends, its Ray processes stop with it.",
            "  trap 'ray stop >/dev/null 2>&1 || true' EXIT",
            f"  deadline=$((SECONDS + {wait}))",
            "  while true; do",
            f'    gpus="$(python3 -c {shell_word(count)} 2>/dev/null | tail -n 1 || true)"',
            '    [[ "$gpus" =~ ^[0-9]+$ ]] || gpus=0',
            f"    if ((gpus >= {total})); then",
            "      break",
            "    fi",
            "    if ((SECONDS >= deadline)); then",
            (
                f'      echo "mdc: Ray reports $gpus of {total} GPUs after {wait} s; a node '
                "did not join the head at $MASTER_ADDR:$MASTER_PORT (see its log, or raise [vllm] "
                'ray_wait_seconds)" >&2'
            ),
            "      exit 1",
            "    fi",
            f"    sleep {POLL_SECONDS}",
            "  done",
            f'  echo "mdc: Ray reports {total} GPUs on {plan.nnodes} nodes; starting the '
            'server" >&2',
            '  "$@" &',
            "  server=$!",
            "  # On Ctrl-C or TERM, stop the server and wait for it; the EXIT trap then stops Ray.",
            '  trap \'kill "$server" 2>/dev/null || true; wait "$server" || true; exit 130\' INT',
            '  trap \'kill "$server" 2>/dev/null || true; wait "$server" || true; exit 143\' TERM',
            "  status=0",
            '  wait "$server" || status=$?',
            '  exit "$status"',
            "fi",
            (
                f'exec ray start --address="$MASTER_ADDR:$MASTER_PORT" --node-ip-address="$ip" '
                f"--num-gpus={gpus} --block"
            ),
        ]
    )


def emit(plan: Plan, options: VllmOptions | None) -> Launch:
    how = mode(plan, options)
    spans = engines_span_nodes(plan, options)
    backend = {"single": "auto", "ray": "ray", "replicas": "auto", "dp": "mp"}[how]
    if spans:
        backend = "ray"
    env: dict[str, Word] = {
        "VLLM_TENSOR_PARALLEL_SIZE": str(plan.sizes.tp),
        "VLLM_PIPELINE_PARALLEL_SIZE": str(plan.sizes.pp),
        "VLLM_DISTRIBUTED_BACKEND": backend,
        "NNODES": str(plan.nnodes),
        "NPROC_PER_NODE": str(plan.nproc_per_node),
        "NODE_RANK": NODE_RANK,
        "MASTER_ADDR": MASTER_ADDR,
        "MASTER_PORT": MASTER_PORT,
    }
    if spans:
        env[PACK_STRATEGY] = "span"
    serve = serve_argv(plan, options)
    files: tuple[Artifact, ...] = ()
    argv: tuple[Word, ...] = tuple(serve)
    if how == "ray" or spans:  # a Ray cluster over every node; node 0 serves
        argv = ("bash", out_file(NODE_SCRIPT), *serve)
        files = (Artifact.text(NODE_SCRIPT, node_script(plan, options), executable=True),)
    elif how == "dp":
        argv = ("bash", out_file(NODE_SCRIPT), *serve)
        files = (Artifact.text(NODE_SCRIPT, dp_node_script(plan, options), executable=True),)
    worker_env = {
        "VLLM_TENSOR_PARALLEL_SIZE": str(plan.sizes.tp),
        "VLLM_PIPELINE_PARALLEL_SIZE": str(plan.sizes.pp),
        "VLLM_DISTRIBUTED_BACKEND": backend,
        "NNODES": str(plan.nnodes),
        "NPROC_PER_NODE": str(plan.nproc_per_node),
        "NODE_RANK": "the backend's node index" if plan.nnodes > 1 else "0 (the only node)",
        "MASTER_ADDR": "node 0's address (set by the backend)",
        "MASTER_PORT": (
            f"{plan.rendezvous.text()} (the Ray head's port)"
            if how == "ray" or spans
            else f"{plan.rendezvous.text()} (--data-parallel-rpc-port)"
            if how == "dp"
            else plan.rendezvous.text()
        ),
    }
    if how in ("ray", "dp"):
        worker_env["VLLM_HOST_IP"] = "this node's IPv4 address, from NODE_HOSTS"
    if spans:
        worker_env[PACK_STRATEGY] = "span (data-parallel ranks wider than a node, over Ray)"
    port = _opts(options).port or DEFAULT_PORT
    endpoint = Endpoint(port=port, every_node=how == "replicas")
    return Launch(
        roles=(Role(name="worker", argv=argv, env=env),),
        files=files,
        worker_env=worker_env,
        endpoint=endpoint,
        servers=servers(plan, options, port),
    )


def servers(plan: Plan, options: VllmOptions | None, port: int) -> tuple[Server, ...]:
    """One server over the job, or (replicas) one per node."""
    how, sizes = mode(plan, options), plan.sizes
    dp = server_dp(plan, options)
    ep = sizes.tp * dp if sizes.ep > 1 else 1
    groups = (
        [(n,) for n in range(plan.nnodes)] if how == "replicas" else [tuple(range(plan.nnodes))]
    )
    return tuple(
        Server(
            role="replica" if how == "replicas" else "server",
            nodes=nodes,
            gpus=sizes.tp * sizes.pp * dp,
            tp=sizes.tp,
            pp=sizes.pp,
            dp=dp,
            ep=ep,
            port=port,
        )
        for nodes in groups
    )


def _table(data: object, name: str) -> dict[str, Any]:
    value = data.get(name) if isinstance(data, dict) else None
    return value if isinstance(value, dict) else {}


def _not_replicas(data: object) -> bool:
    """--data-parallel-size is [parallelism] dp unless each node runs its own server."""
    return _table(data, "vllm").get("mode") != "replicas"


def expert_parallel_size(_: object, data: object) -> object:
    """--enable-expert-parallel as [parallelism] ep: vLLM's expert-parallel group is tp x dp
    of one server (the plan's defaults: tp a node's GPUs, dp the rest of the world)."""
    par, dist = _table(data, "parallelism"), _table(data, "distributed")
    nproc, nnodes = dist.get("nproc_per_node") or 1, dist.get("nnodes") or 1
    tp = par.get("tp") or nproc
    pp = par.get("pp") or (nnodes if par.get("dp") is None else 1)
    dp = par.get("dp") or max(1, nnodes * nproc // (tp * pp * (par.get("cp") or 1)))
    how = _table(data, "vllm").get("mode") if nnodes > 1 else None
    if how == "ray" or (how is None and nnodes > 1 and dp == 1):
        dp = 1
    elif how == "replicas":
        dp = max(1, dp // nnodes)
    return tp * dp if isinstance(tp, int) and isinstance(dp, int) else None


#: the flags that stand for a spec key: read as that key wherever the user passes them
KEYED: dict[str, KnownFlag] = {
    TP_FLAG: KnownFlag(
        name=TP_FLAG,
        source="[parallelism] tp",
        spec_key="/parallelism/tp",
        nargs=1,
        convert=int,
        aliases=("-tp",),
    ),  # fmt: skip
    PP_FLAG: KnownFlag(
        name=PP_FLAG,
        source="[parallelism] pp",
        spec_key="/parallelism/pp",
        nargs=1,
        convert=int,
        aliases=("-pp",),
    ),  # fmt: skip
    DP_FLAG: KnownFlag(
        name=DP_FLAG,
        source="[parallelism] dp",
        spec_key="/parallelism/dp",
        nargs=1,
        convert=int,
        aliases=("-dp",),
        read_if=_not_replicas,
    ),  # fmt: skip
    EP_FLAG: KnownFlag(
        name=EP_FLAG,
        source="[parallelism] ep (= tp x dp of one server)",
        spec_key="/parallelism/ep",
        aliases=("-ep",),
        compute=expert_parallel_size,
    ),  # fmt: skip
    "--host": KnownFlag(name="--host", source="[vllm] host", spec_key="/vllm/host", nargs=1),
    "--port": KnownFlag(
        name="--port", source="[vllm] port", spec_key="/vllm/port", nargs=1, convert=int
    ),  # fmt: skip
    "--model": KnownFlag(name="--model", source="[vllm] model", spec_key="/vllm/model", nargs=1),
}
#: the int-typed flags among those with no key (vllm/engine/arg_utils.py)
INT_FLAGS = (DP_LOCAL_FLAG, "--data-parallel-start-rank", "--data-parallel-rpc-port")
#: flags mdc writes on some nodes only, with values of that node
PER_NODE_FLAGS = (
    "--data-parallel-start-rank",
    "--data-parallel-address",
    "--data-parallel-rpc-port",
    "--headless",
)
#: every flag mdc writes: those of a key, the others compared with mdc's value
OWNED_FLAGS = FlagTable(
    KEYED.get(flag)
    or KnownFlag(
        name=flag,
        source=source,
        nargs=0 if flag in ("--headless", EP_FLAG) else 1,
        convert=int if flag in INT_FLAGS else str,
        aliases=aliases,
    )
    for flag, (aliases, source) in OWNED.items()
)
# vLLM's FlexibleArgumentParser reads --a_b as --a-b, and (argparse's default) takes an
# unambiguous prefix of a long option
OWNED_FLAGS = FlagTable(OWNED_FLAGS.flags, normalize=dashes, abbreviations=True)
COMMAND = ArgPlace(pointer="/job/command", where="the job's command")
READING = FlagReading(
    table=OWNED_FLAGS,
    places=(
        COMMAND,
        ArgPlace(pointer="/vllm/args", where="[vllm] args", table="/vllm"),
        ArgPlace(pointer="/vllm/head_args", where="[vllm] head_args", table="/vllm"),
    ),
    code="MDC364",
    framework="vLLM",
)
HEAD_ONLY_FLAGS = FlagTable(
    [KnownFlag(name=HEAD_ONLY[0], source="[vllm] head_args", nargs=1, aliases=HEAD_ONLY[1:])]
)


def _written(words: Sequence[str], table: FlagTable = OWNED_FLAGS) -> list[str]:
    found = flag_names(table.find(words))
    return [flag.name for flag in table.flags if flag.name in found]


def _layout_findings(plan: Plan, opts: VllmOptions) -> Iterator[Finding]:
    """tp x pp x dp = world, as each mode places the servers (MDC362, MDC368, MDC369)."""
    tp, pp, gpus, dp = plan.sizes.tp, plan.sizes.pp, plan.nproc_per_node, plan.sizes.dp
    how = mode(plan, opts)
    engine = tp * pp
    if how == "ray" and dp > 1:
        yield Finding(
            code="MDC362",
            pointer="/vllm/mode",
            message=f"in ray mode one vLLM server spans every node with tp {tp} x pp {pp} = "
            f"{engine} GPUs, but the job has {plan.nnodes} x {gpus} = {plan.world_size}",
            hint=f'remove mode for {dp} data-parallel engines behind one endpoint ("dp"), or '
            f"set tp and pp so that tp x pp = {plan.world_size}",
        )
    elif how in ("replicas", "dp") and gpus % engine and not engines_span_nodes(plan, opts):
        yield Finding(
            code="MDC362",
            pointer="/vllm/mode" if opts.mode else "/parallelism/tp",
            message=f"in {how} mode every node holds whole engines of tp {tp} x pp {pp} = "
            f"{engine} GPUs, which does not divide its {gpus} GPUs"
            + (f" (nor is it whole nodes of {gpus})" if how == "dp" else ""),
            hint=f"make tp x pp a divisor of {gpus}, e.g. tp = {gpus} and pp = 1"
            + (
                f", or a multiple of {gpus} (engines over whole nodes, through Ray)"
                if how == "dp"
                else ""
            )
            + ', or use mode = "ray" for one server over every node',
        )
    ep = plan.sizes.ep
    if ep > 1:
        # vLLM sizes its expert-parallel group itself: tp x dp of one server
        # (docs/serving/expert_parallel_deployment.md, "EP_SIZE = TP_SIZE x DP_SIZE")
        want = tp * server_dp(plan, opts)
        if ep != want:
            yield Finding(
                code="MDC368",
                pointer="/parallelism/ep",
                message=f"vLLM's expert-parallel group is tp x dp of one server = {tp} x "
                f"{server_dp(plan, opts)} = {want}, not ep = {ep}",
                hint=f"set ep = {want} (--enable-expert-parallel), or remove ep",
            )
        if plan.sizes.etp != 1:
            yield Finding(
                code="MDC368",
                pointer="/parallelism/etp",
                message=f"with expert parallelism vLLM splits no expert over tensor-parallel "
                f"ranks; etp = {plan.sizes.etp}",
                hint="remove etp (it is 1 for vLLM's expert parallelism)",
            )
    head_only = _written(opts.args, HEAD_ONLY_FLAGS)
    if how == "dp" and head_only and not engines_span_nodes(plan, opts):
        yield Finding(
            code="MDC369",
            pointer="/vllm/args",
            message=f"[vllm] args reach every node, and vLLM refuses {head_only[0]} on the "
            "--headless nodes",
            hint="move it to [vllm] head_args (node 0, the API server, only)",
        )


def _places(plan: Plan, opts: VllmOptions) -> Iterator[tuple[list[str], str, Any]]:
    yield plan.job.argv, "the job's command", lambda i: command_pointer(plan.job.command, i)
    yield list(opts.args), "[vllm] args", lambda i: f"/vllm/args/{i}"
    yield list(opts.head_args), "[vllm] head_args", lambda i: f"/vllm/head_args/{i}"


def _mdc_words(plan: Plan, opts: VllmOptions) -> list[object]:
    """What mdc writes on the server's command line, with the flags of the node script
    (different on every node) as per-node words."""
    mine: list[object] = list(_own_argv(plan, opts))
    if mode(plan, opts) == "dp" and not engines_span_nodes(plan, opts):
        for flag in PER_NODE_FLAGS:
            mine += [f"{flag}={PER_NODE}"] if flag == "--headless" else [flag, NODE_RANK]
    return mine


def _clash_findings(plan: Plan, opts: VllmOptions) -> Iterator[Finding]:
    """A flag mdc writes from no key of its own, passed with another value (the keyed
    flags were read into the spec, a disagreeing one refused there)."""
    mine = _mdc_words(plan, opts)
    emitted = plain_words(mine)
    for words, where, pointer in _places(plan, opts):
        _, differ = disagreeing(OWNED_FLAGS, words, mine)
        for use, own in differ:
            message, hint = disagreement_text("vLLM", where, words, use, emitted, own)
            yield Finding(code="MDC364", pointer=pointer(use.index), message=message, hint=hint)


def check(plan: Plan, options: VllmOptions | None) -> Iterator[Finding]:
    opts = _opts(options)
    if not opts.model:
        yield Finding(
            code="MDC360",
            pointer="/vllm",
            message="the vllm launcher needs the model to serve: [vllm] model is not set",
            hint='add [vllm] model = "<Hugging Face id or local path>", e.g. '
            '"meta-llama/Llama-3.1-8B-Instruct"',
        )
    how = mode(plan, options)
    if opts.mode is not None and plan.nnodes == 1:
        yield Finding(
            code="MDC361",
            pointer="/vllm/mode",
            severity=Severity.WARNING,
            message=f'[vllm] mode = "{opts.mode}" has no effect on 1 node',
            hint="remove mode, or set nnodes above 1",
        )
    yield from _layout_findings(plan, opts)
    if plan.sizes.cp > 1:
        yield Finding(
            code="MDC363",
            pointer="/parallelism/cp",
            message=f"vLLM serving has no context parallelism here (cp {plan.sizes.cp})",
            hint="remove cp (or set it to 1)",
        )
    yield from _clash_findings(plan, opts)
    yield from step_limit_findings(list(opts.args), lambda i: f"/vllm/args/{i}")
    argv = plan.job.argv
    if tuple(argv[:2]) != SERVE and not any("vllm.entrypoints" in w for w in argv):
        yield Finding(
            code="MDC365",
            pointer="/job/command",
            severity=Severity.WARNING,
            message=f"the command {' '.join(argv)!r} does not look like a vLLM server; "
            "the vllm launcher appends the model and vLLM's flags to it",
            hint='use command = ["vllm", "serve"]',
        )
    if plan.elastic:
        yield Finding(
            code="MDC366",
            pointer="/distributed/min_nnodes",
            message=f"a vLLM server has a fixed size; it cannot run an elastic job "
            f"(min_nnodes {plan.min_nnodes} < nnodes {plan.nnodes})",
            hint=f"remove min_nnodes, or set it to nnodes ({plan.nnodes})",
        )
    if how == "ray" and plan.accelerator == "cpu":
        yield Finding(
            code="MDC367",
            pointer="/distributed/accelerator",
            message='multi-node vLLM over Ray places its workers on GPUs; accelerator is "cpu"',
            hint='set accelerator to the GPU kind, or [vllm] mode = "replicas"',
        )


#: the engine settings the serving memory check reads from the arguments
#: (vllm/engine/arg_utils.py; --gpu-memory-utilization defaults to 0.9, CacheConfig)
MEMORY_FLAGS = FlagTable(
    [
        KnownFlag(
            name="--gpu-memory-utilization",
            source="[vllm] args",
            key="share",
            nargs=1,
            convert=float,
        ),
        KnownFlag(name="--kv-cache-dtype", source="[vllm] args", key="kv_dtype", nargs=1),
        KnownFlag(
            name="--max-model-len", source="[vllm] args", key="max_len", nargs=1, convert=int
        ),
        # the per-step limits of each engine (SchedulerConfig): the running requests and
        # the tokens one step schedules, prompt chunks included
        KnownFlag(
            name="--max-num-seqs", source="[vllm] args", key="max_batch", nargs=1, convert=int
        ),
        KnownFlag(
            name="--max-num-batched-tokens",
            source="[vllm] args",
            key="step_tokens",
            nargs=1,
            convert=int,
        ),
        # eager mode: no CUDA graphs (the serving model's per-layer launch cost)
        KnownFlag(name="--enforce-eager", source="[vllm] args", key="eager"),
    ]
)


#: the tokens of one step unless --max-num-batched-tokens says: vLLM's default for its
#: OpenAI server on a GPU of 70 GiB or more (EngineArgs' usage-context defaults; 2048 on
#: smaller ones)
DEFAULT_STEP_TOKENS = 8192


def step_limit_findings(words: list[str], pointer: Callable[[int], str]) -> Iterator[Finding]:
    """vLLM refuses a step budget below its running-request cap (SchedulerConfig: each
    running request takes at least one token of every step); ``pointer`` maps a word's
    index in ``words`` to its JSON pointer."""
    values, uses = MEMORY_FLAGS.read(words)
    budget, cap = values.get("step_tokens"), values.get("max_batch")
    if budget is None or cap is None or budget >= cap:
        return
    index = [u.index for u in uses if u.flag.key == "step_tokens"][-1]
    yield Finding(
        code="MDC625",
        pointer=pointer(index),
        message=f"vLLM refuses --max-num-batched-tokens {budget} below --max-num-seqs {cap}: "
        "every running request takes a token of each step",
        hint=f"raise --max-num-batched-tokens to {cap} or more, or lower --max-num-seqs",
    )


def serving(plan: Plan, options: VllmOptions | None) -> ServingSetup:
    """One engine's sizes: tp x pp GPUs; with expert parallelism whole experts over ep."""
    opts = _opts(options)
    values, _ = MEMORY_FLAGS.read([*plan.job.argv, *opts.args, *opts.head_args])
    share = values.get("share")
    ep = plan.sizes.ep
    return ServingSetup(
        engine="vLLM",
        tp=plan.sizes.tp,
        pp=plan.sizes.pp,
        ep=ep,
        etp=1 if ep > 1 else plan.sizes.tp,
        share=share if share is not None else 0.9,
        share_source="--gpu-memory-utilization"
        if share is not None
        else "vLLM's default --gpu-memory-utilization",
        kv_dtype=values.get("kv_dtype", "auto"),
        max_len=values.get("max_len"),
        max_batch=values.get("max_batch"),
        step_tokens=values.get("step_tokens"),
        # vLLM profiles a step of its budget and takes its activations out of the cache
        profiled_tokens=values.get("step_tokens", DEFAULT_STEP_TOKENS),
        cuda_graphs=not values.get("eager", False),
    )


@mdc.hookimpl
def mdc_register_launchers() -> list[LauncherSpec]:
    return [
        LauncherSpec(
            name="vllm",
            description="vLLM OpenAI-compatible server: one node, one server over every node "
            "through Ray, data-parallel engines behind node 0's endpoint, or one replica per node",
            parallelism="model",
            workload="serving",
            emit=emit,
            check=check,
            serving=serving,
            schema=read_schema("mdc_schemas", "plugins/vllm.v1.schema.json"),
            options_type=VllmOptions,
            arguments=READING,
        )
    ]
