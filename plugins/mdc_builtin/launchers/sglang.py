"""sglang: an SGLang server (``python -m sglang.launch_server``) over the plan's GPUs.

The job's command is the server program (``python -m sglang.launch_server``)
with any arguments of the user's own; mdc appends ``--model-path``,
``--tp-size``, ``--pp-size`` (when above 1), ``--host``, ``--port`` and then
``[sglang] args``. With several nodes SGLang joins them itself: every node runs
the same command with ``--nnodes N --node-rank $NODE_RANK --dist-init-addr
$MASTER_ADDR:$MASTER_PORT``; node 0 serves HTTP. There each node runs the server
through ``launch/sglang-node.sh``, which exports ``SGLANG_HOST_IP`` (this node's
address, from ``$NODE_HOSTS``; SGLang reads it as the node's own IP) and then execs
the server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import attrs

import mdc
from mdc.api import (
    MASTER_ADDR,
    MASTER_PORT,
    NODE_RANK,
    Artifact,
    Concat,
    Endpoint,
    Finding,
    Launch,
    LauncherSpec,
    Plan,
    Role,
    Server,
    ServingSetup,
    Severity,
    SglangServer,
    Word,
)
from mdc.api.files import read_schema
from mdc.api.flags import (
    ArgPlace,
    FlagReading,
    FlagTable,
    KnownFlag,
    command_pointer,
    disagreeing,
    disagreement_text,
    drop_flags,
    plain_words,
)
from mdc.api.shell import out_file
from mdc_builtin.launchers._addresses import ipv4_function

NODE_SCRIPT = "launch/sglang-node.sh"
DEFAULT_PORT = 30000
DEFAULT_HOST = "0.0.0.0"
MODULE = "sglang.launch_server"
#: the flags mdc writes, with SGLang's aliases of each and what mdc writes it from; a user's
#: copy of one is a finding
OWNED: dict[str, tuple[tuple[str, ...], str]] = {
    "--model-path": (("--model",), "[sglang] model"),
    "--tp-size": (("--tensor-parallel-size",), "[parallelism] tp"),
    "--pp-size": (("--pipeline-parallel-size",), "[parallelism] pp"),
    "--nnodes": ((), "[distributed] nnodes"),
    "--node-rank": ((), "the node's rank"),
    "--dist-init-addr": (("--nccl-init-addr",), "[distributed] master_port (on node 0)"),
    "--host": ((), "[sglang] host"),
    "--port": ((), "[sglang] port"),
}


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class SglangOptions:
    """The ``[sglang]`` table."""

    model: str | None = None
    port: int | None = None
    host: str | None = None
    args: tuple[str, ...] = ()


def _opts(options: SglangOptions | None) -> SglangOptions:
    return options if options is not None else SglangOptions()


def dist_init_addr() -> Concat:
    """``$MASTER_ADDR:$MASTER_PORT``: where SGLang's nodes meet (node 0)."""
    return Concat((MASTER_ADDR, ":", MASTER_PORT))


def server_argv(plan: Plan, options: SglangOptions | None) -> list[Word]:
    """The server's command line; only --node-rank differs between nodes. A flag of the
    user's that says what mdc writes is written once, by mdc."""
    opts = _opts(options)
    mine = _own_argv(plan, opts)

    def agreed(words: Sequence[str]) -> list[str]:
        return drop_flags(words, disagreeing(OWNED_FLAGS, words, mine)[0])

    return [*agreed(plan.job.argv), *mine, *agreed(opts.args)]


def _own_argv(plan: Plan, opts: SglangOptions) -> list[Word]:
    """The flags mdc writes after the command."""
    argv: list[Word] = [
        "--model-path",
        opts.model or "",
        "--tp-size",
        str(plan.sizes.tp),
    ]
    if plan.sizes.pp > 1:
        argv += ["--pp-size", str(plan.sizes.pp)]
    if plan.nnodes > 1:
        argv += [
            "--nnodes",
            str(plan.nnodes),
            "--node-rank",
            NODE_RANK,
            "--dist-init-addr",
            dist_init_addr(),
        ]
    argv += ["--host", opts.host or DEFAULT_HOST, "--port", str(opts.port or DEFAULT_PORT)]
    return argv


