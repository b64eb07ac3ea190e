"""Helpers for plugins: torchrun command lines, for every launcher that starts its workers
with torchrun.

Not part of the contract (:mod:`mdc.api`): the torchrun, megatron and torchtitan
launchers, and any third-party launcher built on torchrun, share one way of writing the
agent's flags and the worker env.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator, Mapping, Sequence

import attrs

from mdc.api import MASTER_ADDR, MASTER_PORT, NODE_RANK, Concat, Finding, Plan, Ref, Severity, Word

PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
#: madengine's runner prefix: its model scripts run ``$MAD_MULTI_NODE_RUNNER script.py args``
RUNNER_VARIABLE = "MAD_MULTI_NODE_RUNNER"


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class TorchrunOptions:
    """The ``[torchrun]`` table; launchers built on torchrun accept the same keys."""

    rdzv_backend: str | None = None
    rdzv_id: str | None = None
    rdzv_conf: Mapping[str, str | int | float | bool] = attrs.field(factory=dict)
    max_restarts: int = 0
    monitor_interval: float | None = None
    start_method: str | None = None
    role: str | None = None
    log_dir: str | None = None
    tee: int | None = None


def program(words: list[str]) -> list[str]:
    """The user's command as torchrun's trailing arguments.

    torchrun runs ``python -u SCRIPT``, so a leading ``python`` is dropped,
    ``python -m pkg`` becomes ``--module pkg``, and anything that is not a
    Python script runs with ``--no-python``.
    """
    if PYTHON.match(os.path.basename(words[0])) and len(words) > 1:
        rest = words[1:]
        while rest and rest[0] == "-u":  # torchrun adds -u itself
            rest = rest[1:]
        if len(rest) >= 2 and rest[0] == "-m":
            return ["--module", *rest[1:]]
        if rest and not rest[0].startswith("-"):
            return rest
    if words[0].endswith(".py"):
        return words
    return ["--no-python", *words]


def rdzv_backend(opts: TorchrunOptions) -> str:
    return opts.rdzv_backend or "c10d"


def conf_value(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def torchrun_flags(plan: Plan, opts: TorchrunOptions) -> Iterator[Word]:
    """torchrun's own flags for this plan: rendezvous, sizes, restarts."""
    if plan.nnodes == 1 and not plan.elastic:
        yield from ("--standalone", "--nnodes", "1")
    else:
        yield "--nnodes"
        yield f"{plan.min_nnodes}:{plan.nnodes}" if plan.elastic else str(plan.nnodes)
        if rdzv_backend(opts) == "c10d":
            yield from (
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                Concat((MASTER_ADDR, ":", MASTER_PORT)),
                "--rdzv-id",
                opts.rdzv_id or plan.job.name,
            )
        else:
            yield from (
                "--rdzv-backend",
                "static",
                "--node-rank",
                NODE_RANK,
                "--master-addr",
                MASTER_ADDR,
                "--master-port",
                MASTER_PORT,
            )
        if opts.rdzv_conf:
            yield "--rdzv-conf"
            yield ",".join(f"{k}={conf_value(v)}" for k, v in sorted(opts.rdzv_conf.items()))
    yield from ("--nproc-per-node", str(plan.nproc_per_node))
    yield from ("--max-restarts", str(opts.max_restarts))
    for flag, value in (
        ("--monitor-interval", opts.monitor_interval),
        ("--start-method", opts.start_method),
        ("--role", opts.role),
        ("--log-dir", opts.log_dir),
        ("--tee", opts.tee),
    ):
        if value is not None:
            yield from (flag, str(value))


def torchrun_argv(
    plan: Plan, opts: TorchrunOptions | None, program_args: list[Word] | None = None
) -> list[Word]:
    """``torchrun FLAGS PROGRAM``; the program defaults to the job's command."""
    opts = opts or TorchrunOptions()
    args = program_args if program_args is not None else program(plan.job.argv)
    return ["torchrun", *torchrun_flags(plan, opts), *args]


def torchrun_worker_env(plan: Plan, opts: TorchrunOptions | None) -> dict[str, str]:
    """What torchrun gives every worker, as plan.json documents it."""
    opts = opts or TorchrunOptions()
    nproc = plan.nproc_per_node
    if plan.nnodes == 1 and not plan.elastic:
        node, addr, port = "0", "chosen by torchrun (--standalone)", "chosen by torchrun"
    elif rdzv_backend(opts) == "static":
        node, addr, port = "NODE_RANK", "node 0", plan.rendezvous.text()
    else:
        node = "the node's place in the c10d rendezvous (join order)"
        addr, port = "chosen by the c10d rendezvous", "chosen by the c10d rendezvous"
    world = (
        str(plan.world_size)
        if not plan.elastic
        else f"{nproc} * nodes that joined ({plan.min_nnodes * nproc}..{plan.world_size})"
    )
    return {
        "RANK": f"GROUP_RANK * {nproc} + LOCAL_RANK",
        "LOCAL_RANK": f"0..{nproc - 1}",
        "WORLD_SIZE": world,
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": node,
        "MASTER_ADDR": addr,
        "MASTER_PORT": port,
    }


