"""--overlap-moe-expert-parallel-comm: Megatron-Core's combined 1F1B schedule runs one micro
batch's expert all-to-alls beside another's compute. Megatron-Core core_v0.16.1 refuses it
(TransformerConfig.__post_init__) on the conditions below, with these texts."""

from __future__ import annotations

from collections.abc import Iterator

from mdc.api import Finding, Plan
from mdc_builtin.launchers.megatron.options import MegatronOptions, pointer_of
from mdc_builtin.launchers.megatron.words import passes

KEY = "overlap_moe_expert_parallel_comm"


def _refusals(plan: Plan, opts: MegatronOptions) -> Iterator[tuple[str, str, str]]:
    """(why, Megatron-Core's text, hint) for each condition the setting breaks."""
    s, model = plan.sizes, plan.model
    if s.pp > 1 and s.vpp is None:
        yield (
            f"pp = {s.pp} without virtual stages",
            "If enabling EP A2A overlap, virtual_pipeline_model_parallel_size must be "
            "specified when pipeline_model_parallel_size > 1",
            "set [parallelism] vpp",
        )
    if s.ep == 1:
        yield (
            "ep = 1",
            "overlap_moe_expert_parallel_comm is only supported with expert model parallelism",
            "run ep > 1",
        )
    dispatcher = opts.moe_token_dispatcher_type
    if dispatcher not in ("alltoall", "flex"):
        yield (
            f"the {dispatcher} token dispatcher"
            if dispatcher
            else "the allgather token dispatcher (Megatron-Core's default)",
            "overlap_moe_expert_parallel_comm is supported with alltoall/flex token dispatcher",
            'set moe_token_dispatcher_type = "alltoall" (or "flex")',
        )
    # (recompute_method and recompute_num_layers, which it refuses too, apply only with
    # full recompute: without it MDC322 refuses them)
    if opts.recompute_granularity == "full":
        yield (
            'recompute_granularity = "full"',
            "disable full recomputation when enabling overlap_moe_expert_parallel_comm",
            'use recompute_granularity = "selective", or none',
        )
    words = [*plan.job.argv, *opts.extra_args]
    dtype = model.dtype if model else None
    if dtype not in ("bf16", "fp16", "fp8") and not any(
        passes(words, f) for f in ("--bf16", "--fp16")
    ):
        yield (
            f'[model] dtype = "{dtype}"' if dtype else "no [model] dtype (Megatron-LM: fp32)",
            f"{KEY} is only supported with bf16 or fp16 model",
            'set [model] dtype = "bf16"',
        )
    if passes(words, "--moe-shared-expert-overlap"):
        yield (
            "--moe-shared-expert-overlap",
            f"disable moe_shared_expert_overlap when enabling {KEY}",
            "remove --moe-shared-expert-overlap",
        )
    mtp = (model.mtp_num_layers if model else None) or 0
    if mtp > 1:
        yield (
            f"[model] mtp_num_layers = {mtp}",
            f"MTP layernum only supports 1 when enabling {KEY}.",
            "use at most one MTP layer",
        )
    elif mtp == 1 and s.pp == 1:
        yield (
            "one MTP layer with pp = 1",
            f"Pipeline model parallel size must be larger than 1 when enabling {KEY} with MTP "
            "layer.",
            "run pp > 1 (with vpp)",
        )


def ep_overlap_rules(plan: Plan, opts: MegatronOptions) -> Iterator[Finding]:
    if not opts.overlap_moe_expert_parallel_comm:
        return
    for why, text, hint in _refusals(plan, opts):
        yield Finding(
            code="MDC321",
            pointer=pointer_of(opts, KEY),
            message=f"{KEY} with {why} (Megatron-Core: '{text}')",
            hint=f"{hint}, or remove {KEY}",
        )