def node_script(plan: Plan) -> str:
    """launch/sglang-node.sh: SGLANG_HOST_IP from $NODE_HOSTS, then the server (its arguments)."""
    return "\n".join(
        [
            "#!/usr/bin/env bash",
            (
                f"# One node of SGLang job {plan.job.name!r} ({plan.nnodes} nodes). "
                "launch/worker.sh runs it with"
            ),
            "# NODE_RANK and NODE_HOSTS set and the server's command as its arguments; it exports",
            "# SGLANG_HOST_IP, this node's address (SGLang reads it as the node's own IP): an IP",
            "# in NODE_HOSTS as it is, a host name as its first IPv4 address.",
            "set -euo pipefail",
            ': "${NODE_RANK:?NODE_RANK must be set by the backend}"',
            ': "${NODE_HOSTS:?NODE_HOSTS must be set by the backend}"',
            *ipv4_function(),
            'read -r -a hosts <<< "$NODE_HOSTS"',
            'self="${hosts[NODE_RANK]:?NODE_HOSTS names no host for this node}"',
            'ip="$(node_ipv4 "$self")"',
            'export SGLANG_HOST_IP="$ip"',
            'exec "$@"',
        ]
    )


def emit(plan: Plan, options: SglangOptions | None) -> Launch:
    env: dict[str, Word] = {
        "SGLANG_TENSOR_PARALLEL_SIZE": str(plan.sizes.tp),
        "SGLANG_PIPELINE_PARALLEL_SIZE": str(plan.sizes.pp),
        "NNODES": str(plan.nnodes),
        "NPROC_PER_NODE": str(plan.nproc_per_node),
        "NODE_RANK": NODE_RANK,
        "MASTER_ADDR": MASTER_ADDR,
        "MASTER_PORT": MASTER_PORT,
    }
    if plan.nnodes > 1:
        env["NCCL_INIT_ADDR"] = dist_init_addr()
    worker_env = {
        "SGLANG_TENSOR_PARALLEL_SIZE": str(plan.sizes.tp),
        "SGLANG_PIPELINE_PARALLEL_SIZE": str(plan.sizes.pp),
        "NNODES": str(plan.nnodes),
        "NPROC_PER_NODE": str(plan.nproc_per_node),
        "NODE_RANK": "the backend's node index (also --node-rank)"
        if plan.nnodes > 1
        else "0 (the only node)",
        "MASTER_ADDR": "node 0's address (set by the backend)",
        "MASTER_PORT": f"{plan.rendezvous.text()} (SGLang's --dist-init-addr port)"
        if plan.nnodes > 1
        else plan.rendezvous.text(),
    }
    argv: tuple[Word, ...] = tuple(server_argv(plan, options))
    files: tuple[Artifact, ...] = ()
    if plan.nnodes > 1:
        worker_env["NCCL_INIT_ADDR"] = "MASTER_ADDR:MASTER_PORT (as --dist-init-addr)"
        worker_env["SGLANG_HOST_IP"] = "this node's IPv4 address, from NODE_HOSTS"
        argv = ("bash", out_file(NODE_SCRIPT), *argv)
        files = (Artifact.text(NODE_SCRIPT, node_script(plan), executable=True),)
    return Launch(
        roles=(Role(name="worker", argv=argv, env=env),),
        files=files,
        worker_env=worker_env,
        endpoint=Endpoint(port=_opts(options).port or DEFAULT_PORT),
        servers=(
            Server(
                role="server",
                nodes=tuple(range(plan.nnodes)),
                gpus=plan.world_size,
                tp=plan.sizes.tp,
                pp=plan.sizes.pp,
                port=_opts(options).port or DEFAULT_PORT,
            ),
        ),
    )


