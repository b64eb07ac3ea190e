"""The throughput model's terms: one function per cost of a training step.

:func:`mdc.tune.perf.predict` adds them up. Each term's docstring names its formula and the
data behind its constants; docs/tune-model.md gives the sources. Times are seconds per
micro batch on the heaviest pipeline stage unless a docstring says per step.
"""

from __future__ import annotations

import functools
import math

import attrs

from mdc.hardware import Accelerator
from mdc.plan import per_op
from mdc.plan.architecture import Mamba, Parts
from mdc.plan.memory import Shape
from mdc.tune.flops import TokenFlops, layer_weights, token_flops
from mdc.tune.records import Constants, Layout

#: 16-bit activations, gradients of activations and gathered weights
ACT = 2
#: HBM bytes per hidden element and token of the norms and residual adds around attention
#: and the MLP, forward and backward (2 x (4 + 7) each way; see :func:`elementwise`)
_AROUND_BYTES = 44.0
#: bytes per second a pinned host-device copy reaches over one GPU's PCIe 5.0 x16 link (64 GB/s
#: each way): set, not fitted (no published run in tests/published offloads)
HOST_LINK_BYTES_S = 50e9
#: bytes per second of host memory one GPU's share of the CPUs' Adam step streams (a
#: two-socket host's DRAM bandwidth over its 8 GPUs): set, not fitted
HOST_ADAM_BYTES_S = 40e9


# only read: no generated ==, hash or repr (start-up time)
@attrs.frozen(kw_only=True, eq=False, repr=False)
class Recomputed:
    """The share of each term's forward work the backward pass runs again."""

    dense: float = 0.0  # the dense GEMMs
    experts: float = 0.0  # the routed experts' GEMMs (and their weights' reads)
    attention: float = 0.0
    elementwise: float = 0.0
    tp: float = 0.0  # tensor parallelism's forward collectives
    ep: float = 0.0  # the all-to-alls


class Step:
    """What every term reads: the layout on its accelerator and the quantities the terms
    share, computed once per prediction (a plain class: a search builds thousands)."""

    __slots__ = (
        "shape", "layout", "hw", "c", "domain", "stage_layers", "tokens", "split", "again",
        "parts", "routed_width", "capacity", "world", "dense", "expert", "stride",
    )  # fmt: skip

    def __init__(
        self, shape: Shape, layout: Layout, hw: Accelerator, c: Constants, domain: int
    ) -> None:
        L = layout
        self.shape, self.layout, self.hw, self.c, self.domain = shape, L, hw, c, domain
        self.stage_layers = L.stage_layers or math.ceil(shape.layers / L.pp)
        #: tokens one rank of a tp group computes per micro batch
        self.tokens = L.micro_batch_size * shape.seq / L.cp
        #: sequence parallelism splits the norms, the residual adds and the routed tokens
        self.split = L.tp if L.sequence_parallel else 1
        self.again = recomputed(shape, L, self.stage_layers)
        self.parts = _parts(shape)
        #: latent MoE: the routed experts, and the tokens sent to them, are latent wide
        self.routed_width = shape.moe_latent or shape.hidden
        #: experts padded to their capacity (moe_pad_expert_input_to_capacity) run and
        #: receive capacity-factor times the even share of routed tokens; dropping alone,
        #: with tokens spread evenly over the experts as the model counts them, drops none
        self.capacity = L.moe_capacity
        self.world = L.tp * L.pp * L.cp * L.dp
        self.dense = {"tp": L.tp, "cp": L.cp, "ep": 1, "dp": L.dp, "pp": L.pp}
        edp = self.world // (L.etp * L.ep * L.pp)
        self.expert = {"tp": L.etp, "cp": 1, "ep": L.ep, "dp": edp, "pp": L.pp}
        self.stride = {
            "dense": _strides(L.order, tuple(self.dense.items())),
            "expert": _strides(L.order, tuple(self.expert.items())),
        }

    def span(self, grid: str, axis: str) -> int:
        """Consecutive ranks one group of ``axis`` spans in the dense or expert grid."""
        return self.stride[grid][axis] * (self.dense if grid == "dense" else self.expert)[axis]

    @property
    def moe_layers(self) -> float:
        """MoE layers on the heaviest stage (the model's share of them)."""
        return self.stage_layers * self.parts.moe / max(self.shape.layers, 1)

    def hbm(self) -> float:
        """Bytes/s of the accelerator's HBM."""
        return self.hw.memory_bandwidth_gb_s * 1e9


# ---- compute


#: {(accelerator, precision): GEMM level}: the measured maximum achievable matmul TFLOP/s
#: over the catalogue's peak, relative to the H100 SXM's in bf16 (kernels.toml's [gemm], a
#: test holds these equal to mdc.tune.kernels.gemm_levels(); read here, not parsed at start-up)
GEMM_LEVEL: dict[tuple[str, str], float] = {
    ("a100-40gb", "bf16"): 1.0825,
    ("a100-80gb", "bf16"): 1.0825,
    ("b200", "bf16"): 0.9658,
    ("b200", "fp8"): 0.9499,
    ("b300", "bf16"): 0.9791,
    ("b300", "fp8"): 0.9280,
    ("gb200", "bf16"): 0.9076,
    ("gb200", "fp8"): 0.9005,
    ("gb300", "bf16"): 0.9076,
    ("gb300", "fp8"): 0.9005,
    ("h100-sxm", "bf16"): 1.0000,
    ("h100-sxm", "fp8"): 0.8826,
    ("h200", "bf16"): 1.0000,
    ("h200", "fp8"): 0.9146,
    ("mi300x", "bf16"): 0.6367,
    ("mi300x", "fp8"): 0.6367,
    ("mi325x", "bf16"): 0.7476,
    ("mi325x", "fp8"): 0.7476,
    ("mi355x", "bf16"): 0.7744,
    ("mi355x", "fp8"): 0.7744,
}


#: {accelerator: NVFP4 GEMM level}: the measured NVFP4 GEMM TFLOP/s over the catalogue's fp4
#: peak, relative to the H100 SXM's bf16 share (kernels.toml's [fp4] and [[fp4_layer]]; a
#: test holds these equal to mdc.tune.kernels.fp4_levels()); training's FP4 GEMMs run at it
FP4_LEVEL: dict[str, float] = {
    "b200": 0.7610,
    "b300": 0.4699,
    "gb200": 0.7215,
    "gb300": 0.7215,
}


#: {accelerator: attention level}: cuDNN's measured forward attention TFLOP/s over the
#: catalogue's bf16 peak, relative to the H200's (kernels.toml's [attention_level]; a test
#: holds these equal to mdc.tune.kernels.attention_levels()); 1 for one not measured.
#: Blackwell Ultra's doubled exponential rate (the softmax's MUFU.EX2) shows here
ATTENTION_LEVEL: dict[str, float] = {
    "b200": 0.9624,
    "gb200": 0.9097,
    "gb300": 1.1562,
    "h100-sxm": 1.0000,
    "h200": 1.0000,
}


