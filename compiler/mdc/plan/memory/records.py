"""The memory estimate's records and constants: the model's :class:`Shape`, the per-stage
:class:`MemoryEstimate`, the per-layer :class:`LayerParams` and the cache every piece uses."""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import attrs

from mdc.plan.architecture import (
    Dsv4,
    Latent,
    LayerPattern,
    Mamba,
    dsv4_of,
    latent_of,
    mamba_of,
    pattern_of,
    residual_streams_of,
)
from mdc.spec import ModelTable

GIB = 1 << 30
#: What the parameter count and the activations need from [model].
REQUIRED_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "seq_length")
#: bytes per weight element, by [model] dtype (fp8 training keeps 16-bit weights)
WEIGHT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 2}
DEFAULT_DTYPE = "bf16"
#: Megatron-Core's default top-k of the MoE router
DEFAULT_TOPK = 2
#: above this share of the capacity, a warning: the estimate leaves overheads out
HEADROOM = Fraction(9, 10)
#: levers shown in the hint of a memory error
MAX_LEVERS = 4

#: The estimate's pieces are pure functions of hashable arguments, and a layout search
#: estimates thousands of layouts of one model that share most of them (the same stage's
#: parameters under every micro batch and recompute setting, the same activations under
#: every optimizer setting): those pieces are cached, bounded so a long-lived process does
#: not grow without end. A cached piece takes only the values it reads, so its key is
#: complete by construction.
cached = functools.lru_cache(maxsize=1 << 14)


# a cache key: compared and hashed, never printed (no generated repr: start-up time)
@attrs.frozen(kw_only=True, cache_hash=True, repr=False)
class Shape:
    """The model's shape with every default resolved (hashed once: it keys the cached
    pieces of the estimate)."""

    layers: int
    hidden: int
    heads: int
    groups: int
    kv_channels: int
    ffn: int
    vocab: int
    seq: int
    #: 0 for a dense model
    experts: int
    moe_ffn: int
    topk: int
    gated: bool
    tied: bool
    learned_positions: bool
    bias: bool
    #: parameters of one norm: 2h (LayerNorm) or h (RMSNorm)
    norm: int
    dtype: str
    #: fused attention: no s x s scores kept
    flash: bool
    #: which layers are attention, MLP, MoE or Mamba
    pattern: LayerPattern = attrs.field(
        default=attrs.Factory(lambda self: LayerPattern(layers=self.layers), takes_self=True)
    )
    #: a norm on each head's queries and keys (or on MLA's compressed q and kv)
    qk_norm: bool = False
    #: a QKV bias without the other linear biases (--add-qkv-bias)
    qkv_bias: bool = False
    #: one learned softmax offset per head (--softmax-type learnable)
    sinks: bool = False
    latent: Latent | None = None
    #: the shared expert's width (0: none)
    shared_ffn: int = 0
    #: the routed experts' latent width (0: they work in the hidden size)
    moe_latent: int = 0
    mtp_layers: int = 0
    mamba: Mamba | None = None
    #: DeepSeek-V4's hybrid attention (with ``latent``'s q_lora, v_head and rope_head)
    dsv4: Dsv4 | None = None
    #: hyper-connections' residual streams (0: a plain residual)
    streams: int = 0
    #: the checkpoint's FP8 weight scale blocks (rows, columns); None: per-tensor or not FP8
    weight_block: tuple[int, int] | None = None

    def norm_of(self, width: int) -> int:
        """Parameters of a norm over ``width`` (weight, and bias for LayerNorm)."""
        return self.norm // self.hidden * width


def missing_keys(model: ModelTable) -> list[str]:
    return [key for key in REQUIRED_KEYS if getattr(model, key) is None]


