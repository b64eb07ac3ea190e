"""torchrun (torch.distributed.run): one elastic agent per node starts the workers.

Single node: ``--standalone``. Several nodes: c10d rendezvous at node 0 by
default (node ranks follow join order), or static rendezvous with the
backend's node rank (fixed RANK per node). Elastic jobs use ``MIN:MAX``.
The command line itself is built by :func:`mdc.api.torchrun_argv`, which the
launchers that run on torchrun share.
"""

from __future__ import annotations

from collections.abc import Iterator

import mdc
from mdc.api import (
    Finding, Launch, LauncherSpec, Plan, Role, TorchrunOptions, read_schema, torchrun_argv,
    torchrun_findings, torchrun_worker_env)


def emit(plan: Plan, options: TorchrunOptions | None) -> Launch:
    return Launch(roles=(Role(name="worker", argv=tuple(torchrun_argv(plan, options))),),
                  worker_env=torchrun_worker_env(plan, options))


def check(plan: Plan, options: TorchrunOptions | None) -> Iterator[Finding]:
    yield from torchrun_findings(plan, options)


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