def gemm_level(hw: Accelerator, precision: str) -> float:
    """The measured GEMM level of ``hw`` in ``precision`` (:data:`GEMM_LEVEL`): fp16 at
    bf16's, fp4 at fp8's (training's FP4 GEMMs read :data:`FP4_LEVEL`, serving's this); 1 for an
    accelerator not measured."""
    key = {"fp16": "bf16", "fp4": "fp8"}.get(precision, precision)
    return GEMM_LEVEL.get((hw.id, key)) or GEMM_LEVEL.get((hw.id, "bf16"), 1.0)


#: {accelerator: HBM level}: the measured BabelStream Triad bandwidth over the catalogue's,
#: relative to the H100 SXM's (kernels.toml's [hbm], a test holds these equal to
#: mdc.tune.kernels.hbm_levels())
HBM_LEVEL: dict[str, float] = {
    "h100-sxm": 1.0000,
    "h200": 0.9752,
    "mi300x": 0.8704,
}


def hbm_level(hw: Accelerator) -> float:
    """The measured HBM level of ``hw`` (:data:`HBM_LEVEL`); 1 for one not measured."""
    return HBM_LEVEL.get(hw.id, 1.0)


def gemm_rate(
    hw: Accelerator, precision: str, c: Constants, bf16_share: float, *, measured: bool = True
) -> float:
    """FLOP/s of the layers' GEMMs at the level ``gemm_peak`` calls 1: the dense peak of
    ``precision`` (the catalogue's datasheet figure) times the accelerator's measured GEMM
    level in it (:func:`gemm_level`; FP4 at its measured NVFP4 level, :data:`FP4_LEVEL`),
    times ``fp4_peak`` for FP4 (fitted: the recipe's quantization around each GEMM); with
    ``bf16_share`` of the layers in bf16 (--first-last-layers-bf16) the harmonic mean of
    the two rates. Without ``measured``: the datasheet's (what MFU is counted against)."""
    fp4 = c.fp4_peak if precision == "fp4" else 1.0
    level = gemm_level(hw, precision) if measured else 1.0
    if measured and precision == "fp4":
        level = FP4_LEVEL.get(hw.id, level)
    peak = hw.peak_tflops(precision) * 1e12 * fp4 * level
    if bf16_share:  # the layers' GEMM time: each share at its own rate
        slow = hw.peak_tflops("bf16") * 1e12 * (gemm_level(hw, "bf16") if measured else 1.0)
        peak = 1 / ((1 - bf16_share) / peak + bf16_share / slow)
    return peak


def dense_efficiency(st: Step) -> float:
    """Share of the GEMM peak a dense GEMM reaches: ``gemm_peak * M/(M + shape_knee) *
    prod(W^2/(W^2 + width_knee^2))`` over its weight widths (QKV or MLA's projections and
    the hidden size; in a dense model the MLP's width too, square-rooted), M the tokens per
    rank. fp8 GEMMs reach the same share of their 2x peak as bf16 in the fit. All three
    constants are fitted end to end (bench/tune_fit.py)."""
    shape, L, c = st.shape, st.layout, st.c
    q_width = _attention_width(shape) / L.tp
    # the tokens set M; the weight's widths, split by tp, set N and K: they lose little until
    # narrow, where a tp 8 split of a wide model's weights costs them next to nothing
    eff = c.gemm_peak * _efficiency([st.tokens], c.shape_knee)
    eff *= _wide([q_width, shape.hidden], c.width_knee)
    if not shape.experts:
        ffn_width = shape.ffn * (3 if shape.gated else 2) / 2 / L.tp
        eff *= _wide([ffn_width], c.width_knee) ** 0.5
    return eff


def dense_gemms(st: Step, executed: TokenFlops, peak: float, eff: float) -> float:
    """The dense GEMMs of the stage's layers: ``tokens * layers * dense FLOPs per token
    and layer * (1 + recomputed/3) / tp / (peak * efficiency)`` (FLOPs: mdc.tune.flops,
    Narayanan 2021's count)."""
    L = st.layout
    per_layer = executed.dense_gemm / st.shape.layers
    factor = 1 + st.again.dense / 3
    return st.tokens * st.stage_layers * per_layer * factor / L.tp / (peak * eff)


def expert_gemms(st: Step, executed: TokenFlops, peak: float) -> float:
    """The routed experts' grouped GEMMs: their FLOPs at ``gemm_peak`` times
    ``d/(d + shape_knee)`` over the tokens per expert (``ep * tokens * topk / experts *
    capacity``), the expert's width over etp and the routed width (fitted)."""
    shape, L, c = st.shape, st.layout, st.c
    if not shape.experts:
        return 0.0
    per_expert_tokens = L.ep * st.tokens * shape.topk / shape.experts * st.capacity
    eff = c.gemm_peak * _efficiency(
        [per_expert_tokens, shape.moe_ffn / L.etp, st.routed_width], c.shape_knee
    )
    share = executed.expert_gemm / shape.layers
    # the expert group computes the routed tokens of its tp group: spread over tp ranks
    return (
        st.capacity * st.tokens * st.stage_layers * share * (1 + st.again.experts / 3) / L.tp
        / (peak * eff)
    )  # fmt: skip


def attention(st: Step, executed: TokenFlops) -> float:
    """FlashAttention's FLOPs at the bf16 peak times the accelerator's measured attention
    level (:data:`ATTENTION_LEVEL`), ``attention_peak`` (fitted), ``d/(d + shape_knee)`` of
    the head dimension (FlashAttention's tiles are head_dim wide) and ``q/(q +
    attention_seq_knee)`` of the query tokens per kernel (seq / cp): the knee measured,
    kernels.toml's FlashAttention-3 curve."""
    shape, L, c = st.shape, st.layout, st.c
    head_dim = shape.latent.qk_head + shape.latent.rope_head if shape.latent else shape.kv_channels
    rate = (
        st.hw.peak_tflops("bf16") * 1e12 * ATTENTION_LEVEL.get(st.hw.id, 1.0) * c.attention_peak
        * _efficiency([head_dim], c.shape_knee)
        * _efficiency([shape.seq / L.cp], c.attention_seq_knee)
    )  # fmt: skip
    # Mamba's scan is counted with attention's FLOPs (Bridge's convention) and timed in mamba
    share = (executed.attention - executed.scan) / shape.layers
    return st.tokens * st.stage_layers * share * (1 + st.again.attention / 3) / L.tp / rate


def output_layer(st: Step, executed: TokenFlops, peak: float, eff: float) -> float:
    """The output layer's GEMM on the last stage, at the dense GEMMs' efficiency."""
    return st.tokens * executed.logits / st.layout.tp / (peak * eff)


