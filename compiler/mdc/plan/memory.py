"""Parameter count and per-GPU memory estimate for a GPT-style decoder.

Pure arithmetic on the ``[model]`` table, the parallel sizes, the batch and
the launcher's :class:`~mdc.plan.model.TrainingSetup`: O(1) in the world size
(only the hint's "next valid size" search looks at divisors).

Parameters
----------
Classic layout (the defaults: LayerNorm, linear biases, a 2-matrix MLP, learned
position embeddings, input and output embeddings tied). Per layer::

    attention  QKV h*(h+2h) + 3h, output projection h*h + h     = 4h^2 + 4h
    MLP        h*f + f, f*h + h (f = 4h)                          = 8h^2 + 5h
    two LayerNorms (weight and bias)                              = 4h

plus the embeddings V*h + s*h, which is exactly Narayanan et al. 2021
("Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", appendix)::

    P = 12*l*h^2 * (1 + 13/(12h) + (V + s)/(12*l*h))

Like that formula, the final norm (2h, or h for RMSNorm; under 1e-6 of any real
model) is not counted. The general layout replaces, as Megatron-Core builds it:

* grouped-query attention: kv_channels d = h // a; Q is a*d wide, K and V g*d
  each (g = num_query_groups), so QKV = h*(a*d + 2*g*d), projection a*d*h;
* ``gated_mlp`` (SwiGLU): fc1 is h*2f (gate and up), fc2 f*h: 3*h*f, not 2*h*f;
* ``bias = false`` drops every linear bias; ``normalization = "rmsnorm"`` has a
  weight only (h per norm instead of 2h);
* ``position_embedding = "rope"`` has no parameters (``"learned"``: s*h);
* ``tied_embeddings = false`` adds the output matrix V*h;
* MoE (``num_experts`` E): every layer's MLP becomes a router (E*h) and E
  experts of width ``moe_ffn_hidden_size`` (default ffn_hidden_size), with a bias
  each (and the router one per expert) when ``bias`` is on;
* the architecture keys (docs/model.md): ``kv_channels`` sets d; ``qk_layernorm``
  adds two norms of d; ``add_qkv_bias`` a QKV bias; ``softmax_type = "learnable"`` one
  offset per head; multi-latent attention replaces QKV by its down and up projections;
  a shared expert adds an MLP of its width to each MoE layer; ``moe_layer_freq`` makes
  some layers dense; each MTP layer is a copy of the last layer plus two norms, a
  2h x h projection and a final norm; a hybrid pattern makes each layer one part
  (Mamba-2, attention, MLP or MoE, each with its norm). A stage's parameters and
  activations are the sum over the parts of the layers it holds
  (:mod:`mdc.plan.architecture` says which).

Llama-3-8B (l 32, h 4096, a 32, g 8, f 14336, V 128256, gated, untied, rope,
no bias, RMSNorm) gives 8,030,257,152 (published: 8.03e9).

Per GPU, tensor parallelism splits QKV, projection, MLP and the vocabulary by
tp (the fused QKV matrix as a whole, also when num_query_groups < tp; those
ranks then compute one K/V group each, which the activations count); norms,
row-parallel biases, position embeddings and the router are replicated.
Experts split over ep * etp. With pp > 1 the first stage holds the input
embedding and the last the output matrix, which Megatron-Core allocates there
even when tied (a copy, kept equal by an all-reduce).

Weights, gradients, optimizer (ZeRO: Rajbhandari et al. 2020)
-------------------------------------------------------------
Weights take the dtype's bytes (bf16/fp16 2, fp32 4; fp8 training keeps bf16
weights and runs only the GEMMs in fp8: 2). Gradients take the launcher's
``grad_bytes`` (Megatron keeps fp32 main grads: 4) or the weight bytes.
Mixed-precision Adam keeps an fp32 master copy, momentum and variance: 12 B;
pure fp32 needs no master copy: 8 B. ZeRO stage 1 (Megatron's distributed
optimizer) shards the optimizer state over the dp-cp group, stage 2 also the
gradients, stage 3 (FSDP) also the weights. Megatron's docs: 18 B/param
(2 + 4 + 12) plain, 6 + 12/d with the distributed optimizer. Expert parameters
shard over the expert-dp group instead.

Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models")
---------------------------------------------------------------------------
Per layer, for a micro batch b and sequence s, 16-bit activations and 1-byte
dropout masks: s*b*h*(34 + 5*a*s/h) without tp; with tp t
s*b*h*(10 + 24/t + 5*a*s/(h*t)); with sequence parallel everything over t.
The 10 (norm inputs, attention and MLP inputs, two masks) is what sequence
parallel splits; the 24 is Q, K, V, the projection input (8) and the MLP's
two 4h-wide intermediates (16), generalised here to 2*(2*a*d + 2*g*d)/h and
2*(2 or 3)*f/h (GQA: smaller K and V; gated: gate, up and product). The
5*a*s/h term (scores, softmax, dropout of every head) exists only with eager
attention (``flash_attention = false``): fused kernels (FlashAttention, cuDNN
or Transformer Engine fused attention, PyTorch SDPA), the frameworks' default,
keep no s x s matrix, and selective recompute drops it too. Full recompute
keeps only each layer's input (2*s*b*h, over t with sequence parallel) plus
one layer's full activations while it is recomputed. fp32 doubles the 2-byte
terms. Context parallelism divides s by cp (each rank's scores are s/cp
queries by s keys). MoE layers hold top-k copies of each token's expert input
and MLP intermediates (the latter over etp). The last stage adds what its loss holds
at the end of the forward pass, per logit (s*b*V/t of them): the fp32 logits, 4 bytes,
unless the launcher says more (Megatron-Core's vocab-parallel cross entropy keeps the
bf16 logits beside its fp32 copy: 6; a float() cross entropy as TorchTitan's has the
bf16 logits, the saved log-softmax and two fp32 gradients: 12 at its backward, 4 compiled).

Pipeline (1F1B): stage i holds min(pp - i, microbatches) micro batches of its
layers (the microbatches of one schedule run: TorchTitan runs one per accumulation
step): the first stage the most, the last one; the interleaved schedule
multiplies the first stage's by 1 + (pp - 1)/(pp * vpp). The estimate is for
the heavier of the first and the last stage.

Not counted: the CUDA/ROCm context, communication buffers, allocator
fragmentation, ZeRO-3's transient gathered layer, the input embedding's
activations, vocabulary padding.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from fractions import Fraction

import attrs

from mdc.errors import Finding, Severity
from mdc.plan import per_op
from mdc.plan.architecture import (
    CSA_RATIO,
    HCA_RATIO,
    Dsv4,
    Latent,
    LayerPattern,
    Mamba,
    Parts,
    dsv4_of,
    latent_of,
    mamba_of,
    pattern_of,
    residual_streams_of,
)
from mdc.plan.model import BatchPlan, Sizes, TrainingSetup
from mdc.plan.ranks import divisors
from mdc.plan.stages import Model, PipelineSplit, StageLayers, split_layers
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
_cached = functools.lru_cache(maxsize=1 << 14)


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
    )
    return _canonical(shape)


@functools.lru_cache(maxsize=256)
def _canonical(shape: Shape) -> Shape:
    """The first object made for an equal shape: the caches keyed by shapes (here and in the
    throughput model) then find each other's by identity, without comparing every field."""
    return shape


