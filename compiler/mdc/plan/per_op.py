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

from collections.abc import Callable
from fractions import Fraction
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mdc.plan.architecture import Parts
    from mdc.plan.memory.records import Shape

#: a matmul of a block: (its module path in TorchTitan's block, input width, output width,
#: how tensor parallelism splits it: "column" its output, "row" its input (the output is
#: whole-width partial sums until reduced), "none" not at all)
Matmul = tuple[str, int, int, str]


def describes(shape: Shape) -> bool:
    """Whether the block's matmuls are known here (see the module docstring)."""
    return shape.mamba is None and shape.dsv4 is None and not shape.streams


def counts(shape: Shape, recompute: str, by_op: bool) -> bool:
    """Whether the estimates count this policy: selective recompute by operator (``by_op``)
    of a shape described here; the rest is selective recompute by module."""
    return recompute == "selective" and by_op and describes(shape)


def _attention(shape: Shape) -> list[Matmul]:
    """The attention's matmuls, in running order."""
    h, a = shape.hidden, shape.heads
    latent = shape.latent
    if latent is None:
        q, kv = a * shape.kv_channels, shape.groups * shape.kv_channels
        return [
            ("attention.wq", h, q, "column"),
            ("attention.wk", h, kv, "column"),
            ("attention.wv", h, kv, "column"),
            ("attention.wo", q, h, "row"),
        ]
    q_head = latent.qk_head + latent.rope_head
    if latent.q_lora:
        query = [
            ("attention.wq_a", h, latent.q_lora, "none"),
            ("attention.wq_b", latent.q_lora, a * q_head, "column"),
        ]
    else:
        query = [("attention.wq", h, a * q_head, "column")]
    keys_values = [
        ("attention.wkv_a", h, latent.kv_lora + latent.rope_head, "none"),
        ("attention.wkv_b", latent.kv_lora, a * (latent.qk_head + latent.v_head), "column"),
    ]
    return [*query, *keys_values, ("attention.wo", a * latent.v_head, h, "row")]


def _mlp(shape: Shape, module: str, width: int) -> list[Matmul]:
    """An MLP's matmuls: w1 (and w3 when gated), then w2."""
    h = shape.hidden
    if not width:
        return []
    ups = [(f"{module}.w1", h, width, "column")]
    if shape.gated:
        ups.append((f"{module}.w3", h, width, "column"))
    return [*ups, (f"{module}.w2", width, h, "row")]


def _kept(shape: Shape, kind: str, forced: tuple[str, ...]) -> list[tuple[Matmul, bool]]:
    """The matmuls of a layer whose MLP part is ``kind`` (an MoE part: its shared expert's),
    each with whether the policy keeps its output. A matmul whose module path contains one
    of ``forced`` (TorchTitan's per_op_sac_force_recompute_mm_shapes_by_fqns) is recomputed
    and not counted, and so is every matmul of the same weight shape, as TorchTitan matches
    them by shape."""
    if kind == "mlp":
        matmuls = [*_attention(shape), *_mlp(shape, "feed_forward", shape.ffn)]
    else:
        matmuls = [*_attention(shape), *_mlp(shape, "moe.shared_experts", shape.shared_ffn)]
    shapes = {(k, n) for name, k, n, _ in matmuls if any(f in name for f in forced)}
    found, count = [], 0
    for matmul in matmuls:
        if matmul[1:3] in shapes:
            found.append((matmul, False))
            continue
        count += 1
        found.append((matmul, count % 2 == 1))
    return found


def kept_per_token(
    shape: Shape, kind: str, tp: int, sp: int, ep: int, forced: tuple[str, ...] = ()
) -> Fraction:
    """Elements each token keeps of one ``kind`` part ("attention", "mlp" or "moe") on a
    tp rank (``sp``: the sequence split of the replicated tensors)."""
    block = _kept(shape, "moe" if kind == "moe" else "mlp", forced)
    part = [
        (m, keep) for m, keep in block if m[0].startswith("attention.") == (kind == "attention")
    ]
    kept = sum(
        (
            Fraction(out, tp) if split == "column" else Fraction(out)
            for (_, _, out, split), keep in part
            if keep
        ),
        Fraction(0),
    )
    reduced = Fraction(shape.hidden, sp) if sp > 1 and part else 0  # a reduce-scatter's output
    if kind == "attention":
        v_head = shape.latent.v_head if shape.latent else shape.kv_channels
        kernel_output = Fraction(shape.heads * v_head, tp)
        return Fraction(shape.hidden, sp) + kept + kernel_output + reduced
    if kind == "moe" and ep > 1:  # the dispatch and combine all-to-alls' outputs
        kept += 2 * shape.topk * (shape.moe_latent or shape.hidden)
    return kept + reduced


def _gemm_share(
    shape: Shape, parts: Parts, pick: Callable[[str, bool], bool], forced: tuple[str, ...]
) -> float:
    """The share of the layers' dense GEMM FLOPs (attention projections, MLPs, shared
    experts) in the matmuls ``pick`` takes, by module path and whether the policy keeps
    the output."""
    total = picked = 0
    for kind, count in (("mlp", parts.mlp), ("moe", parts.moe)):
        for (name, k, n, _), keep in _kept(shape, kind, forced):
            total += count * k * n
            picked += count * k * n * pick(name, keep)
    return picked / total if total else 0.0


def recomputed_gemm_share(shape: Shape, parts: Parts, forced: tuple[str, ...] = ()) -> float:
    """The share of the layers' dense GEMM FLOPs the backward pass runs again."""
    return _gemm_share(shape, parts, lambda _, keep: not keep, forced)


def gemm_share(shape: Shape, parts: Parts, modules: tuple[str, ...]) -> float:
    """The share of the layers' dense GEMM FLOPs in the matmuls whose module path starts
    with one of ``modules`` (e.g. "feed_forward.", "attention.wkv_b")."""
    return _gemm_share(shape, parts, lambda name, _: name.startswith(modules), ())