def elementwise(st: Step) -> float:
    """Memory-bound kernels over the HBM: inside attention and the MLP, ``elementwise``
    (fitted) times Korthikanti 2022's 24 bytes per hidden element (plus 5*a*s/h for
    materialised scores without FlashAttention) over tp, three passes (forward, backward);
    around them, the norms and residual adds' 44 bytes (:data:`_AROUND_BYTES`, counted)
    over sequence parallelism. Recompute adds a third of the inner passes, half the outer."""
    shape, L, c = st.shape, st.layout, st.c
    h, s = shape.hidden, shape.seq
    # without FlashAttention the scores are materialised: Korthikanti's 5*a*s^2*b more bytes
    # per layer (softmax output, dropout mask and output), split over tp with the heads; the
    # fused softmax and dropout kernels move each of those bytes about once per pass
    scores = 0.0 if shape.flash else 5 * shape.heads * s / h / c.elementwise
    inner = c.elementwise * (24 + scores) / L.tp * 3
    # the two norms and two residual adds (with bias and dropout) around them run on the
    # whole hidden vector, on every tp rank unless sequence parallel splits them: 22 bytes
    # per hidden element forward (norm: read and write 2 bytes each; bias-dropout-add: read
    # input and residual, write output and a 1-byte mask), 22 backward
    around = _AROUND_BYTES / st.split
    # recompute runs the forward once more: a third of inner's passes, half of around's
    again = st.again.elementwise
    return (
        (inner * (1 + again / 3) + around * (1 + again / 2))
        * st.tokens
        * h
        * st.stage_layers
        / st.hbm()
    )


#: HBM bytes per element a forward pass of eager PyTorch moves beyond one fused kernel, by
#: TorchTitan's operators as written (torchtitan/models/norms.py RMSNorm, the llama model's
#: apply_rotary_emb and FeedForward; counted, not fitted): RMSNorm on 2-byte x,
#: ``(x.float() * rsqrt(x.pow(2).mean(-1) + eps)).type_as(x) * weight``: float 2+4, pow 4+4,
#: mean 4, mul 4+4, type_as 4+2, weight 2+2 = 36 bytes where one fused kernel reads 2 and
#: writes 2; rotary on q and k, ``view_as_real(view_as_complex(x.float()) * freqs).type_as(x)``:
#: float 2+4, complex mul 4+4, type_as 4+2 = 20 where fused 4; SwiGLU ``silu(a) * b``: silu
#: 2+2, mul 2+2+2 = 10 where fused 6
_EAGER_NORM = 32.0
_EAGER_ROTARY = 16.0
_EAGER_GLU = 4.0
#: HBM bytes per element torchao's tensorwise Float8Linear moves to cast one GEMM operand
#: (a linear's input forward, its output gradient backward): the amax reads the bf16 tensor
#: (2), the cast reads it again and writes fp8 (2 + 1), and the weight-gradient GEMM's
#: column-major copy writes it once more (1). Transformer Engine fuses the input's cast into
#: the norm or activation before it, so Megatron-Core's fp8 rows pay none of it
_FLOAT8_CAST = 6.0


def _mlp_share(st: Step) -> float:
    """The dense MLPs' share of the model's layers."""
    return st.parts.mlp / max(st.shape.layers, 1)


def eager_kernels(st: Step) -> float:
    """An uncompiled model's elementwise operators, one eager kernel each: per token and
    layer, the two RMSNorms' (over sequence parallelism), the rotary embedding's on q and k
    and the SwiGLU's extra bytes (:data:`_EAGER_NORM`, ...; over tp with the heads and the
    MLP's width), three passes (forward; backward, whose kernels read and write about
    twice the forward's) and one more per recomputed forward. torch.compile (per
    TransformerBlock in TorchTitan) fuses each into one kernel, which :func:`elementwise`
    charges. 0 unless the layout runs eagerly."""
    if not st.layout.eager:
        return 0.0
    shape, L = st.shape, st.layout
    q = shape.heads * shape.kv_channels
    kv = shape.groups * shape.kv_channels
    glu = _EAGER_GLU * shape.ffn * _mlp_share(st) if shape.gated else 0.0
    per_token = 2 * _EAGER_NORM * shape.hidden / st.split + (_EAGER_ROTARY * (q + kv) + glu) / L.tp
    passes = 3 + st.again.elementwise
    return passes * per_token * st.tokens * st.stage_layers / st.hbm()


def float8_casts(st: Step) -> float:
    """torchao's Float8Linear casts (tensorwise scaling), memory bound: every linear of a
    layer casts its input forward and its output gradient backward, :data:`_FLOAT8_CAST`
    bytes per element; a recomputed forward casts its inputs again. Inputs per token: q, k
    and v each read the hidden vector, as w1 and w3 do (five h-wide casts, whole on each tp
    rank but over sequence parallelism), wo its attention output, w2 the MLP's width;
    output gradients: q, k, v, the two MLP projections (over tp) and wo's and w2's h-wide
    ones. The weights' casts, once per
    micro batch over thousands of tokens (or on the shard, with FSDP's float8 all-gather),
    are left out. 0 unless the layout's fp8 GEMMs run through torchao."""
    if not st.layout.float8_casts:
        return 0.0
    shape, L = st.shape, st.layout
    h = shape.hidden
    q = shape.heads * shape.kv_channels
    kv = shape.groups * shape.kv_channels
    f = shape.ffn * _mlp_share(st) * (2 if shape.gated else 1)
    mlp = _mlp_share(st)
    # h-wide tensors are cast on each rank's sequence shard under sequence parallelism
    # (torchao's float8 tensor parallel casts before the all-gather)
    inputs = (3 + 2 * mlp) * h / st.split + (q + shape.ffn * mlp) / L.tp
    grads = (1 + mlp) * h / st.split + (q + 2 * kv + f) / L.tp
    again = 5 / _FLOAT8_CAST * st.again.dense  # a recomputed forward's input casts
    per_token = _FLOAT8_CAST * (inputs * (1 + again) + grads)
    return per_token * st.tokens * st.stage_layers / st.hbm()


def permute_passes(st: Step, precision: str) -> float:
    """HBM passes over each routed copy of a token's hidden vector per MoE layer, forward and
    backward (a recomputed forward once more), counted from the kernels Megatron-Core runs
    around its experts (Transformer Engine's fused permutation kernels; unfused, the same
    bytes): the permute reads a token once and writes its k copies (``1/k + 1``), the
    unpermute reads the k copies and writes the token (``1 + 1/k``), each backward the
    mirror; the alltoall dispatcher sorts the received copies by local expert and back where
    a rank holds more than one (``2 + 2`` more, as their backward); the flex dispatcher
    permutes and unpermutes the received tokens on the rank and sorts nothing (the
    allgather one likewise, over the gathered tokens). In fp8 the grouped GEMM's input is
    quantized forward and the fc2's output gradient backward (read 2 bytes, write 1
    row-wise and 1 column-wise: 2 passes each; NVFP4 half a byte each, 1.5 passes). The
    probabilities multiply the activation (moe_ffn wide, with the elementwise kernels); the
    router's logits and scores (E wide, fp32) are a few percent of one pass at the
    published shapes and not counted."""
    k = max(st.shape.topk, 1)
    forward = 2 + 2 / k
    if st.layout.dispatcher in (None, "alltoall") and st.shape.experts > st.layout.ep:
        forward += 4
    # quantized: read the bf16 copy, write its row-wise and column-wise copies
    forward += {"fp8": 2.0, "fp4": 1.5}.get(precision, 0.0)
    return forward * (2 + st.again.experts)


