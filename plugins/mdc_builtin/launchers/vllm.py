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
be the GPUs of one node.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

import attrs

import mdc
from mdc.api import (
    MASTER_ADDR,
    MASTER_PORT,
    NODE_RANK,
    Artifact,
    Finding,
    FlagTable,
    KnownFlag,
    Launch,
    LauncherSpec,
    Plan,
    Role,
    Severity,
    Word,
    flag_names,
    out_file,
    read_schema,
    shell_word,
)

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
EXECUTOR_FLAG = "--distributed-executor-backend"
OWNED = {
    TP_FLAG: ("-tp",),
    PP_FLAG: ("-pp",),
    "--host": (),
    "--port": (),
    "--model": (),
    EXECUTOR_FLAG: (),
}


@attrs.frozen(kw_only=True)
class VllmOptions:
    """The ``[vllm]`` table."""

    model: str | None = None
    port: int | None = None
    host: str | None = None
    mode: Literal["ray", "replicas"] | None = None
    args: tuple[str, ...] = ()
    ray_wait_seconds: int | None = None


def _opts(options: VllmOptions | None) -> VllmOptions:
    return options if options is not None else VllmOptions()


def mode(plan: Plan, options: VllmOptions | None) -> str:
    """ "single" (one node), "ray" (one server over every node) or "replicas"."""
    if plan.nnodes == 1:
        return "single"
    return _opts(options).mode or "ray"


def serve_argv(plan: Plan, options: VllmOptions | None) -> list[str]:
    """The server's command line, identical on every node that runs it."""
    opts = _opts(options)
    command = list(plan.job.argv)
    model = opts.model or ""
    if tuple(command[:2]) == SERVE:
        argv = [*command[:2], model, *command[2:]]
    else:
        argv = [*command, "--model", model]
    argv += [
        TP_FLAG,
        str(plan.sizes.tp),
        PP_FLAG,
        str(plan.sizes.pp),
        "--host",
        opts.host or DEFAULT_HOST,
        "--port",
        str(opts.port or DEFAULT_PORT),
    ]
    if mode(plan, options) == "ray":
        argv += [EXECUTOR_FLAG, "ray"]
    return argv + list(opts.args)


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
                f"# One node of vLLM job {plan.job.name!r} over Ray: {plan.nnodes} nodes x {gpus} GPUs, "
                f"tensor parallel {plan.sizes.tp}, pipeline parallel {plan.sizes.pp}."
            ),
            "# launch/worker.sh runs it with NODE_RANK, MASTER_ADDR, MASTER_PORT and NODE_HOSTS set and",
            "# the server's command as its arguments. Node 0 starts the Ray head at MASTER_PORT, waits",
            f"# until Ray reports {total} GPUs (at most {wait} s), then runs the server; the other",
            "# nodes join the head and block until Ray stops.",
            "set -euo pipefail",
            ': "${NODE_RANK:?NODE_RANK must be set by the backend}"',
            ': "${MASTER_ADDR:?MASTER_ADDR must be set by the backend}"',
            ': "${MASTER_PORT:?MASTER_PORT must be set by the backend}"',
            ': "${NODE_HOSTS:?NODE_HOSTS must be set by the backend}"',
            'read -r -a hosts <<< "$NODE_HOSTS"',
            'self="${hosts[NODE_RANK]:-}"',
            "# vLLM and Ray need this node's IP address as the other nodes reach it.",
            'if [[ "$self" =~ ^[0-9]+([.][0-9]+){3}$ ]]; then',
            '  ip="$self"',
            "else",
            '  ip="$(getent ahostsv4 "$self" | awk \'NR == 1 { print $1 }\' || true)"',
            "fi",
            'if [[ -z "$ip" ]]; then',
            "  echo \"mdc: cannot find the IPv4 address of node $NODE_RANK ('$self' in NODE_HOSTS)\" >&2",
            "  exit 1",
            "fi",
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
                f'      echo "mdc: Ray reports $gpus of {total} GPUs after {wait} s; a node did not '
                "join the head at $MASTER_ADDR:$MASTER_PORT (see its log, or raise [vllm] "
                'ray_wait_seconds)" >&2'
            ),
            "      exit 1",
            "    fi",
            f"    sleep {POLL_SECONDS}",
            "  done",
            f'  echo "mdc: Ray reports {total} GPUs on {plan.nnodes} nodes; starting the server" >&2',
            '  "$@" &',
            "  server=$!",
            "  # On Ctrl-C or TERM, stop the server and wait for it; the EXIT trap then stops Ray.",
            """  trap 'kill "$server" 2>/dev/null || true; wait "$server" || true; exit 130' INT""",
            """  trap 'kill "$server" 2>/dev/null || true; wait "$server" || true; exit 143' TERM""",
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
    backend = {"single": "auto", "ray": "ray", "replicas": "auto"}[how]
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
    serve = serve_argv(plan, options)
    files: tuple[Artifact, ...] = ()
    argv: tuple[Word, ...] = tuple(serve)
    if how == "ray":
        argv = ("bash", out_file(NODE_SCRIPT), *serve)
        files = (Artifact.text(NODE_SCRIPT, node_script(plan, options), executable=True),)
    worker_env = {
        "VLLM_TENSOR_PARALLEL_SIZE": str(plan.sizes.tp),
        "VLLM_PIPELINE_PARALLEL_SIZE": str(plan.sizes.pp),
        "VLLM_DISTRIBUTED_BACKEND": backend,
        "NNODES": str(plan.nnodes),
        "NPROC_PER_NODE": str(plan.nproc_per_node),
        "NODE_RANK": "the backend's node index" if plan.nnodes > 1 else "0 (the only node)",
        "MASTER_ADDR": "node 0's address (set by the backend)",
        "MASTER_PORT": (
            f"{plan.rendezvous.master_port} (the Ray head's port)"
            if how == "ray"
            else str(plan.rendezvous.master_port)
        ),
    }
    if how == "ray":
        worker_env["VLLM_HOST_IP"] = "this node's IPv4 address, from NODE_HOSTS"
    return Launch(
        roles=(Role(name="worker", argv=argv, env=env),), files=files, worker_env=worker_env
    )


