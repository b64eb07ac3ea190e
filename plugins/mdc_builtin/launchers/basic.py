"""basic: each node starts nproc_per_node copies of the command, which meet by themselves.

For programs that call ``init_process_group`` on their own, as TLaunch's "basic"
mode runs them: every process gets ``--world_size W --rank R`` appended to the
job's command, and the environment ``init_process_group(init_method="env://")``
reads (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) plus LOCAL_RANK,
LOCAL_WORLD_SIZE and NODE_RANK. With ``[basic] rendezvous_file`` they also get
``--init_method file://<path>``, a rendezvous on a shared filesystem.

A launch script execs one command, so the role runs ``launch/spawn.sh`` (a
launcher file) with the job's command as its arguments. On each node it starts
the processes with RANK = NODE_RANK * nproc_per_node + local rank, waits, and
exits with the first failure's status after stopping the others, as
``local/run.sh`` does for nodes; INT and TERM stop every process too.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs

import mdc
from mdc.api import (
    MASTER_ADDR,
    MASTER_PORT,
    NODE_RANK,
    Artifact,
    Finding,
    Launch,
    LauncherSpec,
    Plan,
    Role,
    Severity,
    Word,
)
from mdc.api.files import read_schema
from mdc.api.shell import out_file, shell_word, supervise

SPAWNER = "launch/spawn.sh"
#: the arguments every process gets, spelled as TLaunch's basic mode passes them
WORLD_SIZE_FLAG = "--world_size"
RANK_FLAG = "--rank"
#: the init_process_group argument a rendezvous file is passed as
INIT_METHOD_FLAG = "--init_method"


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class BasicOptions:
    """The ``[basic]`` table."""

    rendezvous_file: str | None = None


def init_method(path: str) -> str:
    """torch's file rendezvous URL for an absolute path: ``file:///shared/x``."""
    return f"file://{path}"


def extra_arguments(options: BasicOptions | None) -> list[str]:
    """What spawn.sh appends after --world_size/--rank, fixed at compile time."""
    if options is None or options.rendezvous_file is None:
        return []
    return [INIT_METHOD_FLAG, init_method(options.rendezvous_file)]


def spawn_script(plan: Plan, options: BasicOptions | None) -> str:
    """launch/spawn.sh: one node's processes, started, watched and stopped together."""
    nproc = plan.nproc_per_node
    extra = "".join(" " + shell_word(word) for word in extra_arguments(options))
    return "\n".join(
        [
            "#!/usr/bin/env bash",
            (
                f"# Starts the processes of job {plan.job.name!r} on one node (basic launcher): "
                f"{nproc} per node, {plan.world_size} in all."
            ),
            "# launch/worker.sh runs it with NODE_RANK, MASTER_ADDR, MASTER_PORT, WORLD_SIZE and",
            "# LOCAL_WORLD_SIZE exported and the job's command as its arguments. Each process gets",
            "# RANK and LOCAL_RANK, and --world_size WORLD_SIZE --rank RANK after the command.",
            "set -euo pipefail",
            ': "${NODE_RANK:?NODE_RANK must be set by the backend}"',
            ': "${WORLD_SIZE:?WORLD_SIZE must be set by launch/worker.sh}"',
            ': "${LOCAL_WORLD_SIZE:?LOCAL_WORLD_SIZE must be set by launch/worker.sh}"',
            "if (($# == 0)); then",
            '  echo "mdc: spawn.sh needs the command to run as its arguments" >&2',
            "  exit 2",
            "fi",
            *supervise(
                [
                    "for ((local_rank = 0; local_rank < LOCAL_WORLD_SIZE; local_rank++)); do",
                    "  rank=$((NODE_RANK * LOCAL_WORLD_SIZE + local_rank))",
                    (
                        '  RANK="$rank" LOCAL_RANK="$local_rank" "$@" '
                        f'{WORLD_SIZE_FLAG} "$WORLD_SIZE" {RANK_FLAG} "$rank"{extra} &'
                    ),
                    '  pids+=("$!")',
                    "done",
                ],
                children="process",
                failed="a process on node $NODE_RANK",
                owner="node",
            ),
        ]
    )