def moe_permute(st: Step, precision: str = "bf16") -> float:
    """Token permutation around the experts, memory bound: :func:`permute_passes` (counted)
    HBM passes over each routed copy of a token's hidden vector per MoE layer."""
    shape = st.shape
    if not shape.experts and not st.parts.moe:
        return 0.0
    return (
        permute_passes(st, precision) * st.capacity * st.tokens / st.split * shape.topk
        * st.routed_width * ACT * st.moe_layers / st.hbm()
    )  # fmt: skip


def expert_overhead(st: Step) -> float:
    """Each local expert's fixed time: ``expert_overhead_us`` (measured: kernels.toml's
    [grouped_gemm], what Transformer Engine's grouped GEMM, one cuBLASLt GEMM per expert over
    several streams, takes beyond one kernel over the same experts, for the expert's two
    GEMMs) per local expert (E/ep), MoE layer and pass (forward, the two backward passes,
    each recomputed forward), whatever its tokens: ep 1 on 8 GPUs runs 8x the GEMMs of ep 8."""
    shape = st.shape
    if not shape.experts:
        return 0.0
    return (
        st.c.expert_overhead_us * 1e-6 * shape.experts / st.layout.ep * st.moe_layers
        * (3 + st.again.experts)
    )  # fmt: skip


#: the SSD kernels' measured share of the dense bf16 peak, and the sequence length (tokens)
#: at which it halves: kernels.toml's [[ssd]] curve (a test holds these equal to
#: mdc.tune.kernels.ssd_level(); read here, not parsed at start-up)
SSD_LEVEL, SSD_SEQ_KNEE = 0.07982, 55.0
#: Megatron-Core MambaMixer's SSD chunk size (its default, which no flag sets)
MAMBA_CHUNK = 128


def ssd_flops(state: int, head_dim: int, heads: float, groups: float) -> float:
    """Forward FLOPs per token of Mamba-2's chunked SSD (Dao and Gu 2024, section 6): each
    group's ``C B^T`` over its chunk (``2 Q N``), each head's chunk state ``B^T x`` and the
    product of ``C`` with the passed state (``2 P N`` each), and the intra-chunk causal
    product with ``x`` (``Q P``, half of ``2 Q P``)."""
    Q, N, P = MAMBA_CHUNK, state, head_dim
    return groups * 2 * Q * N + heads * (4 * P * N + Q * P)


def ssd_step_flops(state: int, head_dim: int, heads: float, groups: float) -> float:
    """A training step's SSD FLOPs per token as mamba_ssm's Triton kernels run them: the
    forward (:func:`ssd_flops`); the backward's recomputed ``C B^T`` and chunk states
    (``2 Q N`` a group, ``2 P N`` a head); and the backward's own products: the states'
    gradient ``C^T dy``, ``dx`` (through the chunk, causal ``Q P``, and the states ``2 P
    N``), ``dB`` and ``dC`` (``2 P N`` each), ``d(CB)`` and the decay's gradient (causal
    ``Q P`` each), and ``d(CB)``'s two products back to B and C (``2 Q N`` a group each,
    over the whole chunk): ``8 G Q N + H (14 P N + 4 Q P)``."""
    Q, N, P = MAMBA_CHUNK, state, head_dim
    return groups * 8 * Q * N + heads * (14 * P * N + 4 * Q * P)


def mamba_bytes(m: Mamba, tp: int) -> float:
    """HBM bytes per token a training step of one Megatron-Core Mamba-2 layer moves outside
    its GEMMs (``mamba_split_conv1d_scan_combined`` with the gate in the chunk scan, then
    Megatron's RMSNorm), counted kernel by kernel from each kernel's inputs and outputs,
    widths over tp: ``68 d + 66 s + 46 S + 32 c`` for the inner width ``d``, B's (and
    C's) width ``s = G N``, the fp32 chunk states ``S = d N / Q`` and the fp32 ``C B^T``
    ``c = G Q``, each per token. Forward ``18 d + 16 s + 12 S + 8 c``: the causal conv1d
    over x, B and C (read, write), the chunk states (x and B in, fp32 states out), the
    state passing (fp32 in, 16-bit out), ``C B^T`` (fp32 out), the chunk scan (``C B^T``,
    x, C, states and the gate z in, the output and its ungated copy out), the norm.
    Backward ``50 d + 50 s + 34 S + 24 c``: the norm's gradient, the conv1d and the chunk
    cumsum, ``C B^T``, chunk states and state passing (fp32) computed again, the gate's
    gradient, the states' gradient, their passing back, ``dx``, ``dB``, ``dC``,
    ``d(CB)``, its two products back, the decay's gradient and the conv1d's gradient.
    Heads and groups split over tp (at least one group a rank)."""
    d = m.inner / tp
    groups = max(m.groups / tp, 1.0)
    s = groups * m.state
    states = 4 * d * m.state / MAMBA_CHUNK  # fp32
    cb = 4 * groups * MAMBA_CHUNK  # fp32
    return 2 * (34 * d + 33 * s) + 11.5 * states + 8 * cb


def mamba(st: Step) -> float:
    """Mamba-2 layers, their work counted and timed at measured rates, times
    ``mamba_overhead`` (fitted: Megatron-Core's layer over that count). The SSD's
    :func:`ssd_step_flops` at the measured SSD kernels' level (``SSD_LEVEL`` of the bf16
    peak at the accelerator's GEMM level, ``q/(q + SSD_SEQ_KNEE)`` of the sequence); the
    bytes its kernels, the causal conv1d and the norm move (:func:`mamba_bytes`) at the
    HBM's bandwidth. Heads and groups split over tp."""
    shape, L = st.shape, st.layout
    m = shape.mamba
    if m is None or not st.parts.mamba:
        return 0.0
    layers = st.stage_layers * st.parts.mamba / max(shape.layers, 1)
    ssd = ssd_step_flops(m.state, m.head_dim, m.heads / L.tp, max(m.groups / L.tp, 1.0))
    rate = (
        st.hw.peak_tflops("bf16") * 1e12 * gemm_level(st.hw, "bf16") * SSD_LEVEL
        * _efficiency([shape.seq], SSD_SEQ_KNEE)
    )  # fmt: skip
    per_token = ssd / rate + mamba_bytes(m, L.tp) / st.hbm()
    return st.c.mamba_overhead * per_token * st.tokens * layers


#: HBM bytes per element of a GEMM operand the NVFP4 recipe quantizes (each linear layer's
#: input forward, its output gradient backward): the amax read for the per-tensor scale,
#: the amax of its Hadamard-rotated transpose (the weight-gradient copy), and one pass
#: reading the 16-bit tensor and writing both 4-bit copies, each with an E4M3 scale per 16
#: elements: 2 + 2 + 2 + 2 x (0.5 + 1/16)
NVFP4_CAST_BYTES = 7.125


