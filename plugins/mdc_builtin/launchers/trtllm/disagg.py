"""trtllm's disaggregated form: context and generation servers behind ``trtllm-serve
disaggregated``.

Given ``[trtllm.context]`` and ``[trtllm.generation]``, the job's GPUs hold ``servers``
context servers, then ``servers`` generation servers, each of its role's tp x pp GPUs, in
order over node 0's GPUs, then node 1's: a server inside one node takes the next GPUs there
(CUDA_VISIBLE_DEVICES), a server over whole nodes takes the next nodes (SLURM only, its
srun --mpi=pmix step, as the aggregated form). Server i listens on ``port + i``. Each role's
``trtllm-serve`` reads its own LLM API options file (``launch/trtllm-context.yaml``,
``launch/trtllm-generation.yaml``) with ``cache_transceiver_config``; the context file also
sets ``disable_overlap_scheduler: true`` as TensorRT-LLM's disaggregated examples do (the
role's own ``extra_llm_api_options`` may set it otherwise).

Node 0 also runs the disaggregated server (``trtllm-serve disaggregated -c CONFIG``, no GPU)
on ``router_port``; ``launch/trtllm-disagg.sh`` writes CONFIG there at run time, each
server's URL ``host:port`` from ``$NODE_HOSTS`` (the keys of ``extract_disagg_cfg`` and
``extract_ctx_gen_cfgs`` in tensorrt_llm/llmapi/disagg_utils.py), in a ``mktemp -d`` folder
that the script's EXIT trap removes (the config is printed to stderr first, for the log).
"""

from __future__ import annotations

from collections.abc import Iterator
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
    StepLimits,
    Word,
)
from mdc.api.shell import out_file, shell_word
from mdc_builtin.launchers._disagg import node_cases
from mdc_builtin.launchers._supervise import supervising_script
from mdc_builtin.launchers.trtllm.aggregated import (
    DEFAULT_HOST,
    EXTRA_FLAG,
    LLMAPI_LAUNCH,
    RoleOptions,
    TrtllmOptions,
    flag_findings,
    flag_table,
    graph_settings,
    kv_override_findings,
    memory_setup,
    mpi_findings,
    resolve,
    yaml_text,
)

SCRIPT = "launch/trtllm-disagg.sh"
ROLES = ("context", "generation")
DEFAULT_SERVER_PORT = 8001
DEFAULT_ROUTER_PORT = 8000
#: CacheTransceiverConfig.backend's default when the spec names none
DEFAULT_TRANSCEIVER = "DEFAULT"
MAX_PORT = 65535
#: the limits a role takes from [trtllm] when its table leaves them unset
SHARED = (
    "max_batch_size",
    "max_num_tokens",
    "max_seq_len",
    "kv_cache_free_gpu_memory_fraction",
    "enable_attention_dp",
)
ROLE_FLAGS = {role: flag_table(f"trtllm.{role}", role=True) for role in ROLES}


# only read, never compared or printed: no generated ==, hash or repr
@attrs.frozen(kw_only=True, eq=False, repr=False)
class Shape:
    """One role's servers: the role table with its args read in and [trtllm]'s limits."""

    role: str
    options: RoleOptions
    rest: tuple[str, ...]

    @property
    def tp(self) -> int:
        return self.options.tp_size or 1

    @property
    def pp(self) -> int:
        return self.options.pp_size or 1

    @property
    def ep(self) -> int:
        return self.options.ep_size or 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp


def shape(options: TrtllmOptions, role: str) -> Shape:
    own: RoleOptions = getattr(options, role) or RoleOptions(servers=0)
    resolved = resolve(own, ROLE_FLAGS[role])
    read: RoleOptions = resolved.options
    top = resolve(options).options
    merged = {k: getattr(top, k) for k in SHARED if getattr(read, k) is None}
    return Shape(role=role, options=attrs.evolve(read, **merged), rest=resolved.rest)


def role_file(role: str) -> str:
    return f"launch/trtllm-{role}.yaml"


