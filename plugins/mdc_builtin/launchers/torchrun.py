"""torchrun (torch.distributed.run): one elastic agent per node starts the workers.

Single node: ``--standalone``. Several nodes: c10d rendezvous at node 0 by
default (node ranks follow join order), or static rendezvous with the
backend's node rank (fixed RANK per node). Elastic jobs use ``MIN:MAX``.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator, Mapping

import attrs

import mdc
from mdc.api import (
    MASTER_ADDR, MASTER_PORT, NODE_RANK, Concat, Finding, Launch, LauncherSpec, Plan, Role,
    Word, read_schema)

PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


@attrs.frozen(kw_only=True)
class TorchrunOptions:
    rdzv_backend: str | None = None
    rdzv_id: str | None = None
    rdzv_conf: Mapping[str, str | int | float | bool] = attrs.field(factory=dict)
    max_restarts: int = 0
    monitor_interval: float | None = None
    start_method: str | None = None
    role: str | None = None
    log_dir: str | None = None
    tee: int | None = None


def program(command: str | tuple[str, ...]) -> list[str]:
    """The user's command as torchrun's trailing arguments.

    torchrun runs ``python -u SCRIPT``, so a leading ``python`` is dropped,
    ``python -m pkg`` becomes ``--module pkg``, and anything that is not a
    Python script runs with ``--no-python``.
    """
    words = shlex.split(command) if isinstance(command, str) else list(command)
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


def _rdzv_backend(opts: TorchrunOptions) -> str:
    return opts.rdzv_backend or "c10d"


def _flags(plan: Plan, opts: TorchrunOptions) -> Iterator[Word]:
    if plan.nnodes == 1 and not plan.elastic:
        yield from ("--standalone", "--nnodes", "1")
    else:
        yield "--nnodes"
        yield f"{plan.min_nnodes}:{plan.nnodes}" if plan.elastic else str(plan.nnodes)
        if _rdzv_backend(opts) == "c10d":
            yield from ("--rdzv-backend", "c10d", "--rdzv-endpoint",
                        Concat((MASTER_ADDR, ":", MASTER_PORT)),
                        "--rdzv-id", opts.rdzv_id or plan.job.name)
        else:
            yield from ("--rdzv-backend", "static", "--node-rank", NODE_RANK,
                        "--master-addr", MASTER_ADDR, "--master-port", MASTER_PORT)
        if opts.rdzv_conf:
            yield "--rdzv-conf"
            yield ",".join(f"{k}={_conf_value(v)}" for k, v in sorted(opts.rdzv_conf.items()))
    yield from ("--nproc-per-node", str(plan.nproc_per_node))
    yield from ("--max-restarts", str(opts.max_restarts))
    for flag, value in (("--monitor-interval", opts.monitor_interval),
                        ("--start-method", opts.start_method), ("--role", opts.role),
                        ("--log-dir", opts.log_dir), ("--tee", opts.tee)):
        if value is not None:
            yield from (flag, str(value))


def _conf_value(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def worker_env(plan: Plan, opts: TorchrunOptions) -> dict[str, str]:
    """What torchrun gives every worker, as plan.json documents it."""
    nproc = plan.nproc_per_node
    if plan.nnodes == 1 and not plan.elastic:
        node, addr, port = "0", "chosen by torchrun (--standalone)", "chosen by torchrun"
    elif _rdzv_backend(opts) == "static":
        node, addr, port = "NODE_RANK", "node 0", str(plan.rendezvous.master_port)
    else:
        node = "the node's place in the c10d rendezvous (join order)"
        addr, port = "chosen by the c10d rendezvous", "chosen by the c10d rendezvous"
    world = str(plan.world_size) if not plan.elastic else \
        f"{nproc} * nodes that joined ({plan.min_nnodes * nproc}..{plan.world_size})"
    return {
        "RANK": f"GROUP_RANK * {nproc} + LOCAL_RANK",
        "LOCAL_RANK": f"0..{nproc - 1}",
        "WORLD_SIZE": world,
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": node,
        "MASTER_ADDR": addr,
        "MASTER_PORT": port,
    }


def emit(plan: Plan, options: TorchrunOptions | None) -> Launch:
    opts = options or TorchrunOptions()
    argv: list[Word] = ["torchrun", *_flags(plan, opts), *program(plan.job.command)]
    return Launch(roles=(Role(name="worker", argv=tuple(argv)),),
                  worker_env=worker_env(plan, opts))


def check(plan: Plan, options: TorchrunOptions | None) -> Iterator[Finding]:
    opts = options or TorchrunOptions()
    if plan.elastic and opts.rdzv_backend == "static":
        yield Finding(code="MDC301", pointer="/torchrun/rdzv_backend",
                      message="static rendezvous cannot run an elastic job (min_nnodes < nnodes)",
                      hint="use rdzv_backend = \"c10d\", or remove min_nnodes")
    for key, value in sorted(opts.rdzv_conf.items()):
        text = _conf_value(value)
        # torchrun splits --rdzv-conf on "," and strips each value; an empty value is an error
        if "," in text or not text.strip() or text != text.strip():
            yield Finding(code="MDC302", pointer=f"/torchrun/rdzv_conf/{key}",
                          message=f"torchrun cannot pass rdzv_conf value {text!r}: --rdzv-conf "
                                  "is split on ',' and its values are stripped and non-empty",
                          hint="use a value without commas or leading/trailing spaces")


@mdc.hookimpl
def mdc_register_launchers() -> list[LauncherSpec]:
    return [LauncherSpec(
        name="torchrun",
        description="torch.distributed.run: one elastic agent per node (c10d, static, standalone)",
        parallelism="data",
        emit=emit,
        check=check,
        schema=read_schema("mdc_schemas", "plugins/torchrun.v1.schema.json"),
        options_type=TorchrunOptions,
    )]
