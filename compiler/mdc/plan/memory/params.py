"""Parameter counts: per layer part (attention, MLP, MoE, Mamba, DeepSeek-V4's compressors
and hyper-connections), the embeddings, multi-token prediction and the model's total."""

from __future__ import annotations

from fractions import Fraction

from mdc.plan.architecture import (
    CSA_RATIO,
    HCA_RATIO,
    Dsv4,
    Latent,
    Parts,
)
from mdc.plan.memory.records import LayerParams, Shape, cached, ceil_int


def split_width(width: int, tp: int) -> int:
    return ceil_int(Fraction(width, tp))


def _dsv4_attention(shape: Shape, dsv4: Dsv4, latent: Latent, tp: int) -> int:
    """DeepSeek-V4's hybrid attention without its compressed branch (Megatron-Core's
    DSv4HybridSelfAttention): the compressed query and its norm, the up projection to
    heads of v_head width, one shared key/value head and its norm, the grouped output
    projection (o_groups x o_lora of heads * v_head / o_groups each), the projection to
    hidden and a sink per head."""
    h, b, v = shape.hidden, int(shape.bias), latent.v_head
    query = h * latent.q_lora + latent.q_lora + latent.q_lora * split_width(shape.heads * v, tp)
    kv = h * split_width(v, tp) + v
    grouped = split_width(dsv4.o_groups, tp) * dsv4.o_lora * (shape.heads * v // dsv4.o_groups)
    projection = split_width(dsv4.o_groups * dsv4.o_lora, tp) * h + b * h
    return shape.norm + query + kv + grouped + projection + split_width(shape.heads, tp)


def _compressor(shape: Shape, width: int, ratio: int, overlap: bool) -> int:
    """A compressor of ``ratio`` tokens into one ``width`` entry (Megatron-Core's csa
    Compressor): KV and gate projections of (2 if overlapping) x width, a learned position
    bias per window slot, an RMSNorm."""
    out = (2 if overlap else 1) * width
    return 2 * shape.hidden * out + ratio * out + width


def compressed_params(shape: Shape, parts: Parts) -> int:
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


def hyper_head_params(shape: Shape) -> int:
    """The final collapse of the n streams (the main model's, and each MTP layer's)."""
    n = shape.streams
    return n * n * shape.hidden + n + 1 if n else 0


def _attention(shape: Shape, tp: int) -> int:
    """The input norm and the attention block of one layer on one tp rank."""
    h, b = shape.hidden, int(shape.bias)
    latent = shape.latent
    if shape.dsv4 is not None and latent is not None:
        return _dsv4_attention(shape, shape.dsv4, latent, tp)
    sinks = split_width(shape.heads, tp) if shape.sinks else 0
    if latent is not None:
        # as Transformer Engine's spec builds it: the down projections (and their norms)
        # are replicated over tp, the up projections split by heads
        q_head = latent.qk_head + latent.rope_head
        q_up = split_width(shape.heads * q_head, tp)
        query = h * latent.q_lora + latent.q_lora * q_up if latent.q_lora else h * q_up
        kv = h * (latent.kv_lora + latent.rope_head) + latent.kv_lora * split_width(
            shape.heads * (latent.qk_head + latent.v_head), tp
        )
        norms = shape.norm_of(latent.q_lora) + shape.norm_of(latent.kv_lora)
        projection = split_width(shape.heads * latent.v_head, tp) * h + b * h
        return shape.norm + query + kv + projection + sinks + (norms if shape.qk_norm else 0)
    d = shape.kv_channels
    q = split_width(shape.heads * d, tp)
    # Megatron-Core splits the fused QKV matrix over tp as a whole, even with fewer
    # query groups than tp (each rank then gathers the one group it needs)
    qkv = split_width((shape.heads + 2 * shape.groups) * d, tp)
    qkv_bias = qkv if shape.bias or shape.qkv_bias else 0
    qk_norms = 2 * shape.norm_of(d) if shape.qk_norm else 0
    return shape.norm + h * qkv + qkv_bias + q * h + b * h + qk_norms + sinks


def _mlp(shape: Shape, width: int, split: int, bias: bool, outer: int = 0) -> int:
    """An MLP of ``width`` split ``split`` ways (gated: fc1 holds gate and up), from and
    to ``outer`` (default the hidden size)."""
    h, b, f = outer or shape.hidden, int(bias), split_width(width, split)
    gates = 2 if shape.gated else 1
    return h * gates * f + b * gates * f + f * h + b * h


def _moe(shape: Shape, tp: int, ep: int, etp: int) -> LayerParams:
    """The pre-MLP norm, router, shared expert and this rank's routed experts."""
    router = shape.experts * shape.hidden + (shape.experts if shape.bias else 0)
    shared = _mlp(shape, shape.shared_ffn, tp, False) if shape.shared_ffn else 0
    local = split_width(shape.experts, ep)
    # MoE latent projections (--moe-latent-size): the routed experts work in the latent
    # width, between a replicated down (h -> latent) and up (latent -> h) projection
    h, latent, b = shape.hidden, shape.moe_latent, int(shape.bias)
    projections = 2 * h * latent + b * (latent + h) if latent else 0
    return LayerParams(
        dense=shape.norm + router + shared + projections,
        expert=local * _mlp(shape, shape.moe_ffn, etp, shape.bias, latent),
    )


def _mamba(shape: Shape, tp: int) -> int:
    """A Mamba-2 layer as Megatron-Core's MambaMixer builds it (heads split over tp)."""
    m, h = shape.mamba, shape.hidden
    if m is None:
        return 0
    inner, heads, bc = (
        split_width(m.inner, tp),
        split_width(m.heads, tp),
        split_width(2 * m.groups * m.state, tp),
    )
    in_proj = h * (2 * inner + bc + heads)  # z, x, B, C and dt
    conv = (inner + bc) * (m.conv + 1)  # a depthwise kernel and a bias per channel
    # dt_bias, A_log and D per head, the gated norm over the inner width, out_proj
    return shape.norm + in_proj + conv + 3 * heads + inner + inner * h


@cached
def part_params(shape: Shape, parts: Parts, tp: int, ep: int, etp: int) -> LayerParams:
    dense = (
        parts.attention * _attention(shape, tp)
        + compressed_params(shape, parts)
        + parts.mlp * (shape.norm + _mlp(shape, shape.ffn, tp, shape.bias))
        + parts.mamba * _mamba(shape, tp)
    )
    blocks = parts.attention + parts.mlp + parts.moe + parts.mamba
    dense += blocks * _hyper_connection(shape)
    return LayerParams(dense=dense, expert=0) + _moe(shape, tp, ep, etp) * parts.moe


def layer_params(shape: Shape, start: int, stop: int, tp: int, ep: int, etp: int) -> LayerParams:
    """Parameters of layers ``start`` to ``stop - 1`` on one GPU."""
    return part_params(shape, shape.pattern.parts(start, stop), tp, ep, etp)


@cached
def mtp_params(shape: Shape, tp: int, ep: int, etp: int) -> LayerParams:
    """The multi-token prediction layers: each a copy of the last layer's kind (with its
    own compress ratio), two input norms, the 2h -> h projection (split over tp), its own
    final norm and, with hyper-connections, its own stream head."""
    moe, h = shape.pattern.last_is_moe(), shape.hidden
    layer = part_params(shape, Parts(attention=1, mlp=int(not moe), moe=int(moe)), tp, ep, etp)
    extra = 3 * shape.norm + 2 * h * split_width(h, tp) + hyper_head_params(shape)
    compressed = compressed_params(shape, shape.pattern.mtp_compressed(shape.mtp_layers))
    return (layer + LayerParams(dense=extra, expert=0)) * shape.mtp_layers + LayerParams(
        dense=compressed, expert=0
    )


def embedding_params(shape: Shape, tp: int) -> int:
    return split_width(shape.vocab, tp) * shape.hidden + (
        shape.seq * shape.hidden if shape.learned_positions else 0
    )


@cached
def parameter_count(shape: Shape) -> int:
    """Parameters of the whole model (tied embeddings counted once; no final norm)."""
    layers = layer_params(shape, 0, shape.layers, 1, 1, 1) + mtp_params(shape, 1, 1, 1)
    output = 0 if shape.tied else shape.vocab * shape.hidden
    return (
        layers.dense
        + layers.expert
        + embedding_params(shape, 1)
        + output
        + hyper_head_params(shape)
    )


def active_parameter_count(shape: Shape) -> int:
    """Parameters one token passes through: each MoE layer's top-k experts, not all
    (the multi-token prediction layers, a training objective, are left out)."""
    layers = layer_params(shape, 0, shape.layers, 1, 1, 1)
    routed = min(shape.topk, shape.experts)
    expert = layers.expert * routed // shape.experts if shape.experts else 0
    output = 0 if shape.tied else shape.vocab * shape.hidden
    return layers.dense + expert + embedding_params(shape, 1) + output + hyper_head_params(shape)
