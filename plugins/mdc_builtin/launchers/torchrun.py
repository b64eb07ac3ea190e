"""torchrun (torch.distributed.run): one elastic agent per node starts the workers.

Single node: ``--standalone``. Several nodes: c10d rendezvous at node 0 by
default (node ranks follow join order), or static rendezvous with the
backend's node rank (fixed RANK per node). Elastic jobs use ``MIN:MAX``.
The command line itself is built by :func:`mdc.api.torchrun.torchrun_argv`, which the
launchers that run on torchrun share.

The env is madengine's contract for torchrun: ``MAD_MULTI_NODE_RUNNER`` (the
torchrun command up to the script, for scripts that run
``$MAD_MULTI_NODE_RUNNER train.py``), ``NNODES``, ``NPROC_PER_NODE`` and
``MAD_RUNTIME_NGPUS`` (the GPUs of one node).
"""

from __future__ import annotations

from collections.abc import Iterator

import mdc
from mdc.api import Finding, Launch, LauncherSpec, Plan, Role, Word
from mdc.api.files import read_schema
from mdc.api.torchrun import (
    TorchrunOptions,
    runner_worker_env,
    torchrun_argv,
    torchrun_env,
    torchrun_findings,
    torchrun_worker_env,
)


def emit(plan: Plan, options: TorchrunOptions | None) -> Launch:
    gpus = str(plan.nproc_per_node)
    env: dict[str, Word] = {**torchrun_env(plan, options), "MAD_RUNTIME_NGPUS": gpus}
    worker_env = {
        **torchrun_worker_env(plan, options),
        **runner_worker_env(plan, "torchrun"),
        "MAD_RUNTIME_NGPUS": f"{gpus} (the GPUs of one node)",
    }
    return Launch(
        roles=(Role(name="worker", argv=tuple(torchrun_argv(plan, options)), env=env),),
        worker_env=worker_env,
    )


def check(plan: Plan, options: TorchrunOptions | None) -> Iterator[Finding]:
    yield from torchrun_findings(plan, options)


@mdc.hookimpl
def mdc_register_launchers() -> list[LauncherSpec]:
    return [
        LauncherSpec(
            name="torchrun",
            description="torch.distributed.run: one elastic agent per node (c10d, static, standalone)",
            parallelism="data",
            emit=emit,
            check=check,
            schema=read_schema("mdc_schemas", "plugins/torchrun.v1.schema.json"),
            options_type=TorchrunOptions,
        )
    ]
