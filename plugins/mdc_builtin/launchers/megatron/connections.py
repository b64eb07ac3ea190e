"""CUDA_DEVICE_MAX_CONNECTIONS, which Megatron-LM core_v0.16.1's validate_args asserts on.

With tp or cp > 1 on a GPU before Blackwell (compute capability major < 10) it must be 1,
unless Megatron-FSDP, torch FSDP2 or the EP overlap is on ("CUDA_DEVICE_MAX_CONNECTIONS
requirement no longer exists since the Blackwell architecture"); with FSDP it must not be 1,
on any GPU. mdc exports 1 where the first applies, and where the spec names no GPU (so that
a Hopper job runs), unless [job] env sets it; a value in [job] env is refused only where
Megatron-LM asserts against it.
"""

from __future__ import annotations

from collections.abc import Iterator

from mdc.api import Finding, Plan, Severity
from mdc_builtin.launchers.megatron.options import MegatronOptions, megatron_fsdp

NAME = "CUDA_DEVICE_MAX_CONNECTIONS"
_ONE = (
    "Using tensor model parallelism or context parallelism require setting the environment "
    "variable CUDA_DEVICE_MAX_CONNECTIONS to 1"
)
_NOT_ONE = "FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one"


def _fsdp(opts: MegatronOptions) -> bool:
    """Megatron-FSDP or torch FSDP2 (their flags in extra_args are read into the keys; in
    the job's command they are MDC323)."""
    return megatron_fsdp(opts) or bool(opts.use_torch_fsdp2)


def needs_one(plan: Plan, opts: MegatronOptions) -> bool | None:
    """Whether Megatron-LM asserts the variable is 1; None: it would on a GPU before
    Blackwell, and the spec names no accelerator_model."""
    s = plan.sizes
    if plan.accelerator == "cpu" or (s.tp == 1 and s.cp == 1):
        return False
    # the EP overlap runs its all-to-alls on streams of their own: Megatron-LM only warns
    if _fsdp(opts) or opts.overlap_moe_expert_parallel_comm:
        return False
    major = plan.hardware.arch_major if plan.hardware else None
    return None if major is None else major < 10


def connections_env(plan: Plan, opts: MegatronOptions) -> dict[str, str]:
    """What the launcher exports: 1 where Megatron-LM may assert it, unless [job] env sets it."""
    if NAME in plan.job.env or needs_one(plan, opts) is False:
        return {}
    return {NAME: "1"}


def connection_rules(plan: Plan, opts: MegatronOptions) -> Iterator[Finding]:
    """MDC328 for a [job] env value Megatron-LM asserts against (a warning where the spec
    names no GPU to tell)."""
    value = plan.job.env.get(NAME)
    if not isinstance(value, str):
        return
    pointer = f"/job/env/{NAME}"
    if value == "1":
        if _fsdp(opts):
            yield Finding(
                code="MDC328",
                pointer=pointer,
                message=f"{NAME} = 1 with FSDP (Megatron-LM: '{_NOT_ONE}')",
                hint=f"remove {NAME} from [job] env, or set it above 1",
            )
        return
    needs = needs_one(plan, opts)
    sizes = f"tp = {plan.sizes.tp}, cp = {plan.sizes.cp}"
    if needs and plan.hardware is not None:
        yield Finding(
            code="MDC328",
            pointer=pointer,
            message=f"{NAME} = {value} with {sizes} on {plan.hardware.name} (compute "
            f"capability {plan.hardware.compute_capability}, before Blackwell) "
            f"(Megatron-LM: '{_ONE}')",
            hint=f"remove {NAME} from [job] env (mdc sets it to 1), or run tp = cp = 1",
        )
    elif needs is None:
        yield Finding(
            code="MDC328",
            pointer=pointer,
            severity=Severity.WARNING,
            message=f"{NAME} = {value} with {sizes}: Megatron-LM asserts it is 1 on GPUs "
            f"before Blackwell ('{_ONE}'), and the spec names no accelerator_model to tell",
            hint="set [distributed] accelerator_model; on Hopper and earlier remove it from "
            "[job] env",
        )
