"""Megatron-LM on torchrun: the plan's sizes, batch and model shape as Megatron-LM arguments.

torchrun starts the workers (the same command line as the torchrun launcher,
``[torchrun]`` options included); Megatron-LM's arguments follow the user's
own: every parallel size (even 1, so the command alone says how the job is
laid out and no default of a wrapper script can change it), the virtual
pipeline stages, ``--use-tp-pp-dp-mapping`` for that rank order, the batch,
sequence parallelism, the distributed optimizer, gradient/parameter overlap,
activation recomputation and, from ``[model]``, the model shape and precision.
Flag names and rules are those of Megatron-LM core_v0.16 (``megatron/training/
arguments.py``) and megatron-core 0.16's config classes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import attrs

import mdc
from mdc.api import (
    Finding,
    FlagTable,
    FlagUse,
    KnownFlag,
    Launch,
    LauncherSpec,
    ModelTable,
    PipelineSplit,
    Plan,
    Role,
    Severity,
    TorchrunOptions,
    TrainingSetup,
    Word,
    already_set,
    command_pointer,
    drop_flags,
    program,
    read_schema,
    runner_worker_env,
    torchrun_argv,
    torchrun_env,
    torchrun_findings,
    torchrun_worker_env,
)
from mdc_builtin.launchers.megatron_bf16_layers import (
    BF16_LAYER_FLAGS,
    bf16_layer_args,
    bf16_layer_rules,
    bf16_layers,
)
from mdc_builtin.launchers.megatron_optimizer import (
    OPTIMIZER_FLAGS,
    end_optimizer_bytes,
    is_muon,
    layer_optimizer_bytes,
    optimizer_args,
    optimizer_rules,
)
from mdc_builtin.launchers.megatron_precision import (
    FP4_FLAGS,
    fp4_args,
    fp4_gemm_input_bytes,
    fp4_layer_weight_bytes,
    fp4_rules,
)
from mdc_builtin.launchers.megatron_words import passes as _passes
from mdc_builtin.launchers.megatron_words import value_after as _value_after

#: The orders Megatron-LM's command line can express: its default, and --use-tp-pp-dp-mapping.
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
TP_PP_DP_ORDER = "tp-cp-ep-pp-dp"
#: Megatron-LM's flags that select the same setting as one mdc emits (a second spelling).
ALIASES: Mapping[str, tuple[str, ...]] = {
    "--num-virtual-stages-per-pipeline-rank": ("--num-layers-per-virtual-pipeline-stage",),
    "--num-layers": ("--encoder-num-layers",),
    "--recompute-granularity": ("--recompute-activations",),
    "--tensor-model-parallel-size": ("--model-parallel-size",),
    "--micro-batch-size": ("--batch-size",),
}
#: Switches mdc owns whether or not it emits them (each has a [megatron] option or a spec key).
SWITCHES: Mapping[str, str] = {
    "--sequence-parallel": "[megatron] sequence_parallel",
    "--use-distributed-optimizer": "[megatron] use_distributed_optimizer",
    "--overlap-grad-reduce": "[megatron] overlap_grad_reduce",
    "--overlap-param-gather": "[megatron] overlap_param_gather",
    "--use-tp-pp-dp-mapping": "[parallelism] order",
    "--recompute-granularity": "[megatron] recompute_granularity",
    "--recompute-method": "[megatron] recompute_method",
    "--recompute-num-layers": "[megatron] recompute_num_layers",
    "--tensor-model-parallel-size": "[parallelism] tp",
    "--pipeline-model-parallel-size": "[parallelism] pp",
    "--context-parallel-size": "[parallelism] cp",
    "--expert-model-parallel-size": "[parallelism] ep",
    "--expert-tensor-parallel-size": "[parallelism] etp",
    "--num-virtual-stages-per-pipeline-rank": "[parallelism] vpp",
    "--decoder-first-pipeline-num-layers": "[megatron] decoder_first_pipeline_num_layers",
    "--decoder-last-pipeline-num-layers": "[megatron] decoder_last_pipeline_num_layers",
    "--account-for-embedding-in-pipeline-split": (
        "[megatron] account_for_embedding_in_pipeline_split"
    ),
    "--account-for-loss-in-pipeline-split": "[megatron] account_for_loss_in_pipeline_split",
    "--pipeline-model-parallel-layout": "[megatron] pipeline_model_parallel_layout",
}
#: the [megatron] keys that place layers on pipeline stages, and their flags
PIPELINE_KEYS: Mapping[str, str] = {
    "decoder_first_pipeline_num_layers": "--decoder-first-pipeline-num-layers",
    "decoder_last_pipeline_num_layers": "--decoder-last-pipeline-num-layers",
    "account_for_embedding_in_pipeline_split": "--account-for-embedding-in-pipeline-split",
    "account_for_loss_in_pipeline_split": "--account-for-loss-in-pipeline-split",
    "pipeline_model_parallel_layout": "--pipeline-model-parallel-layout",
}
#: Megatron-FSDP / torch FSDP2 flags: they need CUDA_DEVICE_MAX_CONNECTIONS unset.
FSDP_FLAGS = ("--use-torch-fsdp2", "--use-megatron-fsdp")
#: Megatron-LM core_v0.16.1's choices (megatron/training/arguments.py, TransformerConfig)
SHARDING_STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")
FP8_RECIPES = ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")
OPTIMIZER_DTYPES = {
    "main_grads_dtype": ("fp32", "bf16"),
    "main_params_dtype": ("fp32", "fp16"),
    "exp_avg_dtype": ("fp32", "fp16", "bf16", "fp8"),
    "exp_avg_sq_dtype": ("fp32", "fp16", "bf16", "fp8"),
}
RECOMPUTE_MODULES = (
    "core_attn",
    "moe_act",
    "layernorm",
    "mla_up_proj",
    "mlp",
    "moe",
    "shared_experts",
)
DISPATCHERS = ("allgather", "alltoall", "flex")
#: Megatron-FSDP's sharding strategy -> the ZeRO stage it amounts to
FSDP_ZERO_STAGE = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}


def _option_flag(
    key: str,
    nargs: Literal[0, 1, "+"] = 0,
    convert: Callable[[str], Any] = str,
    choices: tuple[str, ...] = (),
) -> KnownFlag:
    """A flag read into the [megatron] option of the same name (flag: --key-in-kebab-case)."""
    return KnownFlag(
        name="--" + key.replace("_", "-"),
        source=f"[megatron] {key}",
        key=key,
        nargs=nargs,
        convert=convert,
        choices=choices,
    )


#: [megatron] options a flag in extra_args may stand for: read into the plan as if written
OPTION_FLAGS = (
    _option_flag("use_megatron_fsdp"),
    _option_flag("use_torch_fsdp2"),
    _option_flag("data_parallel_sharding_strategy", 1, choices=SHARDING_STRATEGIES),
    _option_flag("grad_reduce_in_bf16"),
    _option_flag("fp8_recipe", 1, choices=FP8_RECIPES),
    _option_flag("fp8_param_gather"),
    _option_flag("use_precision_aware_optimizer"),
    *(_option_flag(key, 1, choices=values) for key, values in OPTIMIZER_DTYPES.items()),
    _option_flag("optimizer_cpu_offload"),
    _option_flag("optimizer_offload_fraction", 1, float),
    _option_flag("cpu_offloading_num_layers", 1, int),
    _option_flag("recompute_modules", "+", choices=RECOMPUTE_MODULES),
    _option_flag("moe_token_dispatcher_type", 1, choices=DISPATCHERS),
    _option_flag("moe_expert_capacity_factor", 1, float),
    _option_flag("moe_pad_expert_input_to_capacity"),
)


@attrs.frozen(kw_only=True)
class MegatronOptions:
    """The ``[megatron]`` table; ``None`` means "not given"."""

    sequence_parallel: bool | None = None
    use_distributed_optimizer: bool | None = None
    overlap_grad_reduce: bool | None = None
    overlap_param_gather: bool | None = None
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


def _options(options: MegatronOptions | None) -> MegatronOptions:
    return resolve(options or MegatronOptions())


def _read_uses(opts: MegatronOptions) -> list[FlagUse]:
    """The flags of ``extra_args`` that stand for one of the table's keys (values valid)."""
    return [use for use in FLAGS.find(opts.extra_args) if use.flag.key and use.error is None]


