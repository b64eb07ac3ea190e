"""The local backend: run the job on this machine.

Each node becomes one launcher agent on loopback (127.0.0.1), so a
multi-node job's wiring can be tested on a laptop. ``local/run.sh`` starts
them all, waits, returns the first non-zero exit status and stops the rest.
"""

from __future__ import annotations

from collections.abc import Iterator

import mdc
from mdc.api import Artifact, BackendSpec, Finding, Launch, Plan, Severity
from mdc.api.files import script_path
from mdc.api.shell import launch_id_lines, port_lines, shell_word, supervise

LOOPBACK = "127.0.0.1"


def _header(plan: Plan) -> list[str]:
    return [
        "#!/usr/bin/env bash",
        (
            f"# Runs job {plan.job.name!r} on this machine: {plan.nnodes} node(s) x "
            f"{plan.nproc_per_node} process(es), nodes as local agents on {LOOPBACK}."
        ),
        "set -euo pipefail",
        'out="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"',
        f"export MASTER_ADDR={LOOPBACK}",
        *launch_id_lines(None),
        # every node runs on this host, node 0 included: the port is probed here
        *port_lines(plan.rendezvous.master_port, plan.rendezvous.derived, probe="true"),
        "node_hosts=()",
        f"for ((node = 0; node < {plan.nnodes}; node++)); do node_hosts+=({LOOPBACK}); done",
        'export NODE_HOSTS="${node_hosts[*]}"',
    ]


def run_script(plan: Plan) -> str:
    lines = _header(plan)
    if plan.nnodes == 1:
        only = plan.roles[0].name
        lines.append(f'NODE_RANK=0 exec bash "$out"/{shell_word(script_path(only))}')
        return "\n".join(lines)
    start = []
    for role in plan.roles:
        last = role.first_node + role.count
        start += [
            f"for ((node = {role.first_node}; node < {last}; node++)); do",
            f'  NODE_RANK="$node" bash "$out"/{shell_word(script_path(role.name))} &',
            '  pids+=("$!")',
            "done",
        ]
    lines += supervise(start, children="node", failed="a node", owner="job")
    return "\n".join(lines)


def emit(plan: Plan, launch: Launch, options: object) -> list[Artifact]:
    return [Artifact.text("local/run.sh", run_script(plan), executable=True)]


def check(plan: Plan, options: object) -> Iterator[Finding]:
    if plan.job.image:
        yield Finding(
            code="MDC401",
            pointer="/job/image",
            severity=Severity.WARNING,
            message="the local backend runs on this machine without a container; "
            "[job] image is not used",
            hint="choose a backend that runs containers to use the image",
        )
    if plan.nnodes > 1 and plan.accelerator != "cpu":
        yield Finding(
            code="MDC402",
            pointer="/distributed/nnodes",
            severity=Severity.WARNING,
            message=f"the local backend runs all {plan.nnodes} nodes on this machine: "
            f"every node's local ranks 0..{plan.nproc_per_node - 1} use the "
            f"same {plan.accelerator} devices",
            hint='use accelerator = "cpu" to rehearse multi-node wiring here, or a cluster backend',
        )


@mdc.hookimpl
def mdc_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            name="local",
            emit=emit,
            check=check,
            description="this machine: one launcher agent per node on loopback",
            run_command="bash {out}/local/run.sh",
        )
    ]