#: the flags that stand for a spec key: read as that key wherever the user passes them
#: (SGLang's server_args.py: --model-path, --tp-size and --pp-size, --nnodes, --port are
#: str, int, int, int, int; --host str)
KEYS: dict[str, tuple[str, type]] = {
    "--model-path": ("/sglang/model", str),
    "--tp-size": ("/parallelism/tp", int),
    "--pp-size": ("/parallelism/pp", int),
    "--nnodes": ("/distributed/nnodes", int),
    "--host": ("/sglang/host", str),
    "--port": ("/sglang/port", int),
}
#: every flag mdc writes: those of a key, the others (per node) compared with mdc's words
OWNED_FLAGS = FlagTable(
    KnownFlag(
        name=flag,
        source=source,
        nargs=1,
        aliases=aliases,
        spec_key=KEYS[flag][0] if flag in KEYS else None,
        convert=KEYS[flag][1] if flag in KEYS else int if flag == "--node-rank" else str,
    )
    for flag, (aliases, source) in OWNED.items()
)
# SGLang's parser (argparse's defaults) takes an unambiguous prefix of a long option
OWNED_FLAGS = FlagTable(OWNED_FLAGS.flags, abbreviations=True)
READING = FlagReading(
    table=OWNED_FLAGS,
    places=(
        ArgPlace(pointer="/job/command", where="the job's command"),
        ArgPlace(pointer="/sglang/args", where="[sglang] args", table="/sglang"),
    ),
    code="MDC373",
    framework="SGLang",
)


def _clash_findings(plan: Plan, opts: SglangOptions) -> Iterator[Finding]:
    """A flag mdc writes from no key of its own (the node's rank and address) passed with
    another value (the keyed flags were read into the spec, a disagreeing one refused)."""
    mine = _own_argv(plan, opts)
    emitted = plain_words(mine)
    places: list[tuple[Sequence[str], str, Callable[[int], str]]] = [
        (plan.job.argv, "the job's command", partial(command_pointer, plan.job.command)),
        (opts.args, "[sglang] args", "/sglang/args/{}".format),
    ]
    for words, where, pointer in places:
        for use, own in disagreeing(OWNED_FLAGS, words, mine)[1]:
            message, hint = disagreement_text("SGLang", where, words, use, emitted, own)
            yield Finding(code="MDC373", pointer=pointer(use.index), message=message, hint=hint)


def check(plan: Plan, options: SglangOptions | None) -> Iterator[Finding]:
    opts = _opts(options)
    tp, pp = plan.sizes.tp, plan.sizes.pp
    if not opts.model:
        yield Finding(
            code="MDC370",
            pointer="/sglang",
            message="the sglang launcher needs the model to serve: [sglang] model is not set",
            hint='add [sglang] model = "<Hugging Face id or local path>", e.g. '
            '"meta-llama/Llama-3.1-8B-Instruct"',
        )
    if tp * pp != plan.world_size:
        yield Finding(
            code="MDC371",
            pointer="/parallelism",
            message=f"one SGLang server uses tp {tp} x pp {pp} = {tp * pp} GPUs, but "
            f"the job has {plan.nnodes} x {plan.nproc_per_node} = "
            f"{plan.world_size}",
            hint=f"set tp and pp so that tp x pp = {plan.world_size}, e.g. tp = "
            f"{plan.world_size} and pp = 1, or tp = {plan.nproc_per_node} and "
            f"pp = {plan.nnodes}",
        )
    if plan.sizes.cp > 1:
        yield Finding(
            code="MDC372",
            pointer="/parallelism/cp",
            message=f"the sglang launcher passes no context parallelism (cp {plan.sizes.cp})",
            hint="remove cp (or set it to 1)",
        )
    yield from _clash_findings(plan, opts)
    if not any(w == MODULE or w.endswith("/launch_server.py") for w in plan.job.argv):
        yield Finding(
            code="MDC374",
            pointer="/job/command",
            severity=Severity.WARNING,
            message=f"the command {' '.join(plan.job.argv)!r} does not look like an "
            "SGLang server; the sglang launcher appends the model and "
            "SGLang's flags to it",
            hint=f'use command = ["python", "-m", "{MODULE}"]',
        )
    if plan.elastic:
        yield Finding(
            code="MDC375",
            pointer="/distributed/min_nnodes",
            message=f"an SGLang server has a fixed size; it cannot run an elastic "
            f"job (min_nnodes {plan.min_nnodes} < nnodes {plan.nnodes})",
            hint=f"remove min_nnodes, or set it to nnodes ({plan.nnodes})",
        )