def resolve(opts: MegatronOptions) -> MegatronOptions:
    """The options with each readable flag of ``extra_args`` read in as if its key had
    been written (a key the table sets keeps its value: the flag is then MDC323).
    ``extra_args`` stays as written; :func:`user_extra_args` is what mdc emits of it."""
    read = {
        use.flag.key: use.value
        for use in _read_uses(opts)
        if use.flag.key and getattr(opts, use.flag.key) is None
    }
    return attrs.evolve(opts, **read) if read else opts


def user_extra_args(opts: MegatronOptions) -> list[str]:
    """``extra_args`` without the flags read into keys: mdc emits those in its place, once."""
    return drop_flags(opts.extra_args, _read_uses(opts))


def _at(opts: MegatronOptions, key: str) -> str:
    """The pointer of an option: the extra_args word it was read from, or its key."""
    uses = [use for use in _read_uses(opts) if use.flag.key == key]
    return f"/megatron/extra_args/{uses[-1].index}" if uses else f"/megatron/{key}"


def _distributed_optimizer(opts: MegatronOptions) -> bool:
    """On unless turned off; by default off for Muon, which Megatron-LM runs without it."""
    if opts.use_distributed_optimizer is None:
        return not is_muon(opts)
    return opts.use_distributed_optimizer


def _sequence_parallel(plan: Plan, opts: MegatronOptions) -> bool:
    return plan.sizes.tp > 1 and opts.sequence_parallel is not False


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


#: [model] values -> Megatron-LM's choices for --position-embedding-type and --normalization
POSITION_EMBEDDINGS: Mapping[str, str] = {
    "learned": "learned_absolute",
    "rope": "rope",
    "none": "none",
}
#: [model] keys emitted as Megatron-LM's flag of the same name, with a value
ARCHITECTURE_VALUES = (
    "kv_channels",
    "softmax_type",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_head_dim",
    "qk_pos_emb_head_dim",
    "v_head_dim",
    "moe_shared_expert_intermediate_size",
    "moe_latent_size",
    "mtp_num_layers",
    "mamba_state_dim",
    "mamba_head_dim",
    "mamba_num_groups",
    "mamba_num_heads",
    # DeepSeek-V4 (Megatron-LM's dev branch, 2026-08: not in core_v0.16)
    "experimental_attention_variant",
    "o_groups",
    "o_lora_rank",
    "dsa_indexer_n_heads",
    "dsa_indexer_head_dim",
    "num_residual_streams",
    "moe_n_hash_layers",
)
#: and the switches
ARCHITECTURE_SWITCHES = (
    "qk_layernorm",
    "add_qkv_bias",
    "multi_latent_attention",
    "enable_hyper_connections",
)


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _frequency(value: int | tuple[int, ...]) -> str:
    """Megatron-LM's moe_freq_type: an integer, or a Python list expression."""
    return str(value) if isinstance(value, int) else "[" + ",".join(map(str, value)) + "]"


def _architecture_args(model: ModelTable) -> Iterator[str]:
    for key in ARCHITECTURE_SWITCHES:
        if getattr(model, key):
            yield _flag(key)
    for key in ARCHITECTURE_VALUES:
        value = getattr(model, key)
        if value is not None:
            yield from (_flag(key), str(value))
    if model.window_size is not None:
        yield from ("--window-size", ",".join(map(str, model.window_size)))
    for key in ("window_attn_skip_freq", "moe_layer_freq", "csa_compress_ratios"):
        value = getattr(model, key)
        if value is not None:
            yield from (_flag(key), _frequency(value))
    if model.hybrid_override_pattern is not None:
        yield from ("--is-hybrid-model", "--hybrid-override-pattern", model.hybrid_override_pattern)


NORMALIZATIONS: Mapping[str, str] = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}


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
    opts = _options(options)
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
    if _sequence_parallel(plan, opts):
        args.append("--sequence-parallel")
    if _distributed_optimizer(opts):
        args.append("--use-distributed-optimizer")
    if opts.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
    if opts.overlap_param_gather:
        args.append("--overlap-param-gather")
    if plan.batch is not None:
        args += [
            "--micro-batch-size",
            str(plan.batch.micro_batch_size),
            "--global-batch-size",
            str(plan.batch.global_batch_size),
        ]
    args += _model_args(plan, opts)
    if _eager_attention(plan) and _attention_backend(plan, opts) is None:
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
    if opts.use_megatron_fsdp:
        yield "--use-megatron-fsdp"
        # Megatron-LM: "Megatron FSDP only supports fsdp_dtensor checkpoint format"
        if not _passes([*plan.job.argv, *opts.extra_args], "--ckpt-format"):
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
    ):
        value = getattr(opts, key)
        if value is not None:
            yield from (_flag(key), str(value))
    for key in (
        "use_torch_fsdp2",
        "grad_reduce_in_bf16",
        "fp8_param_gather",
        "use_precision_aware_optimizer",
        "optimizer_cpu_offload",
        "moe_pad_expert_input_to_capacity",
    ):
        if getattr(opts, key):
            yield _flag(key)
    yield from fp4_args(opts)
    yield from bf16_layer_args(opts)
    yield from optimizer_args(opts)