# ----------------------------------------------------------------------------- parameters


def _ceil(value: Fraction | int) -> int:
    return math.ceil(value)


# only read, never compared or printed: no generated ==, hash or repr (start-up time)
@attrs.frozen(kw_only=True, eq=False, repr=False)
class _LayerParams:
    """Parameters on one GPU: dense (tp-sharded or replicated) and expert."""

    dense: int
    expert: int

    def __add__(self, other: _LayerParams) -> _LayerParams:
        return _LayerParams(dense=self.dense + other.dense, expert=self.expert + other.expert)

    def __mul__(self, count: int) -> _LayerParams:
        return _LayerParams(dense=self.dense * count, expert=self.expert * count)


def _split(width: int, tp: int) -> int:
    return _ceil(Fraction(width, tp))


def _dsv4_attention(shape: Shape, dsv4: Dsv4, latent: Latent, tp: int) -> int:
    """DeepSeek-V4's hybrid attention without its compressed branch (Megatron-Core's
    DSv4HybridSelfAttention): the compressed query and its norm, the up projection to
    heads of v_head width, one shared key/value head and its norm, the grouped output
    projection (o_groups x o_lora of heads * v_head / o_groups each), the projection to
    hidden and a sink per head."""
    h, b, v = shape.hidden, int(shape.bias), latent.v_head
    query = h * latent.q_lora + latent.q_lora + latent.q_lora * _split(shape.heads * v, tp)
    kv = h * _split(v, tp) + v
    grouped = _split(dsv4.o_groups, tp) * dsv4.o_lora * (shape.heads * v // dsv4.o_groups)
    projection = _split(dsv4.o_groups * dsv4.o_lora, tp) * h + b * h
    return shape.norm + query + kv + grouped + projection + _split(shape.heads, tp)


def _compressor(shape: Shape, width: int, ratio: int, overlap: bool) -> int:
    """A compressor of ``ratio`` tokens into one ``width`` entry (Megatron-Core's csa
    Compressor): KV and gate projections of (2 if overlapping) x width, a learned position
    bias per window slot, an RMSNorm."""
    out = (2 if overlap else 1) * width
    return 2 * shape.hidden * out + ratio * out + width


def _compressed(shape: Shape, parts: Parts) -> int:
    """The compressed branches of the attention parts: compressed sparse layers (ratio 4,
    overlapping windows, and a lightning indexer with its own compressor, query projection
    and head weights) and heavily compressed ones (ratio 128)."""
    dsv4, latent = shape.dsv4, shape.latent
    if dsv4 is None or latent is None:
        return 0
    v, heads, dim = latent.v_head, dsv4.indexer_heads, dsv4.indexer_dim
    indexer = latent.q_lora * heads * dim + shape.hidden * heads
    indexer += _compressor(shape, dim, CSA_RATIO, True)
    csa = _compressor(shape, v, CSA_RATIO, True) + indexer
    return parts.csa * csa + parts.hca * _compressor(shape, v, HCA_RATIO, False)


def _hyper_connection(shape: Shape) -> int:
    """One hyper-connection module (before each attention and MLP block): the n streams'
    projection to n^2 + 2n mixing weights, their bias and three gates."""
    n = shape.streams
    return (n * n + 2 * n) * (n * shape.hidden + 1) + 3 if n else 0


def _hyper_head(shape: Shape) -> int:
    """The final collapse of the n streams (the main model's, and each MTP layer's)."""
    n = shape.streams
    return n * n * shape.hidden + n + 1 if n else 0


def _attention(shape: Shape, tp: int) -> int:
    """The input norm and the attention block of one layer on one tp rank."""
    h, b = shape.hidden, int(shape.bias)
    latent = shape.latent
    if shape.dsv4 is not None and latent is not None:
        return _dsv4_attention(shape, shape.dsv4, latent, tp)
    sinks = _split(shape.heads, tp) if shape.sinks else 0
    if latent is not None:
        # as Transformer Engine's spec builds it: the down projections (and their norms)
        # are replicated over tp, the up projections split by heads
        q_head = latent.qk_head + latent.rope_head
        q_up = _split(shape.heads * q_head, tp)
        query = h * latent.q_lora + latent.q_lora * q_up if latent.q_lora else h * q_up
        kv = h * (latent.kv_lora + latent.rope_head) + latent.kv_lora * _split(
            shape.heads * (latent.qk_head + latent.v_head), tp
        )
        norms = shape.norm_of(latent.q_lora) + shape.norm_of(latent.kv_lora)
        projection = _split(shape.heads * latent.v_head, tp) * h + b * h
        return shape.norm + query + kv + projection + sinks + (norms if shape.qk_norm else 0)
    d = shape.kv_channels
    q = _split(shape.heads * d, tp)
    # Megatron-Core splits the fused QKV matrix over tp as a whole, even with fewer
    # query groups than tp (each rank then gathers the one group it needs)
    qkv = _split((shape.heads + 2 * shape.groups) * d, tp)
    qkv_bias = qkv if shape.bias or shape.qkv_bias else 0
    qk_norms = 2 * shape.norm_of(d) if shape.qk_norm else 0
    return shape.norm + h * qkv + qkv_bias + q * h + b * h + qk_norms + sinks


def _mlp(shape: Shape, width: int, split: int, bias: bool, outer: int = 0) -> int:
    """An MLP of ``width`` split ``split`` ways (gated: fc1 holds gate and up), from and
    to ``outer`` (default the hidden size)."""
    h, b, f = outer or shape.hidden, int(bias), _split(width, split)
    gates = 2 if shape.gated else 1
    return h * gates * f + b * gates * f + f * h + b * h


def _moe(shape: Shape, tp: int, ep: int, etp: int) -> _LayerParams:
    """The pre-MLP norm, router, shared expert and this rank's routed experts."""
    router = shape.experts * shape.hidden + (shape.experts if shape.bias else 0)
    shared = _mlp(shape, shape.shared_ffn, tp, False) if shape.shared_ffn else 0
    local = _split(shape.experts, ep)
    # MoE latent projections (--moe-latent-size): the routed experts work in the latent
    # width, between a replicated down (h -> latent) and up (latent -> h) projection
    h, latent, b = shape.hidden, shape.moe_latent, int(shape.bias)
    projections = 2 * h * latent + b * (latent + h) if latent else 0
    return _LayerParams(
        dense=shape.norm + router + shared + projections,
        expert=local * _mlp(shape, shape.moe_ffn, etp, shape.bias, latent),
    )


def _mamba(shape: Shape, tp: int) -> int:
    """A Mamba-2 layer as Megatron-Core's MambaMixer builds it (heads split over tp)."""
    m, h = shape.mamba, shape.hidden
    if m is None:
        return 0
    inner, heads, bc = _split(m.inner, tp), _split(m.heads, tp), _split(2 * m.groups * m.state, tp)
    in_proj = h * (2 * inner + bc + heads)  # z, x, B, C and dt
    conv = (inner + bc) * (m.conv + 1)  # a depthwise kernel and a bias per channel
    # dt_bias, A_log and D per head, the gated norm over the inner width, out_proj
    return shape.norm + in_proj + conv + 3 * heads + inner + inner * h


@_cached
def _parts(shape: Shape, parts: Parts, tp: int, ep: int, etp: int) -> _LayerParams:
    dense = (
        parts.attention * _attention(shape, tp)
        + _compressed(shape, parts)
        + parts.mlp * (shape.norm + _mlp(shape, shape.ffn, tp, shape.bias))
        + parts.mamba * _mamba(shape, tp)
    )
    blocks = parts.attention + parts.mlp + parts.moe + parts.mamba
    dense += blocks * _hyper_connection(shape)
    return _LayerParams(dense=dense, expert=0) + _moe(shape, tp, ep, etp) * parts.moe


def _layers(shape: Shape, start: int, stop: int, tp: int, ep: int, etp: int) -> _LayerParams:
    """Parameters of layers ``start`` to ``stop - 1`` on one GPU."""
    return _parts(shape, shape.pattern.parts(start, stop), tp, ep, etp)


@_cached
def _mtp(shape: Shape, tp: int, ep: int, etp: int) -> _LayerParams:
    """The multi-token prediction layers: each a copy of the last layer's kind (with its
    own compress ratio), two input norms, the 2h -> h projection (split over tp), its own
    final norm and, with hyper-connections, its own stream head."""
    moe, h = shape.pattern.last_is_moe(), shape.hidden
    layer = _parts(shape, Parts(attention=1, mlp=int(not moe), moe=int(moe)), tp, ep, etp)
    extra = 3 * shape.norm + 2 * h * _split(h, tp) + _hyper_head(shape)
    compressed = _compressed(shape, shape.pattern.mtp_compressed(shape.mtp_layers))
    return (layer + _LayerParams(dense=extra, expert=0)) * shape.mtp_layers + _LayerParams(
        dense=compressed, expert=0
    )


def _embedding(shape: Shape, tp: int) -> int:
    return _split(shape.vocab, tp) * shape.hidden + (
        shape.seq * shape.hidden if shape.learned_positions else 0
    )


@_cached
def parameter_count(shape: Shape) -> int:
    """Parameters of the whole model (tied embeddings counted once; no final norm)."""
    layers = _layers(shape, 0, shape.layers, 1, 1, 1) + _mtp(shape, 1, 1, 1)
    output = 0 if shape.tied else shape.vocab * shape.hidden
    return layers.dense + layers.expert + _embedding(shape, 1) + output + _hyper_head(shape)


def active_parameter_count(shape: Shape) -> int:
    """Parameters one token passes through: each MoE layer's top-k experts, not all
    (the multi-token prediction layers, a training objective, are left out)."""
    layers = _layers(shape, 0, shape.layers, 1, 1, 1)
    routed = min(shape.topk, shape.experts)
    expert = layers.expert * routed // shape.experts if shape.experts else 0
    output = 0 if shape.tied else shape.vocab * shape.hidden
    return layers.dense + expert + _embedding(shape, 1) + output + _hyper_head(shape)


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


# only read, never compared or printed: no generated ==, hash or repr (start-up time)
@attrs.frozen(kw_only=True, eq=False, repr=False)
class _PartActivations:
    """One part's activations for one micro batch, in bytes: the replicated share
    (which sequence parallelism splits over tp), the tp-split share and the s x s scores
    of eager attention."""

    replicated: Fraction = Fraction(0)
    split: Fraction = Fraction(0)
    scores: Fraction = Fraction(0)
    #: what Megatron-Core's selective recompute of a module drops, by module name
    #: ("layernorm": the norm's output, part of the replicated share; "mla_up_proj", "mlp",
    #: "moe", "moe_act", "shared_experts": parts of the split share)
    modules: tuple[tuple[str, Fraction], ...] = ()

    def full(self, sp: int) -> Fraction:
        return self.replicated / sp + self.split + self.scores

    def selective(self, sp: int, modules: tuple[str, ...]) -> Fraction:
        """What the part keeps when the listed modules are recomputed."""
        chosen = set(modules)
        if "moe" in chosen:  # the whole MoE layer: its activation function with it
            chosen -= {"moe_act", "shared_experts"}
        kept = self.full(sp) - (self.scores if "core_attn" in chosen else 0)
        for name, size in self.modules:
            if name in chosen:
                kept -= size / sp if name == "layernorm" else size
        return kept


# a cache key: compared and hashed, never printed (no generated repr: start-up time)
@attrs.frozen(repr=False)
class _ActivationSwitches:
    """What the activations read from the launcher's TrainingSetup (so the cached pieces
    that take it are keyed by these and nothing else)."""

    sequence_parallel: bool
    recompute: str
    recompute_method: str | None
    recompute_num_layers: int | None
    recompute_every: int | None
    recompute_modules: tuple[str, ...] | None
    recompute_per_op: bool
    recompute_per_op_forced: tuple[str, ...]
    dropout_masks: bool
    eager_gated_mlp: bool
    offload_layers: int
    gemm_input_bytes: float | None
    moe_capacity_factor: float | None

    @classmethod
    def of(cls, training: TrainingSetup) -> _ActivationSwitches:
        modules = training.recompute_modules
        return cls(
            sequence_parallel=training.sequence_parallel,
            recompute=training.recompute,
            recompute_method=training.recompute_method,
            recompute_num_layers=training.recompute_num_layers,
            recompute_every=training.recompute_every,
            # a tuple also from a launcher that gave a list: it is hashed
            recompute_modules=None if modules is None else tuple(modules),
            recompute_per_op=training.recompute_per_op,
            recompute_per_op_forced=tuple(training.recompute_per_op_forced),
            dropout_masks=training.dropout_masks,
            eager_gated_mlp=training.eager_gated_mlp,
            offload_layers=training.offload_layers,
            gemm_input_bytes=training.gemm_input_bytes,
            moe_capacity_factor=training.moe_capacity_factor,
        )


@_cached
def _part_activations(
    shape: Shape,
    t: int,
    cp: int,
    etp: int,
    micro: int,
    gemm_input_bytes: float | None,
    moe_capacity_factor: float | None,
    masks: bool = True,
    eager_mlp: bool = False,
) -> dict[str, _PartActivations]:
    """Each part's activations (Korthikanti et al.'s terms, split by part) on a tp rank
    (shared by the cache: read only). ``masks``: the 1-byte dropout masks;
    ``eager_mlp``: a gated MLP also keeps its activation function's output."""
    act = 4 if shape.dtype == "fp32" else 2
    tokens = Fraction(shape.seq, cp) * micro
    h = shape.hidden
    # fp8 training: Transformer Engine keeps a linear layer's input for its backward pass
    # in fp8 (1 byte); the norms, attention and activation functions keep 16 bits
    gemm_in: Fraction | int = 1 if shape.dtype == "fp8" else act
    if gemm_input_bytes is not None:  # e.g. NVFP4: the launcher's quantized copy
        gemm_in = Fraction(gemm_input_bytes)
    norm_output = ("layernorm", gemm_in * tokens * h)
    # per ffn column: the first matrix's outputs (gate and up, or one) and the second
    # matrix's input
    ffn_bytes = act * (intermediates_of(shape) - 1) + gemm_in
    if eager_mlp and shape.gated:
        ffn_bytes += act
    # experts padded to their capacity hold capacity-factor times the even share of tokens
    capacity = Fraction(moe_capacity_factor or 1).limit_denominator(1000)
    routed = tokens * shape.topk * capacity
    experts = routed * (
        ffn_bytes * Fraction(shape.moe_ffn, etp) + gemm_in * (shape.moe_latent or h)
    )
    shared = tokens * ffn_bytes * Fraction(shape.shared_ffn, t)
    # every part keeps its norm's input, its first matrix's input and a dropout mask
    kept_in = act + gemm_in + (1 if masks else 0)
    inputs = kept_in * tokens * h
    latent = shape.latent
    attention_modules: tuple[tuple[str, Fraction], ...] = (norm_output,)
    dsv4 = shape.dsv4
    if dsv4 is not None and latent is not None:
        # DeepSeek-V4: Q before and after its norm and rope, the one shared K = V head, the
        # attention output (the grouped projection's input) and the o_groups x o_lora
        # output projection's input; the compressed query and the kv head, each a norm
        # input and a projection input
        q = Fraction(shape.heads * latent.v_head, t)
        grouped = Fraction(dsv4.o_groups * dsv4.o_lora, t)
        split = act * tokens * (3 * q + 2 * latent.v_head + grouped)
        inputs += act * tokens * (2 * latent.q_lora + 2 * latent.v_head)
        attention_modules += (("mla_up_proj", act * tokens * 2 * q),)
    elif latent is not None:
        # Q and K of qk + rope width, V and the projection input of v width, per head; the
        # replicated compressed q and kv (each a norm input and an up-projection input)
        q = Fraction(shape.heads * (latent.qk_head + latent.rope_head), t)
        v = Fraction(shape.heads * latent.v_head, t)
        split = act * tokens * (2 * q + 2 * v)
        inputs += act * tokens * (2 * latent.q_lora + 2 * latent.kv_lora + latent.rope_head)
        # recompute_modules "mla_up_proj": Megatron-Core discards the up-projected Q, K and V
        # once core attention has run and recomputes them from the latents for its backward
        attention_modules += (("mla_up_proj", act * tokens * (2 * q + v)),)
    else:
        d = shape.kv_channels
        q = Fraction(shape.heads * d, t)
        kv = Fraction(shape.groups * d, t) if shape.groups % t == 0 else Fraction(d)
        split = act * tokens * (2 * q + 2 * kv)
    scores = 0 if shape.flash else (2 * act + 1) * Fraction(shape.heads, t) * tokens * shape.seq
    mlp = tokens * ffn_bytes * Fraction(shape.ffn, t)
    if shape.streams:
        # hyper-connections: each block keeps the n residual streams it mixes
        streams = act * shape.streams * tokens * h
        inputs += streams
    else:
        streams = Fraction(0)
    parts = {
        "attention": _PartActivations(
            replicated=inputs, split=split, scores=Fraction(scores), modules=attention_modules
        ),
        "mlp": _PartActivations(
            replicated=kept_in * tokens * h + streams,
            split=mlp,
            modules=(norm_output, ("mlp", mlp)),
        ),
        "moe": _PartActivations(
            replicated=kept_in * tokens * h + streams,
            split=experts + shared,
            modules=(
                norm_output,
                ("moe", experts + shared),
                ("moe_act", routed * gemm_in * Fraction(shape.moe_ffn, etp)),
                ("shared_experts", shared),
            ),
        ),
    }
    m = shape.mamba
    if m is not None:
        # what the fused Mamba-2 kernel saves for backward: its input projection (z, x, B,
        # C, dt), the scan's output, and the gated norm's output that out_proj keeps
        width = 4 * m.inner + 2 * m.groups * m.state + m.heads
        parts["mamba"] = _PartActivations(
            replicated=kept_in * tokens * h,
            split=act * tokens * Fraction(width, t),
            modules=(norm_output,),
        )
    return parts


def intermediates_of(shape: Shape) -> int:
    """MLP intermediates kept per token and ffn column: gate, up and product, or two."""
    return 3 if shape.gated else 2


def _activations(
    shape: Shape,
    parts: Parts,
    layers: int,
    sizes: Sizes,
    micro: int,
    training: TrainingSetup,
) -> tuple[Fraction, Fraction]:
    """(bytes these layers keep per micro batch, bytes the backward pass holds while it
    recomputes a layer: the heaviest layer's full activations, or none)."""
    t, cp, etp, chunks = sizes.tp, sizes.cp, sizes.etp, sizes.vpp or 1
    # only the per-op policy keeps what ep changes (the all-to-alls' outputs): the other
    # settings share their cached pieces across ep
    ep = sizes.ep if training.recompute_per_op else 1
    switches = _ActivationSwitches.of(training)
    return _layer_activations(shape, parts, layers, t, cp, ep, etp, chunks, micro, switches)


def _counts(parts: Parts) -> dict[str, int]:
    """The parts' kinds that ``parts`` holds, with their counts."""
    counts = {"attention": parts.attention, "mlp": parts.mlp, "moe": parts.moe}
    counts["mamba"] = parts.mamba
    return {kind: count for kind, count in counts.items() if count}


@_cached
def _without_recompute(
    shape: Shape,
    parts: Parts,
    t: int,
    cp: int,
    etp: int,
    micro: int,
    sp: int,
    gemm_input_bytes: float | None,
    moe_capacity_factor: float | None,
    masks: bool = True,
    eager_mlp: bool = False,
) -> tuple[Fraction, Fraction]:
    """(the full activations of ``parts`` per micro batch, the heaviest layer's): what every
    recompute setting starts from."""
    each = _part_activations(
        shape, t, cp, etp, micro, gemm_input_bytes, moe_capacity_factor, masks, eager_mlp
    )
    counts = _counts(parts)
    fulls = {kind: each[kind].full(sp) for kind in counts}
    full = sum((count * fulls[kind] for kind, count in counts.items()), Fraction(0))
    if shape.pattern.hybrid is None:  # a layer is attention and an MLP or MoE part
        mlps = [fulls[k] for k in ("mlp", "moe") if k in counts]
        heaviest = each["attention"].full(sp) + max(mlps, default=Fraction(0))
    else:
        heaviest = max(fulls.values(), default=Fraction(0))
    return full, heaviest


@_cached
def _layer_activations(
    shape: Shape,
    parts: Parts,
    layers: int,
    t: int,
    cp: int,
    ep: int,
    etp: int,
    chunks: int,
    micro: int,
    training: _ActivationSwitches,
) -> tuple[Fraction, Fraction]:
    """:func:`_activations` of ``layers`` layers in ``chunks`` model chunks on a tp rank."""
    sp = t if training.sequence_parallel and t > 1 else 1
    gemm_in, capacity = training.gemm_input_bytes, training.moe_capacity_factor
    saved = (training.dropout_masks, training.eager_gated_mlp)
    full, heaviest = _without_recompute(
        shape, parts, t, cp, etp, micro, sp, gemm_in, capacity, *saved
    )
    # layers whose activations are offloaded keep nothing here (an even share of each kind)
    on_gpu = Fraction(max(layers - training.offload_layers, 0), layers) if layers else Fraction(0)
    if training.recompute == "full":
        act = 4 if shape.dtype == "fp32" else 2
        layer_input = act * Fraction(shape.seq, cp) * micro * shape.hidden / sp
        return _full_recompute(full, layer_input, heaviest, layers, chunks, training)
    if per_op.counts(shape, training.recompute, training.recompute_per_op):
        act = 4 if shape.dtype == "fp32" else 2
        forced = training.recompute_per_op_forced
        tokens = Fraction(shape.seq, cp) * micro
        kept = sum(
            (
                count * per_op.kept_per_token(shape, kind, t, sp, ep, forced)
                for kind, count in _counts(parts).items()
            ),
            Fraction(0),
        )
        # the backward pass recomputes one layer at a time: its activations meanwhile
        return act * tokens * kept * on_gpu, heaviest
    if training.recompute == "selective":
        modules = training.recompute_modules or ("core_attn",)
        each = _part_activations(shape, t, cp, etp, micro, gemm_in, capacity, *saved)
        selective = sum(
            (count * each[kind].selective(sp, modules) for kind, count in _counts(parts).items()),
            Fraction(0),
        )
        return selective * on_gpu, Fraction(0)
    return full * on_gpu, Fraction(0)


def _recompute_name(shape: Shape, training: TrainingSetup) -> str:
    """The recompute setting as the estimate counts it ("selective per op": mdc.plan.per_op)."""
    if per_op.counts(shape, training.recompute, training.recompute_per_op):
        return "selective per op"
    return training.recompute


def _full_recompute(
    full: Fraction,
    layer_input: Fraction,
    heaviest: Fraction,
    layers: int,
    chunks: int,
    training: _ActivationSwitches,
) -> tuple[Fraction, Fraction]:
    """Full recompute of ``layers`` layers in ``chunks`` model chunks (Megatron-Core):
    uniform keeps the input of each run of recompute_num_layers layers and holds one run's
    activations while it recomputes; block recomputes the first recompute_num_layers
    layers of each chunk and keeps the others' activations. (kept, working set)"""
    if not layers:
        return Fraction(0), Fraction(0)
    per_chunk = math.ceil(Fraction(layers, chunks))
    count = training.recompute_num_layers or 1
    if training.recompute_every:  # every n-th layer: its input only; the others all
        again = layers // training.recompute_every
        kept = again * layer_input + full * Fraction(layers - again, layers)
        return kept, heaviest if again else Fraction(0)
    if training.recompute_method == "block":
        again = min(count, per_chunk) * chunks
        rest = max(layers - again, 0)
        kept = min(again, layers) * layer_input + full * Fraction(rest, layers)
        return kept, heaviest
    runs = math.ceil(Fraction(per_chunk, count)) * chunks
    return runs * layer_input, min(count, per_chunk) * heaviest


def _dispatch_buffer(
    shape: Shape, parts: Parts, sizes: Sizes, micro: int, training: TrainingSetup
) -> Fraction:
    """The allgather dispatcher's gathered tokens of the etp * ep group (Megatron-Core's
    tp_ep group), held while one MoE layer runs (the alltoall and flex dispatchers keep only
    the routed copies)."""
    if not parts.moe or training.moe_dispatcher != "allgather" or sizes.etp * sizes.ep == 1:
        return Fraction(0)
    act = 4 if shape.dtype == "fp32" else 2
    # each of the etp * ep ranks' tokens (seq / cp * micro, over tp with sequence parallel)
    split = sizes.tp if training.sequence_parallel and sizes.tp > 1 else 1
    gathered = sizes.etp * sizes.ep
    return Fraction(act * shape.seq * micro * gathered * shape.hidden, sizes.cp * split)


def _stage_split(shape: Shape, sizes: Sizes, training: TrainingSetup) -> StageLayers | None:
    """The launcher's split of the layers over the stages (None: its framework refuses)."""
    model = Model(layers=shape.layers, mtp_layers=shape.mtp_layers or None)
    stages, _ = split_layers(training.pipeline, model, sizes.pp, sizes.vpp)
    return stages


Spans = tuple[tuple[int, int], ...]


def _spans(
    shape: Shape, sizes: Sizes, training: TrainingSetup, stages: StageLayers | None
) -> dict[int, Spans]:
    """The layer index ranges of each pipeline rank that can be the heaviest; a split the
    framework refuses falls back to ceil(layers / pp) on the first and the last rank."""
    return dict(_rank_spans(shape, stages, training.pipeline, sizes.pp, sizes.vpp))


@_cached
def _rank_spans(
    shape: Shape, stages: StageLayers | None, pipeline: PipelineSplit, pp: int, vpp: int | None
) -> tuple[tuple[int, Spans], ...]:
    """:func:`_spans` as (rank, spans) pairs."""
    if stages is None:
        model = Model(layers=shape.layers, mtp_layers=shape.mtp_layers or None)
        stages, _ = split_layers(pipeline, model, pp, vpp)
    if stages is None:
        even = _ceil(Fraction(shape.layers, pp))
        return tuple(
            {0: ((0, even),), pp - 1: ((max(shape.layers - even, 0), shape.layers),)}.items()
        )
    return tuple((rank, tuple(stages.layer_spans(rank))) for rank in stages.candidate_ranks())


@_cached
def _parts_of(shape: Shape, spans: Spans) -> Parts:
    each = [shape.pattern.parts(start, stop) for start, stop in spans]
    return Parts(
        attention=sum(p.attention for p in each),
        mlp=sum(p.mlp for p in each),
        moe=sum(p.moe for p in each),
        mamba=sum(p.mamba for p in each),
        csa=sum(p.csa for p in each),
        hca=sum(p.hca for p in each),
    )


def scheduled_micro_batches(
    batch: BatchPlan | None, training: TrainingSetup, pp: int
) -> tuple[int, int]:
    """(micro batch size, micro batches per step) as the pipeline schedule runs them: a
    launcher that splits each [batch] micro batch further for its pipeline (TorchTitan's
    pipeline_parallel_microbatch_size) runs, and keeps activations of, the smaller ones."""
    micro = batch.micro_batch_size if batch else 1
    microbatches = batch.grad_accum_steps if batch else 1
    split = training.pipeline_micro_batch
    if pp > 1 and split and micro % split == 0:
        return split, microbatches * (micro // split)
    return micro, microbatches


def quantized(shape: Shape, training: TrainingSetup) -> bool:
    """Whether the transformer layers' GEMMs run below 16 bits (fp8 or fp4)."""
    return shape.dtype == "fp8" or training.gemm_precision in ("fp8", "fp4")


def bf16_spans(shape: Shape, training: TrainingSetup, spans: Spans) -> Spans:
    """The parts of ``spans`` (layer index ranges) that the launcher keeps in bf16 when the
    rest is quantized: the model's first and last layers (TrainingSetup.bf16_layers)."""
    first, last = training.bf16_layers
    if not quantized(shape, training) or not (first or last):
        return ()
    ends = [(0, min(first, shape.layers)), (max(shape.layers - last, 0), shape.layers)]
    if ends[0][1] >= ends[1][0]:  # the two ends meet: every layer
        ends = [(0, shape.layers)]
    found = []
    for start, stop in spans:
        for low, high in ends:
            if max(start, low) < min(stop, high):
                found.append((max(start, low), min(stop, high)))
    return tuple(found)


def _in_flight(rank: int, pp: int, vpp: int | None, microbatches: int) -> tuple[int, Fraction]:
    """(micro batches whose activations pipeline rank ``rank`` holds at once, the share of
    its layers' activations each holds). 1F1B: pp - rank, at most the micro batches.
    Megatron's interleaved schedule warms up (pp - rank - 1) * 2 + (vpp - 1) * pp model
    chunks (at most microbatches * vpp) and holds one more: that many chunks of
    layers / vpp each."""
    held = min(pp - rank, microbatches)
    if not vpp:
        return held, Fraction(1)
    chunks = min((pp - rank - 1) * 2 + (vpp - 1) * pp + 1, microbatches * vpp)
    return held, Fraction(chunks, vpp * held)


# a cache key: compared and hashed, never printed (no generated repr: start-up time)
@attrs.frozen(cache_hash=True, repr=False)
class _StateBytes:
    """Bytes per parameter of the model state and the sharding that divides them: what the
    state reads from the launcher's TrainingSetup and the sizes (the key of its cache; made
    once per distinct value, :func:`_state_bytes`, and hashed once)."""

    #: the dtype's weights (the ends'), the layers' (NVFP4: a fraction), gradients, optimizer
    weights: int
    layer_weights: Fraction
    gradients: int
    optimizer: int
    #: the embeddings' and output layer's optimizer state (Muon: Adam's)
    end_optimizer: int
    #: the optimizer step's wider copy of the gradients (TrainingSetup.step_grad_bytes)
    step_gradients: int
    #: the share of the optimizer state kept on the GPU
    on_gpu: Fraction
    param_offload: bool
    zero: int
    shard: int
    expert_shard: int

    @classmethod
    def of(cls, shape: Shape, sizes: Sizes, training: TrainingSetup) -> _StateBytes:
        pp, t = sizes.pp, training
        stage = t.pp_zero_stage if pp > 1 and t.pp_zero_stage is not None else None
        # HSDP / distributed-optimizer instances: state sharded within each replica's ranks
        replicas = t.replicas if sizes.dp * sizes.cp % max(t.replicas, 1) == 0 else 1
        return _state_bytes(
            shape.dtype, t.weight_bytes, t.layer_weight_bytes, t.gradient_bytes(shape.dtype),
            t.step_grad_bytes, t.optimizer_bytes, t.end_optimizer_bytes, t.optimizer_offload,
            t.param_offload,
            max(0, min(3, t.zero_stage if stage is None else stage)),
            sizes.dp * sizes.cp // replicas, max(sizes.edp // replicas, 1),
        )  # fmt: skip


@_cached
def _state_bytes(
    dtype: str,
    weight_bytes: int | None,
    layer_weight_bytes: float | None,
    grad_bytes: int | None,
    step_grad_bytes: int,
    optimizer_bytes: int | None,
    end_optimizer_bytes: int | None,
    optimizer_offload: float,
    param_offload: bool,
    zero: int,
    shard: int,
    expert_shard: int,
) -> _StateBytes:
    """The :class:`_StateBytes` of these values, the [model] dtype's where unset (one object
    per distinct value)."""
    w = weight_bytes or WEIGHT_BYTES.get(dtype, 2)
    o = optimizer_bytes or (8 if WEIGHT_BYTES.get(dtype, 2) >= 4 else 12)
    g = grad_bytes or w
    return _StateBytes(
        weights=w,
        layer_weights=Fraction(layer_weight_bytes or w),
        gradients=g,
        optimizer=o,
        end_optimizer=end_optimizer_bytes or o,
        step_gradients=step_grad_bytes if g < step_grad_bytes else 0,
        on_gpu=1 - Fraction(optimizer_offload).limit_denominator(1000),
        param_offload=param_offload,
        zero=zero,
        shard=shard,
        expert_shard=expert_shard,
    )


def _role(rank: int, pp: int) -> str:
    if pp == 1:
        return "only"
    return "first" if rank == 0 else "last" if rank == pp - 1 else "middle"


@_cached
def _ends(shape: Shape, role: str, tp: int, ep: int, etp: int) -> tuple[int, _LayerParams]:
    """(the embedding and output parameters a stage holds, its multi-token prediction
    layers'): those sit on the last stage, which with pp > 1 also holds a copy of the input
    embedding for them."""
    embedding = _embedding(shape, tp)
    output = _split(shape.vocab, tp) * shape.hidden
    if role == "only":
        return embedding + (0 if shape.tied else output), _mtp(shape, tp, ep, etp)
    if role == "last":
        return output + (embedding if shape.mtp_layers else 0), _mtp(shape, tp, ep, etp)
    return (embedding if role == "first" else 0), _LayerParams(dense=0, expert=0)


@_cached
def _stage_state(
    shape: Shape, spans: Spans, wide: Spans, role: str, tp: int, ep: int, etp: int, b: _StateBytes
) -> tuple[int, int, int, int, int]:
    """(parameters on one GPU of a stage, before ZeRO-3 sharding; its weights, gradients and
    optimizer state in bytes; the optimizer step's copy of the gradients, which the
    activations' memory holds once they are freed). ``wide``: its layers kept in bf16
    (:func:`bf16_spans`)."""
    ends, extra_params = _ends(shape, role, tp, ep, etp)
    params = _parts(shape, _parts_of(shape, spans), tp, ep, etp) + extra_params
    dense, expert = params.dense + ends, params.expert

    def sharded(
        per_param: Fraction, stage: int, dense: int = dense, expert: int = expert
    ) -> Fraction:
        on = b.zero >= stage
        return per_param * (
            Fraction(dense, b.shard if on else 1) + Fraction(expert, b.expert_shard if on else 1)
        )

    w, layer_w, o = b.weights, b.layer_weights, b.optimizer
    # layers kept in bf16 under fp8 / fp4 training: 16-bit weights
    wide_params = _parts(shape, _parts_of(shape, wide), tp, ep, etp)
    # fp8/fp4 parameters: the layers' weights in 1 (1.125) bytes, the embeddings in the
    # dtype's
    wide_w = (w - layer_w) * sharded(Fraction(1), 3, wide_params.dense, wide_params.expert)
    weights = _ceil(sharded(layer_w, 3) + (w - layer_w) * sharded(Fraction(1), 3, ends, 0) + wide_w)
    gradients = _ceil(sharded(Fraction(b.gradients), 2))
    if b.param_offload:
        weights = gradients = 0
    # Muon: Adam's state for the embeddings and the output layer
    optimizer = _ceil(
        sharded(o * b.on_gpu, 1)
        + (b.end_optimizer - o) * b.on_gpu * sharded(Fraction(1), 1, ends, 0)
    )
    step_gradients = _ceil(sharded(b.step_gradients * b.on_gpu, 1))
    return dense + expert, weights, gradients, optimizer, step_gradients


def state_floor(
    shape: Shape, sizes: Sizes, training: TrainingSetup, stages: StageLayers | None = None
) -> int:
    """The largest model state (weights, gradients and optimizer, and the optimizer step's
    copy of the gradients) of the pipeline ranks that can be the heaviest: a lower bound on
    :func:`estimate`'s total under every batch and recompute setting, as that total is one
    of those ranks' state plus the larger of its activations and that copy (sizes, never
    negative). Cheap: the state is cached per stage."""
    b = _StateBytes.of(shape, sizes, training)
    return max(
        sum(_stage_state(shape, spans, bf16_spans(shape, training, spans),
                         _role(rank, sizes.pp), sizes.tp, sizes.ep, sizes.etp, b)[1:])
        for rank, spans in _spans(shape, sizes, training, stages).items()
    )  # fmt: skip


def stage_estimates(
    shape: Shape,
    sizes: Sizes,
    batch: BatchPlan | None,
    training: TrainingSetup,
    capacity: int | None = None,
    stages: StageLayers | None = None,
) -> list[MemoryEstimate]:
    """Per-GPU memory of each pipeline rank that can be the heaviest (one entry when pp = 1).

    ``stages``: the layers of every stage (default: the launcher's rule applied to
    ``shape``).
    """
    return list(_each_stage(shape, sizes, batch, training, capacity, stages))


def exceeds(
    shape: Shape,
    sizes: Sizes,
    batch: BatchPlan | None,
    training: TrainingSetup,
    capacity: int,
    stages: StageLayers | None = None,
) -> bool:
    """Whether :func:`estimate`'s total exceeds ``capacity``: whether one stage's does (the
    estimate is the largest), found without estimating the stages after that one."""
    return any(e.total > capacity for e in _each_stage(shape, sizes, batch, training, None, stages))


def _each_stage(
    shape: Shape,
    sizes: Sizes,
    batch: BatchPlan | None,
    training: TrainingSetup,
    capacity: int | None,
    stages: StageLayers | None,
) -> Iterator[MemoryEstimate]:
    """:func:`stage_estimates`, one stage at a time."""
    tp, pp, ep, etp = sizes.tp, sizes.pp, sizes.ep, sizes.etp
    micro, microbatches = scheduled_micro_batches(batch, training, pp)
    # a schedule holds only its own micro batches in flight
    runs = batch.grad_accum_steps if batch and training.schedule_per_accumulation else 1
    per_schedule = max(1, microbatches // runs)
    logits = (
        (training.logit_bytes or 4)
        * Fraction(shape.seq, sizes.cp)
        * micro
        * Fraction(shape.vocab, tp)
    )
    # multi-token prediction layers sit on the last stage, each with its own logits
    mtp_kept: Fraction | int = 0
    if shape.mtp_layers:
        mtp_kind = "moe" if shape.pattern.last_is_moe() else "mlp"
        mtp_parts = Parts(attention=1, **{mtp_kind: 1})
        mtp_kept = _activations(shape, mtp_parts, 1, sizes, micro, training)[0]
    heads = logits * (1 + shape.mtp_layers)
    b = _StateBytes.of(shape, sizes, training)
    for rank, spans in _spans(shape, sizes, training, stages).items():
        name = _role(rank, pp)
        # the logits and the MTP layers' activations sit on the last stage
        head, extra_kept = (
            (heads, mtp_kept * shape.mtp_layers) if name in ("only", "last") else (0, 0)
        )
        in_flight, factor = _in_flight(rank, pp, sizes.vpp, per_schedule)
        per_stage = sum(stop - start for start, stop in spans)
        parts = _parts_of(shape, spans)
        wide = bf16_spans(shape, training, spans)
        params, weights, gradients, optimizer, step_gradients = _stage_state(
            shape, spans, wide, name, tp, ep, etp, b
        )
        kept, recomputed = _activations(shape, parts, per_stage, sizes, micro, training)
        # layers kept in bf16 under fp8 / fp4 training: 16-bit GEMM inputs
        wide_parts, wide_layers = _parts_of(shape, wide), sum(stop - start for start, stop in wide)
        if wide_layers and training.recompute != "full":  # full keeps 16-bit inputs anyway
            act16 = attrs.evolve(training, gemm_input_bytes=4 if shape.dtype == "fp32" else 2)
            kept += _activations(shape, wide_parts, wide_layers, sizes, micro, act16)[0]
            kept -= _activations(shape, wide_parts, wide_layers, sizes, micro, training)[0]
        recomputing = recomputed + _dispatch_buffer(shape, parts, sizes, micro, training)
        activations = _ceil((kept + extra_kept) * in_flight * factor + recomputing + head)
        layer_w = b.layer_weights
        yield MemoryEstimate(
            params_total=parameter_count(shape),
            params_per_gpu=params,
            stage=name,
            stage_rank=rank,
            stage_layers=per_stage,
            dtype=shape.dtype,
            weight_bytes=int(layer_w) if layer_w.denominator == 1 else float(layer_w),
            grad_bytes=b.gradients,
            optimizer_bytes=b.optimizer,
            zero_stage=b.zero,
            shard=b.shard,
            expert_shard=b.expert_shard,
            micro_batch_size=micro,
            in_flight=in_flight,
            sequence_parallel=training.sequence_parallel and tp > 1,
            recompute=_recompute_name(shape, training),
            weights=weights,
            gradients=gradients,
            optimizer=optimizer,
            activations=activations,
            total=weights + gradients + optimizer + max(activations, step_gradients),
            capacity=capacity,
            step_gradients=step_gradients,
        )


def estimate(
    shape: Shape,
    sizes: Sizes,
    batch: BatchPlan | None,
    training: TrainingSetup,
    capacity: int | None = None,
    stages: StageLayers | None = None,
) -> MemoryEstimate:
    """Per-GPU memory of the heaviest pipeline stage."""
    found = stage_estimates(shape, sizes, batch, training, capacity, stages)
    return max(found, key=lambda e: e.total)  # the first on a tie


# ----------------------------------------------------------------------------- findings


def gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def _number(value: float) -> str:
    return f"{value:g}"


# only read, never compared or printed: no generated ==, hash or repr (start-up time)
@attrs.frozen(kw_only=True, eq=False, repr=False)
class Context:
    """What the hint's alternatives must respect besides the shape."""

    world: int
    nproc_per_node: int
    #: the written global batch size (None: the default micro * dp, one step)
    global_batch_size: int | None
    #: etp was not written, so it follows tp
    etp_follows_tp: bool
    #: the rank order (pp not last needs expert dp = dp)
    order: str


def _resized(
    sizes: Sizes,
    context: Context,
    shape: Shape,
    training: TrainingSetup,
    *,
    tp: int | None = None,
    pp: int | None = None,
    cp: int | None = None,
) -> Sizes | None:
    """The sizes with tp, pp or cp changed, or None if the plan would reject them."""
    tp, pp, cp = tp or sizes.tp, pp or sizes.pp, cp or sizes.cp
    world = context.world
    etp = tp if context.etp_follows_tp else sizes.etp
    if world % (tp * pp * cp) or world % (etp * sizes.ep * pp):
        return None
    dp, edp = world // (tp * pp * cp), world // (etp * sizes.ep * pp)
    if pp > 1 and not context.order.endswith("pp") and dp != edp:
        return None
    g = shape.groups
    if shape.heads % tp or (g % tp and tp % g):
        return None
    if cp > 1 and shape.seq % (2 * cp):
        return None
    resized = attrs.evolve(sizes, tp=tp, pp=pp, cp=cp, etp=etp, dp=dp, edp=edp)
    if pp != sizes.pp and _stage_split(shape, resized, training) is None:
        return None
    return resized


def _rebatched(
    batch: BatchPlan | None, dp: int, context: Context, micro: int | None = None
) -> tuple[bool, BatchPlan | None]:
    """(whether the global batch divides, the batch) for another dp or micro batch."""
    if batch is None:
        return True, None
    micro = micro or batch.micro_batch_size
    total = context.global_batch_size or micro * dp
    if total % (micro * dp):
        return False, None
    return True, BatchPlan(
        global_batch_size=total, micro_batch_size=micro, grad_accum_steps=total // (micro * dp)
    )


Variant = tuple[str, Sizes, BatchPlan | None, TrainingSetup]


def _levers(
    shape: Shape, sizes: Sizes, batch: BatchPlan | None, training: TrainingSetup, context: Context
) -> Iterator[list[Variant]]:
    """Each lever's candidate settings, least disruptive first."""
    for axis in ("tp", "pp", "cp"):
        current = getattr(sizes, axis)
        options: list[Variant] = []
        for value in divisors(context.world):
            if value <= current:
                continue
            resized = _resized(sizes, context, shape, training, **{axis: value})
            if resized is None:
                continue
            divides, rebatched = _rebatched(batch, resized.dp, context)
            if not divides:
                continue
            spans = " (spans nodes)" if axis == "tp" and value > context.nproc_per_node else ""
            options.append((f"{axis} {value}{spans}", resized, rebatched, training))
        yield options
    keys = dict(training.levers)
    if max(sizes.dp * sizes.cp, sizes.edp) > 1:
        yield [
            (keys[f"zero {stage}"], sizes, batch, attrs.evolve(training, zero_stage=stage))
            for stage in range(training.zero_stage + 1, 4)
            if f"zero {stage}" in keys
        ]
    if "optimizer offload" in keys and training.optimizer_offload < 1:
        yield [
            (keys["optimizer offload"], sizes, batch, attrs.evolve(training, optimizer_offload=1.0))
        ]
    if sizes.tp > 1 and not training.sequence_parallel and "sequence parallel" in keys:
        yield [
            (
                keys["sequence parallel"],
                sizes,
                batch,
                attrs.evolve(training, sequence_parallel=True),
            )
        ]
    modes = ("none", "selective", "full")
    after = modes.index(training.recompute) + 1 if training.recompute in modes else 1
    partial = training.recompute_every is not None or training.recompute_method == "block"
    if training.recompute == "full" and partial:  # every layer is a change too
        after -= 1
    yield [
        (
            keys[f"recompute {mode}"],
            sizes,
            batch,
            attrs.evolve(
                training,
                recompute=mode,
                recompute_method=None,
                recompute_num_layers=None,
                recompute_every=None,
                recompute_modules=None,
            ),
        )
        for mode in modes[after:]
        if f"recompute {mode}" in keys
    ]
    if batch is not None and batch.micro_batch_size > 1:
        options = []
        for micro in reversed(divisors(batch.micro_batch_size)[:-1]):
            divides, rebatched = _rebatched(batch, sizes.dp, context, micro)
            if divides:
                options.append((f"micro_batch_size {micro}", sizes, rebatched, training))
        yield options


def _hint(
    shape: Shape,
    sizes: Sizes,
    batch: BatchPlan | None,
    training: TrainingSetup,
    context: Context,
    capacity: int,
    fits: str = "fits",
) -> str:
    """The levers that help most, each evaluated alone (the first setting that fits)."""
    chosen: list[tuple[int, str]] = []
    now = estimate(shape, sizes, batch, training).total
    for options in _levers(shape, sizes, batch, training, context):
        totals = [
            (total, label)
            for total, label in (
                (estimate(shape, s, b, t).total, label) for label, s, b, t in options
            )
            if total < now
        ]
        if not totals:
            continue
        fitting = [item for item in totals if item[0] <= capacity]
        chosen.append(fitting[0] if fitting else min(totals))
    chosen.sort()
    if not chosen:
        return "use accelerators with more memory, or a smaller model"
    shown = ", ".join(
        f"{label} gives {gib(total)}{f' ({fits})' if total <= capacity else ''}"
        for total, label in chosen[:MAX_LEVERS]
    )
    text = f"estimated per-GPU total with one change each: {shown}"
    if chosen[0][0] > capacity:
        text += "; none is enough alone, combine several"
    return text


def plan_memory(
    model: ModelTable | None,
    sizes: Sizes,
    batch: BatchPlan | None,
    training: TrainingSetup,
    capacity_gib: float | None,
    context: Context,
    stages: StageLayers | None = None,
) -> tuple[MemoryEstimate | None, list[Finding]]:
    """The estimate (None without a complete [model]) and the fit findings (MDC260-262)."""
    pointer = "/distributed/accelerator_memory_gib"
    capacity = int(capacity_gib * GIB) if capacity_gib is not None else None
    if model is None:
        if capacity is None:
            return None, []
        return None, [
            Finding(
                code="MDC261",
                severity=Severity.WARNING,
                pointer=pointer,
                message=f"accelerator_memory_gib = {_number(capacity_gib or 0)} is set but there "
                "is no [model] table, so no memory check is made",
                hint=f"add a [model] table with {', '.join(REQUIRED_KEYS)}",
            )
        ]
    shape = resolve_shape(model)
    if shape is None:
        if capacity is None:
            return None, []
        missing = missing_keys(model)
        return None, [
            Finding(
                code="MDC261",
                severity=Severity.WARNING,
                pointer="/model",
                message=f"accelerator_memory_gib = {_number(capacity_gib or 0)} is set but [model] "
                f"lacks {', '.join(missing)}, so no memory estimate or check is made",
                hint=f"add {', '.join(missing)} to [model]",
            )
        ]
    found = estimate(shape, sizes, batch, training, capacity, stages)
    if capacity is None:
        return found, []
    peak = (
        f"activations {gib(found.activations)}"
        if found.activations >= found.step_gradients
        else f"the optimizer step's fp32 gradients {gib(found.step_gradients)} (more than "
        f"the activations, {gib(found.activations)})"
    )
    parts = (
        f"weights {gib(found.weights)} + gradients {gib(found.gradients)} + optimizer "
        f"{gib(found.optimizer)} + {peak}"
    )
    where = (
        "per GPU"
        if found.stage == "only"
        else f"per GPU on pipeline stage {found.stage_rank} ({found.stage}, "
        f"{found.stage_layers} layers)"
    )
    limit = f"accelerator_memory_gib = {_number(capacity_gib or 0)}"
    # Only the model state (weights, gradients, optimizer) refuses: the sharding that sizes it
    # is the spec's. Activations depend on kernels and fusions no spec states, so a total
    # over the limit is a warning: an estimate must not block a layout that really runs.
    state = found.weights + found.gradients + found.optimizer
    if state > capacity:
        return found, [
            Finding(
                code="MDC260",
                pointer=pointer,
                message=f"the model state alone needs {gib(state)} {where} (weights "
                f"{gib(found.weights)} + gradients {gib(found.gradients)} + optimizer "
                f"{gib(found.optimizer)}), more than {limit} (with activations, an "
                f"estimated {gib(found.total)})",
                hint=_hint(shape, sizes, batch, training, context, capacity),
            )
        ]
    if found.total > capacity * HEADROOM:
        share = found.total * 100 // capacity
        return found, [
            Finding(
                code="MDC262",
                severity=Severity.WARNING,
                pointer=pointer,
                message=f"the estimated {gib(found.total)} {where} ({parts}) is {share}% of "
                f"{limit}; "
                + (
                    "the activations are an estimate (kernels and fusions vary), so this is "
                    "not refused, but it may not fit"
                    if found.total > capacity
                    else "the CUDA/ROCm context, communication buffers and fragmentation are "
                    "not counted and may not fit"
                ),
                hint=_hint(
                    shape,
                    sizes,
                    batch,
                    training,
                    context,
                    int(capacity * HEADROOM),
                    f"under {HEADROOM * 100}%",
                ),
            )
        ]
    return found, []
