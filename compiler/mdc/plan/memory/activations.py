"""Activation bytes of one micro batch per layer part, with and without recomputation, and
the MoE dispatch buffer."""

from __future__ import annotations

import math
from fractions import Fraction

import attrs

from mdc.plan import per_op
from mdc.plan.architecture import (
    Parts,
)
from mdc.plan.memory.records import Shape, cached
from mdc.plan.model import Sizes, TrainingSetup


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


@cached
def part_activations(
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
    split, latents, mla_up = _attention_terms(shape, t, act, tokens)
    inputs += latents
    attention_modules = (norm_output, *mla_up)
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


def _attention_terms(
    shape: Shape, t: int, act: int, tokens: Fraction
) -> tuple[Fraction, Fraction, tuple[tuple[str, Fraction], ...]]:
    """Attention's activations split over tp, the replicated ones its latents add (MLA), and
    the up-projections recompute_modules "mla_up_proj" discards (MLA)."""
    latent = shape.latent
    dsv4 = shape.dsv4
    if dsv4 is not None and latent is not None:
        # DeepSeek-V4: Q before and after its norm and rope, the one shared K = V head, the
        # attention output (the grouped projection's input) and the o_groups x o_lora
        # output projection's input; the compressed query and the kv head, each a norm
        # input and a projection input
        q = Fraction(shape.heads * latent.v_head, t)
        grouped = Fraction(dsv4.o_groups * dsv4.o_lora, t)
        split = act * tokens * (3 * q + 2 * latent.v_head + grouped)
        latents = act * tokens * (2 * latent.q_lora + 2 * latent.v_head)
        return split, latents, (("mla_up_proj", act * tokens * 2 * q),)
    if latent is not None:
        # Q and K of qk + rope width, V and the projection input of v width, per head; the
        # replicated compressed q and kv (each a norm input and an up-projection input)
        q = Fraction(shape.heads * (latent.qk_head + latent.rope_head), t)
        v = Fraction(shape.heads * latent.v_head, t)
        split = act * tokens * (2 * q + 2 * v)
        latents = act * tokens * (2 * latent.q_lora + 2 * latent.kv_lora + latent.rope_head)
        # recompute_modules "mla_up_proj": Megatron-Core discards the up-projected Q, K and V
        # once core attention has run and recomputes them from the latents for its backward
        return split, latents, (("mla_up_proj", act * tokens * (2 * q + v)),)
    d = shape.kv_channels
    q = Fraction(shape.heads * d, t)
    kv = Fraction(shape.groups * d, t) if shape.groups % t == 0 else Fraction(d)
    return act * tokens * (2 * q + 2 * kv), Fraction(0), ()


def intermediates_of(shape: Shape) -> int:
    """MLP intermediates kept per token and ffn column: gate, up and product, or two."""
    return 3 if shape.gated else 2


def activations_bytes(
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


@cached
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
    each = part_activations(
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


@cached
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
    """:func:`activations_bytes` of ``layers`` layers in ``chunks`` model chunks on a tp rank."""
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
        each = part_activations(shape, t, cp, etp, micro, gemm_in, capacity, *saved)
        selective = sum(
            (count * each[kind].selective(sp, modules) for kind, count in _counts(parts).items()),
            Fraction(0),
        )
        return selective * on_gpu, Fraction(0)
    return full * on_gpu, Fraction(0)


def recompute_name(shape: Shape, training: TrainingSetup) -> str:
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


def dispatch_buffer(
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
