"""How Megatron-LM trains, as far as the memory estimate and mdc tune go: what is sharded,
the bytes per gradient and optimizer state, the pipeline split, the memory levers."""

from __future__ import annotations

from mdc.api import PipelineSplit, TrainingSetup
from mdc_builtin.launchers.megatron.bf16_layers import bf16_layers
from mdc_builtin.launchers.megatron.optimizer import end_optimizer_bytes, layer_optimizer_bytes
from mdc_builtin.launchers.megatron.options import (
    MegatronOptions,
    distributed_optimizer,
    megatron_fsdp,
    pointer_of,
    resolved_options,
)
from mdc_builtin.launchers.megatron.precision import fp4_gemm_input_bytes, fp4_layer_weight_bytes

#: Megatron-FSDP's sharding strategy -> the ZeRO stage it amounts to
FSDP_ZERO_STAGE = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}


#: bytes per element of Megatron's optimizer dtypes (fp8 moments: 1 byte each)
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


#: what the memory hint proposes, in the [megatron] table's words
LEVERS = (
    ("zero 1", "[megatron] use_distributed_optimizer = true"),
    (
        "zero 2",
        '[megatron] use_megatron_fsdp = true, data_parallel_sharding_strategy = "optim_grads"',
    ),
    (
        "zero 3",
        "[megatron] use_megatron_fsdp = true, "
        'data_parallel_sharding_strategy = "optim_grads_params"',
    ),
    (
        "optimizer offload",
        "[megatron] optimizer_cpu_offload = true, use_precision_aware_optimizer = true",
    ),
    ("sequence parallel", "[megatron] sequence_parallel = true"),
    ("recompute selective", '[megatron] recompute_granularity = "selective"'),
    (
        "recompute full",
        '[megatron] recompute_granularity = "full", recompute_method = "uniform", '
        "recompute_num_layers = 1",
    ),
)


def zero_stage(opts: MegatronOptions) -> int:
    """What is sharded over the dp-cp group, as a ZeRO stage: Megatron-FSDP's strategy
    (no_shard, optim, optim_grads, optim_grads_params: 0-3), else the distributed
    optimizer's 1."""
    stage = 1 if distributed_optimizer(opts) else 0
    if opts.optimizer == "dist_muon":  # Megatron-Core's layer-wise distributed optimizer
        stage = 1
    if opts.use_torch_fsdp2:  # torch's fully_shard: parameters, gradients and optimizer state
        stage = 3
    if megatron_fsdp(opts):
        strategy = opts.data_parallel_sharding_strategy or "no_shard"
        stage = max(stage, FSDP_ZERO_STAGE[strategy])
    return stage


def _optimizer_bytes(opts: MegatronOptions) -> int | None:
    """Bytes per parameter of optimizer state: SGD's or Muon's (optimizer.py), else
    Adam's under the precision-aware optimizer: the main (master) parameters (fp32 kept as
    a 16-bit remainder beside the bf16 weight, as megatron-core's store_param_remainders
    does by default: 2 bytes) and the two moments; None: 12."""
    other = layer_optimizer_bytes(opts, opts.extra_args)
    if other is not None:
        return other
    if not opts.use_precision_aware_optimizer:
        return None
    main = DTYPE_BYTES[opts.main_params_dtype or "fp32"]
    master = 2 if main == 4 else main
    return (
        master
        + DTYPE_BYTES[opts.exp_avg_dtype or "fp32"]
        + DTYPE_BYTES[opts.exp_avg_sq_dtype or "fp32"]
    )


def _grad_bytes(opts: MegatronOptions) -> int:
    """bf16 training: fp32 main gradients, unless reduced in bf16 (--grad-reduce-in-bf16, or
    bf16 main gradients of the precision-aware optimizer)."""
    if opts.grad_reduce_in_bf16 or opts.main_grads_dtype == "bf16":
        return 2
    return 4


