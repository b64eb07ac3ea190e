"""Megatron-LM's and megatron-core's own refusals for the megatron launcher's settings, on
the same conditions (core_v0.16.1: validate_args, TransformerConfig, OptimizerConfig), and
the clashes between mdc's flags and the user's."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from mdc.api import Finding, Plan, Severity, already_set, command_pointer, torchrun_findings
from mdc_builtin.launchers.megatron_bf16_layers import bf16_layer_rules
from mdc_builtin.launchers.megatron_emit import (
    DEFAULT_ORDER,
    EAGER_BACKENDS,
    TP_PP_DP_ORDER,
    attention_backend,
    eager_attention,
    megatron_args,
    megatron_order,
    torchrun_options,
)
from mdc_builtin.launchers.megatron_flags import FLAGS, SWITCHES
from mdc_builtin.launchers.megatron_optimizer import optimizer_rules
from mdc_builtin.launchers.megatron_options import (
    MegatronOptions,
    distributed_optimizer,
    megatron_fsdp,
    pointer_of,
    resolved_options,
)
from mdc_builtin.launchers.megatron_precision import fp4_rules
from mdc_builtin.launchers.megatron_words import passes, value_after


def _attention_backend_rule(plan: Plan, opts: MegatronOptions) -> Iterator[Finding]:
    """--attention-backend decides whether attention keeps its seq x seq scores, which
    [model] flash_attention tells the estimate: the two must agree."""
    backend = attention_backend(plan, opts)
    if backend is None or plan.model is None:
        return
    eager = backend in EAGER_BACKENDS
    if eager == eager_attention(plan):
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
        if not (distributed_optimizer(opts) or megatron_fsdp(opts)):
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
    if distributed_optimizer(opts) and opts.use_torch_fsdp2:
        yield Finding(
            code="MDC321",
            pointer=pointer_of(opts, "use_torch_fsdp2"),
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
    if experts and s.etp > 1 and not passes(words, "--disable-bias-linear"):
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
    if plan.batch is None and not passes(words, "--micro-batch-size"):
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
    yield from fp4_rules(opts, dtype, lambda key: pointer_of(opts, key))
    yield from _optimizer_rules(opts)
    yield from _offload_rules(plan, opts)
    yield from _recompute_module_rules(plan, opts, words, dtype)
    yield from _moe_rules(plan, opts, words)
    layers = plan.model.num_layers if plan.model else None
    at = lambda key: pointer_of(opts, key)  # noqa: E731
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
    if opts.data_parallel_sharding_strategy is not None and not megatron_fsdp(opts):
        yield Finding(
            code="MDC354",
            pointer=pointer_of(opts, "data_parallel_sharding_strategy"),
            severity=Severity.WARNING,
            message="data_parallel_sharding_strategy has no effect without use_megatron_fsdp "
            "(Megatron-LM reads it only on the Megatron-FSDP path)",
            hint="set use_megatron_fsdp = true, or remove data_parallel_sharding_strategy",
        )
    ckpt = value_after(words, "--ckpt-format")
    if megatron_fsdp(opts) and ckpt is not None and ckpt != "fsdp_dtensor":
        yield Finding(
            code="MDC354",
            pointer=pointer_of(opts, "use_megatron_fsdp"),
            message=f"use_megatron_fsdp needs --ckpt-format fsdp_dtensor, but the arguments "
            f"pass --ckpt-format {ckpt} (Megatron-LM: 'Megatron FSDP only supports "
            "fsdp_dtensor checkpoint format')",
            hint="remove --ckpt-format (mdc then passes fsdp_dtensor), or set it to fsdp_dtensor",
        )
    if megatron_fsdp(opts) and opts.use_torch_fsdp2:
        yield Finding(
            code="MDC354",
            pointer=pointer_of(opts, "use_megatron_fsdp"),
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
    ckpt = value_after(words, "--ckpt-format")
    refused = [
        (s.pp > 1, f"pp = {s.pp}", "is not supported with pipeline parallelism", "set pp = 1"),
        (s.ep > 1, f"ep = {s.ep}", "is not supported with expert parallelism", "set ep = 1"),
        (
            not passes(words, "--no-gradient-accumulation-fusion"),
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
                pointer=pointer_of(opts, "use_torch_fsdp2"),
                message=f"use_torch_fsdp2 with {what} (Megatron-LM: '--use-torch-fsdp2 {quote}')",
                hint=hint + ", or remove use_torch_fsdp2",
            )


def _precision_rules(opts: MegatronOptions, dtype: str | None) -> Iterator[Finding]:
    fp8 = dtype == "fp8"
    if opts.fp8_param_gather and not fp8:
        yield Finding(
            code="MDC355",
            pointer=pointer_of(opts, "fp8_param_gather"),
            message=f'fp8_param_gather needs fp8 training ([model] dtype = "fp8"; it is '
            f"{dtype or 'not set'}) (Megatron-Core: 'fp8_param must be used together with "
            "fp8 mode.')",
            hint='set [model] dtype = "fp8", or remove fp8_param_gather',
        )
    if opts.fp8_param_gather and not (distributed_optimizer(opts) or megatron_fsdp(opts)):
        yield Finding(
            code="MDC355",
            pointer=pointer_of(opts, "fp8_param_gather"),
            message="fp8_param_gather needs the distributed optimizer or Megatron-FSDP "
            "(Megatron-LM: '--fp8-param-gather only supported with distributed optimizer, "
            "torch fsdp2, megatron fsdp, or inference mode')",
            hint="remove use_distributed_optimizer = false, or fp8_param_gather",
        )
    if opts.fp8_recipe is not None and not fp8:
        yield Finding(
            code="MDC355",
            pointer=pointer_of(opts, "fp8_recipe"),
            severity=Severity.WARNING,
            message=f'fp8_recipe applies only with [model] dtype = "fp8" (dtype is '
            f"{dtype or 'not set'})",
            hint='set [model] dtype = "fp8", or remove fp8_recipe',
        )
    if opts.grad_reduce_in_bf16 and dtype in ("fp16", "fp32"):
        yield Finding(
            code="MDC355",
            pointer=pointer_of(opts, "grad_reduce_in_bf16"),
            severity=Severity.WARNING,
            message=f"grad_reduce_in_bf16 has no effect with dtype = {dtype!r}: Megatron-LM "
            "reads it only for bf16 training",
            hint="remove grad_reduce_in_bf16",
        )


def _optimizer_rules(opts: MegatronOptions) -> Iterator[Finding]:
    aware = bool(opts.use_precision_aware_optimizer)
    if aware and not distributed_optimizer(opts):
        yield Finding(
            code="MDC356",
            pointer=pointer_of(opts, "use_precision_aware_optimizer"),
            message="use_precision_aware_optimizer needs the distributed optimizer "
            "(Megatron-Core: '--use-precision-aware-optimizer only supported with "
            "distributed optimizer'), but use_distributed_optimizer = false",
            hint="remove use_distributed_optimizer = false",
        )
    for key in ("main_grads_dtype", "main_params_dtype"):
        if getattr(opts, key) not in (None, "fp32") and not aware:
            yield Finding(
                code="MDC356",
                pointer=pointer_of(opts, key),
                message=f"{key} = {getattr(opts, key)!r} needs use_precision_aware_optimizer "
                f"(Megatron-Core: '{key} can only be fp32 when not using precision-aware "
                "optimizer')",
                hint=f"set use_precision_aware_optimizer = true, or remove {key}",
            )
    for key in ("exp_avg_dtype", "exp_avg_sq_dtype"):
        if getattr(opts, key) not in (None, "fp32") and not aware:
            yield Finding(
                code="MDC356",
                pointer=pointer_of(opts, key),
                severity=Severity.WARNING,
                message=f"{key} has no effect without use_precision_aware_optimizer "
                "(only the precision-aware optimizer keeps Adam's moments in another dtype)",
                hint=f"set use_precision_aware_optimizer = true, or remove {key}",
            )
    if opts.optimizer_cpu_offload and not aware:
        yield Finding(
            code="MDC356",
            pointer=pointer_of(opts, "optimizer_cpu_offload"),
            message="optimizer_cpu_offload needs use_precision_aware_optimizer (Megatron-LM: "
            "'The optimizer cpu offload must be used in conjunction with "
            "`--use-precision-aware-optimizer`')",
            hint="set use_precision_aware_optimizer = true",
        )
    recipe = opts.fp8_recipe or "delayed"  # Megatron-Core's default recipe
    if opts.optimizer_cpu_offload and opts.fp8_param_gather and recipe != "delayed":
        yield Finding(
            code="MDC356",
            pointer=pointer_of(opts, "optimizer_cpu_offload"),
            message=f"optimizer_cpu_offload with fp8_param_gather needs fp8_recipe = "
            f'"delayed", not {recipe!r} (Megatron-LM: \'When `--fp8-param-gather` is '
            "enabled, the optimizer cpu offload must be used in conjunction with "
            "`--fp8-recipe delayed`.')",
            hint='set fp8_recipe = "delayed", or remove fp8_param_gather',
        )
    if opts.optimizer_offload_fraction is not None and not opts.optimizer_cpu_offload:
        yield Finding(
            code="MDC356",
            pointer=pointer_of(opts, "optimizer_offload_fraction"),
            severity=Severity.WARNING,
            message="optimizer_offload_fraction has no effect without optimizer_cpu_offload",
            hint="set optimizer_cpu_offload = true, or remove optimizer_offload_fraction",
        )


def _offload_rules(plan: Plan, opts: MegatronOptions) -> Iterator[Finding]:
    count = opts.cpu_offloading_num_layers
    if not count:  # Megatron-LM turns CPU offloading on only for a count above 0
        return
    layers = plan.model.num_layers if plan.model else None
    pointer = pointer_of(opts, "cpu_offloading_num_layers")
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
    pointer = pointer_of(opts, "recompute_modules")
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
    if "moe_act" in modules and not passes(words, "--moe-grouped-gemm"):
        yield Finding(
            code="MDC357",
            pointer=pointer,
            message="recompute_modules has moe_act, which needs --moe-grouped-gemm "
            "(Megatron-Core: 'moe_act in recompute_modules is only supported with "
            "moe_grouped_gemm.'), and the arguments do not pass it",
            hint='add "--moe-grouped-gemm" to extra_args, or remove moe_act',
        )
    latent = bool(getattr(plan.model, "multi_latent_attention", None))
    if "mla_up_proj" in modules and not (latent or passes(words, "--multi-latent-attention")):
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
            pointer=pointer_of(opts, "moe_pad_expert_input_to_capacity"),
            message="moe_pad_expert_input_to_capacity needs moe_expert_capacity_factor "
            "(Megatron-Core: 'moe_expert_capacity_factor must be set to use "
            "moe_pad_expert_input_to_capacity')",
            hint="set moe_expert_capacity_factor, e.g. 1.0",
        )
    backend = value_after(words, "--moe-flex-dispatcher-backend") or "deepep"
    if (
        opts.moe_token_dispatcher_type == "flex"
        and opts.moe_pad_expert_input_to_capacity
        and backend == "deepep"
    ):
        yield Finding(
            code="MDC358",
            pointer=pointer_of(opts, "moe_pad_expert_input_to_capacity"),
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
                pointer=pointer_of(opts, key),
                severity=Severity.WARNING,
                message=f"{key} has no effect: [model] has no num_experts (a dense model)",
                hint=f"remove {key}",
            )


def check(plan: Plan, options: MegatronOptions | None) -> Iterator[Finding]:
    written, opts = options or MegatronOptions(), resolved_options(options)
    yield from torchrun_findings(plan, torchrun_options(plan))
    yield from _attention_backend_rule(plan, opts)
    yield from _order(plan)
    yield from _optimizer(plan, opts)
    yield from _recompute(plan, opts)
    yield from _model(plan, opts)
    yield from _memory_options(plan, opts)
    yield from _clashes(plan, written, opts)
