"""trtllm: TensorRT-LLM's OpenAI-compatible server (``trtllm-serve``) over the plan's GPUs.

The job's command is the server program (``trtllm-serve``); mdc appends the model
(positional), ``--host``, ``--port``, ``--tp_size``, ``--pp_size``, ``--ep_size`` (when
[parallelism] ep is above 1), the batch and token limits, the KV-cache memory fraction,
``--extra_llm_api_options`` (a YAML file mdc writes from ``enable_attention_dp`` and
``[trtllm.extra_llm_api_options]``) and then ``[trtllm] args``. The flag names are those of
the click options of ``tensorrt_llm/commands/serve.py`` (docs/serving.md pins the source).

One server uses tp x pp GPUs (TensorRT-LLM's Mapping: world_size = tp x pp x cp); the job
holds ``world / (tp x pp)`` of them (replicas):

* a server inside one node: ``trtllm-serve`` starts its tp x pp ranks itself. Several per
  node run side by side through ``launch/trtllm-node.sh``, server k of a node on GPUs
  ``k x tp x pp ..`` (CUDA_VISIBLE_DEVICES) and HTTP port ``port + k``;
* a server over whole nodes: its ranks form one MPI world, which TensorRT-LLM needs an MPI
  launcher for. On SLURM the server's first node runs ``srun --overlap --mpi=pmix`` over
  the server's nodes with ``trtllm-llmapi-launch`` in front of the server (TensorRT-LLM's
  multi-node recipe); the other nodes' tasks leave their GPUs to that step. Backends
  without an MPI launcher across their nodes refuse it (MDC705).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from mdc.api import (
    Artifact,
    Endpoint,
    Finding,
    Launch,
    Plan,
    Role,
    Server,
    ServingSetup,
    Severity,
    Word,
)
from mdc.api.flags import FlagTable, FlagUse, KnownFlag, command_pointer
from mdc.api.shell import out_file
from mdc_builtin.launchers._supervise import WAIT_FOR_FIRST_FAILURE, leaving_traps

NODE_SCRIPT = "launch/trtllm-node.sh"
EXTRA_FILE = "launch/trtllm-extra-llm-api-options.yaml"
DEFAULT_PORT = 8000
DEFAULT_HOST = "0.0.0.0"
PROGRAM = "trtllm-serve"
#: TensorRT-LLM's wrapper that turns the ranks of an MPI world into one LLM API server
LLMAPI_LAUNCH = "trtllm-llmapi-launch"
#: backends whose nodes an MPI world can span (an srun step over the job's nodes)
MPI_BACKENDS = ("slurm",)
#: the default of --kv_cache_free_gpu_memory_fraction (serve.py)
DEFAULT_FREE_FRACTION = 0.9
#: the default of --max_num_tokens (serve.py): the tokens of one step
DEFAULT_MAX_NUM_TOKENS = 8192

#: serve.py's click options mdc writes from a key, each with its other spellings and
#: the option field it is read into (a copy in the arguments is read as the key)
VALUE_FLAGS: dict[str, tuple[tuple[str, ...], str, type]] = {
    "--host": ((), "host", str),
    "--port": ((), "port", int),
    "--backend": ((), "backend", str),
    "--max_batch_size": ((), "max_batch_size", int),
    "--max_num_tokens": ((), "max_num_tokens", int),
    "--max_seq_len": ((), "max_seq_len", int),
    "--kv_cache_free_gpu_memory_fraction": (
        ("--free_gpu_memory_fraction",),
        "kv_cache_free_gpu_memory_fraction",
        float,
    ),
}
#: the size flags: read and compared with the plan's sizes ([parallelism])
SIZE_FLAGS: dict[str, tuple[tuple[str, ...], str]] = {
    "--tp_size": (("--tensor_parallel_size",), "tp"),
    "--pp_size": (("--pipeline_parallel_size",), "pp"),
    "--ep_size": (("--moe_expert_parallel_size",), "ep"),
}
EXTRA_FLAG = "--extra_llm_api_options"
#: ``--config`` is serve.py's other spelling of --extra_llm_api_options
EXTRA_ALIASES = ("--config",)


def flag_table(where: str, role: bool = False) -> FlagTable:
    """serve.py's options mdc writes, as mdc's shared flag reader knows them; a role table's
    size flags are its own keys (tp_size, pp_size, ep_size), else the plan's sizes."""
    flags = [
        KnownFlag(
            name=name,
            source=f"[{where}] {key}",
            key=key,
            nargs=1,
            convert=kind,
            aliases=aliases,
        )
        for name, (aliases, key, kind) in VALUE_FLAGS.items()
    ]
    flags += [
        KnownFlag(
            name=name,
            source=f"[{where}] {name[2:]}" if role else f"[parallelism] {size}",
            key=name[2:] if role else f"size_{size}",
            nargs=1,
            convert=int,
            aliases=aliases,
        )
        for name, (aliases, size) in SIZE_FLAGS.items()
    ]
    flags.append(
        KnownFlag(
            name=EXTRA_FLAG,
            source=f"[{where}] extra_llm_api_options",
            key="extra_file",
            nargs=1,
            aliases=EXTRA_ALIASES,
        )
    )
    return FlagTable(flags)


