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

from collections.abc import Iterator, Mapping, Sequence

import attrs

import mdc
from mdc.api import (
    Finding,
    Launch,
    LauncherSpec,
    ModelTable,
    Plan,
    Role,
    Severity,
    TorchrunOptions,
    TrainingSetup,
    Word,
    program,
    read_schema,
    runner_worker_env,
    torchrun_argv,
    torchrun_env,
    torchrun_findings,
    torchrun_worker_env,
)

#: The orders Megatron-LM's command line can express: its default, and --use-tp-pp-dp-mapping.
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
TP_PP_DP_ORDER = "tp-cp-ep-pp-dp"
#: Megatron-LM's flags that select the same setting as one mdc emits (a second spelling).
ALIASES: Mapping[str, tuple[str, ...]] = {
    "--num-virtual-stages-per-pipeline-rank": (
        "--num-layers-per-virtual-pipeline-stage",
        "--pipeline-model-parallel-layout",
    ),
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
}
#: Megatron-FSDP / torch FSDP2 flags: they need CUDA_DEVICE_MAX_CONNECTIONS unset.
FSDP_FLAGS = ("--use-torch-fsdp2", "--use-megatron-fsdp")


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
    max_position_embeddings: int | None = None
    fp8_format: str | None = None
    extra_args: tuple[str, ...] = ()


def _options(options: MegatronOptions | None) -> MegatronOptions:
    return options or MegatronOptions()


def _distributed_optimizer(opts: MegatronOptions) -> bool:
    return opts.use_distributed_optimizer is not False


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
    "mtp_num_layers",
    "mamba_state_dim",
    "mamba_head_dim",
    "mamba_num_groups",
    "mamba_num_heads",
)
#: and the switches
ARCHITECTURE_SWITCHES = ("qk_layernorm", "add_qkv_bias", "multi_latent_attention")


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
    for key in ("window_attn_skip_freq", "moe_layer_freq"):
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
    if s.vpp is not None:
        args += ["--num-virtual-stages-per-pipeline-rank", str(s.vpp)]
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
    if opts.recompute_granularity is not None:
        args += ["--recompute-granularity", opts.recompute_granularity]
        if opts.recompute_method is not None:
            args += ["--recompute-method", opts.recompute_method]
        if opts.recompute_num_layers is not None:
            args += ["--recompute-num-layers", str(opts.recompute_num_layers)]
    return args


def _needs_max_connections(plan: Plan, user_args: Sequence[str]) -> bool:
    """Megatron-LM asserts CUDA_DEVICE_MAX_CONNECTIONS=1 for tp > 1 or cp > 1 on GPUs
    before Blackwell, unless FSDP is on (which asserts the opposite)."""
    if plan.accelerator == "cpu" or (plan.sizes.tp == 1 and plan.sizes.cp == 1):
        return False
    return not any(_passes(user_args, flag) for flag in FSDP_FLAGS)


def _passes(words: Sequence[str], flag: str) -> bool:
    return any(w == flag or w.startswith(flag + "=") for w in words)


def megatron_env(plan: Plan, options: MegatronOptions | None) -> dict[str, str]:
    s = plan.sizes
    env = {
        "TENSOR_MODEL_PARALLEL_SIZE": str(s.tp),
        "PIPELINE_MODEL_PARALLEL_SIZE": str(s.pp),
        "CONTEXT_PARALLEL_SIZE": str(s.cp),
    }
    if _needs_max_connections(plan, [*plan.job.argv, *_options(options).extra_args]):
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    return env


def _torchrun(plan: Plan) -> TorchrunOptions | None:
    opts = plan.options.get("torchrun")
    return opts if isinstance(opts, TorchrunOptions) else None


def emit(plan: Plan, options: MegatronOptions | None) -> Launch:
    opts = _options(options)
    words: list[Word] = [*program(plan.job.argv), *megatron_args(plan, opts), *opts.extra_args]
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


def _command_pointer(plan: Plan, index: int) -> str:
    return f"/job/command/{index}" if isinstance(plan.job.command, tuple) else "/job/command"


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
        for key in ("window_size", "window_attn_skip_freq", "moe_layer_freq")
    },
    "--is-hybrid-model": "[model] hybrid_override_pattern",
    "--hybrid-override-pattern": "[model] hybrid_override_pattern",
    "--bf16": "[model] dtype",
    "--fp16": "[model] dtype",
    "--fp8-format": "[model] dtype and [megatron] fp8_format",
}


def _source_of(flag: str) -> str:
    return SWITCHES.get(flag) or SOURCES.get(flag, "the spec")


def _clashes(plan: Plan, opts: MegatronOptions) -> Iterator[Finding]:
    emitted = [w for w in megatron_args(plan, opts) if w.startswith("--")]
    owned = {flag: flag for flag in [*emitted, *SWITCHES]}
    for flag in list(owned):
        for alias in ALIASES.get(flag, ()):
            owned[alias] = flag
    places = [
        (w, _command_pointer(plan, i), "the job's command") for i, w in enumerate(plan.job.argv)
    ]
    places += [
        (w, f"/megatron/extra_args/{i}", "extra_args") for i, w in enumerate(opts.extra_args)
    ]
    for word, pointer, where in places:
        given = word.split("=", 1)[0]
        if given not in owned:
            continue
        mine = owned[given]
        also = "" if given == mine else f" (another spelling of {mine})"
        yield Finding(
            code="MDC323",
            pointer=pointer,
            message=f"{where} passes {given}{also}, which the megatron launcher sets "
            f"from {_source_of(mine)}",
            hint=f"remove {given} from {where}; set the value through {_source_of(mine)}",
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
        if not _distributed_optimizer(opts):
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
    words = [*plan.job.argv, *opts.extra_args]
    if _distributed_optimizer(opts) and _passes(words, "--use-torch-fsdp2"):
        yield Finding(
            code="MDC321",
            pointer="/megatron/use_distributed_optimizer",
            message="--use-torch-fsdp2 cannot run with the distributed optimizer "
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


def check(plan: Plan, options: MegatronOptions | None) -> Iterator[Finding]:
    opts = _options(options)
    yield from torchrun_findings(plan, _torchrun(plan))
    yield from _order(plan)
    yield from _optimizer(plan, opts)
    yield from _recompute(plan, opts)
    yield from _model(plan, opts)
    yield from _clashes(plan, opts)


def training(options: MegatronOptions | None) -> TrainingSetup:
    opts = _options(options)
    return TrainingSetup(
        zero_stage=1 if _distributed_optimizer(opts) else 0,
        grad_bytes=4,
        sequence_parallel=opts.sequence_parallel is not False,
        recompute=opts.recompute_granularity or "none",
    )


@mdc.hookimpl
def mdc_register_launchers() -> list[LauncherSpec]:
    return [
        LauncherSpec(
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
