"""The serving passes: whole servers in an automatic prefill/decode split, the [workload]
table, and the serving memory estimate."""

from __future__ import annotations

import attrs

from mdc.api import Finding, LauncherSpec, Severity
from mdc.passes.calls import call
from mdc.plan import Plan
from mdc.plan.build import auto_split, disagg_roles
from mdc.plugin_manager import Registered
from mdc.spec import JobSpec, WorkloadTable


def whole_servers(plan: Plan, launcher: LauncherSpec, reg: Registered) -> Plan:
    """The automatic prefill/decode split redone so that each role holds whole servers."""
    split, units_of = plan.disagg, launcher.server_units
    if split is None or split.origin != "auto" or units_of is None:
        return plan
    prefill_unit, decode_unit = call(
        reg, "server_units", lambda: units_of(plan, plan.options.get(launcher.name))
    )
    units = (max(1, prefill_unit), max(1, decode_unit))
    prefill, decode = auto_split(split.prefill + split.decode, units)
    whole = attrs.evolve(split, prefill=prefill, decode=decode)
    return attrs.evolve(plan, disagg=whole, roles=disagg_roles(whole, plan.nnodes))


def workload_findings(launcher: LauncherSpec, workload: WorkloadTable) -> list[Finding]:
    """[workload] describes serving traffic: a training launcher does not read it; its load
    is one of the requests in flight and their arrival rate."""
    given = [k for k in ("concurrency", "request_rate") if getattr(workload, k) is not None]
    found = []
    if len(given) != 1:
        found.append(
            Finding(
                code="MDC623",
                pointer="/workload/request_rate" if given else "/workload",
                message="[workload] gives both concurrency and request_rate"
                if given
                else "[workload] gives neither concurrency nor request_rate",
                hint="keep one: concurrency (requests in flight, a closed loop) or "
                "request_rate (requests per second, Poisson arrivals)",
            )
        )
    if launcher.workload == "serving":
        return found
    return [
        *found,
        Finding(
            code="MDC620",
            pointer="/workload",
            severity=Severity.WARNING,
            message=f"[workload] describes serving traffic; the training launcher "
            f"{launcher.name!r} does not read it",
            hint="remove [workload], or use a serving launcher (vllm, sglang, trtllm, ...)",
        ),
    ]


def fp4_findings(launcher: LauncherSpec, spec: JobSpec) -> list[Finding]:
    """[model] dtype = "fp4" names an FP4 checkpoint (NVFP4, MXFP4) that a serving engine
    reads as it is; no training launcher starts from one (training in FP4 quantizes a bf16
    model around its GEMMs: Megatron's fp4_format)."""
    if spec.model is None or spec.model.dtype != "fp4" or launcher.workload == "serving":
        return []
    return [
        Finding(
            code="MDC624",
            pointer="/model/dtype",
            message=f'[model] dtype = "fp4" is an FP4 checkpoint to serve; the training '
            f"launcher {launcher.name!r} does not train from one",
            hint="serve it with a serving launcher (vllm, sglang, trtllm, ...), or train in FP4 "
            "from dtype = \"bf16\" with the launcher's FP4 recipe (Megatron's fp4_format)",
        )
    ]


def serving_memory_findings(
    plan: Plan, launcher: LauncherSpec, spec: JobSpec, reg: Registered
) -> tuple[Plan, list[Finding]]:
    """The serving memory estimate from the launcher's setup; MDC261 when none is made."""
    capacity = spec.distributed.accelerator_memory_gib
    if capacity is None or plan.model is None:
        return plan, []
    from mdc.plan import serving_memory  # imported only for a spec that asks for the check
    from mdc.plan.memory import missing_keys, resolve_shape

    shape = resolve_shape(plan.model)
    serving_of = launcher.serving
    setup = (
        None
        if serving_of is None or shape is None
        else call(reg, "serving", lambda: serving_of(plan, plan.options.get(launcher.name)))
    )
    if shape is None or setup is None:
        why = (
            f"[model] lacks {', '.join(missing_keys(plan.model))}"
            if shape is None
            else f"{launcher.name!r} gives no serving setup"
        )
        return plan, [
            Finding(
                code="MDC261",
                pointer="/distributed/accelerator_memory_gib",
                severity=Severity.WARNING,
                message=f"accelerator_memory_gib = {capacity:g} is set but no serving memory "
                f"estimate is made: {why}",
                hint="complete [model], or remove accelerator_memory_gib",
            )
        ]
    memory = serving_memory.estimate(shape, setup, capacity)
    return attrs.evolve(plan, serving_memory=memory), serving_memory.findings(memory)
