"""The ssh backend: clusters without a scheduler, reached by password-less ssh.

``ssh/hostfile`` lists the hosts in node-rank order. ``ssh/launch.sh``
starts each node's role (``launch/<role>.sh``) on its host with ``ssh -tt``,
passing ``NODE_RANK``, ``MASTER_ADDR`` (the first host, or ``[ssh]
master_addr``), ``MASTER_PORT`` and ``MDC_LAUNCH_ID`` (fresh for each run); it waits
for all of them, returns the first non-zero exit status and stops the others. ``-tt`` gives each remote
command a terminal, so when launch.sh stops an ssh client the remote side
gets SIGHUP and ends too, instead of running on unattended.

The remote command is one string that the remote login shell parses: every
value in it is single-quoted (POSIX quoting, so sh, dash, bash and zsh agree),
and that string is passed to ssh as one quoted word.

``[ssh] setup`` commands run on this host before the nodes start; ``teardown`` commands
run when launch.sh exits, however the nodes ended (its exit status is kept).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import attrs

import mdc
from mdc.api import (
    OUT_DIR,
    RUNTIME_VARIABLES,
    Artifact,
    BackendSpec,
    Finding,
    Launch,
    Plan,
    Severity,
)
from mdc.api.files import read_schema, script_path
from mdc.api.shell import around_launch, launch_id_lines, port_lines, shell_word, supervise

HOST = re.compile(r"[A-Za-z0-9_:][A-Za-z0-9_.:%-]*")
USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
SSH_OPTION = re.compile(r"[A-Za-z][A-Za-z0-9]*=\S.*", re.DOTALL)
LOOPBACK = re.compile(r"(localhost|(::ffff:)?127(\.\d{1,3}){3}|::1)")
#: what launch.sh passes to every node itself
RESERVED = (*RUNTIME_VARIABLES, OUT_DIR.name)


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class SshOptions:
    """The ``[ssh]`` table."""

    hosts: tuple[str, ...] = ()
    user: str | None = None
    port: int | None = None
    ssh_options: tuple[str, ...] = ()
    remote_dir: str | None = None
    master_addr: str | None = None
    forward_env: tuple[str, ...] = ()
    #: commands (argv lists) launch.sh runs here before starting the nodes, and when it exits
    setup: tuple[tuple[str, ...], ...] = ()
    teardown: tuple[tuple[str, ...], ...] = ()


def _opts(options: SshOptions | None) -> SshOptions:
    return options if options is not None else SshOptions()


def master_addr(opts: SshOptions) -> str:
    return opts.master_addr or opts.hosts[0]


def ssh_words(opts: SshOptions) -> list[str]:
    """The ssh client's argv before the host. ssh keeps the first value it gets for an
    option, so the spec's ssh_options come first and win over mdc's defaults."""
    words = ["ssh"]
    for option in opts.ssh_options:
        words += ["-o", option]
    words += ["-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-tt"]
    if opts.port is not None:
        words += ["-p", str(opts.port)]
    if opts.user is not None:
        words += ["-l", opts.user]
    return words


def _array(name: str, words: Sequence[str]) -> str:
    return f"{name}=({' '.join(shell_word(w) for w in words)})"


def launch_script(plan: Plan, opts: SshOptions) -> str:
    hosts = list(opts.hosts)
    where = (
        f"at {opts.remote_dir} on every host"
        if opts.remote_dir
        else "at this same path on every host (a shared filesystem)"
    )
    lines = [
        "#!/usr/bin/env bash",
        (
            f"# Runs job {plan.job.name!r} over ssh: {plan.nnodes} node(s) x {plan.nproc_per_node} "
            f"process(es), launcher {plan.launcher}."
        ),
        "# Node i runs on line i+1 of ssh/hostfile. Needs password-less ssh from here to every",
        f"# host, and the compiled tree {where}.",
        "# The first node to fail stops the others; its status is the job's.",
        "set -euo pipefail",
        # where the tree is on the hosts: given, or this tree's own path
        f"dir={shell_word(opts.remote_dir)}"
        if opts.remote_dir
        else 'dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"',
        _array("hosts", hosts),
        _array("ssh_command", ssh_words(opts)),
        _array("forward", opts.forward_env),
        f"export MASTER_ADDR={shell_word(master_addr(opts))}",
        *launch_id_lines(None),
        # only where node 0 runs on this machine can the port be probed here
        *port_lines(
            plan.rendezvous.master_port,
            plan.rendezvous.derived,
            probe="true" if hosts and LOOPBACK.fullmatch(hosts[0]) else None,
        ),
        'export NODE_HOSTS="${hosts[*]}"',
        "",
        "# One word for the remote shell, in POSIX single quotes.",
        "quote() {",
        '  local text="$1" tick="\'"',
        '  printf "\'%s\'" "${text//$tick/$tick\\\\$tick$tick}"',
        "}",
        "",
        "# The command the remote login shell runs for node $1 with role script $2.",
        "remote_command() {",
        "  local command name",
        "  # a terminal would turn each line end into CR LF: keep the output as it is",
        '  command="stty -onlcr 2>/dev/null; cd $(quote "$dir") && exec env"',
        '  for name in "${forward[@]}"; do',
        '    if [[ -n "${!name+set}" ]]; then',
        '      command+=" $(quote "$name=${!name}")"',
        "    fi",
        "  done",
        '  command+=" NODE_RANK=$1 $(quote "MASTER_ADDR=$MASTER_ADDR") MASTER_PORT=$MASTER_PORT"',
        '  command+=" $(quote "MDC_LAUNCH_ID=$MDC_LAUNCH_ID")"',
        '  command+=" $(quote "NODE_HOSTS=$NODE_HOSTS")"',
        '  command+=" bash $(quote "$2")"',
        '  printf "%s" "$command"',
        "}",
        "",
    ]
    start = []
    for role in plan.roles:
        last = role.first_node + role.count
        start += [
            f"for ((node = {role.first_node}; node < {last}; node++)); do",
            (
                '  "${ssh_command[@]}" "${hosts[node]}" '
                f'"$(remote_command "$node" {shell_word(script_path(role.name))})" </dev/null &'
            ),
            '  pids+=("$!")',
            "done",
        ]
    lines += around_launch(opts.setup, opts.teardown, "ssh")
    lines += supervise(start, children="node", failed="a node", owner="job")
    return "\n".join(lines)


def emit(plan: Plan, launch: Launch, options: SshOptions | None) -> list[Artifact]:
    opts = _opts(options)
    return [
        Artifact.text("ssh/hostfile", "\n".join(opts.hosts)),
        Artifact.text("ssh/launch.sh", launch_script(plan, opts), executable=True),
    ]


def hosts(nnodes: int, options: SshOptions | None) -> Sequence[str] | None:
    """The hosts, in node-rank order, when the table names one per node."""
    if options is None or len(options.hosts) != nnodes:
        return None
    return list(options.hosts)


def check(plan: Plan, options: SshOptions | None) -> Iterator[Finding]:
    opts = _opts(options)
    yield from _host_findings(plan, options, opts)
    yield from _option_findings(opts)
    yield from _master_findings(opts)
    if plan.job.image:
        yield Finding(
            code="MDC436",
            pointer="/job/image",
            severity=Severity.WARNING,
            message="the ssh backend runs on the hosts' own software; [job] image is not used",
            hint="run in a container from your command, or use a backend that starts containers",
        )


def _host_findings(plan: Plan, options: SshOptions | None, opts: SshOptions) -> Iterator[Finding]:
    """The hosts: one per node, each a host name, each machine once."""
    count = len(opts.hosts)
    if count != plan.nnodes:
        if options is None:
            message = f"the ssh backend needs [ssh] hosts: one per node ({plan.nnodes})"
            pointer = "/distributed/backend"
        else:
            message = f"[ssh] hosts names {count} host(s), but nnodes is {plan.nnodes}"
            pointer = "/ssh/hosts"
        example = ", ".join(f'"gpu{i + 1}"' for i in range(min(plan.nnodes, 3)))
        more = ", ..." if plan.nnodes > 3 else ""
        yield Finding(
            code="MDC430",
            pointer=pointer,
            message=message,
            hint=f"list exactly {plan.nnodes} host(s), node 0 first: hosts = [{example}{more}]",
        )
    seen: dict[str, int] = {}
    for index, host in enumerate(opts.hosts):
        if not HOST.fullmatch(host):
            yield Finding(
                code="MDC431",
                pointer=f"/ssh/hosts/{index}",
                message=f"[ssh] host {host!r} is not a host name or address",
                hint="write a name or IP address only (letters, digits, '.', '-', "
                "'_', ':'), not starting with '-'; set the login name in "
                "[ssh] user",
            )
        elif host in seen:
            yield Finding(
                code="MDC432",
                pointer=f"/ssh/hosts/{index}",
                severity=Severity.WARNING,
                message=f"[ssh] host {host!r} is node {seen[host]} and node {index}: "
                "both run on one machine and share its devices",
                hint="list each machine once (the deepspeed launcher's hostfile "
                "refuses repeated hosts)",
            )
        seen.setdefault(host, index)


def _option_findings(opts: SshOptions) -> Iterator[Finding]:
    """The login name, the ssh options, the remote directory and the forwarded names."""
    if opts.user is not None and not USER.fullmatch(opts.user):
        yield Finding(
            code="MDC438",
            pointer="/ssh/user",
            message=f"[ssh] user {opts.user!r} is not a login name",
            hint="letters, digits, '.', '-' and '_', not starting with '-'",
        )
    for index, option in enumerate(opts.ssh_options):
        if not SSH_OPTION.fullmatch(option):
            yield Finding(
                code="MDC433",
                pointer=f"/ssh/ssh_options/{index}",
                message=f"[ssh] ssh_options entry {option!r} is not Key=Value",
                hint="write one ssh_config option per entry, as ssh -o takes it: "
                '"StrictHostKeyChecking=accept-new"',
            )
    if opts.remote_dir is not None and not opts.remote_dir.startswith("/"):
        yield Finding(
            code="MDC434",
            pointer="/ssh/remote_dir",
            message=f"[ssh] remote_dir {opts.remote_dir!r} is not an absolute path",
            hint="write where the compiled tree lies on every host, from /",
        )
    for index, name in enumerate(opts.forward_env):
        if name in RESERVED:
            yield Finding(
                code="MDC435",
                pointer=f"/ssh/forward_env/{index}",
                message=f"[ssh] forward_env names {name}, which launch.sh sets for "
                "every node itself",
                hint=f"remove it; {', '.join(RESERVED)} come from the plan",
            )


def _master_findings(opts: SshOptions) -> Iterator[Finding]:
    """MASTER_ADDR: a host name, and one the other hosts reach."""
    master = opts.master_addr
    if master is not None and not HOST.fullmatch(master):
        yield Finding(
            code="MDC437",
            pointer="/ssh/master_addr",
            message=f"[ssh] master_addr {master!r} is not a host name or address",
            hint="write a name or IP address of node 0 that every host can reach",
        )
    elif (
        opts.hosts
        and LOOPBACK.fullmatch(master or opts.hosts[0])
        and any(not LOOPBACK.fullmatch(h) for h in opts.hosts)
    ):
        pointer = "/ssh/master_addr" if master else "/ssh/hosts/0"
        yield Finding(
            code="MDC437",
            pointer=pointer,
            severity=Severity.WARNING,
            message=f"MASTER_ADDR would be {master or opts.hosts[0]!r}, a loopback "
            "address, but some hosts are other machines: they cannot reach it",
            hint="name node 0 by an address the other hosts reach, or set [ssh] master_addr",
        )


@mdc.hookimpl
def mdc_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            name="ssh",
            description="hosts without a scheduler: ssh/launch.sh starts every node over ssh",
            emit=emit,
            check=check,
            hosts=hosts,
            schema=read_schema("mdc_schemas", "plugins/ssh.v1.schema.json"),
            options_type=SshOptions,
            run_command="bash {out}/ssh/launch.sh",
        )
    ]
