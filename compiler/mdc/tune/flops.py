"""Model FLOPs per token: the count the published TFLOP/s tables divide by.

All counts are 3 x the forward pass (forward, weight gradient, data gradient) at 2 FLOPs
per multiply-add, per token:

* ``causal=True`` (the default) is NVIDIA Megatron-Bridge's ``num_floating_point_operations``
  (``src/megatron/bridge/training/utils/flop_utils.py``), which its performance tables and
  recipes report TFLOP/s with: attention scores and values over half the sequence (causal),
  GQA or multi-latent attention, dense / MoE / shared-expert MLPs after ``moe_layer_freq``,
  multi-token-prediction layers, sliding windows, hybrid Mamba stacks, latent MoE, and the logits
  over the vocabulary padded to a multiple of 128.
* ``causal=False`` is Narayanan et al. 2021 (Megatron-LM, SC'21, appendix), the count of its
  Table 1: ``72*B*s*l*h^2*(1 + s/(6h) + V/(12*h*l))`` for a GPT: the same terms with the
  attention over all s keys and the vocabulary as it is. With ``recompute=True`` the layers
  are counted 4 times instead of 3 (``96*B*s*l*h^2*(1 + s/(6h) + V/(16*h*l))``, section
  5.1), as that table's TFLOP/s include the recomputed forward pass.
"""

from __future__ import annotations

import attrs

from mdc.plan.memory import Shape

#: Megatron-LM's --make-vocab-size-divisible-by default
VOCAB_MULTIPLE = 128


@attrs.frozen(kw_only=True)
class TokenFlops:
    """Training FLOPs per token, split by the kernels that run them."""

    #: GEMMs outside the experts: attention projections, dense MLPs, Mamba projections
    dense_gemm: float
    #: expert GEMMs: routed (top-k) and shared experts
    expert_gemm: float
    #: attention scores and values (the FlashAttention kernels) and Mamba's scan
    attention: float
    #: the output layer (and the multi-token-prediction heads)
    logits: float
    #: transformer layers the first three are summed over
    layers: int
    #: of ``attention``, Mamba's scan (Bridge's count; the model times the SSD kernels apart)
    scan: float = 0.0

    @property
    def total(self) -> float:
        return self.dense_gemm + self.expert_gemm + self.attention + self.logits


def _padded(vocab: int) -> int:
    return -(-vocab // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def _swa_context(shape: Shape, window: tuple[int, int], causal: bool) -> float:
    """Keys a query sees on average under a sliding window (Bridge's exact causal mean)."""
    s, w = shape.seq, window[0] + window[1] + 1
    if w >= s:
        return s / 2 if causal else s
    return w - w * (w - 1) / (2 * s)


def _attention(shape: Shape, causal: bool, window: tuple[int, int] | None) -> tuple[float, float]:
    """(projection, core) forward FLOPs of one attention layer for one token."""
    h, s, a = shape.hidden, shape.seq, shape.heads
    keys = s / 2 if causal else s
    if window is not None:
        keys = _swa_context(shape, window, causal)
    latent = shape.latent
    if latent is not None:
        q_head = latent.qk_head + latent.rope_head
        query = latent.q_lora * (h + a * q_head + 1) if latent.q_lora else h * a * q_head
        kv = latent.kv_lora * (h + a * (latent.qk_head + latent.v_head) + 1) + h * latent.rope_head
        projection = query + kv + a * latent.v_head * h
        core = keys * a * q_head + keys * a * latent.v_head
        return 2.0 * projection, 2.0 * core
    q, kv = a * shape.kv_channels, shape.groups * shape.kv_channels
    return 2.0 * (h * (q + 2 * kv) + q * h), 2.0 * 2 * q * keys


def _mamba(shape: Shape) -> tuple[float, float]:
    """(projections, scan) forward FLOPs of one Mamba-2 layer for one token (Bridge's
    ``mamba_layer_flops``): the in and out projections are GEMMs, the SSD scan is not."""
    m, h = shape.mamba, shape.hidden
    assert m is not None
    inner = 2 * h  # Bridge counts d_in = 2h
    projections = 2 * h * (2 * inner + 2 * m.groups * m.state + m.heads) + 2 * inner * h
    return float(projections), float(7 * inner * m.state)


def layer_weights(shape: Shape) -> tuple[float, float]:
    """(one attention layer's projection weights, one Mamba layer's): a GEMM does one
    multiply-add per weight and token, so its forward FLOPs per token over 2."""
    mamba = _mamba(shape)[0] / 2 if shape.mamba is not None else 0.0
    return _attention(shape, True, None)[0] / 2, mamba


def token_flops(
    shape: Shape,
    *,
    causal: bool = True,
    recompute: bool = False,
    window: tuple[int, int] | None = None,
    window_skip: int | tuple[int, ...] | None = None,
) -> TokenFlops:
    """Training FLOPs per token of ``shape`` under the chosen convention (module docstring)."""
    h, layers = shape.hidden, shape.layers
    width = 3 if shape.gated else 2
    parts = shape.pattern.parts(0, layers)
    vocab = _padded(shape.vocab) if causal else shape.vocab
    mtp = shape.mtp_layers
    projection, core = _attention(shape, causal, None)
    attention_layers = parts.attention
    dense_mlps, moe_mlps = parts.mlp, parts.moe
    hybrid = shape.pattern.hybrid is not None
    if mtp:
        # Bridge: each MTP layer is one more transformer layer of the last layer's kind; a
        # hybrid stack's MTP depth is its MTP pattern (an attention and the last layer's MLP,
        # "*E" for Nemotron 3), which Bridge counts with the main pattern's layers
        attention_layers += mtp
        if shape.pattern.last_is_moe():
            moe_mlps += mtp
        else:
            dense_mlps += mtp
    core_total = attention_layers * core
    scan_total = 0.0
    if window is not None and not hybrid:
        swa_layers = attention_layers
        if isinstance(window_skip, int) and window_skip > 0:
            swa_layers = sum(1 for i in range(attention_layers) if (i + 1) % window_skip)
        elif isinstance(window_skip, tuple):
            swa_layers = sum(window_skip[:attention_layers])
        _, swa_core = _attention(shape, causal, window)
        core_total = (attention_layers - swa_layers) * core + swa_layers * swa_core
    dense = attention_layers * projection + dense_mlps * 2 * h * shape.ffn * width
    # latent MoE (--moe-latent-size): the routed experts run in the latent width, between a
    # down (h -> latent) and an up (latent -> h) projection of every token; the shared
    # expert stays at h (Bridge's moe_layer_flops)
    routed_width = shape.moe_latent or h
    expert = (
        moe_mlps * 2 * (routed_width * shape.moe_ffn * shape.topk + h * shape.shared_ffn) * width
    )
    dense += moe_mlps * 2 * 2 * h * shape.moe_latent
    if parts.mamba:
        mamba_projections, scan = _mamba(shape)
        dense += parts.mamba * mamba_projections
        scan_total = parts.mamba * scan
        core_total += scan_total
    if not hybrid and mtp:
        dense += mtp * 2 * (3 * h + 2 * h * h)  # MTP's norms and its 2h -> h projection
    logits = 2.0 * h * vocab * (1 + mtp)
    passes = 4 if recompute else 3
    return TokenFlops(
        dense_gemm=passes * dense,
        expert_gemm=passes * expert,
        attention=passes * core_total,
        logits=3 * logits,
        layers=layers,
        scan=passes * scan_total,
    )
