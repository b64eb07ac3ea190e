"""The [megatron] table."""

from __future__ import annotations

import attrs

from mdc_builtin.launchers.megatron.optimizer import is_muon
from mdc_builtin.launchers.megatron.words import passes


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class MegatronOptions:
    """The ``[megatron]`` table; ``None`` means "not given"."""

    sequence_parallel: bool | None = None
    use_distributed_optimizer: bool | None = None
    overlap_grad_reduce: bool | None = None
    overlap_param_gather: bool | None = None
    overlap_p2p_comm: bool | None = None
    tp_comm_overlap: bool | None = None
    overlap_moe_expert_parallel_comm: bool | None = None
    recompute_granularity: str | None = None
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    recompute_modules: tuple[str, ...] | None = None
    max_position_embeddings: int | None = None
    fp8_format: str | None = None
    decoder_first_pipeline_num_layers: int | None = None
    decoder_last_pipeline_num_layers: int | None = None
    account_for_embedding_in_pipeline_split: bool | None = None
    account_for_loss_in_pipeline_split: bool | None = None
    pipeline_model_parallel_layout: str | None = None
    fp8_recipe: str | None = None
    fp8_param_gather: bool | None = None
    use_megatron_fsdp: bool | None = None
    use_torch_fsdp2: bool | None = None
    data_parallel_sharding_strategy: str | None = None
    grad_reduce_in_bf16: bool | None = None
    accumulate_allreduce_grads_in_fp32: bool | None = None
    use_precision_aware_optimizer: bool | None = None
    main_grads_dtype: str | None = None
    main_params_dtype: str | None = None
    exp_avg_dtype: str | None = None
    exp_avg_sq_dtype: str | None = None
    optimizer_cpu_offload: bool | None = None
    optimizer_offload_fraction: float | None = None
    cpu_offloading_num_layers: int | None = None
    moe_token_dispatcher_type: str | None = None
    moe_expert_capacity_factor: float | None = None
    moe_pad_expert_input_to_capacity: bool | None = None
    moe_router_num_groups: int | None = None
    moe_router_group_topk: int | None = None
    cp_comm_type: tuple[str, ...] | None = None
    hierarchical_context_parallel_sizes: tuple[int, ...] | None = None
    fp4_format: str | None = None
    fp4_recipe: str | None = None
    fp4_quantizer_factory: str | None = None
    fp4_param_gather: bool | None = None
    first_last_layers_bf16: bool | None = None
    num_layers_at_start_in_bf16: int | None = None
    num_layers_at_end_in_bf16: int | None = None
    optimizer: str | None = None
    num_distributed_optimizer_instances: int | None = None
    extra_args: tuple[str, ...] = ()


def resolved_options(options: MegatronOptions | None) -> MegatronOptions:
    return resolve(options or MegatronOptions())


def resolve(opts: MegatronOptions) -> MegatronOptions:
    """The options as Megatron-LM reads them. (The flags of extra_args and the command that
    stand for a key were read into the spec before it was checked: mdc.passes.flags.)"""
    return _moe_layer_recompute(opts)


#: Megatron-Core's default selective recompute modules (TransformerConfig.recompute_modules)
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)


def _moe_layer_recompute(opts: MegatronOptions) -> MegatronOptions:
    """--moe-layer-recompute (deprecated) as Megatron-Core reads it: selective recompute
    with "moe" among the modules (TransformerConfig.__post_init__; with full granularity it
    raises, the launcher's rule MDC357)."""
    if not passes(opts.extra_args, "--moe-layer-recompute"):
        return opts
    if opts.recompute_granularity == "full":
        return opts
    modules = opts.recompute_modules or DEFAULT_RECOMPUTE_MODULES
    return attrs.evolve(
        opts,
        recompute_granularity="selective",
        recompute_modules=modules if "moe" in modules else (*modules, "moe"),
    )


def user_extra_args(opts: MegatronOptions) -> list[str]:
    """``extra_args`` as mdc emits them (the flags read into keys are gone from them)."""
    return list(opts.extra_args)


def pointer_of(opts: MegatronOptions, key: str) -> str:
    """The pointer of an option (a key read from a flag is located at the flag's word)."""
    return f"/megatron/{key}"


def distributed_optimizer(opts: MegatronOptions) -> bool:
    """On unless turned off; by default off for Muon, which Megatron-LM runs without it."""
    if opts.use_distributed_optimizer is None:
        return not is_muon(opts)
    return opts.use_distributed_optimizer


def megatron_fsdp(opts: MegatronOptions) -> bool:
    return bool(opts.use_megatron_fsdp)