#: the engine settings the serving memory check reads from the arguments (server_args.py)
MEMORY_FLAGS = FlagTable(
    [
        KnownFlag(
            name="--mem-fraction-static",
            source="[sglang] args",
            key="share",
            nargs=1,
            convert=float,
        ),
        KnownFlag(name="--kv-cache-dtype", source="[sglang] args", key="kv_dtype", nargs=1),
        KnownFlag(
            name="--context-length", source="[sglang] args", key="max_len", nargs=1, convert=int
        ),
        # the scheduler's per-step limits: running requests, and the tokens of one prefill
        # chunk
        KnownFlag(
            name="--max-running-requests",
            source="[sglang] args",
            key="max_batch",
            nargs=1,
            convert=int,
        ),
        KnownFlag(
            name="--chunked-prefill-size",
            source="[sglang] args",
            key="step_tokens",
            nargs=1,
            convert=int,
        ),
        # DP attention, which SGLang's own share reserves CUDA-graph memory for
        KnownFlag(
            name="--dp-size",
            source="[sglang] args",
            key="dp",
            nargs=1,
            convert=int,
            aliases=("--data-parallel-size",),
        ),
        KnownFlag(name="--enable-dp-attention", source="[sglang] args", key="dp_attention"),
        # eager mode: no CUDA graphs (the serving model's per-layer launch cost), and the
        # largest decode batch captured in one (a larger step runs eager)
        KnownFlag(name="--disable-cuda-graph", source="[sglang] args", key="eager"),
        KnownFlag(
            name="--cuda-graph-max-bs",
            source="[sglang] args",
            key="graph_batch",
            nargs=1,
            convert=int,
        ),
        KnownFlag(
            name="--cuda-graph-bs",
            source="[sglang] args",
            key="graph_sizes",
            nargs="+",
            convert=int,
        ),
    ]
)


def graph_batch(values: Mapping[str, Any]) -> int | None:
    """The largest decode batch SGLang captures a CUDA graph for, where the flags set it:
    the largest of --cuda-graph-bs (which sets the sizes themselves), else
    --cuda-graph-max-bs."""
    sizes = values.get("graph_sizes")
    return max(sizes) if sizes else values.get("graph_batch")


def serving(plan: Plan, options: SglangOptions | None) -> ServingSetup:
    values, _ = MEMORY_FLAGS.read([*plan.job.argv, *_opts(options).args])
    share = values.get("share")
    setup = ServingSetup(
        engine="SGLang",
        tp=plan.sizes.tp,
        pp=plan.sizes.pp,
        ep=plan.sizes.ep,
        etp=plan.sizes.etp,
        kv_dtype=values.get("kv_dtype", "auto"),
        max_len=values.get("max_len"),
        max_batch=values.get("max_batch"),
        step_tokens=values.get("step_tokens"),
        cuda_graphs=not values.get("eager", False),
        graph_batch=graph_batch(values),
    )
    if share is None:  # the estimate takes the share SGLang picks for this server
        own = SglangServer(
            tp=plan.sizes.tp,
            pp=plan.sizes.pp,
            dp=values.get("dp", 1) if values.get("dp_attention") else 1,
            chunked_prefill=values.get("step_tokens"),
            max_running=values.get("max_batch"),
        )
        return attrs.evolve(setup, sglang=own)
    return attrs.evolve(setup, share=share, share_source="--mem-fraction-static")


@mdc.hookimpl
def mdc_register_launchers() -> list[LauncherSpec]:
    return [
        LauncherSpec(
            name="sglang",
            description="SGLang server (sglang.launch_server): one node, or one server over every "
            "node with SGLang's own --nnodes/--node-rank/--dist-init-addr",
            parallelism="model",
            workload="serving",
            emit=emit,
            check=check,
            serving=serving,
            schema=read_schema("mdc_schemas", "plugins/sglang.v1.schema.json"),
            options_type=SglangOptions,
            arguments=READING,
        )
    ]