def resolve_shape(model: ModelTable) -> Shape | None:
    """The shape, or None when [model] lacks what the count needs (see :func:`missing_keys`)."""
    if missing_keys(model):
        return None
    h, a = model.hidden_size or 0, model.num_attention_heads or 0
    ffn = model.ffn_hidden_size or 4 * h
    shape = Shape(
        layers=model.num_layers or 0,
        hidden=h,
        heads=a,
        groups=model.num_query_groups or a,
        kv_channels=model.kv_channels or h // a,
        ffn=ffn,
        vocab=model.vocab_size or 0,
        seq=model.seq_length or 0,
        experts=model.num_experts or 0,
        moe_ffn=model.moe_ffn_hidden_size or ffn,
        topk=model.moe_router_topk or DEFAULT_TOPK,
        gated=bool(model.gated_mlp),
        tied=model.tied_embeddings is not False,
        learned_positions=(model.position_embedding or "learned") == "learned",
        bias=model.bias is not False,
        norm=h if model.normalization == "rmsnorm" else 2 * h,
        dtype=model.dtype or DEFAULT_DTYPE,
        flash=model.flash_attention is not False,
        pattern=pattern_of(model),
        qk_norm=bool(model.qk_layernorm),
        qkv_bias=bool(model.add_qkv_bias),
        sinks=model.softmax_type == "learnable",
        latent=latent_of(model),
        shared_ffn=(model.moe_shared_expert_intermediate_size or 0) if model.num_experts else 0,
        moe_latent=(model.moe_latent_size or 0) if model.num_experts else 0,
        mtp_layers=model.mtp_num_layers or 0,
        mamba=mamba_of(model),
        dsv4=dsv4_of(model),
        streams=residual_streams_of(model),
        weight_block=_pair(model.weight_block_size),
    )
    return _canonical(shape)


def _pair(value: tuple[int, int] | list[int] | None) -> tuple[int, int] | None:
    """A two-integer key (a list when the table was built from a plain mapping) as a tuple."""
    return (value[0], value[1]) if value else None


@functools.lru_cache(maxsize=256)
def _canonical(shape: Shape) -> Shape:
    """The first object made for an equal shape: the caches keyed by shapes (here and in the
    throughput model) then find each other's by identity, without comparing every field."""
    return shape


# ----------------------------------------------------------------------------- parameters


def ceil_int(value: Fraction | int) -> int:
    return math.ceil(value)


# only read, never compared or printed: no generated ==, hash or repr (start-up time)
@attrs.frozen(kw_only=True, eq=False, repr=False)
class LayerParams:
    """Parameters on one GPU: dense (tp-sharded or replicated) and expert."""

    dense: int
    expert: int

    def __add__(self, other: LayerParams) -> LayerParams:
        return LayerParams(dense=self.dense + other.dense, expert=self.expert + other.expert)

    def __mul__(self, count: int) -> LayerParams:
        return LayerParams(dense=self.dense * count, expert=self.expert * count)


# ----------------------------------------------------------------------------- memory


@attrs.frozen(kw_only=True)
class MemoryEstimate:
    """Per-GPU memory of the heaviest pipeline stage, in bytes, and what it assumed."""

    #: parameters of the whole model
    params_total: int
    #: parameters one GPU of that stage holds (its tp/ep shard), before ZeRO-3 sharding
    params_per_gpu: int
    #: "only" (pp = 1), "first", "middle" or "last": the heaviest pipeline stage
    stage: str
    #: its pipeline rank
    stage_rank: int
    #: transformer layers on that stage
    stage_layers: int
    dtype: str
    #: bytes per parameter of weights (NVFP4 ones: a fraction), gradients and optimizer state
    weight_bytes: float
    grad_bytes: int
    optimizer_bytes: int
    zero_stage: int
    #: dp-cp size the ZeRO stage shards dense parameters over (expert ones: expert-dp)
    shard: int
    expert_shard: int
    micro_batch_size: int
    #: micro batches whose activations the stage holds at once (1F1B)
    in_flight: int
    sequence_parallel: bool
    recompute: str
    weights: int
    gradients: int
    optimizer: int
    activations: int
    total: int
    #: accelerator_memory_gib in bytes; None: no fit check
    capacity: int | None = None
    #: the optimizer step's wider copy of the gradients (TrainingSetup.step_grad_bytes),
    #: held while the step runs, when the activations are freed: the total counts the larger
    step_gradients: int = 0


Spans = tuple[tuple[int, int], ...]


# ----------------------------------------------------------------------------- findings


def gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"