def role_options(options: TrtllmOptions, server: Shape) -> dict[str, Any]:
    """A role's LLM API options file: [trtllm]'s table, the role's, then mdc's keys."""
    data: dict[str, Any] = {}
    if server.role == "context":
        data["disable_overlap_scheduler"] = True
    data.update(options.extra_llm_api_options or {})
    data.update(server.options.extra_llm_api_options or {})
    if server.options.enable_attention_dp is not None:
        data["enable_attention_dp"] = server.options.enable_attention_dp
    transceiver: dict[str, Any] = dict(data.get("cache_transceiver_config") or {})
    transceiver["backend"] = options.cache_transceiver_backend or transceiver.get(
        "backend", DEFAULT_TRANSCEIVER
    )
    if options.max_tokens_in_buffer is not None:
        transceiver["max_tokens_in_buffer"] = options.max_tokens_in_buffer
    data["cache_transceiver_config"] = transceiver
    return data


def server_words(options: TrtllmOptions, server: Shape) -> list[Word]:
    """A role's ``trtllm-serve`` options after the model, up to its port."""
    opts = server.options
    words: list[Word] = [
        "--host",
        options.host or DEFAULT_HOST,
        "--tp_size",
        str(server.tp),
        "--pp_size",
        str(server.pp),
    ]
    if server.ep > 1:
        words += ["--ep_size", str(server.ep)]
    if options.backend is not None:
        words += ["--backend", options.backend]
    for key in SHARED[:4]:
        value = getattr(opts, key)
        if value is not None:
            words += [f"--{key}", format(value, "g") if isinstance(value, float) else str(value)]
    shared = resolve(options).rest  # [trtllm] args: both roles'
    return [*words, EXTRA_FLAG, out_file(role_file(server.role)), *shared, *server.rest]


# only read, never compared or printed: no generated ==, hash or repr
@attrs.frozen(kw_only=True, eq=False, repr=False)
class Placed:
    """A server: its role's shape, its nodes, its first GPU on its first node, its port."""

    shape: Shape
    nodes: tuple[int, ...]
    first_gpu: int
    port: int


