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
#: DeepSeek-V4's hybrid attention (Megatron-Core's "dsv4_hybrid"): its defaults and the
#: compress ratios of its compressed sparse (overlapping windows, with an indexer) and
#: heavily compressed layers (megatron/core/transformer/experimental_attention_variant/
#: csa.py, Megatron-LM dev 2026-08)
DSV4 = "dsv4_hybrid"
DEFAULT_O_GROUPS, DEFAULT_O_LORA_RANK, DEFAULT_RESIDUAL_STREAMS = 8, 1024, 4
CSA_RATIO, HCA_RATIO = 4, 128


# in the memory estimate's cache keys: compared and hashed, never printed (no repr)
@attrs.frozen(kw_only=True, repr=False)
class Latent:
    """Multi-latent attention's widths (0 q_lora: queries are not compressed)."""

    q_lora: int
    kv_lora: int
    qk_head: int
    rope_head: int
    v_head: int


# in the memory estimate's cache keys: compared and hashed, never printed (no repr)
@attrs.frozen(kw_only=True, repr=False)
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


# in the memory estimate's cache keys: compared and hashed, never printed (no repr)
@attrs.frozen(kw_only=True, repr=False)
class Dsv4:
    """DeepSeek-V4's hybrid attention: the grouped output projection and the indexer of its
    compressed sparse layers."""

    o_groups: int
    o_lora: int
    indexer_heads: int
    indexer_dim: int


# in the memory estimate's cache keys: compared and hashed, never printed (no repr)
@attrs.frozen(kw_only=True, repr=False)
class Parts:
    """How many of each part a range of layers holds (csa, hca: how many of the attention
    parts have a compressed sparse or heavily compressed branch)."""

    attention: int = 0
    mlp: int = 0
    moe: int = 0
    mamba: int = 0
    csa: int = 0
    hca: int = 0


# in the memory estimate's cache keys: compared and hashed, never printed (no repr)
@attrs.frozen(kw_only=True, repr=False)
class LayerPattern:
    """Which part each layer is: a GPT stack with MoE layers, or a hybrid pattern."""

    layers: int
    #: every moe_every-th layer is MoE (0: a dense model)
    moe_every: int = 0
    #: or one 0/1 per layer
    moe_list: tuple[int, ...] | None = None
    #: or one symbol per layer (a hybrid stack)
    hybrid: str | None = None
    #: DeepSeek-V4: each layer's KV compress ratio (then each MTP layer's)
    compress: tuple[int, ...] | None = None

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
        csa, hca = self._compressed(start, stop)
        if self.moe_list is not None:
            moe = sum(self.moe_list[start:stop])
        elif self.moe_every:
            moe = math.ceil(stop / self.moe_every) - math.ceil(start / self.moe_every)
        else:
            moe = 0
        return Parts(attention=count, mlp=count - moe, moe=moe, csa=csa, hca=hca)

    def _compressed(self, start: int, stop: int) -> tuple[int, int]:
        ratios = (self.compress or ())[start:stop]
        return ratios.count(CSA_RATIO), ratios.count(HCA_RATIO)

    def mtp_compressed(self, count: int) -> Parts:
        """The compressed branches of the first ``count`` MTP layers, whose compress ratios
        follow the layers' ones."""
        csa, hca = self._compressed(self.layers, self.layers + count)
        return Parts(csa=csa, hca=hca)

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


def dsv4_of(model: ModelTable) -> Dsv4 | None:
    if model.experimental_attention_variant != DSV4:
        return None
    return Dsv4(
        o_groups=model.o_groups or DEFAULT_O_GROUPS,
        o_lora=model.o_lora_rank or DEFAULT_O_LORA_RANK,
        indexer_heads=model.dsa_indexer_n_heads or 0,
        indexer_dim=model.dsa_indexer_head_dim or 0,
    )


def residual_streams_of(model: ModelTable) -> int:
    """The hyper-connections' residual streams (0: a plain residual)."""
    if not model.enable_hyper_connections:
        return 0
    return model.num_residual_streams or DEFAULT_RESIDUAL_STREAMS


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
    # tuples, also from a [model] table built with lists: the pattern is hashed (it keys the
    # estimate's cached pieces)
    ratios = model.csa_compress_ratios
    compress = tuple(ratios) if ratios is not None and dsv4_of(model) else None
    if not model.num_experts:
        return LayerPattern(layers=layers, compress=compress)
    freq = model.moe_layer_freq if model.moe_layer_freq is not None else 1
    if isinstance(freq, int):
        return LayerPattern(layers=layers, moe_every=freq, compress=compress)
    if len(freq) == layers:
        return LayerPattern(layers=layers, moe_list=tuple(freq), compress=compress)
    # refused by rules(); count every layer
    return LayerPattern(layers=layers, moe_every=1, compress=compress)


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
    yield from _dsv4_rules(model, tp)


def _dsv4_rules(model: ModelTable, tp: int) -> Iterator[Finding]:
    """Megatron-Core's asserts for DeepSeek-V4's parts (TransformerConfig.__post_init__ and
    the dsv4_hybrid attention, Megatron-LM dev 2026-08)."""
    if dsv4_of(model) is None:
        for key in ("csa_compress_ratios", "o_groups", "o_lora_rank"):
            if getattr(model, key) is not None:
                yield _finding(
                    "MDC477",
                    f'{key} applies only with experimental_attention_variant = "{DSV4}"',
                    f"/model/{key}",
                    f'set experimental_attention_variant = "{DSV4}", or remove {key}',
                )
        return
    if not model.multi_latent_attention:
        yield _finding(
            "MDC477",
            "DSv4 Hybrid requires multi_latent_attention (Megatron-Core asserts it)",
            "/model/multi_latent_attention",
            "set multi_latent_attention = true",
        )
    ratios, layers = model.csa_compress_ratios, model.num_layers or 0
    wanted = layers + (model.mtp_num_layers or 0)
    if ratios is None or len(ratios) < wanted:
        given = "not set" if ratios is None else f"{len(ratios)} long"
        yield _finding(
            "MDC477",
            f"csa_compress_ratios is {given}; Megatron-Core needs at least num_layers + "
            f"mtp_num_layers = {wanted} entries",
            "/model/csa_compress_ratios",
            "give one ratio (0, 4 or 128) per layer and per MTP layer",
        )
    if (
        ratios
        and CSA_RATIO in ratios
        and not (model.dsa_indexer_n_heads and model.dsa_indexer_head_dim)
    ):
        yield _finding(
            "MDC477",
            "compressed sparse attention layers (ratio 4) need their indexer's sizes",
            "/model/dsa_indexer_n_heads",
            "set dsa_indexer_n_heads and dsa_indexer_head_dim",
        )
    groups = model.o_groups or DEFAULT_O_GROUPS
    width = (model.num_attention_heads or 0) * (model.v_head_dim or DEFAULT_V_HEAD_DIM)
    if width % groups:
        yield _finding(
            "MDC477",
            f"num_attention_heads * v_head_dim ({width}) must be divisible by o_groups "
            f"({groups}) (Megatron-Core asserts it)",
            "/model/o_groups",
        )
    if tp > 1:
        yield _finding(
            "MDC477",
            f"DSv4 Hybrid Attention only supports TP size 1 (tp is {tp}; Megatron-Core asserts it)",
            "/parallelism/tp",
            "set tp = 1 (DeepSeek-V4 runs expert parallelism instead)",
        )


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