#: Megatron-Core's AttnBackend values that run attention eagerly (seq x seq scores kept)
EAGER_BACKENDS = ("unfused", "local")


def _eager_attention(plan: Plan) -> bool:
    return plan.model is not None and plan.model.flash_attention is False


def _attention_backend(plan: Plan, opts: MegatronOptions) -> str | None:
    """The --attention-backend the job's command or extra_args pass (None: not passed)."""
    return _value_after([*plan.job.argv, *opts.extra_args], "--attention-backend")


def _attention_backend_rule(plan: Plan, opts: MegatronOptions) -> Iterator[Finding]:
    """--attention-backend decides whether attention keeps its seq x seq scores, which
    [model] flash_attention tells the estimate: the two must agree."""
    backend = _attention_backend(plan, opts)
    if backend is None or plan.model is None:
        return
    eager = backend in EAGER_BACKENDS
    if eager == _eager_attention(plan):
        return
    where = "/model/flash_attention"
    for index, word in enumerate(plan.job.argv):
        if word.split("=", 1)[0] == "--attention-backend":
            where = command_pointer(plan.job.command, index)
    for index, word in enumerate(opts.extra_args):  # extra_args come last: they win
        if word.split("=", 1)[0] == "--attention-backend":
            where = f"/megatron/extra_args/{index}"
    kind = "eager attention, which keeps the seq x seq scores" if eager else "a fused kernel"
    yield Finding(
        code="MDC479",
        pointer=where,
        message=f"the arguments pass --attention-backend {backend} ({kind}), but [model] "
        f"flash_attention is {'not false' if eager else 'false'}: the memory estimate would "
        "count the other attention",
        hint=f"set [model] flash_attention = {'false' if eager else 'true'}",
    )


def _needs_max_connections(plan: Plan, user_args: Sequence[str]) -> bool:
    """Megatron-LM asserts CUDA_DEVICE_MAX_CONNECTIONS=1 for tp > 1 or cp > 1 on GPUs
    before Blackwell, unless FSDP is on (which asserts the opposite)."""
    if plan.accelerator == "cpu" or (plan.sizes.tp == 1 and plan.sizes.cp == 1):
        return False
    return not any(_passes(user_args, flag) for flag in FSDP_FLAGS)


def _fsdp(opts: MegatronOptions) -> bool:
    return bool(opts.use_megatron_fsdp)


def megatron_env(plan: Plan, options: MegatronOptions | None) -> dict[str, str]:
    s = plan.sizes
    env = {
        "TENSOR_MODEL_PARALLEL_SIZE": str(s.tp),
        "PIPELINE_MODEL_PARALLEL_SIZE": str(s.pp),
        "CONTEXT_PARALLEL_SIZE": str(s.cp),
    }
    opts = _options(options)
    torch_fsdp2 = bool(opts.use_torch_fsdp2)
    if not (_fsdp(opts) or torch_fsdp2) and _needs_max_connections(
        plan, [*plan.job.argv, *opts.extra_args]
    ):
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    return env


def _torchrun(plan: Plan) -> TorchrunOptions | None:
    opts = plan.options.get("torchrun")
    return opts if isinstance(opts, TorchrunOptions) else None


def emit(plan: Plan, options: MegatronOptions | None) -> Launch:
    opts = _options(options)
    words: list[Word] = [
        *program(plan.job.argv),
        *megatron_args(plan, opts),
        *user_extra_args(opts),
    ]
    env = megatron_env(plan, opts)
    worker_env = {
        **torchrun_worker_env(plan, _torchrun(plan)),
        **runner_worker_env(plan, "torchrun"),
        **env,
    }
    role_env: dict[str, Word] = {**torchrun_env(plan, _torchrun(plan)), **env}
    return Launch(
        roles=(
            Role(
                name="worker", argv=tuple(torchrun_argv(plan, _torchrun(plan), words)), env=role_env
            ),
        ),
        worker_env=worker_env,
    )


# ------------------------------------------------------------------ checks


#: where the value of a flag mdc emits (other than SWITCHES) comes from
SOURCES: Mapping[str, str] = {
    "--micro-batch-size": "[batch] micro_batch_size",
    "--global-batch-size": "[batch] global_batch_size",
    "--num-layers": "[model] num_layers",
    "--hidden-size": "[model] hidden_size",
    "--ffn-hidden-size": "[model] ffn_hidden_size",
    "--num-attention-heads": "[model] num_attention_heads",
    "--group-query-attention": "[model] num_query_groups",
    "--num-query-groups": "[model] num_query_groups",
    "--seq-length": "[model] seq_length",
    "--max-position-embeddings": "[megatron] max_position_embeddings ([model] seq_length)",
    "--num-experts": "[model] num_experts",
    "--moe-ffn-hidden-size": "[model] moe_ffn_hidden_size",
    "--moe-router-topk": "[model] moe_router_topk",
    "--swiglu": "[model] gated_mlp",
    "--untie-embeddings-and-output-weights": "[model] tied_embeddings",
    "--position-embedding-type": "[model] position_embedding",
    "--disable-bias-linear": "[model] bias",
    "--normalization": "[model] normalization",
    **{_flag(key): f"[model] {key}" for key in (*ARCHITECTURE_VALUES, *ARCHITECTURE_SWITCHES)},
    **{
        _flag(key): f"[model] {key}"
        for key in ("window_size", "window_attn_skip_freq", "moe_layer_freq", "csa_compress_ratios")
    },
    "--is-hybrid-model": "[model] hybrid_override_pattern",
    "--hybrid-override-pattern": "[model] hybrid_override_pattern",
    "--bf16": "[model] dtype",
    "--fp16": "[model] dtype",
    "--fp8-format": "[model] dtype and [megatron] fp8_format",
}


def _readable(key: str, nargs: Literal[0, 1, "+"] = 0, **how: Any) -> KnownFlag:
    return attrs.evolve(_option_flag(key, nargs), **how)