def fp4_casts(st: Step, bf16_share: float) -> float:
    """The NVFP4 recipe's casts around every GEMM of the NVFP4 layers (Megatron's
    --fp4-recipe nvfp4), memory bound: :data:`NVFP4_CAST_BYTES` per element of each linear
    layer's input (its width K) and output gradient (N), K + N per token: attention's QKV
    and output projections, the MLP's two, each routed copy's expert pair (and the shared
    expert's), Mamba's in and out projections; widths split over tp (etp for the experts),
    the hidden-wide ones over sequence parallelism (quantized before its all-gather), the
    routed copies as the rank's tokens are (over sequence parallelism); the
    recomputed forward casts its inputs again; the bf16 layers cast nothing."""
    shape, L, parts = st.shape, st.layout, st.parts
    h, tp, gate = shape.hidden / st.split, L.tp, 2 if shape.gated else 1
    attention = h + _attention_width(shape) / tp + shape.heads * _v_head(shape) / tp + h
    mlp = h + (gate + 1) * shape.ffn / tp + h
    # each rank casts its own tokens' routed copies (tokens / sp of them), at the experts'
    moe = shape.topk * st.capacity * (2 * st.routed_width + (gate + 1) * shape.moe_ffn / L.etp)
    moe /= st.split
    moe += (2 * h + (gate + 1) * shape.shared_ffn / tp) if shape.shared_ffn else 0.0
    mamba = 0.0
    if shape.mamba is not None:
        m = shape.mamba
        mamba = 2 * h + (3 * m.inner + 2 * m.groups * m.state + m.heads) / tp
    per_layer = parts.attention * attention + parts.mlp * mlp + parts.moe * moe
    per_layer = (per_layer + parts.mamba * mamba) / max(shape.layers, 1)
    elements = per_layer * st.tokens * st.stage_layers * (1 + st.again.dense / 2)
    return NVFP4_CAST_BYTES * elements * (1 - bf16_share) / st.hbm()


def expert_weights(st: Step, expert_params: float) -> float:
    """The local experts' weights streamed from HBM every micro batch: 12 bytes per local
    expert parameter (bf16 reads by the forward and data-gradient GEMMs, the fp32 main
    gradient read and written by the weight-gradient GEMM), 2 more per recomputed forward;
    few tokens per expert do not amortise it. A dense GEMM's share is negligible."""
    return expert_params * (12 + 2 * st.again.experts) / st.hbm()


# ---- communication within a micro batch


def tp_comm(st: Step, t_dense: float) -> float:
    """Tensor parallelism: 2 collectives forward, 2 backward per layer, ring bytes
    ``2(t-1)/t * tokens * h * 2`` each at the group's bandwidth (:func:`bandwidth`). The
    forward ones exposed by ``tp_exposed`` (set), or with --tp-comm-overlap hidden behind
    the forward GEMMs at ``overlap_tax`` (set); the backward ones hidden behind the
    weight-gradient GEMM (Megatron-Core's async input-gradient collective) at the tax."""
    shape, L, c = st.shape, st.layout, st.c
    if L.tp <= 1:
        return 0.0
    again = st.again
    bw = bandwidth(st.span("dense", "tp"), 1, st.domain, st.hw, c)
    one = 2 * (L.tp - 1) / L.tp * st.tokens * shape.hidden * ACT / bw
    # a third of the layer's dense GEMM time: its forward, or its weight gradient
    third = t_dense / (1 + again.dense / 3) / 3 / max(st.stage_layers, 1)
    # forward (and recomputed forward): the row-parallel outputs' collectives wait
    forward = (2 + 2 * again.tp) * one
    if L.tp_comm_overlap:
        # Transformer Engine's userbuffers split the all-gather before each column-
        # parallel GEMM and the reduce-scatter after each row-parallel one into chunks
        # and run them beside the GEMM's own chunks: hidden behind the forward GEMMs
        # (recomputed ones too), but for the overlap tax. Megatron-Core turns them off
        # for the experts' layers: an MoE layer's MLP collective (half of its forward
        # ones, in the token dispatcher) stays as without the overlap
        plain = forward / 2 * st.parts.moe / max(shape.layers, 1)
        covered = min(forward - plain, third * (1 + again.dense))
        forward = forward - plain - covered + c.overlap_tax * covered + plain * c.tp_exposed
    else:
        forward *= c.tp_exposed
    # backward: Megatron-Core launches each column-parallel layer's input-gradient
    # collective asynchronously and computes the weight gradient meanwhile
    # (LinearWithGradAccumulationAndAsyncCommunication): hidden behind that GEMM, but
    # for the overlap tax
    backward = 2 * one
    hidden = min(backward, third)
    return (forward + backward - hidden + c.overlap_tax * hidden) * st.stage_layers


def cp_comm(st: Step, t_attention: float) -> float:
    """Context parallelism's ring attention as Megatron-Core runs it by default
    (``cp_comm_type`` p2p, Transformer Engine's KV ring with causal load balancing): ``cp``
    steps per layer, each a ``1/cp`` share of the rank's attention (each rank holds two of
    the ``2 cp`` chunks), the send of the next step's K and V (forward; K, V and their
    gradients backward: ``s`` and ``2 s`` per step) beside the step's own attention. Only
    the ``cp - 1`` steps with a send can hide one, each behind its own share:
    ``(cp - 1) * (max(0, s - A/cp) + max(0, 2 s - 2 A/cp))`` per layer, A the layer's
    forward attention time (a third of the term's three passes)."""
    shape, L = st.shape, st.layout
    if L.cp <= 1:
        return 0.0
    bw = bandwidth(st.span("dense", "cp"), st.stride["dense"]["cp"], st.domain, st.hw, st.c)
    kv = st.tokens * 2 * shape.groups * shape.kv_channels / min(L.tp, shape.groups) * ACT
    send = kv / bw
    step = t_attention / max(st.stage_layers, 1) / 3 / L.cp
    exposed = max(0.0, send - step) + max(0.0, 2 * send - 2 * step)
    return (L.cp - 1) * exposed * st.stage_layers


