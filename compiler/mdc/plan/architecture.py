"""Which kind each layer of a model is, and the architecture rules Megatron-Core applies.

A GPT-style layer is attention followed by an MLP, which ``moe_layer_freq`` makes an
MoE layer or a dense one. A hybrid stack (``hybrid_override_pattern``) gives one symbol
per layer instead, each layer a single part: ``M`` Mamba, ``*`` attention, ``-`` MLP,
``E`` MoE (``megatron.core.ssm.mamba_hybrid_layer_allocation.Symbols``). Counting the
parts in a range of layers is O(1) for a frequency and linear in the written list or
pattern otherwise, never in anything larger than the spec itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import attrs

from mdc.errors import Finding
from mdc.spec import ModelTable

MAMBA, ATTENTION, MLP, MOE = "M", "*", "-", "E"
#: Megatron-LM's defaults for the multi-latent attention widths (arguments.py)
DEFAULT_KV_LORA_RANK, DEFAULT_QK_HEAD_DIM, DEFAULT_QK_POS_EMB_HEAD_DIM = 32, 128, 64
DEFAULT_V_HEAD_DIM = 128
#: Megatron-Core's TransformerConfig defaults for Mamba-2 layers
DEFAULT_MAMBA_STATE_DIM, DEFAULT_MAMBA_HEAD_DIM, DEFAULT_MAMBA_NUM_GROUPS = 128, 64, 8
#: MambaMixer's expand and d_conv (not configurable through Megatron-LM's flags)
MAMBA_EXPAND, MAMBA_CONV_KERNEL = 2, 4


@attrs.frozen(kw_only=True)
class Latent:
    """Multi-latent attention's widths (0 q_lora: queries are not compressed)."""

    q_lora: int
    kv_lora: int
    qk_head: int
    rope_head: int
    v_head: int


@attrs.frozen(kw_only=True)
class Mamba:
    """A Mamba-2 layer's sizes; its inner width is heads * head_dim."""

    state: int
    head_dim: int
    heads: int
    groups: int
    conv: int = MAMBA_CONV_KERNEL

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim


@attrs.frozen(kw_only=True)
class Parts:
    """How many of each part a range of layers holds."""

    attention: int = 0
    mlp: int = 0
    moe: int = 0
    mamba: int = 0


@attrs.frozen(kw_only=True)
class LayerPattern:
    """Which part each layer is: a GPT stack with MoE layers, or a hybrid pattern."""

    layers: int
    #: every moe_every-th layer is MoE (0: a dense model)
    moe_every: int = 0
    #: or one 0/1 per layer
    moe_list: tuple[int, ...] | None = None
    #: or one symbol per layer (a hybrid stack)
    hybrid: str | None = None

    def parts(self, start: int, stop: int) -> Parts:
        """The parts of layers ``start`` to ``stop - 1``."""
        start, stop = max(0, start), min(self.layers, stop)
        if stop <= start:
            return Parts()
        if self.hybrid is not None:
            symbols = self.hybrid[start:stop]
            return Parts(
                attention=symbols.count(ATTENTION),
                mlp=symbols.count(MLP),
                moe=symbols.count(MOE),
                mamba=symbols.count(MAMBA),
            )
        count = stop - start
        if self.moe_list is not None:
            moe = sum(self.moe_list[start:stop])
        elif self.moe_every:
            moe = math.ceil(stop / self.moe_every) - math.ceil(start / self.moe_every)
        else:
            moe = 0
        return Parts(attention=count, mlp=count - moe, moe=moe)

    def last_is_moe(self) -> bool:
        """Whether the last layer's MLP is an MoE layer (an MTP layer copies it)."""
        return self.parts(self.layers - 1, self.layers).moe > 0


def latent_of(model: ModelTable) -> Latent | None:
    if not model.multi_latent_attention:
        return None
    return Latent(
        q_lora=model.q_lora_rank or 0,
        kv_lora=model.kv_lora_rank or DEFAULT_KV_LORA_RANK,
        qk_head=model.qk_head_dim or DEFAULT_QK_HEAD_DIM,
        rope_head=model.qk_pos_emb_head_dim or DEFAULT_QK_POS_EMB_HEAD_DIM,
        v_head=model.v_head_dim or DEFAULT_V_HEAD_DIM,
    )


def mamba_of(model: ModelTable) -> Mamba | None:
    if model.hybrid_override_pattern is None or MAMBA not in model.hybrid_override_pattern:
        return None
    head_dim = model.mamba_head_dim or DEFAULT_MAMBA_HEAD_DIM
    heads = model.mamba_num_heads or MAMBA_EXPAND * (model.hidden_size or 0) // head_dim
    return Mamba(
        state=model.mamba_state_dim or DEFAULT_MAMBA_STATE_DIM,
        head_dim=head_dim,
        heads=max(heads, 1),
        groups=model.mamba_num_groups or DEFAULT_MAMBA_NUM_GROUPS,
    )


