"""Megatron-LM's and megatron-core's own refusals for the megatron launcher's settings, on
the same conditions (core_v0.16.1: validate_args, TransformerConfig, OptimizerConfig), and
the clashes between mdc's flags and the user's."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial

from mdc.api import Finding, Plan, Severity
from mdc.api.flags import command_pointer, disagreeing, disagreement_text
from mdc.api.torchrun import torchrun_findings
from mdc_builtin.launchers.megatron.connections import connection_rules
from mdc_builtin.launchers.megatron.cp_comm import cp_comm_rules
from mdc_builtin.launchers.megatron.emit import (
    DEFAULT_ORDER,
    EAGER_BACKENDS,
    TP_PP_DP_ORDER,
    attention_backend,
    eager_attention,
    megatron_args,
    megatron_order,
    sequence_parallel,
    torchrun_options,
)
from mdc_builtin.launchers.megatron.ep_overlap import ep_overlap_rules
from mdc_builtin.launchers.megatron.flags import FLAGS, VPP_LAYERS
from mdc_builtin.launchers.megatron.memory_rules import memory_option_rules
from mdc_builtin.launchers.megatron.options import (
    MegatronOptions,
    distributed_optimizer,
    megatron_fsdp,
    pointer_of,
    resolved_options,
)
from mdc_builtin.launchers.megatron.words import passes


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


def _clashes(plan: Plan, opts: MegatronOptions) -> Iterator[Finding]:
    """A flag mdc writes from a key that is not the flag's own, also in the command or in
    extra_args with another value: Megatron-LM would silently keep the last. (A flag that
    is its key's was read into the spec already; a disagreeing one refused there.)"""
    emitted = megatron_args(plan, opts)
    places: list[tuple[Sequence[str], str, Callable[[int], str]]] = [
        (plan.job.argv, "the job's command", partial(command_pointer, plan.job.command)),
        (opts.extra_args, "[megatron] extra_args", "/megatron/extra_args/{}".format),
    ]
    for words, where, pointer in places:
        _, differ = disagreeing(FLAGS, words, emitted)
        for use, own in differ:
            message, hint = disagreement_text("Megatron-LM", where, words, use, emitted, own)
            yield Finding(code="MDC323", pointer=pointer(use.index), message=message, hint=hint)
        layers = [use for use in FLAGS.find(words) if use.flag.name == VPP_LAYERS]
        if layers:
            yield _vpp_layers(plan, where, pointer(layers[-1].index), emitted)


def _vpp_layers(plan: Plan, where: str, pointer: str, emitted: list[str]) -> Finding:
    """--num-layers-per-virtual-pipeline-stage gives the virtual stages as layers per stage:
    with [parallelism] vpp, Megatron-LM refuses the two together; without, the plan (the
    stages, the estimate) would not know the interleaving the job runs."""
    both = "--num-virtual-stages-per-pipeline-rank" in emitted
    why = (
        "and mdc writes --num-virtual-stages-per-pipeline-rank from [parallelism] vpp: "
        "Megatron-LM refuses the two together"
        if both
        else "the virtual stages in layers per stage, which mdc does not read: the plan "
        "and its estimate would not know the interleaving"
    )
    return Finding(
        code="MDC323",
        pointer=pointer,
        message=f"{where} passes {VPP_LAYERS}, {why}",
        hint=f"remove {VPP_LAYERS}; set [parallelism] vpp (layers per stage = num_layers / "
        f"(pp x vpp), pp = {plan.sizes.pp})",
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


def _pipeline(plan: Plan, opts: MegatronOptions) -> Iterator[Finding]:
    """validate_args: without the send/compute overlap, the interleaved schedule would send
    and receive twice between the same two ranks in one batch when pp is 2."""
    sizes = plan.sizes
    if opts.overlap_p2p_comm is False and sizes.vpp is not None and sizes.pp <= 2:
        yield Finding(
            code="MDC321",
            pointer=pointer_of(opts, "overlap_p2p_comm"),
            message=f"overlap_p2p_comm = false with vpp = {sizes.vpp} and pp = {sizes.pp} "
            "(Megatron-LM: 'When interleaved schedule is used and p2p communication overlap "
            "is disabled, pipeline-model-parallel size should be greater than 2')",
            hint="remove overlap_p2p_comm, or use pp > 2 (or no vpp)",
        )


def _tp_comm_overlap(plan: Plan, opts: MegatronOptions) -> Iterator[Finding]:
    """validate_args turns sequence parallelism off when tp is 1, then asserts it for
    --tp-comm-overlap: Transformer Engine's userbuffers overlap its all-gathers and
    reduce-scatters with the GEMMs."""
    if not opts.tp_comm_overlap or sequence_parallel(plan, opts):
        return
    where = pointer_of(opts, "tp_comm_overlap")
    flag = "extra_args" in where
    given = "--tp-comm-overlap in extra_args" if flag else "tp_comm_overlap"
    drop = "--tp-comm-overlap from extra_args" if flag else "tp_comm_overlap"
    why = (
        f"tp = {plan.sizes.tp}, with which Megatron-LM turns sequence parallelism off"
        if plan.sizes.tp == 1
        else "sequence_parallel = false"
    )
    yield Finding(
        code="MDC321",
        pointer=where,
        message=f"{given} with {why} (Megatron-LM: 'Tensor parallel communication/GEMM "
        "overlap can happen only when sequence parallelism is enabled')",
        hint=f"remove {drop}, or run tp > 1 with sequence parallelism",
    )


def _router_groups(plan: Plan, opts: MegatronOptions) -> Iterator[Finding]:
    """Group-limited routing as Megatron-Core core_v0.16.1 checks it
    (TransformerConfig.__post_init__, only with a group top-k): the groups must be given,
    divide the experts, and be at least the groups chosen per token."""
    chosen, groups = opts.moe_router_group_topk, opts.moe_router_num_groups
    if not chosen:
        return
    experts = plan.model.num_experts if plan.model else None
    where = pointer_of(opts, "moe_router_group_topk")
    if not groups:
        why, text = (
            "no moe_router_num_groups",
            "When using group limited routing, moe_router_num_groups must be specified.",
        )
    elif experts and experts % groups:
        why, text = (
            f"moe_router_num_groups = {groups} not dividing the {experts} experts",
            f"num_moe_experts ({experts}) should be divisible by moe_router_num_groups ({groups}).",
        )
    elif chosen > groups:
        why, text = (
            f"moe_router_num_groups = {groups} below it",
            f"moe_router_group_topk ({chosen}) should be smaller than moe_router_num_groups "
            f"({groups}).",
        )
    else:
        return
    yield Finding(
        code="MDC321",
        pointer=where,
        message=f"moe_router_group_topk = {chosen} with {why} (Megatron-Core: '{text}')",
        hint="set moe_router_num_groups to a divisor of the experts at least "
        "moe_router_group_topk (node-limited routing: the nodes of the ep group)",
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
    if granularity in (None, "selective"):
        yield from _unused_recompute_keys(granularity, method, count)
    else:
        yield from _full_recompute(plan, method, count)


def _unused_recompute_keys(
    granularity: str | None, method: str | None, count: int | None
) -> Iterator[Finding]:
    """recompute_method and recompute_num_layers without full recomputation: none at all,
    or selective (which Megatron refuses them with)."""
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
                message=f'{key} must not be set with recompute_granularity = "selective" ({quote})',
                hint=f'remove {key}, or use recompute_granularity = "full"',
            )


def _full_recompute(plan: Plan, method: str | None, count: int | None) -> Iterator[Finding]:
    """Full recomputation: its method and layer count, which must fit each model chunk's
    layers."""
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
    no_bias = (model is not None and model.bias is False) or passes(words, "--disable-bias-linear")
    if experts and s.etp > 1 and not no_bias:
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


def check(plan: Plan, options: MegatronOptions | None) -> Iterator[Finding]:
    opts = resolved_options(options)
    yield from torchrun_findings(plan, torchrun_options(plan))
    yield from _attention_backend_rule(plan, opts)
    yield from _order(plan)
    yield from _pipeline(plan, opts)
    yield from _tp_comm_overlap(plan, opts)
    yield from ep_overlap_rules(plan, opts)
    yield from _router_groups(plan, opts)
    yield from cp_comm_rules(plan, opts)
    yield from connection_rules(plan, opts)
    yield from _optimizer(plan, opts)
    yield from _recompute(plan, opts)
    yield from _model(plan, opts)
    yield from memory_option_rules(plan, opts)
    yield from _clashes(plan, opts)
