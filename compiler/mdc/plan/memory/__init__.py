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

The package's modules: records (the shape, the estimate and the constants), params
(parameter counts), activations, spans (which layers each pipeline rank holds), state
(weights, gradients and optimizer state), estimate (the per-stage sum) and check (the
compile's finding and its hint). Per-operation activations are in :mod:`mdc.plan.per_op`,
the serving estimate in :mod:`mdc.plan.serving_memory`.
"""

from __future__ import annotations

from mdc.plan.memory.check import Context, plan_memory
from mdc.plan.memory.estimate import estimate, exceeds, stage_estimates
from mdc.plan.memory.params import active_parameter_count, parameter_count
from mdc.plan.memory.records import (
    GIB,
    HEADROOM,
    REQUIRED_KEYS,
    MemoryEstimate,
    Shape,
    gib,
    missing_keys,
    resolve_shape,
)
from mdc.plan.memory.spans import quantized, scheduled_micro_batches
from mdc.plan.memory.state import state_floor

__all__ = [
    "GIB",
    "HEADROOM",
    "REQUIRED_KEYS",
    "Context",
    "MemoryEstimate",
    "Shape",
    "active_parameter_count",
    "estimate",
    "exceeds",
    "gib",
    "missing_keys",
    "parameter_count",
    "plan_memory",
    "quantized",
    "resolve_shape",
    "scheduled_micro_batches",
    "stage_estimates",
    "state_floor",
]
