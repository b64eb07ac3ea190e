"""Megatron-LM's FP4 (NVFP4) training: the [megatron] fp4_* keys, their flags and rules.

Megatron-Core 0.16 trains the linear layers' GEMMs in FP4 through Transformer Engine
with ``--fp4-format e2m1`` (TransformerConfig.fp4), beside ``--bf16`` for the rest, the
way FP8 does; ``--fp4-recipe`` picks the scaling (``nvfp4``: NVFP4BlockScaling, the
default, or ``custom`` with ``--fp4-quantizer-factory``) and ``--fp4-param-gather``
keeps the layers' weights in FP4 (TransformerConfig.fp4_param). The rules are those of
megatron/training/arguments.py (validate_args) and TransformerConfig.__post_init__ at
core_v0.16.1, on the same conditions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Literal, Protocol

from mdc.api import Finding, Severity
from mdc.api.flags import KnownFlag

#: TransformerConfig.fp4 and fp4_recipe's choices (megatron-core 0.16.1)
FP4_FORMATS = ("e2m1",)
FP4_RECIPES = ("nvfp4", "custom")
#: bytes per element of an NVFP4 weight as Transformer Engine keeps it for training: a
#: 4-bit value plus one E4M3 scale per 16-element block (0.5 + 1/16 bytes), once row-wise
#: for the forward GEMM and once column-wise (transposed) for the backward's dgrad GEMM
NVFP4_WEIGHT_BYTES = 2 * (0.5 + 1 / 16)

#: the [megatron] keys, in the order their flags are emitted
FP4_KEYS = ("fp4_format", "fp4_recipe", "fp4_quantizer_factory", "fp4_param_gather")


class Fp4Options(Protocol):
    """The FP4 keys of the [megatron] table (None: not given)."""

    @property
    def fp4_format(self) -> str | None: ...
    @property
    def fp4_recipe(self) -> str | None: ...
    @property
    def fp4_quantizer_factory(self) -> str | None: ...
    @property
    def fp4_param_gather(self) -> bool | None: ...


def _flag(key: str, nargs: Literal[0, 1], choices: tuple[str, ...] = ()) -> KnownFlag:
    return KnownFlag(
        name="--" + key.replace("_", "-"),
        source=f"[megatron] {key}",
        key=key,
        nargs=nargs,
        choices=choices,
    )


#: the flags, read from extra_args into their keys as if written
FP4_FLAGS = (
    _flag("fp4_format", 1, FP4_FORMATS),
    _flag("fp4_recipe", 1, FP4_RECIPES),
    _flag("fp4_quantizer_factory", 1),
    _flag("fp4_param_gather", 0),
)


def fp4_args(opts: Fp4Options) -> Iterator[str]:
    """The FP4 flags of the options that are set."""
    for key in ("fp4_format", "fp4_recipe", "fp4_quantizer_factory"):
        value = getattr(opts, key)
        if value is not None:
            yield from ("--" + key.replace("_", "-"), str(value))
    if opts.fp4_param_gather:
        yield "--fp4-param-gather"


#: bytes per element of an NVFP4 GEMM input Transformer Engine saves for the backward pass
#: (one quantized copy)
NVFP4_INPUT_BYTES = 0.5 + 1 / 16


def fp4_gemm_input_bytes(opts: Fp4Options) -> float | None:
    """Bytes per saved linear-layer input under FP4 training (None: not FP4)."""
    return NVFP4_INPUT_BYTES if opts.fp4_format is not None else None


def fp4_layer_weight_bytes(opts: Fp4Options) -> float | None:
    """Bytes per transformer-layer weight element under FP4 parameters (None: not FP4)."""
    if opts.fp4_format is not None and opts.fp4_param_gather:
        return NVFP4_WEIGHT_BYTES
    return None


def fp4_rules(opts: Fp4Options, dtype: str | None, at: Callable[[str], str]) -> Iterator[Finding]:
    """Megatron-LM core_v0.16.1's FP4 rules; ``at`` gives a key's pointer."""
    fp4 = opts.fp4_format is not None
    if fp4 and dtype == "fp8":
        yield Finding(
            code="MDC394",
            pointer=at("fp4_format"),
            message='fp4_format with [model] dtype = "fp8": Megatron-LM trains in one of the '
            "two ('--fp4-format and --fp8-format cannot be used simultaneously. Please "
            "choose one.')",
            hint='set [model] dtype = "bf16" for FP4 training, or remove fp4_format',
        )
    if opts.fp4_param_gather and not fp4:
        yield Finding(
            code="MDC394",
            pointer=at("fp4_param_gather"),
            message="fp4_param_gather needs fp4_format (Megatron-LM: '--fp4-param-gather "
            "must be used together with --fp4-format.')",
            hint='set fp4_format = "e2m1", or remove fp4_param_gather',
        )
    if fp4 and opts.fp4_recipe == "custom" and not opts.fp4_quantizer_factory:
        yield Finding(
            code="MDC394",
            pointer=at("fp4_recipe"),
            message='fp4_recipe = "custom" needs fp4_quantizer_factory (Megatron-Core: '
            "'fp4_quantizer_factory must be provided when fp4_recipe is 'custom'.')",
            hint='set fp4_quantizer_factory to the factory\'s import path, or fp4_recipe = "nvfp4"',
        )
    for key in ("fp4_recipe", "fp4_quantizer_factory"):
        if getattr(opts, key) is not None and not fp4:
            yield Finding(
                code="MDC395",
                pointer=at(key),
                severity=Severity.WARNING,
                message=f"{key} has no effect without fp4_format (Megatron-Core reads it "
                "only for FP4 training)",
                hint=f'set fp4_format = "e2m1", or remove {key}',
            )