def runner_env(plan: Plan, prefix: Sequence[Word]) -> dict[str, Word]:
    """madengine's launcher env for a launcher whose command is ``prefix`` + the program.

    ``MAD_MULTI_NODE_RUNNER`` is ``prefix`` as one value: words separated by spaces,
    literals shell-quoted, run-time values (``$NODE_RANK``, ``$MASTER_ADDR``, the out/
    path) put in as they are. madengine's scripts run ``$MAD_MULTI_NODE_RUNNER script.py
    args`` unquoted, which splits it at spaces and removes no quotes; ``eval`` reads it
    too. Both give back the words exactly when no literal needs quoting (mdc's own words
    never do; :func:`torchrun_findings` warns about a user's) and no run-time value holds
    a space: an out/ path with a space cannot pass through this variable at all.
    ``NNODES`` and ``NPROC_PER_NODE`` are the plan's node count and processes per node.
    """
    parts: list[str | Ref] = []
    for index, word in enumerate(prefix):
        if index:
            parts.append(" ")
        pieces = word.parts if isinstance(word, Concat) else (word,)
        parts += [shlex.quote(p) if isinstance(p, str) and p else p for p in pieces]
    return {
        RUNNER_VARIABLE: Concat(tuple(parts)),
        "NNODES": str(plan.nnodes),
        "NPROC_PER_NODE": str(plan.nproc_per_node),
    }


def runner_worker_env(plan: Plan, command: str) -> dict[str, str]:
    """What :func:`runner_env` gives every worker, as plan.json documents it."""
    return {
        RUNNER_VARIABLE: f"the {command} command up to the script (madengine's runner: "
        "scripts run $MAD_MULTI_NODE_RUNNER script.py args unquoted); words "
        "separated by spaces, literals shell-quoted, so no word (the out/ "
        "path included) may hold a space",
        "NNODES": str(plan.nnodes),
        "NPROC_PER_NODE": str(plan.nproc_per_node),
    }


def torchrun_env(plan: Plan, opts: TorchrunOptions | None) -> dict[str, Word]:
    """madengine's env for a launcher on torchrun: :func:`runner_env` of torchrun's flags."""
    return runner_env(plan, torchrun_argv(plan, opts, []))


#: shells a command may start a script with
SHELLS = ("bash", "sh", "dash", "ksh", "zsh")


def shell_script(command: Sequence[str]) -> str | None:
    """The shell script ``command`` runs (``run.sh ...``, ``bash run.sh ...``), if it runs one."""
    if not command:
        return None
    if command[0].endswith(".sh"):
        return command[0]
    if os.path.basename(command[0]) not in SHELLS:
        return None
    for word in command[1:]:
        if word == "-c":
            return None  # an inline command, not a script file
        if not word.startswith("-"):
            return word
    return None


def torchrun_findings(plan: Plan, opts: TorchrunOptions | None) -> Iterator[Finding]:
    """What torchrun would reject in the ``[torchrun]`` table, for this plan, and a shell
    script given to it (MDC252)."""
    script = shell_script(plan.job.command)
    if script is not None:
        yield Finding(
            code="MDC252",
            pointer="/job/command",
            severity=Severity.WARNING,
            message=f"[job] command runs the shell script {script!r} under torchrun, which "
            f"starts it as each of the {plan.nproc_per_node} worker process(es) of every node; "
            f"a script that starts its own launcher (${RUNNER_VARIABLE} train.py, as "
            "madengine's model scripts do, or torchrun) would run torchrun inside each worker",
            hint="set [job] command to the program the script starts (for example "
            '["python", "train.py", ...]) and move the script\'s exports to [job] env',
        )
    opts = opts or TorchrunOptions()
    if plan.elastic and opts.rdzv_backend == "static":
        yield Finding(
            code="MDC301",
            pointer="/torchrun/rdzv_backend",
            message="static rendezvous cannot run an elastic job (min_nnodes < nnodes)",
            hint='use rdzv_backend = "c10d", or remove min_nnodes',
        )
    # words of MAD_MULTI_NODE_RUNNER that the user wrote (rdzv_conf only off --standalone)
    given: list[tuple[str, str]] = []
    for key, value in sorted(opts.rdzv_conf.items()):
        text = conf_value(value)
        # torchrun splits --rdzv-conf on "," and strips each value; an empty value is an error
        if "," in text or not text.strip() or text != text.strip():
            yield Finding(
                code="MDC302",
                pointer=f"/torchrun/rdzv_conf/{key}",
                message=f"torchrun cannot pass rdzv_conf value {text!r}: --rdzv-conf "
                "is split on ',' and its values are stripped and non-empty",
                hint="use a value without commas or leading/trailing spaces",
            )
        elif plan.nnodes > 1 or plan.elastic:
            given.append((f"/torchrun/rdzv_conf/{key}", text))
    if opts.log_dir is not None:
        given.append(("/torchrun/log_dir", opts.log_dir))
    for pointer, text in given:
        quoted = shlex.quote(text)
        if quoted != text:
            yield Finding(
                code="MDC303",
                pointer=pointer,
                severity=Severity.WARNING,
                message=f"{RUNNER_VARIABLE} holds {text!r} shell-quoted, as {quoted}: "
                f"a script that runs ${RUNNER_VARIABLE} script.py unquoted "
                "(madengine's way) gets other words; only eval reads it back",
                hint="use a value of letters, digits and @%+=:,./-_ if a script uses "
                f"{RUNNER_VARIABLE}; mdc's own launch command is not affected",
            )


__all__ = [
    "RUNNER_VARIABLE",
    "TorchrunOptions",
    "program",
    "runner_env",
    "runner_worker_env",
    "torchrun_argv",
    "torchrun_env",
    "torchrun_findings",
    "torchrun_worker_env",
]
