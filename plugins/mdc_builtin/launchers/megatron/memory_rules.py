"""Megatron-LM core_v0.16.1's rules for the [megatron] options that change what a GPU
holds (validate_args, TransformerConfig, OptimizerConfig), on the same conditions, and the
warning for memory flags the estimate does not model."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence

from mdc.api import Finding, Plan, Severity
from mdc.api.flags import command_pointer
from mdc_builtin.launchers.megatron.bf16_layers import bf16_layer_rules
from mdc_builtin.launchers.megatron.optimizer import optimizer_rules
from mdc_builtin.launchers.megatron.options import (
    MegatronOptions,
    distributed_optimizer,
    megatron_fsdp,
    pointer_of,
)
from mdc_builtin.launchers.megatron.precision import fp4_rules
from mdc_builtin.launchers.megatron.words import passes, value_after


def memory_option_rules(plan: Plan, opts: MegatronOptions) -> Iterator[Finding]:
    """Megatron-LM core_v0.16.1's rules for the options that change what a GPU holds
    (validate_args, TransformerConfig, OptimizerConfig), on the same conditions."""
    words = [*plan.job.argv, *opts.extra_args]
    dtype = plan.model.dtype if plan.model else None
    at = functools.partial(pointer_of, opts)  # a key's pointer
    yield from _fsdp_rules(opts, words)
    yield from _torch_fsdp2_rules(plan, opts, words, dtype)
    yield from _precision_rules(opts, dtype)
    yield from _mxfp8_hardware(plan, opts, dtype)
    yield from fp4_rules(opts, dtype, at)
    yield from _optimizer_rules(opts)
    yield from _offload_rules(plan, opts)
    yield from _recompute_module_rules(plan, opts, words, dtype)
    yield from _moe_rules(plan, opts, words)
    layers = plan.model.num_layers if plan.model else None
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
    if opts.accumulate_allreduce_grads_in_fp32 and dtype == "fp32":
        yield Finding(
            code="MDC355",
            pointer=pointer_of(opts, "accumulate_allreduce_grads_in_fp32"),
            severity=Severity.WARNING,
            message="accumulate_allreduce_grads_in_fp32 has no effect with dtype = 'fp32': "
            "the gradients are fp32 already",
            hint="remove accumulate_allreduce_grads_in_fp32",
        )
    bf16 = dtype in ("bf16", "fp8")  # both run Megatron-LM with --bf16
    if bf16 and opts.accumulate_allreduce_grads_in_fp32 and opts.main_grads_dtype == "bf16":
        yield Finding(
            code="MDC356",
            pointer=pointer_of(opts, "accumulate_allreduce_grads_in_fp32"),
            message="accumulate_allreduce_grads_in_fp32 with main_grads_dtype = 'bf16' "
            "(Megatron-LM: '--main-grads-dtype can only be fp32 when "
            "--accumulate-allreduce-grads-in-fp32 is set')",
            hint="remove accumulate_allreduce_grads_in_fp32, or main_grads_dtype",
        )


def _mxfp8_hardware(plan: Plan, opts: MegatronOptions, dtype: str | None) -> Iterator[Finding]:
    """MXFP8 scales blocks of 32 values in the tensor cores, which came with the FP4 ones
    (Blackwell, CDNA 4): the catalogue's fp4 peak marks them."""
    hw = plan.hardware
    if dtype != "fp8" or opts.fp8_recipe != "mxfp8" or hw is None or "fp4" in hw.dense_tflops:
        return
    yield Finding(
        code="MDC602",
        pointer=pointer_of(opts, "fp8_recipe"),
        message=f'fp8_recipe = "mxfp8" needs block-scaled tensor cores, which {hw.name} lacks: '
        "Transformer Engine runs MXFP8 from compute capability 10.0 (Blackwell) and, on AMD, "
        "from gfx950 (CDNA 4)",
        hint='use fp8_recipe = "tensorwise" or "delayed" on this accelerator',
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
    if opts.recompute_granularity == "full" and passes(opts.extra_args, "--moe-layer-recompute"):
        index = next(
            i for i, w in enumerate(opts.extra_args) if w.split("=")[0] == "--moe-layer-recompute"
        )
        yield Finding(
            code="MDC357",
            pointer=f"/megatron/extra_args/{index}",
            message='extra_args passes --moe-layer-recompute with recompute_granularity = "full" '
            "(Megatron-Core: 'Do not set --moe-layer-recompute with full recompute "
            "granularity.')",
            hint='remove --moe-layer-recompute, or use recompute_granularity = "selective" '
            'with recompute_modules = ["core_attn", "moe"]',
        )
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