def _dtype_grad_bytes(opts: MegatronOptions) -> tuple[tuple[str, int], ...]:
    """Megatron-LM's gradient buffer holds the parameter's dtype unless it accumulates and
    all-reduces in fp32 (DistributedDataParallel: ``torch.float if grad_reduce_in_fp32 else
    param.dtype``, set from --accumulate-allreduce-grads-in-fp32), which validate_args turns
    on for bf16 only: fp16 gradients take 2 bytes unless the flag asks for fp32; fp32 ones 4."""
    return (("fp16", 4 if opts.accumulate_allreduce_grads_in_fp32 else 2), ("fp32", 4))


def pipeline_split(opts: MegatronOptions) -> PipelineSplit:
    """Megatron-LM's rule for placing layers on pipeline stages, with the [megatron] keys."""
    return PipelineSplit(
        rule="megatron",
        first=opts.decoder_first_pipeline_num_layers,
        last=opts.decoder_last_pipeline_num_layers,
        embedding=bool(opts.account_for_embedding_in_pipeline_split),
        loss=bool(opts.account_for_loss_in_pipeline_split),
        layout=opts.pipeline_model_parallel_layout,
        pointers=tuple(
            (name, pointer_of(opts, key))
            for name, key in (
                ("first", "decoder_first_pipeline_num_layers"),
                ("last", "decoder_last_pipeline_num_layers"),
                ("embedding", "account_for_embedding_in_pipeline_split"),
                ("loss", "account_for_loss_in_pipeline_split"),
                ("layout", "pipeline_model_parallel_layout"),
            )
        ),
    )


def training(options: MegatronOptions | None) -> TrainingSetup:
    opts = resolved_options(options)
    offload = 0.0
    if opts.optimizer_cpu_offload:
        offload = (
            1.0 if opts.optimizer_offload_fraction is None else opts.optimizer_offload_fraction
        )
    return TrainingSetup(
        zero_stage=zero_stage(opts),
        replicas=opts.num_distributed_optimizer_instances or 1,
        grad_bytes=_grad_bytes(opts),
        dtype_grad_bytes=_dtype_grad_bytes(opts),
        # Megatron's optimizers step on fp32 gradients: a 16-bit buffer is copied
        # (`main_grad.float()`), unless the precision-aware optimizer steps on it directly
        step_grad_bytes=0 if opts.use_precision_aware_optimizer else 4,
        sequence_parallel=opts.sequence_parallel is not False,
        recompute=opts.recompute_granularity or "none",
        pipeline=pipeline_split(opts),
        recompute_method=opts.recompute_method,
        recompute_num_layers=opts.recompute_num_layers,
        recompute_modules=opts.recompute_modules,
        layer_weight_bytes=1 if opts.fp8_param_gather else fp4_layer_weight_bytes(opts),
        gemm_input_bytes=fp4_gemm_input_bytes(opts),
        gemm_precision="fp4" if opts.fp4_format else "fp8" if opts.fp8_format else None,
        optimizer_bytes=_optimizer_bytes(opts),
        end_optimizer_bytes=end_optimizer_bytes(opts),
        bf16_layers=bf16_layers(opts),
        optimizer_offload=offload,
        offload_layers=opts.cpu_offloading_num_layers or 0,
        moe_dispatcher=opts.moe_token_dispatcher_type or "allgather",
        overlap_p2p=opts.overlap_p2p_comm is not False,
        tp_comm_overlap=bool(opts.tp_comm_overlap),
        ep_comm_overlap=bool(opts.overlap_moe_expert_parallel_comm),
        overlap_grad_reduce=bool(opts.overlap_grad_reduce),
        overlap_param_gather=bool(opts.overlap_param_gather),
        moe_capacity_factor=opts.moe_expert_capacity_factor
        if opts.moe_pad_expert_input_to_capacity
        else None,
        # Megatron-Core limits the routing to groups only with a group top-k (its router's
        # _compute_topk: `if group_topk`)
        moe_router_groups=(opts.moe_router_num_groups, opts.moe_router_group_topk)
        if opts.moe_router_group_topk and opts.moe_router_num_groups
        else None,
        # vocab_parallel_cross_entropy: the output layer's bf16 logits and their fp32 copy
        logit_bytes=6,
        levers=LEVERS,
    )