def place(plan: Plan, options: TrtllmOptions) -> tuple[list[Placed], list[Finding]]:
    """Context servers, then generation servers, over the job's GPUs in order."""
    gpus, cursor, port = plan.nproc_per_node, 0, options.port or DEFAULT_SERVER_PORT
    placed: list[Placed] = []
    found: list[Finding] = []
    for role in ROLES:
        server = shape(options, role)
        for _ in range(server.options.servers):
            node, first = divmod(cursor, gpus)
            size = server.gpus
            # inside one node, or over whole nodes from a node's first GPU
            if first + size > gpus if size <= gpus else first or size % gpus:
                found.append(_crossing(role, size, gpus, node, first))
                return placed, found
            span = max(1, size // gpus)
            nodes = tuple(range(node, node + span))
            placed.append(Placed(shape=server, nodes=nodes, first_gpu=first, port=port))
            port += 1
            cursor += size
    return placed, found


def _crossing(role: str, size: int, gpus: int, node: int, first: int) -> Finding:
    return Finding(
        code="MDC711",
        pointer=f"/trtllm/{role}/tp_size",
        message=f"a {role} server of {size} GPUs would start at GPU {first} of node {node} and "
        f"cross into the next node: servers take the job's GPUs in order (context first), "
        f"each inside one node of {gpus} or over whole nodes",
        hint=f"give each role's tp_size x pp_size a divisor of {gpus} (or whole nodes), and "
        "the context servers together a multiple of the generation servers' size",
    )


def check(plan: Plan, options: TrtllmOptions) -> Iterator[Finding]:
    for role in ROLES:
        if getattr(options, role) is None:
            yield Finding(
                code="MDC710",
                pointer=f"/trtllm/{role}",
                message=f"disaggregated serving needs both [trtllm.context] and "
                f"[trtllm.generation]; [trtllm.{role}] is missing",
                hint=f"add [trtllm.{role}] with servers and tp_size",
            )
    if any(getattr(options, role) is None for role in ROLES):
        return
    placed, found = place(plan, options)
    yield from found
    yield from _shared_args_findings(plan, options)
    for role in ROLES:
        server = shape(options, role)
        yield from _role_findings(plan, options, server)
    if found:
        return
    used = sum(p.shape.gpus for p in placed)
    if used != plan.world_size:
        yield Finding(
            code="MDC712",
            pointer="/trtllm",
            message=f"the context and generation servers use {used} GPUs, the job has "
            f"{plan.nnodes} x {plan.nproc_per_node} = {plan.world_size}; mdc requests every "
            "GPU of the job for a server and no more",
            hint="set each role's servers (and sizes) so that together they use every GPU, "
            "or change nnodes / nproc_per_node",
        )
    spans = any(len(p.nodes) > 1 for p in placed)
    yield from mpi_findings(plan, spans, "MDC717", "trtllm")
    yield from _port_findings(options, placed)
    if plan.sizes.cp > 1:
        yield Finding(
            code="MDC704",
            pointer="/parallelism/cp",
            message=f"the trtllm launcher passes no context parallelism (cp {plan.sizes.cp})",
            hint="remove cp (or set it to 1)",
        )


def _shared_args_findings(plan: Plan, options: TrtllmOptions) -> Iterator[Finding]:
    """[trtllm] args reach both roles: a size flag there has no role (MDC703)."""
    resolved = resolve(options)
    yield from flag_findings(attrs.evolve(resolved, sizes={}), plan, "trtllm", "/trtllm/args", True)
    for use in resolved.sizes.values():
        yield Finding(
            code="MDC703",
            pointer=f"/trtllm/args/{use.index}",
            message=f"{use.spelled} in [trtllm] args would size both roles' servers; each "
            "role's sizes are its own table's",
            hint=f"remove it; set {use.flag.name[2:]} in [trtllm.context] and "
            "[trtllm.generation] (or pass it in their args)",
        )


def _role_findings(plan: Plan, options: TrtllmOptions, server: Shape) -> Iterator[Finding]:
    role = server.role
    if server.ep > 1 and server.tp % server.ep:
        yield Finding(
            code="MDC713",
            pointer=f"/trtllm/{role}/ep_size",
            message=f"TensorRT-LLM splits the experts of a {role} server's tp {server.tp} "
            f"ranks into ep groups (moe_tp_size x moe_ep_size = tp_size), so ep_size "
            f"{server.ep} must divide {server.tp}",
            hint=f"set ep_size to a divisor of {server.tp}",
        )
    pointer = f"/trtllm/{role}/kv_cache_free_gpu_memory_fraction"
    yield from kv_override_findings(server.options, role_options(options, server), pointer)
    own: RoleOptions = getattr(options, role)
    resolved = resolve(own, ROLE_FLAGS[role])
    yield from flag_findings(resolved, plan, "trtllm", f"/trtllm/{role}/args", True)


def _port_findings(options: TrtllmOptions, placed: list[Placed]) -> Iterator[Finding]:
    router = options.router_port or DEFAULT_ROUTER_PORT
    ports = [p.port for p in placed]
    if ports and max(ports) > MAX_PORT:
        yield Finding(
            code="MDC715",
            pointer="/trtllm/port",
            message=f"server i listens on port + i; the last, {max(ports)}, exceeds {MAX_PORT}",
            hint=f"set port to at most {MAX_PORT - len(ports) + 1}",
        )
    if router in ports:
        yield Finding(
            code="MDC715",
            pointer="/trtllm/router_port",
            message=f"router_port {router} is also a server's port (port + i: "
            f"{ports[0]}..{ports[-1]})",
            hint=f"set router_port outside {ports[0]}..{ports[-1]}, e.g. {DEFAULT_ROUTER_PORT}",
        )


def _server_lines(plan: Plan, options: TrtllmOptions, server: Placed) -> list[str]:
    """Start one server in the background (node script lines)."""
    words = [shell_word(w) for w in server_words(options, server.shape)]
    words += ["--port", str(server.port)]
    role = server.shape.role
    if len(server.nodes) == 1:
        devices = f'"$(devices {server.first_gpu} {server.shape.gpus})"'
        head = f'CUDA_VISIBLE_DEVICES={devices} TRTLLM_DISAGG_ROLE={role} "$@" "$MODEL"'
        return [f"{head} {' '.join(words)} &", 'pids+=("$!")']
    span, ranks = len(server.nodes), server.shape.gpus
    first = server.nodes[0]
    return [
        f'nodelist="$(IFS=,; printf \'%s\' "${{hosts[*]:{first}:{span}}}")"',
        f"TRTLLM_DISAGG_ROLE={role} srun --overlap --mpi=pmix --kill-on-bad-exit=1 "
        f'--nodes={span} --ntasks={ranks} --ntasks-per-node={plan.nproc_per_node} --nodelist="$nodelist" '
        f'{LLMAPI_LAUNCH} "$@" "$MODEL" {" ".join(words)} &',
        'pids+=("$!")',
    ]


def config_lines(plan: Plan, options: TrtllmOptions, placed: list[Placed]) -> list[str]:
    """Bash lines writing the disaggregated server's config (disagg_utils.extract_disagg_cfg)
    to "$config", every URL host:port from NODE_HOSTS."""
    router = options.router_port or DEFAULT_ROUTER_PORT
    lines = [
        "{",
        f"  echo 'hostname: {DEFAULT_HOST}'",
        f"  echo 'port: {router}'",
    ]
    for role, key in (("context", "context_servers"), ("generation", "generation_servers")):
        mine = [p for p in placed if p.shape.role == role]
        lines += [f"  echo '{key}:'", f"  echo '  num_instances: {len(mine)}'", "  echo '  urls:'"]
        lines += [f'  echo "    - \\"${{hosts[{p.nodes[0]}]}}:{p.port}\\""' for p in mine]
    lines.append('} > "$config"')
    return lines


def script(plan: Plan, options: TrtllmOptions) -> str:
    placed, _ = place(plan, options)
    router = options.router_port or DEFAULT_ROUTER_PORT
    nodes: dict[object, list[str]] = {n: [] for n in range(plan.nnodes)}
    for server in placed:
        nodes[server.nodes[0]] += _server_lines(plan, options, server)
    nodes[0] += [
        # a folder of its own, removed when the script leaves (the EXIT trap)
        'config_dir="$(mktemp -d)"',
        'config="$config_dir/disagg_config.yaml"',
        *config_lines(plan, options, placed),
        f'echo "mdc: trtllm-serve disaggregated on port {router}, config $config:" >&2',
        'cat "$config" >&2',
        'TRTLLM_DISAGG_ROLE=proxy "$@" disaggregated -c "$config" &',
        'pids+=("$!")',
    ]
    arms = {node: lines for node, lines in nodes.items() if lines}
    arms["*"] = [
        'echo "mdc: node $NODE_RANK runs its ranks in another node\'s srun step" >&2',
        "exit 0",
    ]
    gpus = " ".join(str(g) for g in range(plan.nproc_per_node))
    comment = f"""# Generated by mdc (trtllm launcher, disaggregated) for job {plan.job.name!r}. Usage:
# trtllm-disagg.sh MODEL PROGRAM... (PROGRAM: trtllm-serve). Each node starts its context and
# generation servers on their GPUs; node 0 also writes the disaggregated server's config from
# NODE_HOSTS into a temporary folder, removed when the script ends, and starts trtllm-serve
# disaggregated. A node's part ends when one of its processes fails (the others are
# stopped) or all have ended."""
    body = f""": "${{NODE_RANK:?NODE_RANK must be set by the backend}}"
: "${{NODE_HOSTS:?NODE_HOSTS must be set by the backend}}"
MODEL="$1"
shift
read -r -a hosts <<< "$NODE_HOSTS"
# the node's GPUs as the backend hands them (CUDA_VISIBLE_DEVICES), else 0..n-1
if [[ -n "${{CUDA_VISIBLE_DEVICES:-}}" ]]; then
  IFS=, read -r -a gpus <<< "$CUDA_VISIBLE_DEVICES"
else
  gpus=({gpus})
fi
# devices FIRST COUNT: those GPUs, separated by commas
devices() {{ local IFS=,; printf '%s' "${{gpus[*]:$1:$2}}"; }}
{node_cases(arms, '"$NODE_RANK"')}"""
    leaving = ("remove the config", 'if [[ -n "${config_dir:-}" ]]; then rm -rf "$config_dir"; fi')
    return supervising_script(comment, body, leaving)


def emit(plan: Plan, options: TrtllmOptions) -> Launch:
    placed, _ = place(plan, options)
    files = [Artifact.text(SCRIPT, script(plan, options), executable=True)]
    for role in ROLES:
        server = shape(options, role)
        files.append(
            Artifact.text(
                role_file(role),
                yaml_text(
                    role_options(options, server),
                    f"trtllm-serve --extra_llm_api_options of the {role} servers (LLM API)",
                ),
            )
        )
    model = resolve(options).options.model or ""
    argv: tuple[Word, ...] = ("bash", out_file(SCRIPT), model, *plan.job.argv)
    env: dict[str, Word] = {"NNODES": str(plan.nnodes), "NPROC_PER_NODE": str(plan.nproc_per_node)}
    meaning = {
        **{k: v for k, v in env.items() if isinstance(v, str)},
        "TRTLLM_DISAGG_ROLE": f"context, generation or proxy: each process its own (set by {SCRIPT})",
    }
    return Launch(
        roles=(Role(name="worker", argv=argv, env=env),),
        files=tuple(files),
        worker_env=meaning,
        endpoint=Endpoint(port=options.router_port or DEFAULT_ROUTER_PORT),
        servers=servers(options, placed),
    )


def servers(options: TrtllmOptions, placed: list[Placed]) -> tuple[Server, ...]:
    """The disaggregated server on node 0 (no GPU), then every context and generation server."""
    found = [
        Server(role="proxy", nodes=(0,), gpus=0, port=options.router_port or DEFAULT_ROUTER_PORT)
    ]
    for p in placed:
        # attention data parallel: each of the tp ranks runs attention for its own requests
        attention_dp = role_options(options, p.shape).get("enable_attention_dp") is True
        found.append(
            Server(
                role=p.shape.role,
                nodes=p.nodes,
                gpus=p.shape.gpus,
                tp=p.shape.tp,
                pp=p.shape.pp,
                dp=p.shape.tp if attention_dp else 1,
                ep=p.shape.ep,
                port=p.port,
                first_gpu=p.first_gpu,
            )
        )
    return tuple(found)


def serving(plan: Plan, options: TrtllmOptions) -> ServingSetup | None:
    """The tighter role's servers (fewer GPUs; generation on a tie) for the memory check."""
    if any(getattr(options, role) is None for role in ROLES):
        return None
    shapes = [shape(options, role) for role in ("generation", "context")]
    tight = min(shapes, key=lambda s: s.gpus)
    setup = memory_setup(
        f"TensorRT-LLM ({tight.role})",
        tight.tp,
        tight.pp,
        tight.ep,
        tight.options,
        role_options(options, tight),
    )
    # each role's per-step limits (max_batch_size, max_num_tokens: its table's, else
    # [trtllm]'s) and its KV cache's share, by the model's names of the roles
    roles = {
        {"context": "prefill", "generation": "decode"}[s.role]: StepLimits(
            max_batch=s.options.max_batch_size,
            step_tokens=s.options.max_num_tokens,
            share=memory_setup("", s.tp, s.pp, s.ep, s.options, role_options(options, s)).share,
        )
        for s in shapes
    }
    # the generation servers' steps are the ones a token waits for
    generation = role_options(options, shapes[0])
    return attrs.evolve(setup, roles=roles, **graph_settings(generation, options.backend))
