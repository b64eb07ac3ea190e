"""What vLLM or the layout would refuse: engines inside a node, roles of whole servers,
heads over tensor-parallel ranks, flags mdc writes passed otherwise, ports that collide."""

from __future__ import annotations

from collections.abc import Iterator

from mdc.api import Finding, Plan, Severity
from mdc.api.flags import already_set, command_pointer
from mdc_builtin.launchers import vllm
from mdc_builtin.launchers._disagg import crossing, disagreements, elastic_findings
from mdc_builtin.launchers.vllm_disagg.options import (
    MAX_PORT,
    NAME,
    OWNED_FLAGS,
    READING,
    ROLES,
    RoleOptions,
    VllmDisaggOptions,
)
from mdc_builtin.launchers.vllm_disagg.servers import (
    Server,
    mdc_words,
    server,
    servers,
    shared_servers,
)


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
    elif unit == "gpus" and (start := crossing(plan, shape)) is not None:
        yield Finding(
            code="MDC721",
            pointer=f"/distributed/{shape.role}_gpus",
            message=f"a {shape.role} server of {shape.gpus} GPUs starting at GPU "
            f"{start % gpus} of node {start // gpus} would cross into the next node",
            hint=f"give the servers a size dividing nproc_per_node ({gpus}) and "
            "prefill_gpus a multiple of the decode servers' size",
        )


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
    yield from disagreements(
        READING,
        lambda table: options.args if table == NAME else getattr(options, table).args,
        lambda role: mdc_words(options, server(plan, options, role)),
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
    yield from elastic_findings(plan, "MDC724")
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