def ep_comm(st: Step, compute: float) -> float:
    """Expert parallelism's dispatch and combine, forward and backward (4 per MoE layer, 2
    more per recomputed one): the routed copies' bytes ``capacity * tokens * topk *
    width * 2 * (ep-1)/ep`` over the scale-up links for the share of the ep group in the
    domain, over the NICs for the rest (``link_share``, ``nic_share``: measured); the allgather dispatcher
    gathers the etp x ep group's tokens; the flex one (DeepEP) sends a token once per
    remote domain holding one of its experts. ``ep_exposed`` (fitted) of it is exposed;
    with overlap_moe_expert_parallel_comm what the compute covers costs the overlap tax."""
    shape, L, c = st.shape, st.layout, st.c
    if not shape.experts or L.ep <= 1:
        return 0.0
    inside = min(1.0, st.domain / st.span("expert", "ep"))
    up = st.hw.scale_up_gb_s * 1e9 * c.link_share
    out = st.hw.scale_out_gb_s * 1e9 * c.nic_share
    width = st.routed_width
    routed = st.capacity * st.tokens / st.split * shape.topk * width * ACT * (L.ep - 1) / L.ep
    if L.dispatcher == "allgather":
        # the allgather dispatcher (Megatron-LM's default) gathers every token of the
        # etp x ep group on each rank and reduce-scatters the outputs back, whatever
        # the experts each token picked
        routed = st.tokens / st.split * width * ACT * (L.etp * L.ep - 1)
    per_a2a = routed * (inside / up + (1 - inside) / out)
    if L.dispatcher == "flex" and inside < 1:
        # the flex dispatcher (DeepEP, HybridEP) sends a token once to each other
        # domain holding one of its experts, then fans it out over the scale-up links:
        # every routed copy crosses them, the deduplicated ones the NIC too
        # remote domains each token reaches (node-limited routing caps them)
        token = st.tokens / st.split * width * ACT
        domains = 1 / inside
        remote = (domains - 1) * _routed_hit(shape.experts, shape.topk, L.router_groups, domains)
        per_a2a = routed / up + token * remote / out
    t_ep = (4 + 2 * st.again.ep) * per_a2a * st.moe_layers
    # Megatron-Core's combined 1F1B schedule (overlap_moe_expert_parallel_comm) pairs one
    # micro batch's forward with another's backward, each one's all-to-alls beside the
    # other's compute: what the compute covers costs only the overlap tax
    hidden = min(t_ep, compute) if L.ep_comm_overlap else 0.0
    return c.ep_exposed * (t_ep - hidden) + c.overlap_tax * hidden


def pp_p2p(st: Step, compute: float) -> float:
    """Pipeline sends: one activation each way per virtual stage and micro batch,
    ``2 * vpp * tokens * h * 2 / sp`` at the pp neighbours' bandwidth; the interleaved
    schedule's overlap_p2p_comm hides it behind compute but for the overlap tax."""
    L, c = st.layout, st.c
    if L.pp <= 1:
        return 0.0
    bw = bandwidth(st.span("dense", "pp"), st.stride["dense"]["pp"], st.domain, st.hw, c)
    t_p2p = 2 * L.vpp * st.tokens * st.shape.hidden * ACT / st.split / bw
    if L.vpp > 1 and L.overlap_p2p:
        # the interleaved schedule overlaps its sends and receives with the next chunk's
        # forward or backward (Megatron-LM's overlap_p2p_comm, on by default there since
        # 2023 and forced off without interleaving): what is hidden costs only the tax
        hidden = min(t_p2p, compute)
        t_p2p = t_p2p - hidden + c.overlap_tax * hidden
    return t_p2p


# ---- the pipeline schedule


def last_stage_scale(st: Step, layers_time: float, t_logits: float) -> tuple[float, float]:
    """(the factor on the layers' terms, the output layer's time) of the slowest stage: the
    last stage runs its decoder layers (fewer where the split counts the loss as a layer),
    the multi-token-prediction layers and the output layer; where a middle stage is slower,
    (1, 0)."""
    L = st.layout
    last_layers = L.last_stage_layers if L.last_stage_layers is not None else st.stage_layers
    last_layers += st.shape.mtp_layers  # Megatron-Core runs the MTP layers on the last stage
    scale = last_layers / st.stage_layers
    if layers_time * scale + t_logits < layers_time:
        return 1.0, 0.0
    return scale, t_logits


def bubble_slots(L: Layout) -> tuple[float, float]:
    """(fill, slots): each schedule run fills and drains the pipeline once, ``(p - 1) / v``
    micro-batch times (1F1B, interleaved: Narayanan 2021); the step runs ``m + fill``."""
    fill = L.schedules * (L.pp - 1) / L.vpp
    return fill, L.microbatches + fill


# ---- once per step


