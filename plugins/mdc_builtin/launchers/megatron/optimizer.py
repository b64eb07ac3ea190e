"""Megatron-LM's optimizer choice and distributed-optimizer instances: keys, flags, rules.

``optimizer`` (``--optimizer``: adam, sgd, muon, dist_muon) decides the bytes of optimizer
state per parameter: Adam keeps fp32 main parameters and two moments (12), SGD the main
parameters and, with ``--sgd-momentum`` above 0 (its default 0.9), a momentum buffer (8),
Muon (megatron/core/optimizer/muon.py) a momentum buffer for the 2-D weights of the layers
and Adam for the rest (the embeddings and the output layer: 12). dist_muon shards that state
over the data-parallel ranks layer by layer.

``num_distributed_optimizer_instances`` (``--num-distributed-optimizer-instances``) keeps
that many copies of the distributed optimizer over the dp-cp group: each shards its state
over dp * cp / instances ranks (Megatron-FSDP: hybrid sharding, the strategy applies within
each instance).

The rules are Megatron-LM core_v0.16.1's (validate_args' Muon checks,
get_megatron_muon_optimizer, initialize_model_parallel's divisibility asserts), on the same
conditions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from mdc.api import Finding, Plan
from mdc.api.flags import KnownFlag
from mdc_builtin.launchers.megatron.words import value_after

#: Megatron-LM core_v0.16.1's --optimizer choices
OPTIMIZERS = ("adam", "sgd", "muon", "dist_muon")


def _positive(word: str) -> int:
    """A count of at least 1 (0 makes Megatron-Core divide by zero)."""
    value = int(word)
    if value < 1:
        raise ValueError(word)
    return value


#: the flags, read from extra_args into their keys as if written
OPTIMIZER_FLAGS = (
    KnownFlag(
        name="--optimizer", source="[megatron] optimizer", key="optimizer", nargs=1,
        choices=OPTIMIZERS,
    ),
    KnownFlag(
        name="--num-distributed-optimizer-instances",
        source="[megatron] num_distributed_optimizer_instances",
        key="num_distributed_optimizer_instances",
        nargs=1,
        convert=_positive,
    ),
)  # fmt: skip


class OptimizerOptions(Protocol):
    """The [megatron] keys these rules read (None: not given)."""

    @property
    def optimizer(self) -> str | None: ...
    @property
    def num_distributed_optimizer_instances(self) -> int | None: ...
    @property
    def use_distributed_optimizer(self) -> bool | None: ...
    @property
    def overlap_grad_reduce(self) -> bool | None: ...
    @property
    def overlap_param_gather(self) -> bool | None: ...
    @property
    def use_megatron_fsdp(self) -> bool | None: ...
    @property
    def use_torch_fsdp2(self) -> bool | None: ...
    @property
    def use_precision_aware_optimizer(self) -> bool | None: ...


def is_muon(opts: OptimizerOptions) -> bool:
    return opts.optimizer in ("muon", "dist_muon")


def optimizer_args(opts: OptimizerOptions) -> Iterator[str]:
    if opts.optimizer is not None:
        yield from ("--optimizer", opts.optimizer)
    if opts.num_distributed_optimizer_instances is not None:
        count = str(opts.num_distributed_optimizer_instances)
        yield from ("--num-distributed-optimizer-instances", count)


def _sgd_momentum(words: Sequence[str]) -> float:
    """--sgd-momentum as the arguments give it (the last one; Megatron-LM's default 0.9)."""
    try:
        return float(value_after(words, "--sgd-momentum") or 0.9)
    except ValueError:
        return 0.9


def layer_optimizer_bytes(opts: OptimizerOptions, words: Sequence[str]) -> int | None:
    """Bytes of optimizer state per transformer-layer parameter in mixed precision (fp32
    main parameters, 4, and the optimizer's own state); None: Adam's."""
    if opts.optimizer == "sgd":
        return 8 if _sgd_momentum(words) else 4
    if is_muon(opts):  # the momentum buffer of each 2-D weight
        return 8
    return None


def end_optimizer_bytes(opts: OptimizerOptions) -> int | None:
    """Bytes per parameter of the embeddings and the output layer when they differ from the
    layers': Muon leaves them to Adam (12)."""
    return 12 if is_muon(opts) else None


def optimizer_rules(
    plan: Plan,
    opts: OptimizerOptions,
    words: Sequence[str],
    dtype: str | None,
    at: Callable[[str], str],
) -> Iterator[Finding]:
    """Megatron-LM core_v0.16.1's rules; ``at`` gives a key's pointer."""
    yield from _instance_rules(plan, opts, at)
    if opts.optimizer not in (None, "adam") and opts.use_precision_aware_optimizer:
        yield Finding(
            code="MDC476",
            pointer=at("use_precision_aware_optimizer"),
            message=f"use_precision_aware_optimizer with optimizer = {opts.optimizer!r} "
            "(Megatron-Core: '--use-precision-aware-optimizer only supported with adam')",
            hint='remove use_precision_aware_optimizer, or use optimizer = "adam"',
        )
    if not is_muon(opts):
        return
    name = opts.optimizer
    ckpt = value_after(words, "--ckpt-format")
    refused = [
        (opts.overlap_grad_reduce, "overlap_grad_reduce", "does not support overlap grad "
         "reduce for now", "remove overlap_grad_reduce"),
        (opts.overlap_param_gather, "overlap_param_gather", "does not support overlap param "
         "gather for now", "remove overlap_param_gather"),
        (opts.use_distributed_optimizer, "use_distributed_optimizer", "does not support "
         "distributed optimizer for now", "remove use_distributed_optimizer (with Muon the "
         "launcher leaves the distributed optimizer off)"),
        (opts.use_torch_fsdp2, "use_torch_fsdp2", "does not support Torch-FSDP2 for now",
         "remove use_torch_fsdp2"),
        (opts.use_megatron_fsdp, "use_megatron_fsdp", "does not support Megatron-FSDP for "
         "now", "remove use_megatron_fsdp"),
    ]  # fmt: skip
    for failed, key, quote, hint in refused:
        if failed:
            yield Finding(
                code="MDC476",
                pointer=at(key),
                message=f"optimizer = {name!r} with {key} (Megatron-LM: 'Muon optimizer {quote}.')",
                hint=f"{hint}, or use another optimizer",
            )
    if ckpt is not None and ckpt not in ("torch", "torch_dist"):
        yield Finding(
            code="MDC476",
            pointer=at("optimizer"),
            message=f"optimizer = {name!r} with --ckpt-format {ckpt} (Megatron-LM: 'Muon "
            "optimizer supports torch and torch_dist checkpoint format.')",
            hint="pass --ckpt-format torch_dist (the default) or torch",
        )
    if dtype == "fp16":
        yield Finding(
            code="MDC476",
            pointer=at("optimizer"),
            message=f'optimizer = {name!r} with [model] dtype = "fp16" (Megatron-Core: '
            "'muon with fp16 is not supported.')",
            hint='use dtype = "bf16", or another optimizer',
        )


def _instance_rules(
    plan: Plan, opts: OptimizerOptions, at: Callable[[str], str]
) -> Iterator[Finding]:
    count = opts.num_distributed_optimizer_instances
    if count is None or count < 1:  # below 1: the schema's minimum refuses it
        return
    pointer = at("num_distributed_optimizer_instances")
    s = plan.sizes
    for size, name, quote in (
        (s.dp * s.cp, f"dp * cp = {s.dp * s.cp}", "Data parallel size"),
        (s.edp, f"the expert data-parallel size {s.edp}", "Expert data parallel size"),
    ):
        if size % count:
            fitting = ", ".join(str(n) for n in range(1, size + 1) if size % n == 0)
            yield Finding(
                code="MDC474",
                pointer=pointer,
                message=f"num_distributed_optimizer_instances ({count}) must divide {name} "
                f"(Megatron-Core: '{quote} should be divisible by partial DistOpt shard "
                "factor')",
                hint=f"set it to one of {fitting}",
            )
            return  # Megatron-Core stops at the first; the expert one then says the same