#: Every Megatron-LM flag the launcher knows: the [megatron] options' (read from extra_args)
#: and those whose value comes from another table (never read: refused with that table's key).
FLAGS = FlagTable(
    [
        _readable("sequence_parallel"),
        _readable("use_distributed_optimizer"),
        _readable("overlap_grad_reduce"),
        _readable("overlap_param_gather"),
        _readable("recompute_granularity", 1, choices=("full", "selective")),
        KnownFlag(
            name="--recompute-activations",
            source="[megatron] recompute_granularity",
            key="recompute_granularity",
            switch_value="selective",
        ),
        _readable("recompute_method", 1, choices=("uniform", "block")),
        _readable("recompute_num_layers", 1, convert=int),
        _readable("max_position_embeddings", 1, convert=int),
        _readable("fp8_format", 1, choices=("e4m3", "hybrid")),
        _readable("decoder_first_pipeline_num_layers", 1, convert=int),
        _readable("decoder_last_pipeline_num_layers", 1, convert=int),
        _readable("account_for_embedding_in_pipeline_split"),
        _readable("account_for_loss_in_pipeline_split"),
        _readable("pipeline_model_parallel_layout", 1),
        *OPTION_FLAGS,
        *FP4_FLAGS,
        *BF16_LAYER_FLAGS,
        *OPTIMIZER_FLAGS,
        *(
            KnownFlag(name=flag, source=source, aliases=ALIASES.get(flag, ()))
            for flag, source in [*SWITCHES.items(), *SOURCES.items()]
            if not flag.startswith("--recompute-")
            and flag not in PIPELINE_KEYS.values()
            and flag
            not in (
                "--sequence-parallel",
                "--use-distributed-optimizer",
                "--overlap-grad-reduce",
                "--overlap-param-gather",
                "--max-position-embeddings",
                "--fp8-format",
            )
        ),
    ]
)


def _sets(plan: Plan, opts: MegatronOptions) -> set[str]:
    """The flags the launcher sets: those it emits, its switches and its options' flags."""
    emitted = {w for w in megatron_args(plan, opts) if w.startswith("--")}
    return {f.name for f in FLAGS.flags if f.name in emitted or f.name in SWITCHES or f.key}


def _clashes(plan: Plan, written: MegatronOptions, opts: MegatronOptions) -> Iterator[Finding]:
    """A flag the launcher sets, also in the command or in extra_args (where it is not
    read into the plan: its key is set too, or another table decides it)."""
    mine = _sets(plan, opts)
    in_command = [use for use in FLAGS.find(plan.job.argv) if use.flag.name in mine]
    yield from already_set(
        in_command,
        code="MDC323",
        launcher="megatron",
        where="the job's command",
        pointer=lambda index: command_pointer(plan.job.command, index),
    )
    extra = [use for use in FLAGS.find(written.extra_args) if use.flag.name in mine]
    yield from already_set(
        [
            use
            for use in extra
            if use.flag.key is None or getattr(written, use.flag.key) is not None
        ],
        code="MDC323",
        launcher="megatron",
        where="extra_args",
        pointer=lambda index: f"/megatron/extra_args/{index}",
        canonical={"--recompute-activations": "--recompute-granularity"},
    )
    for use in extra:
        if use.flag.key is not None and use.error is not None:
            yield Finding(
                code="MDC359",
                pointer=f"/megatron/extra_args/{use.index}",
                message=f"extra_args: {use.error} (Megatron-LM refuses it)",
                hint=f"set {use.flag.source} instead",
            )


def _order(plan: Plan) -> Iterator[Finding]:
    if megatron_order(plan) is None:
        yield Finding(
            code="MDC320",
            pointer="/parallelism/order",
            message=f"Megatron-LM lays ranks out in order {DEFAULT_ORDER!r}, or "
            f"{TP_PP_DP_ORDER!r} with --use-tp-pp-dp-mapping; its command line "
            f"cannot express order {plan.layout.order!r}",
            hint=f"use order {DEFAULT_ORDER!r} (the default) or {TP_PP_DP_ORDER!r}",
        )


def _optimizer(plan: Plan, opts: MegatronOptions) -> Iterator[Finding]:
    if opts.overlap_param_gather:
        if not (_distributed_optimizer(opts) or _fsdp(opts)):
            yield Finding(
                code="MDC321",
                pointer="/megatron/overlap_param_gather",
                message="overlap_param_gather needs the distributed optimizer "
                "(Megatron-LM: '--overlap-param-gather only supported with "
                "distributed optimizer or megatron fsdp'), but "
                "use_distributed_optimizer = false",
                hint="set use_distributed_optimizer = true, or remove overlap_param_gather",
            )
        if not opts.overlap_grad_reduce:
            yield Finding(
                code="MDC321",
                pointer="/megatron/overlap_param_gather",
                message="overlap_param_gather needs overlap_grad_reduce (Megatron-LM: "
                "'Must use --overlap-param-gather with --overlap-grad-reduce')",
                hint="set overlap_grad_reduce = true",
            )
    if _distributed_optimizer(opts) and opts.use_torch_fsdp2:
        yield Finding(
            code="MDC321",
            pointer=_at(opts, "use_torch_fsdp2"),
            message="use_torch_fsdp2 cannot run with the distributed optimizer "
            "(Megatron-LM: \"--use-torch-fsdp2 is not supported with MCore's "
            'distributed optimizer"), which the megatron launcher turns on '
            "by default",
            hint="set use_distributed_optimizer = false",
        )


