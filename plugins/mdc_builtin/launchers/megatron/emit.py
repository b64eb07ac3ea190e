"""The megatron launcher's command line and environment: torchrun, then Megatron-LM's
arguments for the plan's sizes, batch, model shape and memory options, then extra_args."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from mdc.api import Launch, ModelTable, Plan, Role, Word
from mdc.api.flags import disagreeing, drop_flags
from mdc.api.torchrun import (
    TorchrunOptions,
    program,
    runner_worker_env,
    torchrun_argv,
    torchrun_env,
    torchrun_worker_env,
)
from mdc_builtin.launchers.megatron.bf16_layers import bf16_layer_args
from mdc_builtin.launchers.megatron.connections import connections_env
from mdc_builtin.launchers.megatron.flags import (
    ARCHITECTURE_SWITCHES,
    ARCHITECTURE_VALUES,
    FLAGS,
    NO_P2P_OVERLAP,
    NORMALIZATIONS,
    PIPELINE_KEYS,
    POSITION_EMBEDDINGS,
    flag_of,
)
from mdc_builtin.launchers.megatron.optimizer import optimizer_args
from mdc_builtin.launchers.megatron.options import (
    MegatronOptions,
    distributed_optimizer,
    resolved_options,
    user_extra_args,
)
from mdc_builtin.launchers.megatron.precision import fp4_args
from mdc_builtin.launchers.megatron.words import passes, value_after

#: The orders Megatron-LM's command line can express: its default, and --use-tp-pp-dp-mapping.
DEFAULT_ORDER = "tp-cp-ep-dp-pp"


TP_PP_DP_ORDER = "tp-cp-ep-pp-dp"


def _significant(axes: Sequence[str], sizes: Mapping[str, int]) -> list[str]:
    return [axis for axis in axes if sizes[axis] > 1]


def megatron_order(plan: Plan) -> str | None:
    """Which of Megatron-LM's two orders lays ranks out as the plan does (None: neither).

    Only the relative order of axes larger than 1 moves ranks, so an order that
    differs from Megatron's only in size-1 axes is the same layout.
    """
    for candidate in (DEFAULT_ORDER, TP_PP_DP_ORDER):
        same = True
        for grid in (plan.layout.dense, plan.layout.expert):
            sizes = dict(zip(grid.axes, grid.sizes, strict=True))
            if _significant(grid.axes, sizes) != _significant(candidate.split("-"), sizes):
                same = False
        if same:
            return candidate
    return None


def sequence_parallel(plan: Plan, opts: MegatronOptions) -> bool:
    """Whether Megatron-LM runs sequence parallelism: on by default, and turned off by its
    validate_args when tp is 1."""
    return plan.sizes.tp > 1 and opts.sequence_parallel is not False


def _frequency(value: int | tuple[int, ...]) -> str:
    """Megatron-LM's moe_freq_type: an integer, or a Python list expression."""
    return str(value) if isinstance(value, int) else "[" + ",".join(map(str, value)) + "]"


def _architecture_args(model: ModelTable) -> Iterator[str]:
    for key in ARCHITECTURE_SWITCHES:
        if getattr(model, key):
            yield flag_of(key)
    for key in ARCHITECTURE_VALUES:
        value = getattr(model, key)
        if value is not None:
            yield from (flag_of(key), str(value))
    if model.window_size is not None:
        yield from ("--window-size", ",".join(map(str, model.window_size)))
    for key in ("window_attn_skip_freq", "moe_layer_freq", "csa_compress_ratios"):
        value = getattr(model, key)
        if value is not None:
            yield from (flag_of(key), _frequency(value))
    if model.hybrid_override_pattern is not None:
        yield from ("--is-hybrid-model", "--hybrid-override-pattern", model.hybrid_override_pattern)


