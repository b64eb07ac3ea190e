"""What the serving memory check reads: the tighter role's engine and the engine settings
in the servers' arguments."""

from __future__ import annotations

from mdc.api import Plan, ServingSetup, StepLimits
from mdc_builtin.launchers import vllm
from mdc_builtin.launchers.vllm_disagg.options import VllmDisaggOptions
from mdc_builtin.launchers.vllm_disagg.servers import server


def serving(plan: Plan, options: VllmDisaggOptions | None) -> ServingSetup | None:
    """The tighter role's engine for the memory check: the smaller tensor-parallel size
    holds the larger share of the weights on each GPU (decode on a tie)."""
    if options is None or plan.disagg is None:
        return None
    shapes = [server(plan, options, role) for role in ("decode", "prefill")]
    shape = min(shapes, key=lambda s: s.tp)
    values, _ = vllm.MEMORY_FLAGS.read([*plan.job.argv, *options.args, *shape.args])
    decode, _ = vllm.MEMORY_FLAGS.read([*plan.job.argv, *options.args, *shapes[0].args])
    roles = {}
    for each in shapes:  # each role's engines' per-step limits
        own, _ = vllm.MEMORY_FLAGS.read([*plan.job.argv, *options.args, *each.args])
        roles[each.role] = StepLimits(
            max_batch=own.get("max_batch"),
            step_tokens=own.get("step_tokens"),
            share=own.get("share", DEFAULT_SHARE),
        )
    share = values.get("share")
    # vLLM's expert-parallel group is tp x dp of one server; each engine holds its share
    ep = shape.expert_ranks
    return ServingSetup(
        engine=f"vLLM ({shape.role})",
        tp=shape.tp,
        ep=ep,
        etp=1 if shape.ep else shape.tp,
        share=share if share is not None else DEFAULT_SHARE,
        share_source="--gpu-memory-utilization"
        if share is not None
        else "vLLM's default --gpu-memory-utilization",
        kv_dtype=values.get("kv_dtype", "auto"),
        max_len=values.get("max_len"),
        roles=roles,
        profiled_tokens=values.get("step_tokens", vllm.DEFAULT_STEP_TOKENS),
        # the decode engines' (shapes[0]) steps are the ones a token waits for
        cuda_graphs=not decode.get("eager", False),
    )


#: vLLM's default --gpu-memory-utilization (vllm/config/cache.py)
DEFAULT_SHARE = 0.9
