"""Model FLOPs per token: the count the published TFLOP/s tables divide by.

Two conventions, both 3 x the forward pass (forward, weight gradient, data gradient) and
2 FLOPs per multiply-add:

* ``causal`` (the default): NVIDIA Megatron-Bridge's ``num_floating_point_operations``
  (``src/megatron/bridge/training/utils/flop_utils.py``), used for the TFLOP/s of its
  performance tables and recipes. Per token and layer::

      6 * (h*(q + 2*kv) + q*h)          QKV and output projections (q = heads*d, kv = groups*d)
    + 6 * q * s                         attention scores and values, causal (half of s^2)
    + 6 * h * f * (3 if gated else 2)   MLP; MoE: topk * moe_ffn instead of f (+ shared experts)

  plus the logits 6 * h * V per token.
* ``full``: Narayanan et al. 2021 (Megatron-LM, SC'21), appendix, used for its Table 1:
  ``72*B*s*l*h^2*(1 + s/(6h) + V/(12*h*l))`` for a GPT with 4h MLPs. The same terms with
  the attention counted over all s keys (``12 * q * s``).

Narayanan's formula is the ``full`` count of the classic GPT shape exactly.
"""

from __future__ import annotations

import attrs

from mdc.plan.memory import Shape


@attrs.frozen(kw_only=True)
class TokenFlops:
    """Training FLOPs per token (forward and backward), split by where they run."""

    #: GEMMs of the transformer layers that are not experts (projections, dense MLPs)
    dense_gemm: float
    #: expert GEMMs (routed and shared), all layers
    expert_gemm: float
    #: attention scores and values (FlashAttention's kernels), all layers
    attention: float
    #: the output layer
    logits: float

    @property
    def total(self) -> float:
        return self.dense_gemm + self.expert_gemm + self.attention + self.logits

    @property
    def per_layer(self) -> float:
        """Transformer-layer FLOPs of one token in one layer (without the logits)."""
        return (self.dense_gemm + self.expert_gemm + self.attention) / self.layers

    layers: int = 1


def token_flops(shape: Shape, *, causal: bool = True) -> TokenFlops:
    """Training FLOPs per token of ``shape`` under the chosen attention convention."""
    h, d, s, layers = shape.hidden, shape.kv_channels, shape.seq, shape.layers
    q, kv = shape.heads * d, shape.groups * d
    width = 3 if shape.gated else 2
    projections = 6 * (h * (q + 2 * kv) + q * h)
    attention = 6 * q * s * (1 if causal else 2)
    if shape.experts:
        dense_mlp, expert_mlp = 0, 6 * h * shape.moe_ffn * width * shape.topk
    else:
        dense_mlp, expert_mlp = 6 * h * shape.ffn * width, 0
    return TokenFlops(
        dense_gemm=float(layers * (projections + dense_mlp)),
        expert_gemm=float(layers * expert_mlp),
        attention=float(layers * attention),
        logits=float(6 * h * shape.vocab),
        layers=layers,
    )