def _model_args(plan: Plan, opts: MegatronOptions) -> Iterator[str]:
    model = plan.model
    if model is None:
        if opts.max_position_embeddings is not None:
            yield from ("--max-position-embeddings", str(opts.max_position_embeddings))
        return
    for flag, value in (
        ("--num-layers", model.num_layers),
        ("--hidden-size", model.hidden_size),
        ("--ffn-hidden-size", model.ffn_hidden_size),
        ("--num-attention-heads", model.num_attention_heads),
    ):
        if value is not None:
            yield from (flag, str(value))
    groups, heads = model.num_query_groups, model.num_attention_heads
    if groups is not None and groups != heads:
        yield from ("--group-query-attention", "--num-query-groups", str(groups))
    if model.seq_length is not None:
        yield from ("--seq-length", str(model.seq_length))
    positions = opts.max_position_embeddings or model.seq_length
    if positions is not None:
        yield from ("--max-position-embeddings", str(positions))
    if model.num_experts is not None:
        yield from ("--num-experts", str(model.num_experts))
    for flag, value in (
        ("--moe-ffn-hidden-size", model.moe_ffn_hidden_size),
        ("--moe-router-topk", model.moe_router_topk),
    ):
        if value is not None:
            yield from (flag, str(value))
    # the layout keys the memory estimate reads, in Megatron-LM's words (its defaults:
    # no gating, tied embeddings, learned positions, biases, LayerNorm)
    if model.gated_mlp:
        yield "--swiglu"
    if model.tied_embeddings is False:
        yield "--untie-embeddings-and-output-weights"
    if model.position_embedding is not None:
        yield from ("--position-embedding-type", POSITION_EMBEDDINGS[model.position_embedding])
    if model.bias is False:
        yield "--disable-bias-linear"
    if model.normalization is not None:
        yield from ("--normalization", NORMALIZATIONS[model.normalization])
    yield from _architecture_args(model)
    if model.dtype == "bf16":
        yield "--bf16"
    elif model.dtype == "fp16":
        yield "--fp16"
    elif model.dtype == "fp8":  # FP8 GEMMs through Transformer Engine, bf16 everywhere else
        yield from ("--bf16", "--fp8-format", opts.fp8_format or "hybrid")


def megatron_args(plan: Plan, options: MegatronOptions | None) -> list[str]:
    """The Megatron-LM arguments mdc appends to the user's command (before ``extra_args``)."""
    opts = resolved_options(options)
    s = plan.sizes
    args = [
        "--tensor-model-parallel-size",
        str(s.tp),
        "--pipeline-model-parallel-size",
        str(s.pp),
        "--context-parallel-size",
        str(s.cp),
        "--expert-model-parallel-size",
        str(s.ep),
        "--expert-tensor-parallel-size",
        str(s.etp),
    ]
    if opts.pipeline_model_parallel_layout is not None:
        # the layout gives the virtual stages; Megatron-LM takes only one of the two
        args += ["--pipeline-model-parallel-layout", opts.pipeline_model_parallel_layout]
    elif s.vpp is not None:
        args += ["--num-virtual-stages-per-pipeline-rank", str(s.vpp)]
    for key in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"):
        value = getattr(opts, key)
        if value is not None:
            args += [PIPELINE_KEYS[key], str(value)]
    for key in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
        if getattr(opts, key):
            args.append(PIPELINE_KEYS[key])
    if megatron_order(plan) == TP_PP_DP_ORDER:
        args.append("--use-tp-pp-dp-mapping")
    if sequence_parallel(plan, opts):
        args.append("--sequence-parallel")
    if distributed_optimizer(opts):
        args.append("--use-distributed-optimizer")
    if opts.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
    if opts.overlap_param_gather:
        args.append("--overlap-param-gather")
    if opts.overlap_p2p_comm is False:
        args.append(NO_P2P_OVERLAP)
    if opts.tp_comm_overlap:
        args.append("--tp-comm-overlap")
    if opts.overlap_moe_expert_parallel_comm:
        args.append("--overlap-moe-expert-parallel-comm")
    if plan.batch is not None:
        args += [
            "--micro-batch-size",
            str(plan.batch.micro_batch_size),
            "--global-batch-size",
            str(plan.batch.global_batch_size),
        ]
    args += _model_args(plan, opts)
    if eager_attention(plan) and attention_backend(plan, opts) is None:
        # Megatron-Core's default backend picks a fused kernel; eager attention is unfused
        args += ["--attention-backend", "unfused"]
    if opts.recompute_granularity is not None:
        args += ["--recompute-granularity", opts.recompute_granularity]
        if opts.recompute_method is not None:
            args += ["--recompute-method", opts.recompute_method]
        if opts.recompute_num_layers is not None:
            args += ["--recompute-num-layers", str(opts.recompute_num_layers)]
    return args + list(_memory_args(plan, opts))