def emit(plan: Plan, options: BasicOptions | None) -> Launch:
    env: dict[str, Word] = {
        "NODE_RANK": NODE_RANK,
        "MASTER_ADDR": MASTER_ADDR,
        "MASTER_PORT": MASTER_PORT,
        "WORLD_SIZE": str(plan.world_size),
        "LOCAL_WORLD_SIZE": str(plan.nproc_per_node),
    }
    argv: tuple[Word, ...] = ("bash", out_file(SPAWNER), *plan.job.argv)
    nproc, last = plan.nproc_per_node, plan.nnodes - 1
    worker_env = {
        "RANK": f"NODE_RANK * {nproc} + LOCAL_RANK (also passed as {RANK_FLAG})",
        "LOCAL_RANK": f"0..{nproc - 1}",
        "WORLD_SIZE": f"{plan.world_size} (also passed as {WORLD_SIZE_FLAG})",
        "LOCAL_WORLD_SIZE": str(nproc),
        "NODE_RANK": f"the backend's node index, 0..{last}" if last else "0 (the only node)",
        "MASTER_ADDR": "node 0's address (set by the backend)",
        "MASTER_PORT": plan.rendezvous.text(),
    }
    return Launch(
        roles=(Role(name="worker", argv=argv, env=env),),
        files=(Artifact.text(SPAWNER, spawn_script(plan, options), executable=True),),
        worker_env=worker_env,
    )


def check(plan: Plan, options: BasicOptions | None) -> Iterator[Finding]:
    if plan.elastic:
        yield Finding(
            code="MDC350",
            pointer="/distributed/min_nnodes",
            message=f"the basic launcher passes a fixed --world_size "
            f"{plan.world_size}; it cannot run an elastic job "
            f"(min_nnodes {plan.min_nnodes} < nnodes {plan.nnodes})",
            hint=f"remove min_nnodes, or set it to nnodes ({plan.nnodes})",
        )
    path = options.rendezvous_file if options is not None else None
    if path is not None:
        if not path.startswith("/"):
            yield Finding(
                code="MDC351",
                pointer="/basic/rendezvous_file",
                message=f"rendezvous_file {path!r} is not an absolute path; every "
                "process on every node must name the same file",
                hint=f"use an absolute path on a shared filesystem, e.g. "
                f"/shared/rendezvous/{plan.job.name}",
            )
        bad = sorted({c for c in path if c in "?#" or not c.isprintable()})
        if bad or path.endswith("/"):
            shown = ", ".join(repr(c) for c in bad) if bad else "a trailing '/'"
            yield Finding(
                code="MDC352",
                pointer="/basic/rendezvous_file",
                message=f"rendezvous_file {path!r} cannot be a file:// URL "
                f"init_process_group reads: it has {shown} (in such a URL, "
                "'?' starts torch's rank/world_size parameters and '#' a "
                "fragment)",
                hint="use a file path of plain characters, e.g. "
                f"/shared/rendezvous/{plan.job.name}",
            )
    flags = [WORLD_SIZE_FLAG, RANK_FLAG] + ([INIT_METHOD_FLAG] if path is not None else [])
    written = [f for f in flags if any(w == f or w.startswith(f + "=") for w in plan.job.argv)]
    if written:
        yield Finding(
            code="MDC353",
            pointer="/job/command",
            severity=Severity.WARNING,
            message=f"the command already has {', '.join(written)}; the basic "
            "launcher appends its own after the command, and argparse "
            "keeps the last",
            hint=f"remove {', '.join(written)} from the command",
        )


@mdc.hookimpl
def mdc_register_launchers() -> list[LauncherSpec]:
    return [
        LauncherSpec(
            name="basic",
            description="the command itself, nproc_per_node copies per node, each with "
            "--world_size/--rank and RANK/WORLD_SIZE/MASTER_* for its own "
            "init_process_group",
            parallelism="data",
            emit=emit,
            check=check,
            schema=read_schema("mdc_schemas", "plugins/basic.v1.schema.json"),
            options_type=BasicOptions,
        )
    ]
