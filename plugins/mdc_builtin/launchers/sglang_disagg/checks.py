"""What SGLang or the layout would refuse: servers of whole nodes, roles of whole servers,
ports that collide, flags mdc writes passed otherwise, a command that is no Python."""

from __future__ import annotations

from collections.abc import Iterator

from mdc.api import Finding, Plan, Severity
from mdc_builtin.launchers._disagg import crossing, disagreements, elastic_findings
from mdc_builtin.launchers.sglang_disagg.options import (
    MAX_PORT,
    PYTHON,
    READING,
    RoleOptions,
    SglangDisaggOptions,
)
from mdc_builtin.launchers.sglang_disagg.servers import Server, mdc_words, server, shared_servers


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
    yield from disagreements(
        READING,
        lambda table: _words_of(options, table),
        lambda role: mdc_words(options, server(plan, options, role)),
    )


def _words_of(options: SglangDisaggOptions, table: str) -> tuple[str, ...]:
    """The server flags of a place: [sglang_disagg] server_args, or a role's args."""
    if table == "sglang_disagg":
        return options.server_args
    role: RoleOptions = getattr(options, table)
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
        start = crossing(plan, shape)
        if start is not None:
            yield Finding(
                code="MDC383",
                pointer=f"/distributed/{role}_gpus"
                if split.origin == "spec"
                else f"{where}/tp_size",
                message=f"on {plan.nnodes} nodes the servers share the nodes, side by side: a "
                f"{role} server of {shape.gpus} GPUs starting at GPU {start % gpus} of "
                f"node {start // gpus} would cross into the next node",
                hint=f"give the servers a size dividing nproc_per_node ({gpus}) and prefill_gpus "
                f"a multiple of the decode servers' size, or use 3 or more nodes (servers over "
                "whole nodes)",
            )


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
    yield from elastic_findings(plan, "MDC385")
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