FLAGS = flag_table("trtllm")


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class RoleOptions:
    """``[trtllm.context]`` / ``[trtllm.generation]``: one role's servers of a disaggregated
    job; unset limits and options are [trtllm]'s."""

    servers: int = 1
    tp_size: int | None = None
    pp_size: int | None = None
    ep_size: int | None = None
    enable_attention_dp: bool | None = None
    max_batch_size: int | None = None
    max_num_tokens: int | None = None
    max_seq_len: int | None = None
    kv_cache_free_gpu_memory_fraction: float | None = None
    extra_llm_api_options: dict[str, Any] | None = None
    args: tuple[str, ...] = ()


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class TrtllmOptions:
    """The ``[trtllm]`` table."""

    model: str | None = None
    host: str | None = None
    port: int | None = None
    backend: str | None = None
    max_batch_size: int | None = None
    max_num_tokens: int | None = None
    max_seq_len: int | None = None
    kv_cache_free_gpu_memory_fraction: float | None = None
    enable_attention_dp: bool | None = None
    extra_llm_api_options: dict[str, Any] | None = None
    args: tuple[str, ...] = ()
    #: disaggregated serving: both role tables given
    context: RoleOptions | None = None
    generation: RoleOptions | None = None
    #: the disaggregated server's (trtllm-serve disaggregated) port
    router_port: int | None = None
    #: cache_transceiver_config of both roles (CacheTransceiverConfig)
    cache_transceiver_backend: str | None = None
    max_tokens_in_buffer: int | None = None


def disaggregated(options: TrtllmOptions | None) -> bool:
    return options is not None and (options.context is not None or options.generation is not None)


def _opts(options: TrtllmOptions | None) -> TrtllmOptions:
    return options if options is not None else TrtllmOptions()


# only read, never compared or printed: no generated ==, hash or repr
@attrs.frozen(kw_only=True, eq=False, repr=False)
class Resolved:
    """The options with the flags of ``args`` read in, and what is left of ``args``."""

    options: Any
    #: the arguments without the flags read as keys
    rest: tuple[str, ...]
    #: the size flags found (--tp_size ...), by plan size name, with their uses
    sizes: Mapping[str, FlagUse]
    #: a user's own --extra_llm_api_options file (kept in rest), when given
    extra_file: FlagUse | None
    #: (use, the table's value) for each flag whose value differs from its key's
    clashes: tuple[tuple[FlagUse, Any], ...]
    #: flags given without a usable value
    broken: tuple[FlagUse, ...]


def resolve(options: Any, table: FlagTable = FLAGS) -> Resolved:
    """Read the owned flags of ``args`` as TensorRT-LLM reads them: the last one wins; a
    key the table also sets must agree (both would reach the server, the last winning)."""
    uses = table.find(options.args)
    read: dict[str, Any] = {}
    clashes: list[tuple[FlagUse, Any]] = []
    sizes: dict[str, FlagUse] = {}
    extra: FlagUse | None = None
    dropped: list[FlagUse] = []
    broken = [use for use in uses if use.error is not None]
    for use in uses:
        key = use.flag.key
        if use.error is not None or key is None:
            continue
        if key == "extra_file":
            extra = use
            continue
        dropped.append(use)
        if key.startswith("size_"):
            sizes[key.removeprefix("size_")] = use
            continue
        mine = getattr(options, key)
        if mine is not None and mine != use.value:
            clashes.append((use, mine))
        read[key] = use.value
    drop = {i for use in [*dropped, *broken] for i in range(use.index, use.index + use.count)}
    rest = tuple(word for i, word in enumerate(options.args) if i not in drop)
    merged = {k: v for k, v in read.items() if getattr(options, k) is None}
    return Resolved(
        options=attrs.evolve(options, **merged),
        rest=rest,
        sizes=sizes,
        extra_file=extra,
        clashes=tuple(clashes),
        broken=tuple(broken),
    )


