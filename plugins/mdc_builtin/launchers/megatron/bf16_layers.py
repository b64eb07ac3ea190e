"""Megatron-LM's first and last layers in bf16 under fp8 or fp4 training: keys, flags, rules.

``--first-last-layers-bf16`` (TransformerConfig.first_last_layers_bf16) runs the first
``--num-layers-at-start-in-bf16`` and the last ``--num-layers-at-end-in-bf16`` transformer
layers of the model (global layer numbers; default 1 each) outside the fp8 / fp4 context
(megatron/core/fp8_utils.py is_first_last_bf16_layer, fp4_utils.get_fp4_context): their
GEMMs run in bf16, their weights are bf16 copies and their saved GEMM inputs 16-bit. The
rules are TransformerConfig.__post_init__'s at core_v0.16.1, which checks them only for fp8.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from mdc.api import Finding, Severity
from mdc.api.flags import KnownFlag

#: TransformerConfig's defaults for the two counts
DEFAULT_COUNT = 1

#: the [megatron] keys, in the order their flags are emitted
BF16_LAYER_KEYS = (
    "first_last_layers_bf16",
    "num_layers_at_start_in_bf16",
    "num_layers_at_end_in_bf16",
)

#: the flags, read from extra_args into their keys as if written
BF16_LAYER_FLAGS = (
    KnownFlag(
        name="--first-last-layers-bf16",
        source="[megatron] first_last_layers_bf16",
        key="first_last_layers_bf16",
    ),
    *(
        KnownFlag(
            name="--" + key.replace("_", "-"),
            source=f"[megatron] {key}",
            key=key,
            nargs=1,
            convert=int,
        )
        for key in BF16_LAYER_KEYS[1:]
    ),
)


class Bf16LayerOptions(Protocol):
    """The keys these rules read (None: not given)."""

    @property
    def first_last_layers_bf16(self) -> bool | None: ...
    @property
    def num_layers_at_start_in_bf16(self) -> int | None: ...
    @property
    def num_layers_at_end_in_bf16(self) -> int | None: ...
    @property
    def fp8_recipe(self) -> str | None: ...
    @property
    def fp4_format(self) -> str | None: ...


def bf16_layer_args(opts: Bf16LayerOptions) -> Iterator[str]:
    if opts.first_last_layers_bf16:
        yield "--first-last-layers-bf16"
    for key in BF16_LAYER_KEYS[1:]:
        value = getattr(opts, key)
        if value is not None:
            yield from ("--" + key.replace("_", "-"), str(value))


def _quantized(opts: Bf16LayerOptions, dtype: str | None) -> bool:
    return dtype == "fp8" or opts.fp4_format is not None


def bf16_layers(opts: Bf16LayerOptions) -> tuple[int, int]:
    """(layers at the start, layers at the end) kept out of fp8 / fp4 training (they change
    something only when the GEMMs are quantized)."""
    if not opts.first_last_layers_bf16:
        return (0, 0)
    start, end = opts.num_layers_at_start_in_bf16, opts.num_layers_at_end_in_bf16
    return (
        max(DEFAULT_COUNT if start is None else start, 0),
        max(DEFAULT_COUNT if end is None else end, 0),
    )


def bf16_layer_rules(
    opts: Bf16LayerOptions,
    dtype: str | None,
    num_layers: int | None,
    pp: int,
    at: Callable[[str], str],
) -> Iterator[Finding]:
    """TransformerConfig's checks (for fp8 only, as megatron-core makes them), and a warning
    for the keys that change nothing."""
    on = bool(opts.first_last_layers_bf16)
    if on and dtype == "fp8" and (opts.fp8_recipe or "delayed") == "delayed":
        yield Finding(
            code="MDC475",
            pointer=at("first_last_layers_bf16"),
            message="first_last_layers_bf16 with fp8's delayed scaling recipe (Megatron-Core: "
            "'Delayed scaling does not support first / last layer in BF16.')",
            hint='set fp8_recipe to "tensorwise", "mxfp8" or "blockwise"',
        )
    if on and dtype == "fp8" and num_layers is not None:
        most = num_layers // pp
        for key in BF16_LAYER_KEYS[1:]:
            value = getattr(opts, key)
            count = DEFAULT_COUNT if value is None else value
            if not 0 <= count <= most:
                yield Finding(
                    code="MDC475",
                    pointer=at(key),
                    message=f"{key} ({count}) must be between 0 and the layers per pipeline "
                    f"stage, num_layers // pp = {num_layers} // {pp} = {most} (Megatron-Core "
                    "checks it)",
                    hint=f"set {key} to 0..{most}",
                )
    if on and not _quantized(opts, dtype):
        yield Finding(
            code="MDC475",
            pointer=at("first_last_layers_bf16"),
            severity=Severity.WARNING,
            message="first_last_layers_bf16 has no effect without fp8 or fp4 training "
            f"([model] dtype is {dtype or 'not set'}, no fp4_format): every layer runs in "
            "the model's dtype",
            hint="remove first_last_layers_bf16",
        )
    for key in BF16_LAYER_KEYS[1:]:
        if getattr(opts, key) is not None and not on:
            yield Finding(
                code="MDC475",
                pointer=at(key),
                severity=Severity.WARNING,
                message=f"{key} has no effect without first_last_layers_bf16 (Megatron-Core "
                "reads the counts only with it)",
                hint=f"set first_last_layers_bf16 = true, or remove {key}",
            )