def _recompute(plan: Plan, opts: MegatronOptions) -> Iterator[Finding]:
    granularity, method, count = (
        opts.recompute_granularity,
        opts.recompute_method,
        opts.recompute_num_layers,
    )
    if granularity is None:
        for key, value in (("recompute_method", method), ("recompute_num_layers", count)):
            if value is not None:
                yield Finding(
                    code="MDC322",
                    pointer=f"/megatron/{key}",
                    message=f'{key} applies only with recompute_granularity = "full"',
                    hint='set recompute_granularity = "full", or remove ' + key,
                )
        return
    if granularity == "selective":
        for key, value, quote in (
            (
                "recompute_method",
                method,
                (
                    "Megatron-LM: 'recompute method is not yet "
                    "supported for selective recomputing granularity'"
                ),
            ),
            (
                "recompute_num_layers",
                count,
                (
                    "Megatron-Core: 'When using "
                    "recompute_granularity: selective recompute_num_layers must be None.'"
                ),
            ),
        ):
            if value is not None:
                yield Finding(
                    code="MDC322",
                    pointer=f"/megatron/{key}",
                    message=f"{key} must not be set with recompute_granularity = "
                    f'"selective" ({quote})',
                    hint=f'remove {key}, or use recompute_granularity = "full"',
                )
        return
    layers = plan.model.num_layers if plan.model else None
    chunks = plan.sizes.pp * (plan.sizes.vpp or 1)
    chunk = layers // chunks if layers and layers % chunks == 0 else None
    where = (
        f"num_layers / (pp * vpp) = {layers} / {chunks}"
        if plan.sizes.vpp
        else f"num_layers / pp = {layers} / {chunks}"
    )
    if method is None:
        yield Finding(
            code="MDC322",
            pointer="/megatron/recompute_granularity",
            message='recompute_granularity = "full" needs recompute_method '
            '(Megatron-Core: \'recompute_method must be "block" or '
            '"uniform"\')',
            hint='set recompute_method = "uniform" (every layer, in chunks of '
            'recompute_num_layers) or "block" (the first recompute_num_layers '
            "layers of each pipeline stage)",
        )
    if count is None:
        yield Finding(
            code="MDC322",
            pointer="/megatron/recompute_granularity",
            message='recompute_granularity = "full" needs recompute_num_layers '
            "(Megatron-Core: 'recompute_num_layers must be between 1 and "
            "num_layers_per_pipeline_rank')",
            hint=f"set recompute_num_layers to 1..{chunk} ({where})"
            if chunk
            else "set recompute_num_layers",
        )
        return
    if chunk is None:
        return
    if method == "uniform" and chunk % count:
        fitting = ", ".join(str(n) for n in range(1, chunk + 1) if chunk % n == 0)
        yield Finding(
            code="MDC322",
            pointer="/megatron/recompute_num_layers",
            message=f'recompute_method = "uniform" recomputes each model chunk\'s '
            f"{chunk} layers ({where}) in runs of recompute_num_layers = "
            f"{count}, which must divide {chunk} (Megatron-Core indexes past "
            "the chunk's last layer otherwise)",
            hint=f"recompute_num_layers can be one of {fitting}",
        )
    elif method == "block" and count > chunk:
        yield Finding(
            code="MDC322",
            pointer="/megatron/recompute_num_layers",
            severity=Severity.WARNING,
            message=f"recompute_num_layers ({count}) is more than the {chunk} layers "
            f"of each model chunk ({where}): every layer is recomputed",
            hint=f"set recompute_num_layers to 1..{chunk}",
        )


def _model(plan: Plan, opts: MegatronOptions) -> Iterator[Finding]:
    model, s = plan.model, plan.sizes
    experts = model.num_experts if model else None
    dtype = model.dtype if model else None
    if dtype == "fp16" and s.ep > 1:
        yield Finding(
            code="MDC324",
            pointer="/model/dtype",
            message=f"Megatron-LM does not train fp16 with expert parallelism (ep = "
            f"{s.ep}): 'Expert parallelism is not supported with fp16 "
            "training.'",
            hint='use dtype = "bf16", or ep = 1',
        )
    words = [*plan.job.argv, *opts.extra_args]
    if experts and s.etp > 1 and not _passes(words, "--disable-bias-linear"):
        yield Finding(
            code="MDC324",
            pointer="/parallelism/etp" if s.etp != s.tp else "/parallelism/tp",
            severity=Severity.WARNING,
            message=f"an MoE model with etp = {s.etp} needs --disable-bias-linear "
            "(Megatron-Core: 'Bias in Moe is only supported when ETP==1'), "
            "and neither the command nor extra_args passes it",
            hint='add "--disable-bias-linear" to [megatron] extra_args, or set etp = 1',
        )
    hashed = model.moe_n_hash_layers if model else None
    if hashed and s.pp > 1 and opts.pipeline_model_parallel_layout is None:
        yield Finding(
            code="MDC478",
            pointer="/model/moe_n_hash_layers",
            message=f"hash-routed MoE layers (moe_n_hash_layers = {hashed}) with pp = {s.pp} "
            "need an explicit layout (Megatron-Core: 'pipeline_model_parallel_layout must be "
            "set when using hash MoE layers with pipeline parallelism (PP > 1).')",
            hint="set [megatron] pipeline_model_parallel_layout, with the hash layers on the "
            "embedding's stage",
        )
    if opts.sequence_parallel and s.tp == 1:
        yield Finding(
            code="MDC325",
            pointer="/megatron/sequence_parallel",
            severity=Severity.WARNING,
            message="sequence_parallel = true has no effect with tp = 1: Megatron-LM "
            "turns it off ('Disabling sequence parallelism because tensor "
            "model parallelism is disabled')",
            hint="remove sequence_parallel, or set tp > 1",
        )
    if opts.sequence_parallel is False and s.ep > 1 and s.tp > 1:
        yield Finding(
            code="MDC325",
            pointer="/megatron/sequence_parallel",
            severity=Severity.WARNING,
            message=f"with ep = {s.ep} and tp = {s.tp}, Megatron-Core wants sequence "
            "parallelism ('When using expert parallelism and tensor "
            "parallelism for training, sequence parallelism must be used')",
            hint="remove sequence_parallel = false",
        )
    seq = model.seq_length if model else None
    positions = opts.max_position_embeddings
    if positions is not None and seq is not None and positions < seq:
        yield Finding(
            code="MDC326",
            pointer="/megatron/max_position_embeddings",
            message=f"max_position_embeddings ({positions}) must be at least "
            f"seq_length ({seq}) (Megatron-LM checks it)",
            hint=f"set max_position_embeddings to {seq} or more, or remove it "
            "(it defaults to seq_length)",
        )
    if opts.fp8_format is not None and dtype != "fp8":
        yield Finding(
            code="MDC326",
            pointer="/megatron/fp8_format",
            message=f'fp8_format applies only with [model] dtype = "fp8" (dtype is '
            f"{dtype or 'not set'})",
            hint='set [model] dtype = "fp8", or remove fp8_format',
        )
    if plan.batch is None and not _passes(words, "--micro-batch-size"):
        yield Finding(
            code="MDC327",
            pointer="/batch",
            severity=Severity.WARNING,
            message="Megatron-LM needs --micro-batch-size: the spec has no [batch] "
            "table and the command does not pass it",
            hint="add [batch] micro_batch_size (and global_batch_size); mdc then "
            "passes both and checks them against dp",
        )