def pattern_of(model: ModelTable) -> LayerPattern:
    layers = model.num_layers or 0
    pattern = model.hybrid_override_pattern
    if pattern is not None and len(pattern) == layers:
        return LayerPattern(layers=layers, hybrid=pattern)
    if not model.num_experts:
        return LayerPattern(layers=layers)
    freq = model.moe_layer_freq if model.moe_layer_freq is not None else 1
    if isinstance(freq, int):
        return LayerPattern(layers=layers, moe_every=freq)
    if len(freq) == layers:
        return LayerPattern(layers=layers, moe_list=freq)
    return LayerPattern(layers=layers, moe_every=1)  # refused by rules(); count every layer


def _finding(code: str, message: str, pointer: str, hint: str | None = None) -> Finding:
    return Finding(code=code, message=message, pointer=pointer, hint=hint)


def rules(model: ModelTable, tp: int, megatron: bool = True) -> Iterator[Finding]:
    """What Megatron-Core refuses in these keys, on its conditions (MDC270-279).

    A pattern or list that does not describe every layer (MDC270, 271, 274) leaves the
    shape undefined for any launcher; the others are Megatron-LM's and Megatron-Core's own
    rules, applied to the megatron launcher only.
    """
    layers, pattern = model.num_layers, model.hybrid_override_pattern
    if pattern is not None and layers is not None and len(pattern) != layers:
        # megatron.core.ssm.mamba_hybrid_layer_allocation._allocate_override
        yield _finding(
            "MDC270",
            f"hybrid_override_pattern has {len(pattern)} layers but num_layers is {layers}",
            "/model/hybrid_override_pattern",
            f"write one symbol per layer, or set num_layers = {len(pattern)}",
        )
    freq = model.moe_layer_freq
    if isinstance(freq, tuple) and layers is not None and len(freq) != layers:
        # megatron.core.models.gpt.gpt_layer_specs.get_gpt_decoder_layer_specs
        yield _finding(
            "MDC271",
            f"moe_layer_freq lists {len(freq)} layers but num_layers is {layers}",
            "/model/moe_layer_freq",
            "give one 0 (dense) or 1 (MoE) per layer",
        )
    if pattern is not None and MOE in pattern and not model.num_experts:
        yield _finding(
            "MDC274",
            "hybrid_override_pattern has MoE layers (E) but num_experts is not set",
            "/model/num_experts",
            "set num_experts",
        )
    if not megatron:
        return
    groups, heads = model.num_query_groups, model.num_attention_heads
    if model.multi_latent_attention and groups is not None and groups != heads:
        # megatron/training/arguments.py: MLA and --group-query-attention exclude each other
        yield _finding(
            "MDC272",
            "multi_latent_attention cannot be combined with grouped-query attention "
            f"(num_query_groups = {groups})",
            "/model/num_query_groups",
            "remove num_query_groups: multi-latent attention compresses keys and values itself",
        )
    if model.moe_shared_expert_intermediate_size is not None and model.bias is not False:
        # megatron.core.transformer.moe.shared_experts.SharedExpertMLP
        yield _finding(
            "MDC273",
            "shared experts (moe_shared_expert_intermediate_size) need bias = false: "
            "Megatron-Core builds them without biases",
            "/model/bias",
            "set bias = false",
        )
    if model.mtp_num_layers and model.position_embedding in (None, "learned"):
        # megatron/training/arguments.py: MTP needs rope or no position embedding
        yield _finding(
            "MDC275",
            'multi-token prediction (mtp_num_layers) needs position_embedding = "rope" or "none"',
            "/model/position_embedding",
            'set position_embedding = "rope"',
        )
    mamba = mamba_of(model)
    if mamba is not None:
        yield from _mamba_rules(mamba, tp)


def _mamba_rules(mamba: Mamba, tp: int) -> Iterator[Finding]:
    # megatron.core.ssm.mamba_mixer.MambaMixer's assertions
    if mamba.heads % mamba.groups:
        yield _finding(
            "MDC276",
            f"mamba_num_heads ({mamba.heads}) must be a multiple of mamba_num_groups "
            f"({mamba.groups})",
            "/model/mamba_num_groups",
        )
    for key, value in (("mamba_num_heads", mamba.heads), ("mamba_num_groups", mamba.groups)):
        if value % tp:
            yield _finding(
                "MDC277",
                f"{key} ({value}) must be a multiple of tp ({tp})",
                f"/model/{key}",
            )