#: the same flags as a table of mdc's shared flag reader (each takes one value)
OWNED_FLAGS = FlagTable(
    KnownFlag(name=flag, source="the plan", nargs=1, aliases=aliases)
    for flag, aliases in OWNED.items()
)


def _written(words: Sequence[str]) -> list[str]:
    found = flag_names(OWNED_FLAGS.find(words))
    return [flag for flag in OWNED if flag in found]


def check(plan: Plan, options: VllmOptions | None) -> Iterator[Finding]:
    opts = _opts(options)
    tp, pp, gpus = plan.sizes.tp, plan.sizes.pp, plan.nproc_per_node
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
    if how == "replicas" and tp * pp != gpus:
        yield Finding(
            code="MDC362",
            pointer="/vllm/mode",
            message=f"in replicas mode each node runs its own server on its "
            f"{gpus} GPUs, but tp {tp} x pp {pp} = {tp * pp}",
            hint=f"set [parallelism] tp = {gpus} and pp = 1",
        )
    elif how in ("single", "ray") and tp * pp != plan.world_size:
        yield Finding(
            code="MDC362",
            pointer="/parallelism",
            message=f"one vLLM server uses tp {tp} x pp {pp} = {tp * pp} GPUs, "
            f"but the job has {plan.nnodes} x {gpus} = {plan.world_size}",
            hint=(
                f'set [vllm] mode = "replicas" for {plan.nnodes} independent servers'
                if tp * pp == gpus and plan.nnodes > 1
                else f"set tp and pp so that tp x pp = {plan.world_size}, e.g. tp = "
                f"{gpus} and pp = {plan.nnodes}"
            ),
        )
    if plan.sizes.cp > 1:
        yield Finding(
            code="MDC363",
            pointer="/parallelism/cp",
            message=f"vLLM serving has no context parallelism here (cp {plan.sizes.cp})",
            hint="remove cp (or set it to 1)",
        )
    in_command = _written(plan.job.argv)
    if in_command:
        yield Finding(
            code="MDC364",
            pointer="/job/command",
            message=f"the command already has {', '.join(in_command)}, which the "
            "vllm launcher sets from the plan",
            hint="remove them from the command; set the sizes in [parallelism] and "
            "host, port and model in [vllm]",
        )
    in_args = _written(opts.args)
    if in_args:
        yield Finding(
            code="MDC364",
            pointer="/vllm/args",
            message=f"[vllm] args has {', '.join(in_args)}, which the vllm launcher "
            "sets from the plan",
            hint="remove them from args; set the sizes in [parallelism] and host, "
            "port and model in [vllm]",
        )
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


@mdc.hookimpl
def mdc_register_launchers() -> list[LauncherSpec]:
    return [
        LauncherSpec(
            name="vllm",
            description="vLLM OpenAI-compatible server: one node, one server over every node "
            "through Ray, or one replica per node",
            parallelism="model",
            workload="serving",
            emit=emit,
            check=check,
            schema=read_schema("mdc_schemas", "plugins/vllm.v1.schema.json"),
            options_type=VllmOptions,
        )
    ]