def _memory_options(plan: Plan, opts: MegatronOptions) -> Iterator[Finding]:
    """Megatron-LM core_v0.16.1's rules for the options that change what a GPU holds
    (validate_args, TransformerConfig, OptimizerConfig), on the same conditions."""
    words = [*plan.job.argv, *opts.extra_args]
    dtype = plan.model.dtype if plan.model else None
    yield from _fsdp_rules(opts, words)
    yield from _torch_fsdp2_rules(plan, opts, words, dtype)
    yield from _precision_rules(opts, dtype)
    yield from fp4_rules(opts, dtype, lambda key: _at(opts, key))
    yield from _optimizer_rules(opts)
    yield from _offload_rules(plan, opts)
    yield from _recompute_module_rules(plan, opts, words, dtype)
    yield from _moe_rules(plan, opts, words)
    layers = plan.model.num_layers if plan.model else None
    at = lambda key: _at(opts, key)  # noqa: E731
    yield from bf16_layer_rules(opts, dtype, layers, plan.sizes.pp, at)
    yield from optimizer_rules(plan, opts, words, dtype, at)
    yield from _unmodelled(plan, opts)


#: Megatron-LM flags that change what a GPU holds and that the estimate does not model
UNMODELLED = (
    "--torch-fsdp2-no-reshard-after-forward",
    "--outer-dp-sharding-strategy",
    "--fine-grained-activation-offloading",
    "--offload-modules",
    "--distribute-saved-activations",
    "--moe-flex-dispatcher-backend",
    "--reuse-grad-buf-for-mxfp8-param-ag",
    "--keep-fp8-transpose-cache",
    # CUDA graphs keep their static buffers and memory pool
    "--cuda-graph-impl",
    "--enable-cuda-graph",
    "--external-cuda-graph",
)


def _unmodelled(plan: Plan, opts: MegatronOptions) -> Iterator[Finding]:
    places: list[tuple[str, Sequence[str], Callable[[int], str]]] = [
        ("the job's command", plan.job.argv, lambda i: command_pointer(plan.job.command, i)),
        ("extra_args", opts.extra_args, lambda i: f"/megatron/extra_args/{i}"),
    ]
    for where, words, pointer in places:
        for index, word in enumerate(words):
            flag = word.split("=", 1)[0]
            if flag in UNMODELLED:
                yield Finding(
                    code="MDC359",
                    pointer=pointer(index),
                    severity=Severity.WARNING,
                    message=f"{where} passes {flag}, which changes what each GPU holds; the "
                    "memory estimate does not model it (it may be off either way)",
                    hint="compare the estimate with a measured run, or leave "
                    "accelerator_memory_gib out to skip the check",
                )


def _fsdp_rules(opts: MegatronOptions, words: Sequence[str]) -> Iterator[Finding]:
    if opts.data_parallel_sharding_strategy is not None and not _fsdp(opts):
        yield Finding(
            code="MDC354",
            pointer=_at(opts, "data_parallel_sharding_strategy"),
            severity=Severity.WARNING,
            message="data_parallel_sharding_strategy has no effect without use_megatron_fsdp "
            "(Megatron-LM reads it only on the Megatron-FSDP path)",
            hint="set use_megatron_fsdp = true, or remove data_parallel_sharding_strategy",
        )
    ckpt = _value_after(words, "--ckpt-format")
    if _fsdp(opts) and ckpt is not None and ckpt != "fsdp_dtensor":
        yield Finding(
            code="MDC354",
            pointer=_at(opts, "use_megatron_fsdp"),
            message=f"use_megatron_fsdp needs --ckpt-format fsdp_dtensor, but the arguments "
            f"pass --ckpt-format {ckpt} (Megatron-LM: 'Megatron FSDP only supports "
            "fsdp_dtensor checkpoint format')",
            hint="remove --ckpt-format (mdc then passes fsdp_dtensor), or set it to fsdp_dtensor",
        )
    if _fsdp(opts) and opts.use_torch_fsdp2:
        yield Finding(
            code="MDC354",
            pointer=_at(opts, "use_megatron_fsdp"),
            message="use_megatron_fsdp and use_torch_fsdp2 are two FSDP implementations; "
            "Megatron-LM wraps the model in one (torch FSDP2) and ignores the other",
            hint="remove use_torch_fsdp2, or use_megatron_fsdp",
        )


def _torch_fsdp2_rules(
    plan: Plan, opts: MegatronOptions, words: Sequence[str], dtype: str | None
) -> Iterator[Finding]:
    """Megatron-LM core_v0.16.1's asserts on --use-torch-fsdp2 (validate_args)."""
    if not opts.use_torch_fsdp2:
        return
    s = plan.sizes
    tied = plan.model.tied_embeddings if plan.model else None
    ckpt = _value_after(words, "--ckpt-format")
    refused = [
        (s.pp > 1, f"pp = {s.pp}", "is not supported with pipeline parallelism", "set pp = 1"),
        (s.ep > 1, f"ep = {s.ep}", "is not supported with expert parallelism", "set ep = 1"),
        (
            not _passes(words, "--no-gradient-accumulation-fusion"),
            "gradient accumulation fusion (on by default)",
            "is not supported with gradient accumulation fusion",
            'add "--no-gradient-accumulation-fusion" to extra_args',
        ),
        (
            ckpt is not None and ckpt not in ("torch_dist", "torch_dcp"),
            f"--ckpt-format {ckpt}",
            "requires --ckpt-format torch_dist or torch_dcp",
            "pass --ckpt-format torch_dist (the default) or torch_dcp",
        ),
        (
            tied is not False,
            "tied input and output embeddings",
            "requires --untie-embeddings-and-output-weights",
            "set [model] tied_embeddings = false",
        ),
        (dtype == "fp16", 'dtype = "fp16"', "not supported with fp16 yet", 'use dtype "bf16"'),
    ]
    for failed, what, quote, hint in refused:
        if failed:
            yield Finding(
                code="MDC396",
                pointer=_at(opts, "use_torch_fsdp2"),
                message=f"use_torch_fsdp2 with {what} (Megatron-LM: '--use-torch-fsdp2 {quote}')",
                hint=hint + ", or remove use_torch_fsdp2",
            )