def _memory_args(plan: Plan, opts: MegatronOptions) -> Iterator[str]:
    """The flags of the options that change what each GPU holds, in the table's order."""
    if opts.recompute_modules is not None:
        yield "--recompute-modules"
        yield from opts.recompute_modules
    for key in ("cp_comm_type", "hierarchical_context_parallel_sizes"):
        values = getattr(opts, key)
        if values is not None:
            yield from (flag_of(key), *map(str, values))
    if opts.use_megatron_fsdp:
        yield "--use-megatron-fsdp"
        # Megatron-LM: "Megatron FSDP only supports fsdp_dtensor checkpoint format"
        if not passes([*plan.job.argv, *opts.extra_args], "--ckpt-format"):
            yield from ("--ckpt-format", "fsdp_dtensor")
    for key in (
        "data_parallel_sharding_strategy",
        "fp8_recipe",
        "main_grads_dtype",
        "main_params_dtype",
        "exp_avg_dtype",
        "exp_avg_sq_dtype",
        "optimizer_offload_fraction",
        "cpu_offloading_num_layers",
        "moe_token_dispatcher_type",
        "moe_expert_capacity_factor",
        "moe_router_num_groups",
        "moe_router_group_topk",
    ):
        value = getattr(opts, key)
        if value is not None:
            yield from (flag_of(key), str(value))
    for key in (
        "use_torch_fsdp2",
        "grad_reduce_in_bf16",
        "accumulate_allreduce_grads_in_fp32",
        "fp8_param_gather",
        "use_precision_aware_optimizer",
        "optimizer_cpu_offload",
        "moe_pad_expert_input_to_capacity",
    ):
        if getattr(opts, key):
            yield flag_of(key)
    yield from fp4_args(opts)
    yield from bf16_layer_args(opts)
    yield from optimizer_args(opts)


#: Megatron-Core's AttnBackend values that run attention eagerly (seq x seq scores kept)
EAGER_BACKENDS = ("unfused", "local")


def eager_attention(plan: Plan) -> bool:
    return plan.model is not None and plan.model.flash_attention is False


def attention_backend(plan: Plan, opts: MegatronOptions) -> str | None:
    """The --attention-backend the job's command or extra_args pass (None: not passed)."""
    return value_after([*plan.job.argv, *opts.extra_args], "--attention-backend")


def megatron_env(plan: Plan, options: MegatronOptions | None) -> dict[str, str]:
    s = plan.sizes
    env = {
        "TENSOR_MODEL_PARALLEL_SIZE": str(s.tp),
        "PIPELINE_MODEL_PARALLEL_SIZE": str(s.pp),
        "CONTEXT_PARALLEL_SIZE": str(s.cp),
    }
    return {**env, **connections_env(plan, resolved_options(options))}


def torchrun_options(plan: Plan) -> TorchrunOptions | None:
    opts = plan.options.get("torchrun")
    return opts if isinstance(opts, TorchrunOptions) else None


def emit(plan: Plan, options: MegatronOptions | None) -> Launch:
    opts = resolved_options(options)
    mine = megatron_args(plan, opts)
    # a flag of the user's that says what mdc writes is written once, by mdc
    command = plan.job.argv
    extra = user_extra_args(opts)
    words: list[Word] = [
        *program(drop_flags(command, disagreeing(FLAGS, command, mine)[0])),
        *mine,
        *drop_flags(extra, disagreeing(FLAGS, extra, mine)[0]),
    ]
    env = megatron_env(plan, opts)
    worker_env = {
        **torchrun_worker_env(plan, torchrun_options(plan)),
        **runner_worker_env(plan, "torchrun"),
        **env,
    }
    role_env: dict[str, Word] = {**torchrun_env(plan, torchrun_options(plan)), **env}
    return Launch(
        roles=(
            Role(
                name="worker",
                argv=tuple(torchrun_argv(plan, torchrun_options(plan), words)),
                env=role_env,
            ),
        ),
        worker_env=worker_env,
    )
