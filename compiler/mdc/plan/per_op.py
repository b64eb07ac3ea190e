"""Selective recompute by operator (TorchTitan's ``selective_ac_option = "op"``).

Each transformer block runs under one checkpoint whose policy keeps the outputs of the
matmuls (``aten.mm``) but every second one, counted in the order the block runs them, the
attention kernel's output and the outputs of the reduce-scatters (tensor parallelism with
its sequence split) and all-to-alls (expert parallelism); the checkpoint keeps the block's
input. Everything else is recomputed in the backward pass: the norms, the rotary
embedding, the activation function, the MoE router's gate (TorchTitan's
``per_op_sac_force_recompute_mm_shapes_by_fqns`` default, not counted) and the routed
experts' grouped GEMMs (``torch._grouped_mm`` is not on the list).

A Llama block (separate wq, wk, wv, wo; a gated MLP run as w1, w3, w2) keeps wq's, wv's,
w1's and w2's outputs and recomputes wk, wo and w3. Shapes TorchTitan has no model of
(Mamba layers, DeepSeek-V4's attention, hyper-connections) are not described here: the
estimate counts them as selective recompute of the attention core.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mdc.plan.architecture import Parts
    from mdc.plan.memory import Shape

#: how tensor parallelism splits a matmul: "column" its output, "row" its input (the
#: output is whole-width partial sums until reduced), "none" not at all
Matmul = tuple[int, int, str]


def describes(shape: Shape) -> bool:
    """Whether the block's matmuls are known here (see the module docstring)."""
    return shape.mamba is None and shape.dsv4 is None and not shape.streams


def _attention(shape: Shape) -> list[Matmul]:
    """(input width, output width, split) of the attention's matmuls, in running order."""
    h, a = shape.hidden, shape.heads
    latent = shape.latent
    if latent is None:
        q, kv = a * shape.kv_channels, shape.groups * shape.kv_channels
        return [(h, q, "column"), (h, kv, "column"), (h, kv, "column"), (q, h, "row")]
    q_head = latent.qk_head + latent.rope_head
    if latent.q_lora:
        query = [(h, latent.q_lora, "none"), (latent.q_lora, a * q_head, "column")]
    else:
        query = [(h, a * q_head, "column")]
    keys_values = [
        (h, latent.kv_lora + latent.rope_head, "none"),
        (latent.kv_lora, a * (latent.qk_head + latent.v_head), "column"),
    ]
    return [*query, *keys_values, (a * latent.v_head, h, "row")]


def _mlp(shape: Shape, width: int) -> list[Matmul]:
    """An MLP's matmuls: w1 (and w3 when gated), then w2."""
    h = shape.hidden
    if not width:
        return []
    ups = [(h, width, "column")] * (2 if shape.gated else 1)
    return [*ups, (width, h, "row")]


def _block(shape: Shape, kind: str) -> tuple[list[Matmul], list[Matmul]]:
    """(the attention's matmuls, the MLP's) of a layer whose MLP part is ``kind``; an MoE
    part counts only its shared expert's (the router's gate is not counted)."""
    width = shape.ffn if kind == "mlp" else shape.shared_ffn
    return _attention(shape), _mlp(shape, width)


def _kept_outputs(matmuls: list[Matmul], before: int, tp: int) -> Fraction:
    """Elements per token of the kept matmul outputs (the odd ones of the block's count)."""
    kept = Fraction(0)
    for index, (_, out, split) in enumerate(matmuls, start=before + 1):
        if index % 2:
            kept += Fraction(out, tp) if split == "column" else out
    return kept


def kept_per_token(shape: Shape, kind: str, tp: int, sp: int, ep: int) -> Fraction:
    """Elements each token keeps of one ``kind`` part ("attention", "mlp" or "moe") on a
    tp rank (``sp``: the sequence split of the replicated tensors)."""
    attention, mlp = _block(shape, kind)
    reduced = Fraction(shape.hidden, sp) if sp > 1 else 0  # a reduce-scatter's output
    if kind == "attention":
        v_head = shape.latent.v_head if shape.latent else shape.kv_channels
        kernel_output = Fraction(shape.heads * v_head, tp)
        block_input = Fraction(shape.hidden, sp)
        return block_input + _kept_outputs(attention, 0, tp) + kernel_output + reduced
    kept = _kept_outputs(mlp, len(attention), tp) + (reduced if mlp else 0)
    if kind == "moe" and ep > 1:  # the dispatch and combine all-to-alls' outputs
        kept += 2 * shape.topk * (shape.moe_latent or shape.hidden)
    return kept


def recomputed_gemm_share(shape: Shape, parts: Parts) -> float:
    """The share of the layers' dense GEMM FLOPs (attention projections, MLPs, shared
    experts) the backward pass runs again."""
    total = again = 0
    for kind, count in (("mlp", parts.mlp), ("moe", parts.moe)):
        attention, mlp = _block(shape, kind)
        for index, (k, n, _) in enumerate([*attention, *mlp], start=1):
            total += count * k * n
            again += count * k * n * (index % 2 == 0)
    return again / total if total else 0.0