def _precision_rules(opts: MegatronOptions, dtype: str | None) -> Iterator[Finding]:
    fp8 = dtype == "fp8"
    if opts.fp8_param_gather and not fp8:
        yield Finding(
            code="MDC355",
            pointer=_at(opts, "fp8_param_gather"),
            message=f'fp8_param_gather needs fp8 training ([model] dtype = "fp8"; it is '
            f"{dtype or 'not set'}) (Megatron-Core: 'fp8_param must be used together with "
            "fp8 mode.')",
            hint='set [model] dtype = "fp8", or remove fp8_param_gather',
        )
    if opts.fp8_param_gather and not (_distributed_optimizer(opts) or _fsdp(opts)):
        yield Finding(
            code="MDC355",
            pointer=_at(opts, "fp8_param_gather"),
            message="fp8_param_gather needs the distributed optimizer or Megatron-FSDP "
            "(Megatron-LM: '--fp8-param-gather only supported with distributed optimizer, "
            "torch fsdp2, megatron fsdp, or inference mode')",
            hint="remove use_distributed_optimizer = false, or fp8_param_gather",
        )
    if opts.fp8_recipe is not None and not fp8:
        yield Finding(
            code="MDC355",
            pointer=_at(opts, "fp8_recipe"),
            severity=Severity.WARNING,
            message=f'fp8_recipe applies only with [model] dtype = "fp8" (dtype is '
            f"{dtype or 'not set'})",
            hint='set [model] dtype = "fp8", or remove fp8_recipe',
        )
    if opts.grad_reduce_in_bf16 and dtype in ("fp16", "fp32"):
        yield Finding(
            code="MDC355",
            pointer=_at(opts, "grad_reduce_in_bf16"),
            severity=Severity.WARNING,
            message=f"grad_reduce_in_bf16 has no effect with dtype = {dtype!r}: Megatron-LM "
            "reads it only for bf16 training",
            hint="remove grad_reduce_in_bf16",
        )


def _optimizer_rules(opts: MegatronOptions) -> Iterator[Finding]:
    aware = bool(opts.use_precision_aware_optimizer)
    if aware and not _distributed_optimizer(opts):
        yield Finding(
            code="MDC356",
            pointer=_at(opts, "use_precision_aware_optimizer"),
            message="use_precision_aware_optimizer needs the distributed optimizer "
            "(Megatron-Core: '--use-precision-aware-optimizer only supported with "
            "distributed optimizer'), but use_distributed_optimizer = false",
            hint="remove use_distributed_optimizer = false",
        )
    for key in ("main_grads_dtype", "main_params_dtype"):
        if getattr(opts, key) not in (None, "fp32") and not aware:
            yield Finding(
                code="MDC356",
                pointer=_at(opts, key),
                message=f"{key} = {getattr(opts, key)!r} needs use_precision_aware_optimizer "
                f"(Megatron-Core: '{key} can only be fp32 when not using precision-aware "
                "optimizer')",
                hint=f"set use_precision_aware_optimizer = true, or remove {key}",
            )
    for key in ("exp_avg_dtype", "exp_avg_sq_dtype"):
        if getattr(opts, key) not in (None, "fp32") and not aware:
            yield Finding(
                code="MDC356",
                pointer=_at(opts, key),
                severity=Severity.WARNING,
                message=f"{key} has no effect without use_precision_aware_optimizer "
                "(only the precision-aware optimizer keeps Adam's moments in another dtype)",
                hint=f"set use_precision_aware_optimizer = true, or remove {key}",
            )
    if opts.optimizer_cpu_offload and not aware:
        yield Finding(
            code="MDC356",
            pointer=_at(opts, "optimizer_cpu_offload"),
            message="optimizer_cpu_offload needs use_precision_aware_optimizer (Megatron-LM: "
            "'The optimizer cpu offload must be used in conjunction with "
            "`--use-precision-aware-optimizer`')",
            hint="set use_precision_aware_optimizer = true",
        )
    recipe = opts.fp8_recipe or "delayed"  # Megatron-Core's default recipe
    if opts.optimizer_cpu_offload and opts.fp8_param_gather and recipe != "delayed":
        yield Finding(
            code="MDC356",
            pointer=_at(opts, "optimizer_cpu_offload"),
            message=f"optimizer_cpu_offload with fp8_param_gather needs fp8_recipe = "
            f'"delayed", not {recipe!r} (Megatron-LM: \'When `--fp8-param-gather` is '
            "enabled, the optimizer cpu offload must be used in conjunction with "
            "`--fp8-recipe delayed`.')",
            hint='set fp8_recipe = "delayed", or remove fp8_param_gather',
        )
    if opts.optimizer_offload_fraction is not None and not opts.optimizer_cpu_offload:
        yield Finding(
            code="MDC356",
            pointer=_at(opts, "optimizer_offload_fraction"),
            severity=Severity.WARNING,
            message="optimizer_offload_fraction has no effect without optimizer_cpu_offload",
            hint="set optimizer_cpu_offload = true, or remove optimizer_offload_fraction",
        )


def _offload_rules(plan: Plan, opts: MegatronOptions) -> Iterator[Finding]:
    count = opts.cpu_offloading_num_layers
    if not count:  # Megatron-LM turns CPU offloading on only for a count above 0
        return
    layers = plan.model.num_layers if plan.model else None
    pointer = _at(opts, "cpu_offloading_num_layers")
    quote = "Megatron-Core: "
    if layers is not None and count >= layers:
        yield Finding(
            code="MDC357",
            pointer=pointer,
            message=f"cpu_offloading_num_layers ({count}) must be below num_layers ({layers}) "
            f"({quote}'CPU offloading can be done only for layers less than {layers}')",
            hint=f"set cpu_offloading_num_layers to 1..{layers - 1}",
        )
    if plan.sizes.pp > 1:
        yield Finding(
            code="MDC357",
            pointer=pointer,
            message=f"cpu_offloading_num_layers needs pp = 1, not {plan.sizes.pp} ({quote}"
            "'Currently there is no support for Pipeline parallelism with CPU offloading')",
            hint="remove cpu_offloading_num_layers, or set pp = 1",
        )
    if opts.recompute_granularity is not None:
        yield Finding(
            code="MDC357",
            pointer=pointer,
            message=f"cpu_offloading_num_layers cannot be used with recompute_granularity "
            f"({quote}'CPU offloading does not work when activation recomputation is "
            "enabled')",
            hint="remove recompute_granularity, or cpu_offloading_num_layers",
        )


