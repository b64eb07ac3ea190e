"""TensorRT-LLM's trtllm-serve: the aggregated form (:mod:`.aggregated`, which also holds the
options and flags both forms share) or, given ``[trtllm.context]`` and
``[trtllm.generation]``, the disaggregated one (:mod:`.disagg`)."""

from __future__ import annotations

from collections.abc import Iterator

import mdc
from mdc.api import Finding, Launch, LauncherSpec, Plan, ServingSetup
from mdc.api.files import read_schema
from mdc_builtin.launchers.trtllm import aggregated, disagg
from mdc_builtin.launchers.trtllm.aggregated import TrtllmOptions, disaggregated


def emit(plan: Plan, options: TrtllmOptions | None) -> Launch:
    if options is not None and disaggregated(options):
        return disagg.emit(plan, options)
    return aggregated.emit(plan, options)


def check(plan: Plan, options: TrtllmOptions | None) -> Iterator[Finding]:
    yield from aggregated.shared_check(plan, options)
    if options is not None and disaggregated(options):
        yield from disagg.check(plan, options)
    else:
        yield from aggregated.check(plan, options)


def serving(plan: Plan, options: TrtllmOptions | None) -> ServingSetup | None:
    if options is not None and disaggregated(options):
        return disagg.serving(plan, options)
    return aggregated.serving(plan, options)


@mdc.hookimpl
def mdc_register_launchers() -> list[LauncherSpec]:
    return [
        LauncherSpec(
            name="trtllm",
            description="TensorRT-LLM server (trtllm-serve): servers of tp x pp GPUs, side by "
            "side on a node or over whole nodes (SLURM, srun --mpi=pmix), as replicas",
            parallelism="model",
            workload="serving",
            emit=emit,
            check=check,
            serving=serving,
            schema=read_schema("mdc_schemas", "plugins/trtllm.v1.schema.json"),
            options_type=TrtllmOptions,
        )
    ]