def extra_options(opts: TrtllmOptions) -> dict[str, Any]:
    """The LLM API options file's content: the user's table, enable_attention_dp over it."""
    data = dict(opts.extra_llm_api_options or {})
    if opts.enable_attention_dp is not None:
        data["enable_attention_dp"] = opts.enable_attention_dp
    return data


def yaml_text(data: Mapping[str, Any], comment: str) -> str:
    """A YAML document (JSON is YAML; json keeps it exact and deterministic)."""
    import json

    return f"# {comment}\n" + json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def server_gpus(plan: Plan) -> int:
    return plan.sizes.tp * plan.sizes.pp


def per_node(plan: Plan) -> int:
    """Servers on one node (0: a server spans several nodes)."""
    return plan.nproc_per_node // server_gpus(plan)


def nodes_per_server(plan: Plan) -> int:
    return max(1, server_gpus(plan) // plan.nproc_per_node)


def server_words(plan: Plan, opts: TrtllmOptions, rest: Sequence[str]) -> list[str]:
    """The server's command after the program, up to what its place adds (its port)."""
    words = [opts.model or "", "--host", opts.host or DEFAULT_HOST]
    if opts.backend is not None:
        words += ["--backend", opts.backend]
    words += ["--tp_size", str(plan.sizes.tp), "--pp_size", str(plan.sizes.pp)]
    if plan.sizes.ep > 1:
        words += ["--ep_size", str(plan.sizes.ep)]
    for key, flag in (
        ("max_batch_size", "--max_batch_size"),
        ("max_num_tokens", "--max_num_tokens"),
        ("max_seq_len", "--max_seq_len"),
        ("kv_cache_free_gpu_memory_fraction", "--kv_cache_free_gpu_memory_fraction"),
    ):
        value = getattr(opts, key)
        if value is not None:
            words += [flag, format(value, "g") if isinstance(value, float) else str(value)]
    return words + list(rest)


def _extra_words(opts: TrtllmOptions) -> list[Word]:
    return [EXTRA_FLAG, out_file(EXTRA_FILE)] if extra_options(opts) else []


def node_script(plan: Plan, opts: TrtllmOptions) -> str:
    """launch/trtllm-node.sh: this node's servers (several per node, or its part of a server
    over nodes); its arguments are the server's command without the port."""
    port = opts.port or DEFAULT_PORT
    lines = [
        "#!/usr/bin/env bash",
        f"# Generated by mdc (trtllm launcher) for job {plan.job.name!r}: servers of tp "
        f"{plan.sizes.tp} x pp {plan.sizes.pp} = {server_gpus(plan)} GPUs on nodes of "
        f"{plan.nproc_per_node}.",
        "# launch/worker.sh runs it with NODE_RANK and NODE_HOSTS set and the server's command",
        "# (without --port) as its arguments.",
        "set -euo pipefail",
        ': "${NODE_RANK:?NODE_RANK must be set by the backend}"',
    ]
    count = per_node(plan)
    if count:
        return "\n".join([*lines, *_side_by_side(count, server_gpus(plan), port)]) + "\n"
    span = nodes_per_server(plan)
    ranks = span * plan.nproc_per_node
    return (
        "\n".join(
            [
                *lines,
                ': "${NODE_HOSTS:?NODE_HOSTS must be set by the backend}"',
                'read -r -a hosts <<< "$NODE_HOSTS"',
                f"first=$((NODE_RANK / {span} * {span}))",
                "if ((NODE_RANK != first)); then",
                '  echo "mdc: node $NODE_RANK runs its ranks of the server of node $first '
                '(its srun step)" >&2',
                "  exit 0",
                "fi",
                f'nodelist="$(IFS=,; printf \'%s\' "${{hosts[*]:first:{span}}}")"',
                "# one MPI world over the server's nodes (PMIx); trtllm-llmapi-launch makes rank 0",
                "# the server and the other ranks its workers",
                f"exec srun --overlap --mpi=pmix --kill-on-bad-exit=1 --nodes={span} "
                f'--ntasks={ranks} --ntasks-per-node={plan.nproc_per_node} --nodelist="$nodelist" '
                f'{LLMAPI_LAUNCH} "$@" --port {port}',
            ]
        )
        + "\n"
    )


def _side_by_side(count: int, gpus: int, port: int) -> list[str]:
    """Bash lines: ``count`` servers of ``gpus`` GPUs, server k on port + k; the node's part
    ends when one fails (the others are stopped) or all have ended."""
    if count == 1:
        return [f'exec "$@" --port {port}']
    lines = [
        "# the node's GPUs as the backend hands them (CUDA_VISIBLE_DEVICES), else 0..n-1",
        'if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then',
        '  IFS=, read -r -a gpus <<< "$CUDA_VISIBLE_DEVICES"',
        "else",
        f"  gpus=({' '.join(str(g) for g in range(count * gpus))})",
        "fi",
        "# devices FIRST COUNT: those GPUs, separated by commas",
        "devices() { local IFS=,; printf '%s' \"${gpus[*]:$1:$2}\"; }",
        *leaving_traps(),
    ]
    for k in range(count):
        lines += [
            f'CUDA_VISIBLE_DEVICES="$(devices {k * gpus} {gpus})" "$@" --port {port + k} &',
            'pids+=("$!")',
        ]
    return lines + WAIT_FOR_FIRST_FAILURE.splitlines()


def emit(plan: Plan, options: TrtllmOptions | None) -> Launch:
    resolved = resolve(_opts(options))
    opts = resolved.options
    port = opts.port or DEFAULT_PORT
    words: list[Word] = [
        *plan.job.argv,
        *server_words(plan, opts, []),
        *_extra_words(opts),
        *resolved.rest,
    ]
    files: list[Artifact] = []
    if extra_options(opts):
        files.append(
            Artifact.text(
                EXTRA_FILE,
                yaml_text(extra_options(opts), "trtllm-serve --extra_llm_api_options (LLM API)"),
            )
        )
    if per_node(plan) == 1:  # one server per node: its command as it is
        argv: tuple[Word, ...] = (*words, "--port", str(port))
    else:
        argv = ("bash", out_file(NODE_SCRIPT), *words)
        files.append(Artifact.text(NODE_SCRIPT, node_script(plan, opts), executable=True))
    env: dict[str, Word] = {
        "TRTLLM_TP_SIZE": str(plan.sizes.tp),
        "TRTLLM_PP_SIZE": str(plan.sizes.pp),
        "NNODES": str(plan.nnodes),
        "NPROC_PER_NODE": str(plan.nproc_per_node),
    }
    worker_env = {k: v for k, v in env.items() if isinstance(v, str)}
    return Launch(
        roles=(Role(name="worker", argv=argv, env=env),),
        files=tuple(files),
        worker_env=worker_env,
        endpoint=Endpoint(port=port, every_node=plan.nnodes > 1 and per_node(plan) > 0),
        servers=servers(plan, port, extra_options(opts).get("enable_attention_dp") is True),
    )


def servers(plan: Plan, port: int, attention_dp: bool = False) -> tuple[Server, ...]:
    """Each server: its nodes, its GPUs there and its port; with attention data parallel,
    its tp ranks each run attention for their own requests (dp = tp)."""
    sizes, gpus = plan.sizes, server_gpus(plan)
    dp = sizes.tp if attention_dp else 1
    count = per_node(plan)
    role = "server" if plan.world_size == gpus else "replica"
    found: list[Server] = []
    if count:
        for node in range(plan.nnodes):
            for k in range(count):
                found.append(
                    Server(
                        role=role,
                        nodes=(node,),
                        gpus=gpus,
                        tp=sizes.tp,
                        pp=sizes.pp,
                        dp=dp,
                        ep=sizes.ep,
                        port=port + k,
                        first_gpu=k * gpus,
                    )
                )
        return tuple(found)
    span = nodes_per_server(plan)
    for first in range(0, plan.nnodes, span):
        found.append(
            Server(
                role=role,
                nodes=tuple(range(first, min(plan.nnodes, first + span))),
                gpus=gpus,
                tp=sizes.tp,
                pp=sizes.pp,
                dp=dp,
                ep=sizes.ep,
                port=port,
            )
        )
    return tuple(found)


def size_findings(plan: Plan, where: str, pointer: str) -> Iterator[Finding]:
    """TensorRT-LLM's own refusals of the sizes (tensorrt_llm/mapping.py), then the layout's."""
    tp, pp, ep, gpus = plan.sizes.tp, plan.sizes.pp, plan.sizes.ep, plan.nproc_per_node
    if ep > 1 and tp % ep:
        # Mapping: moe_tp_size * moe_ep_size must equal tp_size (moe_tp = tp // ep)
        yield Finding(
            code="MDC702",
            pointer="/parallelism/ep",
            message=f"TensorRT-LLM splits the experts of tp {tp} ranks into ep groups "
            f"(moe_tp_size x moe_ep_size = tp_size), so ep {ep} must divide tp {tp}",
            hint=f"set ep to a divisor of {tp}, e.g. ep = {tp} (one expert group per rank)",
        )
    if plan.sizes.etp not in (1, max(1, tp // max(1, ep))):
        yield Finding(
            code="MDC702",
            pointer="/parallelism/etp",
            message=f"TensorRT-LLM's expert tensor parallel size is tp / ep = {tp // max(1, ep)}"
            f", not etp {plan.sizes.etp}",
            hint="remove etp (TensorRT-LLM derives it from tp and ep)",
        )
    engine = tp * pp
    fits = gpus % engine == 0 if engine <= gpus else engine % gpus == 0
    if not fits or plan.world_size % engine:
        yield Finding(
            code="MDC701",
            pointer=pointer,
            message=f"a {where} server uses tp {tp} x pp {pp} = {engine} GPUs (TensorRT-LLM: "
            f"world_size = tp_size x pp_size), which must divide a node's {gpus} GPUs or be "
            f"whole nodes, and divide the job's {plan.world_size}",
            hint=f"set tp and pp so that tp x pp divides {gpus} (servers side by side) or is "
            f"a multiple of {gpus} dividing {plan.world_size}, e.g. tp = {gpus} and pp = 1",
        )
    if plan.sizes.cp > 1:
        yield Finding(
            code="MDC704",
            pointer="/parallelism/cp",
            message=f"the {where} launcher passes no context parallelism (cp {plan.sizes.cp})",
            hint="remove cp (or set it to 1); pass --cp_size in args for TensorRT-LLM's own",
        )


def mpi_findings(plan: Plan, spans: bool, code: str, launcher: str) -> Iterator[Finding]:
    """A server over several nodes needs an MPI launcher across them (MDC705/MDC717)."""
    if spans and plan.backend not in MPI_BACKENDS:
        yield Finding(
            code=code,
            pointer="/distributed/backend",
            message=f"a {launcher} server over several nodes is one MPI world (srun --mpi=pmix "
            f"or mpirun with trtllm-llmapi-launch); the {plan.backend} backend runs one "
            "process per node and has no MPI launcher across its nodes",
            hint="use the slurm backend, or servers that fit one node (tp x pp at most "
            f"nproc_per_node = {plan.nproc_per_node})",
        )


def flag_findings(
    resolved: Resolved, plan: Plan, launcher: str, pointer: str, writes_extra: bool
) -> Iterator[Finding]:
    """A flag of the arguments that contradicts a key, or that cannot be read (MDC703)."""
    for use in resolved.broken:
        yield Finding(
            code="MDC703",
            pointer=f"{pointer}/{use.index}",
            message=f"{use.error} (trtllm-serve would refuse it)",
            hint=f"give {use.spelled} one value",
        )
    for use, mine in resolved.clashes:
        yield Finding(
            code="MDC703",
            pointer=f"{pointer}/{use.index}",
            message=f"{use.spelled} {use.value} in the arguments contradicts "
            f"{use.flag.source} = {mine}",
            hint=f"keep one of the two: remove {use.spelled} from the arguments, or make the "
            "values agree",
        )
    for size, use in resolved.sizes.items():
        planned = getattr(plan.sizes, size)
        if use.value != planned:
            yield Finding(
                code="MDC703",
                pointer=f"{pointer}/{use.index}",
                message=f"{use.spelled} {use.value} in the arguments contradicts the plan's "
                f"{size} {planned} ([parallelism] {size}, or its default), from which mdc "
                f"requests the {launcher} server's GPUs",
                hint=f"set [parallelism] {size} = {use.value} and remove {use.spelled} from "
                "the arguments",
            )
    if resolved.extra_file is not None and writes_extra:
        use = resolved.extra_file
        yield Finding(
            code="MDC708",
            pointer=f"{pointer}/{use.index}",
            message=f"trtllm-serve reads one --extra_llm_api_options file; the arguments pass "
            f"{use.spelled}, and mdc writes one from enable_attention_dp / "
            "extra_llm_api_options",
            hint="move the file's options into the extra_llm_api_options table, or drop "
            "enable_attention_dp and extra_llm_api_options",
        )


def shared_check(plan: Plan, options: TrtllmOptions | None) -> Iterator[Finding]:
    """The findings of both forms."""
    yield from common_findings(plan, resolve(_opts(options)).options)


def check(plan: Plan, options: TrtllmOptions | None) -> Iterator[Finding]:
    """The aggregated form's own findings."""
    resolved = resolve(_opts(options))
    opts = resolved.options
    yield from size_findings(plan, "trtllm", "/parallelism")
    yield from mpi_findings(plan, per_node(plan) == 0, "MDC705", "trtllm")
    pointer = "/trtllm/kv_cache_free_gpu_memory_fraction"
    yield from kv_override_findings(opts, extra_options(opts), pointer)
    yield from flag_findings(resolved, plan, "trtllm", "/trtllm/args", bool(extra_options(opts)))


def kv_override_findings(opts: Any, extra: Mapping[str, Any], pointer: str) -> Iterator[Finding]:
    """A fraction on the command line that the options file's kv_cache_config replaces
    (update_llm_args_with_extra_dict: llm_args | the file's; MDC709, a warning)."""
    fraction = opts.kv_cache_free_gpu_memory_fraction
    kv_config = extra.get("kv_cache_config")
    if fraction is None or not isinstance(kv_config, dict):
        return
    kept = kv_config.get("free_gpu_memory_fraction", DEFAULT_FREE_FRACTION)
    if kept != fraction:
        yield Finding(
            code="MDC709",
            pointer=pointer,
            severity=Severity.WARNING,
            message=f"kv_cache_config in the LLM API options replaces the KV cache settings "
            f"of trtllm-serve's command line, so --kv_cache_free_gpu_memory_fraction "
            f"{fraction:g} has no effect: TensorRT-LLM keeps {kept:g}",
            hint=f"set free_gpu_memory_fraction = {fraction:g} inside kv_cache_config (or "
            "drop kv_cache_free_gpu_memory_fraction)",
        )


def common_findings(plan: Plan, opts: TrtllmOptions) -> Iterator[Finding]:
    """The model, the command and elastic jobs (both forms)."""
    if not opts.model:
        yield Finding(
            code="MDC700",
            pointer="/trtllm",
            message="the trtllm launcher needs the model to serve: [trtllm] model is not set",
            hint='add [trtllm] model = "<Hugging Face id or local path>", e.g. '
            '"meta-llama/Llama-3.1-8B-Instruct"',
        )
    argv = plan.job.argv
    if not argv or argv[-1].rsplit("/", 1)[-1] != PROGRAM:
        yield Finding(
            code="MDC706",
            pointer=command_pointer(plan.job.command, 0),
            severity=Severity.WARNING,
            message=f"the command {' '.join(argv)!r} does not end in {PROGRAM}; the trtllm "
            "launcher appends the model and trtllm-serve's options to it",
            hint=f'use command = ["{PROGRAM}"]',
        )
    if plan.elastic:
        yield Finding(
            code="MDC707",
            pointer="/distributed/min_nnodes",
            message=f"a TensorRT-LLM server has a fixed size; it cannot run an elastic job "
            f"(min_nnodes {plan.min_nnodes} < nnodes {plan.nnodes})",
            hint=f"remove min_nnodes, or set it to nnodes ({plan.nnodes})",
        )


def memory_setup(
    engine: str, tp: int, pp: int, ep: int, opts: Any, extra: Mapping[str, Any]
) -> ServingSetup:
    """One server's memory: the KV cache takes --kv_cache_free_gpu_memory_fraction of what
    the weights leave (KvCacheConfig.free_gpu_memory_fraction); its dtype from kv_cache_config."""
    fraction = opts.kv_cache_free_gpu_memory_fraction
    source = "--kv_cache_free_gpu_memory_fraction"
    kv_config = extra.get("kv_cache_config")
    kv_dtype = kv_config.get("dtype", "auto") if isinstance(kv_config, dict) else "auto"
    if isinstance(kv_config, dict):
        # the file's kv_cache_config replaces the command line's (llm_args | file)
        fraction = kv_config.get("free_gpu_memory_fraction", DEFAULT_FREE_FRACTION)
        source = "kv_cache_config.free_gpu_memory_fraction of the LLM API options (or its 0.9)"
    return ServingSetup(
        engine=engine,
        tp=tp,
        pp=pp,
        ep=ep,
        etp=max(1, tp // ep),
        share=fraction if fraction is not None else DEFAULT_FREE_FRACTION,
        share_source=source
        if fraction is not None
        else "trtllm-serve's default --kv_cache_free_gpu_memory_fraction",
        share_of="free",
        kv_dtype=str(kv_dtype),
        max_len=opts.max_seq_len,
        max_batch=opts.max_batch_size,
        step_tokens=opts.max_num_tokens,
        # the engine profiles a step of max_num_tokens before it sizes the KV cache
        profiled_tokens=opts.max_num_tokens or DEFAULT_MAX_NUM_TOKENS,
    )


def graph_settings(extra: Mapping[str, Any], backend: str | None) -> dict[str, Any]:
    """The serving model's CUDA-graph fields of a server run with these LLM API options."""
    return {"cuda_graphs": cuda_graphs(extra), "graph_batch": graph_batch(extra, backend)}


def cuda_graphs(extra: Mapping[str, Any]) -> bool:
    """Whether the engine decodes in CUDA graphs: the LLM API captures them unless its
    options set ``cuda_graph_config`` to null (on by default since NVIDIA/TensorRT-LLM#5480,
    July 2025)."""
    return not ("cuda_graph_config" in extra and extra["cuda_graph_config"] is None)


#: CudaGraphConfig's largest captured batch where neither max_batch_size nor batch_sizes
#: is set (llm_args.py: ``max_batch_size or 128``)
GRAPH_MAX_DEFAULT = 128
#: without padding, CudaGraphConfig generates every size from 1 to this one, then 64, 128
#: and powers of two (_generate_cuda_graph_batch_sizes)
UNPADDED_EVERY_SIZE = 32


def graph_batch(extra: Mapping[str, Any], backend: str | None = None) -> int | None:
    """The largest decode batch, per rank, up to which every step replays a CUDA graph, as
    ``cuda_graph_config`` sets it (its defaults where the options leave it). With
    ``enable_padding`` a batch rounds up to the next captured size: every batch up to the
    largest (``max_batch_size``, else the largest of ``batch_sizes``, else 128). Without it
    (the default) a batch runs in a graph only at a captured size itself, so the bound is
    where the sizes stop being every size: 32 of the generated ones (an exact batch of 64
    or 128 is not counted), the run of 1, 2, 3 ... of a listed ``batch_sizes``. None with
    the graphs off, and off the PyTorch backend (a built engine's C++ runtime launches
    without the Python per-kernel cost the eager term measures: not bounded here)."""
    config = extra.get("cuda_graph_config", {})
    if backend not in (None, "pytorch") or not isinstance(config, Mapping):
        return None
    listed, most = config.get("batch_sizes") or [], config.get("max_batch_size") or 0
    if not (isinstance(listed, list) and all(isinstance(s, int) for s in [*listed, most])):
        return None  # not a config the engine would take: not read here
    sizes = sorted(listed)
    largest = most or (sizes[-1] if sizes else GRAPH_MAX_DEFAULT)
    if config.get("enable_padding", False):
        return largest
    if not sizes:
        return min(UNPADDED_EVERY_SIZE, largest)
    run = 0
    while run + 1 in sizes:
        run += 1
    return run


def serving(plan: Plan, options: TrtllmOptions | None) -> ServingSetup | None:
    opts = resolve(_opts(options)).options
    extra = extra_options(opts)
    setup = memory_setup("TensorRT-LLM", plan.sizes.tp, plan.sizes.pp, plan.sizes.ep, opts, extra)
    return attrs.evolve(setup, **graph_settings(extra, opts.backend))