def _recompute_module_rules(
    plan: Plan, opts: MegatronOptions, words: Sequence[str], dtype: str | None
) -> Iterator[Finding]:
    modules = opts.recompute_modules
    if modules is None:
        return
    pointer = _at(opts, "recompute_modules")
    if opts.recompute_granularity != "selective":
        yield Finding(
            code="MDC357",
            pointer=pointer,
            severity=Severity.WARNING,
            message='recompute_modules applies only with recompute_granularity = "selective" '
            "(Megatron-Core reads it for selective recompute only)",
            hint='set recompute_granularity = "selective", or remove recompute_modules',
        )
        return
    if "moe_act" in modules and not _passes(words, "--moe-grouped-gemm"):
        yield Finding(
            code="MDC357",
            pointer=pointer,
            message="recompute_modules has moe_act, which needs --moe-grouped-gemm "
            "(Megatron-Core: 'moe_act in recompute_modules is only supported with "
            "moe_grouped_gemm.'), and the arguments do not pass it",
            hint='add "--moe-grouped-gemm" to extra_args, or remove moe_act',
        )
    latent = bool(getattr(plan.model, "multi_latent_attention", None))
    if "mla_up_proj" in modules and not (latent or _passes(words, "--multi-latent-attention")):
        yield Finding(
            code="MDC357",
            pointer=pointer,
            message="recompute_modules has mla_up_proj, which needs multi-latent attention "
            "(Megatron-Core: 'mla_up_proj in recompute_modules is only supported with "
            "multi_latent_attention.')",
            hint="remove mla_up_proj",
        )
    output_discarding = sorted({"moe_act", "layernorm"} & set(modules))
    if dtype == "fp8" and output_discarding and (opts.fp8_recipe or "delayed") == "delayed":
        yield Finding(
            code="MDC357",
            pointer=pointer,
            message=f"recompute_modules has {' and '.join(output_discarding)}, which fp8's "
            "delayed scaling recipe cannot recompute (Megatron-Core: 'Delayed scaling does "
            "not support moe_act and layernorm recompute for fp8.')",
            hint='set fp8_recipe to "tensorwise", "mxfp8" or "blockwise", or remove them',
        )


def _moe_rules(plan: Plan, opts: MegatronOptions, words: Sequence[str]) -> Iterator[Finding]:
    if opts.moe_pad_expert_input_to_capacity and opts.moe_expert_capacity_factor is None:
        yield Finding(
            code="MDC358",
            pointer=_at(opts, "moe_pad_expert_input_to_capacity"),
            message="moe_pad_expert_input_to_capacity needs moe_expert_capacity_factor "
            "(Megatron-Core: 'moe_expert_capacity_factor must be set to use "
            "moe_pad_expert_input_to_capacity')",
            hint="set moe_expert_capacity_factor, e.g. 1.0",
        )
    backend = _value_after(words, "--moe-flex-dispatcher-backend") or "deepep"
    if (
        opts.moe_token_dispatcher_type == "flex"
        and opts.moe_pad_expert_input_to_capacity
        and backend == "deepep"
    ):
        yield Finding(
            code="MDC358",
            pointer=_at(opts, "moe_pad_expert_input_to_capacity"),
            message="the flex dispatcher with its deepep backend cannot pad expert inputs "
            "(Megatron-Core: 'Flex token dispatcher with deepep backend does not support "
            "moe_pad_expert_input_to_capacity')",
            hint="remove moe_pad_expert_input_to_capacity, or use moe_token_dispatcher_type "
            '= "alltoall"',
        )
    experts = plan.model.num_experts if plan.model else None
    for key in (
        "moe_token_dispatcher_type",
        "moe_expert_capacity_factor",
        "moe_pad_expert_input_to_capacity",
    ):
        if plan.model is not None and not experts and getattr(opts, key) is not None:
            yield Finding(
                code="MDC358",
                pointer=_at(opts, key),
                severity=Severity.WARNING,
                message=f"{key} has no effect: [model] has no num_experts (a dense model)",
                hint=f"remove {key}",
            )


def check(plan: Plan, options: MegatronOptions | None) -> Iterator[Finding]:
    written, opts = options or MegatronOptions(), _options(options)
    yield from torchrun_findings(plan, _torchrun(plan))
    yield from _attention_backend_rule(plan, opts)
    yield from _order(plan)
    yield from _optimizer(plan, opts)
    yield from _recompute(plan, opts)
    yield from _model(plan, opts)
    yield from _memory_options(plan, opts)
    yield from _clashes(plan, written, opts)


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
    stage = 1 if _distributed_optimizer(opts) else 0
    if opts.optimizer == "dist_muon":  # Megatron-Core's layer-wise distributed optimizer
        stage = 1
    if opts.use_torch_fsdp2:  # torch's fully_shard: parameters, gradients and optimizer state
        stage = 3
    if _fsdp(opts):
        strategy = opts.data_parallel_sharding_strategy or "no_shard"
        stage = max(stage, FSDP_ZERO_STAGE[strategy])
    return stage


def _optimizer_bytes(opts: MegatronOptions) -> int | None:
    """Bytes per parameter of optimizer state: SGD's or Muon's (megatron_optimizer), else
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
    """fp32 main gradients, unless reduced in bf16 (--grad-reduce-in-bf16, or bf16 main
    gradients of the precision-aware optimizer)."""
    if opts.grad_reduce_in_bf16 or opts.main_grads_dtype == "bf16":
        return 2
    return 4


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
            (name, _at(opts, key))
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
    opts = _options(options)
    offload = 0.0
    if opts.optimizer_cpu_offload:
        offload = (
            1.0 if opts.optimizer_offload_fraction is None else opts.optimizer_offload_fraction
        )
    return TrainingSetup(
        zero_stage=zero_stage(opts),
        replicas=opts.num_distributed_optimizer_instances or 1,
        grad_bytes=_grad_bytes(opts),
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
        moe_capacity_factor=opts.moe_expert_capacity_factor
        if opts.moe_pad_expert_input_to_capacity
        else None,
        # vocab_parallel_cross_entropy: the output layer's bf16 logits and their fp32 copy
        logit_bytes=6,
        levers=LEVERS,
    )


@mdc.hookimpl
def mdc_register_launchers() -> list[LauncherSpec]:
    return [
        LauncherSpec(
            reads=("torchrun",),  # [torchrun] tunes the torchrun it runs on
            name="megatron",
            description="Megatron-LM on torchrun: parallel sizes, batch and model shape as "
            "Megatron-LM arguments, plus its environment",
            parallelism="model",
            emit=emit,
            check=check,
            training=training,
            schema=read_schema("mdc_schemas", "plugins/megatron.v1.schema.json"),
            options_type=MegatronOptions,
        )
    ]