def dp_comm(
    st: Step, micro: float, pipeline: float, dense_params: float, expert_params: float
) -> float:
    """Per step: the data-parallel gradient reduce-scatter and parameter all-gather (or
    all-reduce) over dp x cp, ring bytes ``(g-1)/g`` of the stage's parameters (expert
    weights over their expert-data-parallel group), per micro batch under ZeRO-2/3 (FSDP
    gathers forward and backward). Hidden behind the last micro batch (or the pipeline
    under ZeRO-2/3, or Megatron's per-chunk warm-up with interleaving) but for the
    ``overlap_tax`` (set) and one layer's share per micro batch under ZeRO-2/3."""
    L, c = st.layout, st.c
    group = L.dp * L.cp
    if not (group > 1 or L.ep * L.etp < st.world // L.pp):
        return 0.0
    # the gradient group is dp x cp: its closest members are cp's (or dp's) neighbours
    inner = st.stride["dense"]["cp" if L.cp > 1 else "dp"]
    outer = max(st.span("dense", "dp"), st.span("dense", "cp"))
    bw = bandwidth(outer, inner, st.domain, st.hw, c)
    # the expert weights reduce over the expert-data-parallel group, whose members lie
    # ep * etp ranks apart: one per scale-up domain once ep fills it, so each GPU's own
    # NIC carries its experts' gradients (Megatron-Core's expert_data_parallel_group)
    edp = st.expert["dp"]
    ebw = bw
    if edp > 1:
        ebw = bandwidth(st.span("expert", "dp"), st.stride["expert"]["dp"], st.domain, st.hw, c)
    ring = (group - 1) / group
    ering = (edp - 1) / edp if edp > 1 else 0.0
    # the bytes the expert group moves, in the dense group's bandwidth (one time term)
    eweight = ering * bw / ebw
    grads = (dense_params * ring + expert_params * eweight) * L.grad_bytes
    params = (dense_params * ring + expert_params * eweight) * ACT
    if L.gather_bytes != ACT:  # the layers' weights gathered in fp8 (torchao), the rest not
        embedding = min(st.shape.vocab * st.shape.hidden / L.tp, dense_params)
        layers = dense_params - embedding
        params += layers * ring * (L.gather_bytes - ACT)
    if L.zero_stage >= 3:  # FSDP: parameters gathered for forward and backward
        traffic = grads * L.microbatches + 2 * params * L.microbatches
    elif L.zero_stage == 2:  # gradients reduce-scattered every micro batch, weights kept
        traffic = grads * L.microbatches + params
    elif L.zero_stage >= 1:
        traffic = grads + params
    else:
        traffic = 2 * grads
    t_dp = traffic / bw
    return _dp_exposed(st, t_dp, micro, pipeline)


def _dp_exposed(st: Step, t_dp: float, micro: float, pipeline: float) -> float:
    """What of the data-parallel traffic's ``t_dp`` the step sees (see :func:`dp_comm`)."""
    L = st.layout
    hidden_behind = micro if (L.overlap_grad_reduce or L.zero_stage >= 2) else 0.0
    exposed = 0.0
    if L.zero_stage >= 2:
        hidden_behind = pipeline
        # each micro batch's first all-gather and last reduce-scatter have no layer to
        # hide behind: one layer's share of the traffic per micro batch stays exposed
        exposed = t_dp / st.stage_layers
    if L.zero_stage < 2 and L.pp > 1 and L.vpp > 1 and hidden_behind:
        # Megatron-Core syncs each model chunk's buffers on its own (the DP communication's
        # granularity is a virtual stage's layers): a chunk's gradients reduce once its last
        # backward ends and its parameters gather before its first forward, so all but the
        # chunk that ends the step hide in the first stage's warm-up and cool-down, each as
        # many chunk steps (forwards, or backwards) as Megatron's warm-up count
        warm = min(2 * (L.pp - 1) + (L.vpp - 1) * L.pp, L.microbatches * L.vpp)
        last = t_dp / L.vpp  # the chunk whose last backward ends the step
        exposed = max(0.0, last - micro) + max(0.0, t_dp - last - warm * micro / L.vpp)
        hidden_behind = t_dp - exposed
    # what is hidden is not free: NCCL's kernels take SMs and HBM bandwidth from the
    # GEMMs they overlap, a share of the hidden time the compute still loses
    return max(exposed, t_dp - hidden_behind) + st.c.overlap_tax * min(t_dp, hidden_behind)


def optimizer(st: Step, dense_params: float, expert_params: float) -> float:
    """Per step: Adam over the parameters a GPU owns (sharded by dp x cp from ZeRO-1, the
    experts by their data-parallel group), 30 HBM bytes each (fp32 master weights and two
    moments read and written, the fp32 gradient read, the 16-bit weight written); the
    offloaded share runs on the host instead (:func:`host_offload`)."""
    L = st.layout
    shard = L.dp * L.cp if L.zero_stage >= 1 else 1
    owned = dense_params / shard + expert_params / (st.expert["dp"] if L.zero_stage >= 1 else 1)
    t_opt = owned * 30 / st.hbm()
    return t_opt * (1 - L.optimizer_offload) + host_offload(L, owned, ACT)


def host_offload(L: Layout, owned: float, act: float) -> float:
    """Seconds per step of ZeRO-Offload and ZeRO-Infinity (DeepSpeed's offload_optimizer,
    offload_param): the offloaded share of the owned gradients goes to the host, the CPUs
    run Adam over it (the same 30 bytes per parameter as on the GPU), and the updated
    16-bit weights come back, after the backward, with nothing to hide behind; offloaded
    weights are also fetched from the host for every micro batch's forward and backward.
    Rates: :data:`HOST_LINK_BYTES_S`, :data:`HOST_ADAM_BYTES_S` (set, not fitted)."""
    share = L.optimizer_offload
    t = share * owned * ((L.grad_bytes + act) / HOST_LINK_BYTES_S + 30 / HOST_ADAM_BYTES_S)
    if L.param_offload:
        t += 2 * L.microbatches * owned * act / HOST_LINK_BYTES_S
    return t


# ---- helpers


@functools.lru_cache(maxsize=1 << 12)
def _strides(order: str, sizes: tuple[tuple[str, int], ...]) -> dict[str, int]:
    """Rank distance between neighbours of each axis in a grid laid out in ``order`` (an
    axis the order leaves out: the whole grid's size). Cached: a search asks it of the same
    few grids thousands of times (read only)."""
    size = dict(sizes)
    strides, stride = {}, 1
    for name in order.split("-"):
        strides[name] = stride
        stride *= size.get(name, 1)
    return {axis: strides.get(axis, stride) for axis in size}


@functools.lru_cache(maxsize=256)
def _routed_hit(experts: int, topk: int, groups: tuple[int, int] | None, domains: float) -> float:
    """The chance that one of ``domains`` equal domains (each ``experts / domains``
    consecutive experts, as Megatron-Core lays the experts out over the ep ranks) holds at
    least one of a token's ``topk`` experts. With group-limited routing (``groups`` = (G,
    g): the experts in G equal consecutive groups, each token's experts chosen within g of
    them; Megatron-Core's moe_router_num_groups and moe_router_group_topk, DeepSeek-V3's
    node-limited routing of 8 groups and 4 per token) the g groups are drawn uniformly and
    the token's experts uniformly among theirs; where neither G nor the domains divide the
    other, or g covers every group, as without groups (:func:`_domain_hit`)."""
    plain = _domain_hit(experts, topk, domains)
    if groups is None:
        return plain
    count, chosen = groups
    n = round(domains)
    if chosen >= count or n != domains or not (count % n == 0 or n % count == 0):
        return plain
    pool = experts * chosen // count  # the experts of the chosen groups
    if n % count == 0:
        # each group spans n / count domains: a domain is open with its group
        return min(plain, chosen / count * _drawn_hit(pool, experts // n, topk))
    # each domain holds count / n whole groups: j of them chosen (hypergeometric)
    held = count // n
    hit = 0.0
    for j in range(1, min(held, chosen) + 1):
        ways = math.comb(held, j) * math.comb(count - held, chosen - j) / math.comb(count, chosen)
        hit += ways * _drawn_hit(pool, j * experts // count, topk)
    return min(plain, hit)


def _drawn_hit(pool: int, inside: int, topk: int) -> float:
    """The chance that ``topk`` distinct experts drawn uniformly from ``pool`` include one
    of ``inside`` of them."""
    if topk > pool:
        return 1.0
    return 1.0 - math.comb(pool - inside, topk) / math.comb(pool, topk)


def _domain_hit(experts: int, topk: int, domains: float) -> float:
    """The chance that one of ``domains`` equal domains holds at least one of a token's
    ``topk`` distinct experts, the experts drawn uniformly (no node-limited routing)."""
    elsewhere = experts - experts / domains
    miss = 1.0
    for i in range(topk):
        miss *= max(0.0, elsewhere - i) / (experts - i)
    return 1.0 - miss


def bandwidth(span: int, stride: int, domain: int, hw: Accelerator, c: Constants) -> float:
    """Bytes/s per GPU of a collective over a group whose members lie ``stride`` ranks apart
    within ``span`` consecutive ranks. Inside one scale-up domain: the scale-up link at
    ``link_share``. Across domains, NCCL's rings and trees send each domain's share over all
    its members' NICs at once: the k members a domain holds reach k NICs' bandwidth at
    ``nic_share`` (up to the scale-up link's). Both shares measured (kernels.toml)."""
    up = hw.scale_up_gb_s * 1e9 * c.link_share
    if span <= domain:
        return up
    members = max(1, domain // stride)
    return min(up, hw.scale_out_gb_s * 1e9 * c.nic_share * members)


def scale_up_domain(hw: Accelerator, nproc_per_node: int) -> int:
    """GPUs on one scale-up network: the rack for NVL72-style systems, the bridged pair for
    PCIe cards whose NVLink bridge joins fewer GPUs than the node holds (H100 PCIe and NVL:
    2), else the node."""
    if hw.scale_up_domain > 8:
        return hw.scale_up_domain
    if hw.scale_up_domain < 8:
        return min(nproc_per_node, hw.scale_up_domain)
    return nproc_per_node


def _efficiency(dims: list[float], knee: float) -> float:
    result = 1.0
    for d in dims:
        result *= d / (d + knee)
    return result


def _wide(dims: list[float], knee: float) -> float:
    """Efficiency over a dense GEMM's weight dimensions (see ``width_knee``)."""
    result = 1.0
    for d in dims:
        result *= d * d / (d * d + knee * knee)
    return result


@functools.lru_cache(maxsize=64)
def flops_of(
    shape: Shape,
    causal: bool,
    recompute: bool,
    window: tuple[int, int] | None,
    window_skip: int | tuple[int, ...] | None,
) -> TokenFlops:
    """:func:`mdc.tune.flops.token_flops`, cached (a search asks it of one shape)."""
    return token_flops(
        shape, causal=causal, recompute=recompute, window=window, window_skip=window_skip
    )


@functools.lru_cache(maxsize=64)
def _parts(shape: Shape) -> Parts:
    return shape.pattern.parts(0, shape.layers)


def _v_head(shape: Shape) -> int:
    """Width of each head's values (the output projection's input per head)."""
    return shape.latent.v_head if shape.latent else shape.kv_channels


def _attention_width(shape: Shape) -> float:
    """Output width of the attention projections (QKV, or MLA's up projections)."""
    latent = shape.latent
    if latent is not None:
        return shape.heads * (latent.qk_head + latent.rope_head + latent.qk_head + latent.v_head)
    return (shape.heads + 2 * shape.groups) * shape.kv_channels


def stage_params(shape: Shape, layout: Layout, stage_layers: int) -> tuple[float, float]:
    """(dense, expert) parameters one GPU of the heaviest stage holds."""
    return _stage_params(shape, layout.tp, layout.ep, layout.etp, stage_layers)


@functools.lru_cache(maxsize=1 << 12)
def _stage_params(
    shape: Shape, tp: int, ep: int, etp: int, stage_layers: int
) -> tuple[float, float]:
    """:func:`stage_params` of the sizes it reads (cached: a search asks it of the same
    few stages for thousands of layouts)."""
    h = shape.hidden
    width = 3 if shape.gated else 2
    parts = _parts(shape)
    layers = max(shape.layers, 1)
    attention_w, mamba_w = layer_weights(shape)
    mlp = width * h * shape.ffn
    dense = (attention_w * parts.attention + mamba_w * parts.mamba + mlp * parts.mlp) / layers
    routed_width = shape.moe_latent or h
    expert = shape.experts * shape.moe_ffn * width * routed_width * parts.moe / layers
    # the shared expert and the latent projections are replicated over ep like dense weights
    dense += (shape.shared_ffn * width * h + 2 * h * shape.moe_latent) * parts.moe / layers
    embedding = shape.vocab * h / tp
    dense_gpu = dense / tp * stage_layers + embedding
    return dense_gpu, expert / (ep * etp) * stage_layers


def recompute_shares(shape: Shape, L: Layout) -> tuple[float, ...]:
    """The shares :class:`Step` reads for ``L`` (its heaviest stage), as one tuple: every
    term grows with each share, so a setting whose shares are all at least another's runs
    no faster than it, the rest of the layout alike."""
    again = recomputed(shape, L, L.stage_layers or math.ceil(shape.layers / L.pp))
    return (again.dense, again.experts, again.attention, again.elementwise, again.tp, again.ep)


def recomputed(shape: Shape, L: Layout, stage_layers: int) -> Recomputed:
    """The share of each term's forward work recompute runs again: full recompute's
    layers (block: the first n of each model chunk), selective by operator (the matmuls
    mdc.plan.per_op does not keep), or Megatron-Core's recompute_modules."""
    return _recomputed(
        shape, L.recompute, L.recompute_layers, L.recompute_per_op, L.recompute_per_op_forced,
        L.recompute_modules, L.vpp, stage_layers,
    )  # fmt: skip


@functools.lru_cache(maxsize=1 << 12)
def _recomputed(
    shape: Shape,
    recompute: str,
    recompute_layers: int | None,
    recompute_per_op: bool,
    recompute_per_op_forced: tuple[str, ...],
    recompute_modules: tuple[str, ...] | None,
    vpp: int,
    stage_layers: int,
) -> Recomputed:
    """:func:`recomputed` of the layout fields it reads. Cached: a search predicts each
    recompute setting for thousands of layouts that differ elsewhere (the record is
    frozen, so sharing it is safe)."""
    if recompute == "full":
        # block recomputes the first recompute_num_layers layers of each model chunk
        # (Megatron-Core's TransformerBlock is one chunk), as the memory estimate counts them
        chunk = math.ceil(stage_layers / vpp)
        count = chunk if recompute_layers is None else min(recompute_layers, chunk)
        share = min(count * vpp, stage_layers) / stage_layers
        return Recomputed(
            dense=share, experts=share, attention=share, elementwise=share, tp=share, ep=share
        )
    if per_op.counts(shape, recompute, recompute_per_op):
        # the kept outputs (mdc.plan.per_op) are not run again; the column-parallel layers'
        # all-gathers are, their reduce-scatters not
        dense = per_op.recomputed_gemm_share(shape, _parts(shape), recompute_per_op_forced)
        return Recomputed(dense=dense, experts=1.0, elementwise=1.0, tp=0.5)
    if recompute == "selective":  # Megatron-Core's recompute_modules (default: core_attn)
        modules = recompute_modules or ("core_attn",)
        rerun = tuple(name for module in modules for name in _MODULE_GEMMS.get(module, ()))
        described = rerun and per_op.describes(shape)
        dense = per_op.gemm_share(shape, _parts(shape), rerun) if described else 0.0
        moe = float("moe" in modules)  # the whole MoE layer: its experts and all-to-alls
        return Recomputed(attention=float("core_attn" in modules), dense=dense, experts=moe, ep=moe)
    return Recomputed()


#: the dense GEMMs each of Megatron-Core's recompute_modules runs again, by the matmuls'
#: module paths in mdc.plan.per_op (mla_up_proj: the query and key-value up projections;
#: moe: the whole MoE layer, with its shared experts). Its recomputed elementwise kernels
#: (moe_act, layernorm: the activation and the norms) are a few percent of a layer's HBM
#: traffic and not charged; in a shape per_op does not describe (Mamba, DeepSeek-V4's
#: attention) their GEMMs are not found.
_MODULE_GEMMS: dict[str, tuple[str, ...]] = {
    "mla_up_proj": ("attention.wq_b", "attention.wkv_b"),
    "mlp": ("feed_forward.",),
    "shared_experts": ("moe.shared_experts.",),
    "moe": ("moe.shared_experts.",),
}
