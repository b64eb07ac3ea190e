"""The throughput model: one training step's time for a layout on an accelerator.

Every term, with its formula and source, is in docs/tune.md. In short, per GPU::

    step = (m + (p - 1)/v) * t_micro          1F1B pipeline, bubble (p-1)/(v*m) (Narayanan 2021)
         + exposed data-parallel communication
         + optimizer step (memory bound)

    t_micro = compute + elementwise + TP + CP (exposed) + EP all-to-all + p2p

Compute runs the executed FLOPs (the model's, plus recompute's extra forward) at the
dense peak of the GEMM precision times an efficiency that falls with the per-rank GEMM
shape. Collectives are bandwidth terms over the scale-up network when the group lies in
one scale-up domain, over each GPU's NIC otherwise. The calibrated constants are the
fields of :class:`Constants`; bench/tune_fit.py fits them on published measured runs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import attrs

from mdc.hardware import Accelerator
from mdc.plan import per_op
from mdc.plan.architecture import Parts
from mdc.plan.memory import Shape, quantized, resolve_shape, scheduled_micro_batches
from mdc.plan.model import BatchPlan, Plan, Sizes, TrainingSetup
from mdc.tune.flops import TokenFlops, layer_weights, token_flops


@attrs.frozen(kw_only=True)
class Constants:
    """The calibrated constants (defaults: the fit in docs/tune.md)."""

    #: share of the dense peak a large GEMM reaches
    gemm_peak: float = 0.6089
    #: token dimension (M) at which a GEMM's efficiency halves: d / (d + knee); also every
    #: dimension of the routed experts' grouped GEMMs, and FlashAttention's head dimension
    shape_knee: float = 373.5
    #: weight dimension (N, K) of a dense GEMM at which its efficiency halves, sharper:
    #: d^2 / (d^2 + knee^2), so a weight a few tiles wide runs near the peak
    width_knee: float = 513.2
    #: share of the bf16 dense peak FlashAttention reaches (forward and backward)
    attention_peak: float = 0.9524
    #: query tokens per attention kernel (the sequence over cp) at which FlashAttention's
    #: efficiency halves: measured, not fitted (kernels.toml, docs/tune.md)
    attention_seq_knee: float = 234.0
    #: HBM bytes moved by elementwise kernels per activation byte Korthikanti counts
    elementwise: float = 3.596
    #: share of link bandwidth collectives reach (NCCL bus bandwidth / link rate)
    link_share: float = 0.6673
    #: share of the forward tensor-parallel collectives not hidden behind GEMMs (the
    #: backward ones overlap the weight-gradient GEMM: see predict); set, not fitted: the
    #: measured rows leave it open (docs/tune.md), the recipes' own layouts pin it
    tp_exposed: float = 0.3
    #: share of an overlapped data-parallel collective's time the compute still loses
    #: (NCCL's channels occupy SMs and HBM bandwidth while the GEMMs run)
    overlap_tax: float = 0.2
    #: share of the expert all-to-all not hidden (overlap, node-limited routing, fp8 dispatch);
    #: with Megatron-Core's overlap_moe_expert_parallel_comm, of what the compute cannot hide
    ep_exposed: float = 0.8465
    #: HBM passes over each routed token's hidden vector per MoE layer (permute, unpermute,
    #: router, grouped-GEMM staging), forward and backward
    moe_passes: float = 4.801
    #: HBM passes over each token's Mamba inner-width vector per Mamba layer (conv1d, SSD
    #: scan kernels, gated norm), forward and backward
    mamba_passes: float = 435.1
    #: share of its dense peak an FP4 GEMM reaches, relative to a bf16 or fp8 GEMM's: the
    #: NVFP4 recipe quantizes around every GEMM (16-element blocks under two scales, random
    #: Hadamard transforms of the weight-gradient inputs, stochastically rounded gradients)
    fp4_peak: float = 0.6565
    #: microseconds each local expert costs per MoE layer and pass whatever its tokens
    #: (its grouped-GEMM group, its own quantization and scaling kernels)
    expert_overhead_us: float = 32.56

    def to_json(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in attrs.fields(Constants)}


DEFAULT = Constants()


@attrs.frozen(kw_only=True)
class Layout:
    """What the model needs of a candidate layout (sizes, batch and training switches)."""

    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    dp: int
    vpp: int
    micro_batch_size: int
    #: micro batches per step per pipeline (gradient accumulation steps)
    microbatches: int
    sequence_parallel: bool
    #: "none", "selective" or "full"
    recompute: str
    #: layers of each model chunk recomputed with full recompute (None: all)
    recompute_layers: int | None = None
    #: selective recompute by operator (TrainingSetup.recompute_per_op), and its forced
    #: matmuls (TrainingSetup.recompute_per_op_forced)
    recompute_per_op: bool = False
    recompute_per_op_forced: tuple[str, ...] = ()
    #: selective recompute's modules in Megatron-Core's names (None: the attention core)
    recompute_modules: tuple[str, ...] | None = None
    #: routed tokens each expert runs and receives over the even share: the capacity factor
    #: where the experts' input is padded to capacity, else 1
    moe_capacity: float = 1.0
    #: 0 plain, 1 distributed optimizer, 3 FSDP
    zero_stage: int = 1
    grad_bytes: int = 4
    #: share of the optimizer state kept and stepped on the host (ZeRO-Offload)
    optimizer_offload: float = 0.0
    #: the weights kept on the host, fetched for every micro batch (ZeRO-Infinity)
    param_offload: bool = False
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    #: pipeline schedule runs per step, each filling and draining the pipeline (TorchTitan
    #: runs one per gradient-accumulation step; Megatron-Core one per step)
    schedules: int = 1
    #: the interleaved schedule overlaps its sends with compute (Megatron-LM's overlap_p2p_comm)
    overlap_p2p: bool = True
    #: the forward tensor-parallel collectives pipelined with the GEMMs next to them
    #: (Megatron-LM's --tp-comm-overlap: Transformer Engine's userbuffers)
    tp_comm_overlap: bool = False
    #: the expert all-to-alls run beside another micro batch's compute (Megatron-Core's
    #: overlap_moe_expert_parallel_comm)
    ep_comm_overlap: bool = False
    #: the MoE token dispatcher, in Megatron-Core's names: "alltoall" (or None) sends each
    #: token's routed copies; "flex" (DeepEP, HybridEP) sends a token once to each scale-up
    #: domain holding one of its experts and fans it out there; "allgather" (Megatron-LM's
    #: default) gathers every token of the etp x ep group on each rank and reduce-scatters back
    dispatcher: str | None = None
    #: layers on the heaviest pipeline stage (None: ceil(layers / pp))
    stage_layers: int | None = None
    #: layers on the last pipeline stage, which also runs the output layer and the loss
    #: (None: stage_layers; fewer where the loss counts as a layer in the split)
    last_stage_layers: int | None = None
    order: str = "tp-cp-ep-dp-pp"


@attrs.frozen(kw_only=True)
class Prediction:
    step_time_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float
    bubble: float
    #: seconds per step of each exposed term
    breakdown: Mapping[str, float]

    @property
    def dominant_communication(self) -> str:
        comm = {k: v for k, v in self.breakdown.items() if k not in ("compute", "elementwise")}
        name, value = max(sorted(comm.items()), key=lambda kv: kv[1])
        return name if value > 0 else "none"

    def to_json(self) -> dict[str, object]:
        return {
            "step_time_s": _round(self.step_time_s),
            "tokens_per_s_per_gpu": _round(self.tokens_per_s_per_gpu),
            "model_tflops_per_gpu": _round(self.model_tflops_per_gpu),
            "mfu": _round(self.mfu),
            "bubble": _round(self.bubble),
            "dominant_communication": self.dominant_communication,
            "breakdown_s": {k: _round(v) for k, v in sorted(self.breakdown.items())},
        }


def _round(value: float) -> float:
    """Four significant digits: the model is no more precise, and JSON stays stable."""
    return float(f"{value:.4g}")


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


def _domain_hit(experts: int, topk: int, domains: float) -> float:
    """The chance that one of ``domains`` equal domains holds at least one of a token's
    ``topk`` distinct experts, the experts drawn uniformly (no node-limited routing)."""
    elsewhere = experts - experts / domains
    miss = 1.0
    for i in range(topk):
        miss *= max(0.0, elsewhere - i) / (experts - i)
    return 1.0 - miss


def _bandwidth(span: int, stride: int, domain: int, hw: Accelerator, share: float) -> float:
    """Bytes/s per GPU of a collective over a group whose members lie ``stride`` ranks apart
    within ``span`` consecutive ranks. Inside one scale-up domain: the scale-up link. Across
    domains, NCCL's rings and trees send each domain's share over all its members' NICs at
    once: the k members a domain holds reach k NICs' bandwidth (up to the scale-up link)."""
    if span <= domain:
        return hw.scale_up_gb_s * 1e9 * share
    members = max(1, domain // stride)
    return min(hw.scale_up_gb_s, hw.scale_out_gb_s * members) * 1e9 * share


def scale_up_domain(hw: Accelerator, nproc_per_node: int) -> int:
    """GPUs on one scale-up network: the rack for NVL72-style systems, else the node."""
    return hw.scale_up_domain if hw.scale_up_domain > 8 else nproc_per_node


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


def predict(
    shape: Shape,
    layout: Layout,
    hw: Accelerator,
    *,
    nproc_per_node: int,
    precision: str = "bf16",
    constants: Constants = DEFAULT,
    causal: bool = True,
    count_recompute: bool = False,
    window: tuple[int, int] | None = None,
    window_skip: int | tuple[int, ...] | None = None,
    bf16_share: float = 0.0,
) -> Prediction:
    """The predicted step of ``layout`` (see the module docstring and docs/tune.md).

    ``bf16_share``: the share of the heaviest stage's layers whose GEMMs run at the bf16
    peak although ``precision`` is fp8 or fp4 (Megatron's --first-last-layers-bf16).

    ``causal`` and ``count_recompute`` choose the model-FLOPs convention the TFLOP/s and
    MFU are reported in (:func:`mdc.tune.flops.token_flops`); the time does not depend on it.
    """
    c, L = constants, layout
    world = L.tp * L.pp * L.cp * L.dp
    h, s = shape.hidden, shape.seq
    recomputes = count_recompute and L.recompute == "full"
    flops = _flops(shape, causal, recomputes, window, window_skip)
    # what the kernels execute: causal attention skips the masked half either way
    executed = _flops(shape, True, False, None, None)
    domain = scale_up_domain(hw, nproc_per_node)
    act = 2  # bf16 activations

    # ---- compute per micro batch on the heaviest stage
    layers = shape.layers
    stage_layers = L.stage_layers or math.ceil(layers / L.pp)
    tokens = L.micro_batch_size * s / L.cp  # tokens one rank of a tp group computes
    dense_share, expert_share = executed.dense_gemm / layers, executed.expert_gemm / layers
    attention_share = executed.attention / layers
    again = _recomputed(shape, L, stage_layers)
    gemm_factor = 1 + again.dense / 3
    q_width = _attention_width(shape) / L.tp
    ffn_width = shape.ffn * (3 if shape.gated else 2) / 2 / L.tp
    peak = hw.peak_tflops(precision) * 1e12 * (c.fp4_peak if precision == "fp4" else 1.0)
    if bf16_share:  # the layers' GEMM time: each share at its own peak
        slow = hw.peak_tflops("bf16") * 1e12
        peak = 1 / ((1 - bf16_share) / peak + bf16_share / slow)
    # fp8 GEMMs reach the same share of their 2x peak as bf16 in the fit, fp4 ones fp4_peak
    # of that; the step gains less, as the attention, elementwise, MoE and communication
    # terms do not speed up with the GEMM precision
    gemm_peak = c.gemm_peak
    # the tokens set M; the weight's widths, split by tp, set N and K: they lose little until
    # narrow, where a tp 8 split of a wide model's weights costs them next to nothing
    dense_eff = gemm_peak * _efficiency([tokens], c.shape_knee) * _wide([q_width, h], c.width_knee)
    if not shape.experts:
        dense_eff *= _wide([ffn_width], c.width_knee) ** 0.5
    t_dense = tokens * stage_layers * dense_share * gemm_factor / L.tp / (peak * dense_eff)
    t_expert = 0.0
    # latent MoE: the routed experts, and the tokens sent to them, are latent wide
    routed_width = shape.moe_latent or h
    # experts padded to their capacity (moe_pad_expert_input_to_capacity) run and receive
    # capacity-factor times the even share of routed tokens; dropping alone, with tokens
    # spread evenly over the experts as the model counts them, drops none
    capacity = L.moe_capacity
    if shape.experts:
        per_expert_tokens = L.ep * tokens * shape.topk / shape.experts * capacity
        expert_eff = gemm_peak * _efficiency(
            [per_expert_tokens, shape.moe_ffn / L.etp, routed_width], c.shape_knee
        )
        # the expert group computes the routed tokens of its tp group: spread over tp ranks
        t_expert = (
            capacity * tokens * stage_layers * expert_share * (1 + again.experts / 3) / L.tp
            / (peak * expert_eff)
        )  # fmt: skip
    # FlashAttention's tiles are head_dim wide: narrow heads run further from the peak
    head_dim = shape.latent.qk_head + shape.latent.rope_head if shape.latent else shape.kv_channels
    attention_peak = (
        hw.peak_tflops("bf16") * 1e12 * c.attention_peak * _efficiency([head_dim], c.shape_knee)
        * _efficiency([s / L.cp], c.attention_seq_knee)
    )  # fmt: skip
    t_attention = (
        tokens * stage_layers * attention_share * (1 + again.attention / 3) / L.tp / attention_peak
    )
    # the output layer runs on the last stage (see the slowest stage below)
    t_logits = tokens * executed.logits / L.tp / (peak * dense_eff)
    compute = t_dense + t_expert + t_attention

    # elementwise kernels inside attention and the MLP (activation, softmax, rotary,
    # bias): Korthikanti's 24*s*b*h activation bytes per layer (16-bit), split over tp,
    # read and written in forward and backward, over the HBM
    split = L.tp if L.sequence_parallel else 1
    # without FlashAttention the scores are materialised: Korthikanti's 5*a*s^2*b more bytes
    # per layer (softmax output, dropout mask and output), split over tp with the heads; the
    # fused softmax and dropout kernels move each of those bytes about once per pass
    scores = 0.0 if shape.flash else 5 * shape.heads * s / h / c.elementwise
    inner = c.elementwise * (24 + scores) / L.tp * 3
    # the two norms and two residual adds (with bias and dropout) around them run on the
    # whole hidden vector, on every tp rank unless sequence parallel splits them: 22 bytes
    # per hidden element forward (norm: read and write 2 bytes each; bias-dropout-add: read
    # input and residual, write output and a 1-byte mask), 22 backward
    around = _AROUND_BYTES / split
    # recompute runs the forward once more: a third of inner's passes, half of around's
    elementwise = (
        (inner * (1 + again.elementwise / 3) + around * (1 + again.elementwise / 2))
        * tokens
        * h
        * stage_layers
        / (hw.memory_bandwidth_gb_s * 1e9)
    )

    dense = {"tp": L.tp, "cp": L.cp, "ep": 1, "dp": L.dp, "pp": L.pp}
    expert = {"tp": L.etp, "cp": 1, "ep": L.ep, "dp": world // (L.etp * L.ep * L.pp), "pp": L.pp}

    stride = {
        "dense": _strides(L.order, tuple(dense.items())),
        "expert": _strides(L.order, tuple(expert.items())),
    }

    def span(grid: str, axis: str) -> int:
        return stride[grid][axis] * (dense if grid == "dense" else expert)[axis]

    # ---- tensor parallel: 2 all-reduces forward, 2 backward per layer (all-gather plus
    # reduce-scatter with sequence parallel: the same bytes), ring: 2(t-1)/t of the tensor
    t_tp = 0.0
    if L.tp > 1:
        bw = _bandwidth(span("dense", "tp"), 1, domain, hw, c.link_share)
        one = 2 * (L.tp - 1) / L.tp * tokens * h * act / bw
        # a third of the layer's dense GEMM time: its forward, or its weight gradient
        third = t_dense / gemm_factor / 3 / max(stage_layers, 1)
        # forward (and recomputed forward): the row-parallel outputs' collectives wait
        forward = (2 + 2 * again.tp) * one
        if L.tp_comm_overlap:
            # Transformer Engine's userbuffers split the all-gather before each column-
            # parallel GEMM and the reduce-scatter after each row-parallel one into chunks
            # and run them beside the GEMM's own chunks: hidden behind the forward GEMMs
            # (recomputed ones too), but for the overlap tax. Megatron-Core turns them off
            # for the experts' layers: an MoE layer's MLP collective (half of its forward
            # ones, in the token dispatcher) stays as without the overlap
            plain = forward / 2 * _parts(shape).moe / max(layers, 1)
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
        t_tp = (forward + backward - hidden + c.overlap_tax * hidden) * stage_layers

    # ---- context parallel: ring attention passes K and V (cp-1) times forward, K, V and
    # their gradients backward, hidden behind the attention it feeds
    t_cp = 0.0
    if L.cp > 1:
        bw = _bandwidth(span("dense", "cp"), stride["dense"]["cp"], domain, hw, c.link_share)
        kv_bytes = tokens * 2 * shape.groups * shape.kv_channels / min(L.tp, shape.groups) * act
        ring = 3 * (L.cp - 1) * kv_bytes / bw * stage_layers
        t_cp = max(0.0, ring - t_attention)

    # ---- expert parallel: dispatch and combine all-to-alls, forward and backward
    parts = _parts(shape)
    moe_layers = stage_layers * parts.moe / max(layers, 1)
    # token permutation around the experts: memory bound, every routed copy of a token
    t_moe = (
        c.moe_passes
        * capacity
        * tokens
        / split
        * shape.topk
        * routed_width
        * act
        * moe_layers
        / (hw.memory_bandwidth_gb_s * 1e9)
    )
    # Mamba-2 layers: the conv1d, the chunked SSD scan and the gated norm are memory bound
    # over the inner width (heads split over tp), forward and backward
    t_mamba = 0.0
    if shape.mamba is not None and parts.mamba:
        mamba_layers = stage_layers * parts.mamba / max(layers, 1)
        t_mamba = (
            c.mamba_passes
            * tokens
            * shape.mamba.inner
            / L.tp
            * act
            * mamba_layers
            / (hw.memory_bandwidth_gb_s * 1e9)
        )
    if shape.experts:
        # every local expert adds fixed work per pass: forward, the two backward GEMMs and
        # each recomputed forward; ep 1 on 8 GPUs runs 8x the groups of ep 8
        t_moe += (
            c.expert_overhead_us * 1e-6 * shape.experts / L.ep * moe_layers
            * (3 + again.experts)
        )  # fmt: skip
    t_ep = 0.0
    if shape.experts and L.ep > 1:
        ep_span = span("expert", "ep")
        inside = min(1.0, domain / ep_span)
        up = hw.scale_up_gb_s * 1e9 * c.link_share
        out = hw.scale_out_gb_s * 1e9 * c.link_share
        routed = capacity * tokens / split * shape.topk * routed_width * act * (L.ep - 1) / L.ep
        if L.dispatcher == "allgather":
            # the allgather dispatcher (Megatron-LM's default) gathers every token of the
            # etp x ep group on each rank and reduce-scatters the outputs back, whatever
            # the experts each token picked
            routed = tokens / split * routed_width * act * (L.etp * L.ep - 1)
        per_a2a = routed * (inside / up + (1 - inside) / out)
        if L.dispatcher == "flex" and inside < 1:
            # the flex dispatcher (DeepEP, HybridEP) sends a token once to each other
            # domain holding one of its experts, then fans it out over the scale-up links:
            # every routed copy crosses them, the deduplicated ones the NIC too
            token = tokens / split * routed_width * act
            remote = (1 / inside - 1) * _domain_hit(shape.experts, shape.topk, 1 / inside)
            per_a2a = routed / up + token * remote / out
        t_ep = (4 + 2 * again.ep) * per_a2a * moe_layers
        # Megatron-Core's combined 1F1B schedule (overlap_moe_expert_parallel_comm) pairs one
        # micro batch's forward with another's backward, each one's all-to-alls beside the
        # other's compute: what the compute covers costs only the overlap tax
        hidden = min(t_ep, compute) if L.ep_comm_overlap else 0.0
        t_ep = c.ep_exposed * (t_ep - hidden) + c.overlap_tax * hidden

    # ---- pipeline p2p: one activation each way per virtual stage and micro batch
    t_p2p = 0.0
    if L.pp > 1:
        bw = _bandwidth(span("dense", "pp"), stride["dense"]["pp"], domain, hw, c.link_share)
        t_p2p = 2 * L.vpp * tokens * h * act / split / bw
        if L.vpp > 1 and L.overlap_p2p:
            # the interleaved schedule overlaps its sends and receives with the next chunk's
            # forward or backward (Megatron-LM's overlap_p2p_comm, on by default there since
            # 2023 and forced off without interleaving): what is hidden costs only the tax
            hidden = min(t_p2p, compute)
            t_p2p = t_p2p - hidden + c.overlap_tax * hidden

    # the local experts' weights stream from HBM every micro batch: read by the forward and
    # the data-gradient GEMMs (bf16), their fp32 main gradients read and written by the
    # weight-gradient GEMM (Megatron's gradient accumulation fusion): 12 bytes per local
    # expert parameter (2 more per recomputed forward), which few tokens per expert do not
    # amortise. A dense GEMM sees thousands of tokens per weight: its share is negligible.
    dense_params, expert_params = stage_params(shape, L, stage_layers)
    t_weights = expert_params * (12 + 2 * again.experts) / (hw.memory_bandwidth_gb_s * 1e9)

    elementwise += t_moe + t_mamba + t_weights
    # a stage's time is its layers' (every term above but the output layer scales with
    # them); the last stage adds the multi-token-prediction layers, the output layer and the
    # loss, and the schedule runs at the pace of the slower of it and the heaviest stage. A
    # split that counts the loss as a layer (--account-for-loss-in-pipeline-split) or a
    # layout string gives the last stage fewer decoder layers.
    layers_time = compute + elementwise + t_tp + t_cp + t_ep
    last_layers = L.last_stage_layers if L.last_stage_layers is not None else stage_layers
    last_layers += shape.mtp_layers  # Megatron-Core runs the MTP layers on the last stage
    scale = last_layers / stage_layers
    if layers_time * scale + t_logits < layers_time:
        scale, t_logits = 1.0, 0.0  # a middle stage is the slowest
    compute, elementwise = compute * scale + t_logits, elementwise * scale
    t_tp, t_cp, t_ep = t_tp * scale, t_cp * scale, t_ep * scale
    micro = compute + elementwise + t_tp + t_cp + t_ep + t_p2p
    # each schedule run fills and drains the pipeline once
    fill = L.schedules * (L.pp - 1) / L.vpp
    slots = L.microbatches + fill
    pipeline = slots * micro
    bubble = fill / slots

    # ---- data parallel: gradient reduce-scatter and parameter all-gather (distributed
    # optimizer) or all-reduce, once per step; overlapped with the last micro batch's
    # backward and the first one's forward when Megatron's overlap flags are on
    t_dp = 0.0
    group = L.dp * L.cp
    if group > 1 or L.ep * L.etp < world // L.pp:
        # the gradient group is dp x cp: its closest members are cp's (or dp's) neighbours
        inner = stride["dense"]["cp" if L.cp > 1 else "dp"]
        outer = max(span("dense", "dp"), span("dense", "cp"))
        bw = _bandwidth(outer, inner, domain, hw, c.link_share)
        # the expert weights reduce over the expert-data-parallel group, whose members lie
        # ep * etp ranks apart: one per scale-up domain once ep fills it, so each GPU's own
        # NIC carries its experts' gradients (Megatron-Core's expert_data_parallel_group)
        edp = expert["dp"]
        ebw = bw
        if edp > 1:
            ebw = _bandwidth(span("expert", "dp"), stride["expert"]["dp"], domain, hw,
                             c.link_share)  # fmt: skip
        ring = (group - 1) / group
        ering = (edp - 1) / edp if edp > 1 else 0.0
        # the bytes the expert group moves, in the dense group's bandwidth (one time term)
        eweight = ering * bw / ebw
        grads = (dense_params * ring + expert_params * eweight) * L.grad_bytes
        params = (dense_params * ring + expert_params * eweight) * act
        if L.zero_stage >= 3:  # FSDP: parameters gathered for forward and backward
            traffic = grads * L.microbatches + 2 * params * L.microbatches
        elif L.zero_stage == 2:  # gradients reduce-scattered every micro batch, weights kept
            traffic = grads * L.microbatches + params
        elif L.zero_stage >= 1:
            traffic = grads + params
        else:
            traffic = 2 * grads
        t_dp = traffic / bw
        hidden_behind = micro if (L.overlap_grad_reduce or L.zero_stage >= 2) else 0.0
        exposed = 0.0
        if L.zero_stage >= 2:
            hidden_behind = pipeline
            # each micro batch's first all-gather and last reduce-scatter have no layer to
            # hide behind: one layer's share of the traffic per micro batch stays exposed
            exposed = t_dp / stage_layers
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
        t_dp = max(exposed, t_dp - hidden_behind) + c.overlap_tax * min(t_dp, hidden_behind)

    # ---- optimizer: Adam reads and writes fp32 master weights, moments, grads (memory bound)
    shard = group if L.zero_stage >= 1 else 1
    owned = dense_params / shard + expert_params / (expert["dp"] if L.zero_stage >= 1 else 1)
    t_opt = owned * 30 / (hw.memory_bandwidth_gb_s * 1e9)
    t_host = _host_offload(L, owned, act)
    t_opt = t_opt * (1 - L.optimizer_offload) + t_host

    step = pipeline + t_dp + t_opt
    tokens_step = L.microbatches * L.micro_batch_size * L.dp * s
    model_flops = tokens_step * flops.total
    tflops = model_flops / step / world / 1e12
    breakdown = {
        "compute": slots * compute,
        "elementwise": slots * elementwise,
        "tp": slots * t_tp,
        "cp": slots * t_cp,
        "ep": slots * t_ep,
        "pp-p2p": slots * t_p2p,
        "pp-bubble": fill * micro,
        "dp": t_dp,
        "optimizer": t_opt,
    }
    return Prediction(
        step_time_s=step,
        tokens_per_s_per_gpu=tokens_step / step / world,
        model_tflops_per_gpu=tflops,
        mfu=tflops * 1e12 / peak,
        bubble=bubble,
        breakdown=breakdown,
    )


#: bytes per second a pinned host-device copy reaches over one GPU's PCIe 5.0 x16 link (64 GB/s
#: each way): set, not fitted (no published run in tests/published offloads)
HOST_LINK_BYTES_S = 50e9
#: bytes per second of host memory one GPU's share of the CPUs' Adam step streams (a
#: two-socket host's DRAM bandwidth over its 8 GPUs): set, not fitted
HOST_ADAM_BYTES_S = 40e9


def _host_offload(L: Layout, owned: float, act: float) -> float:
    """Seconds per step of ZeRO-Offload and ZeRO-Infinity (DeepSpeed's offload_optimizer,
    offload_param): the offloaded share of the owned gradients goes to the host, the CPUs
    run Adam over it (the same 30 bytes per parameter as on the GPU), and the updated
    16-bit weights come back, after the backward, with nothing to hide behind; offloaded
    weights are also fetched from the host for every micro batch's forward and backward."""
    share = L.optimizer_offload
    t = share * owned * ((L.grad_bytes + act) / HOST_LINK_BYTES_S + 30 / HOST_ADAM_BYTES_S)
    if L.param_offload:
        t += 2 * L.microbatches * owned * act / HOST_LINK_BYTES_S
    return t


#: HBM bytes per hidden element and token of the norms and residual adds around attention
#: and the MLP, forward and backward (2 x (4 + 7) each way; see predict)
_AROUND_BYTES = 44.0


@functools.lru_cache(maxsize=64)
def _flops(
    shape: Shape,
    causal: bool,
    recompute: bool,
    window: tuple[int, int] | None,
    window_skip: int | tuple[int, ...] | None,
) -> TokenFlops:
    return token_flops(
        shape, causal=causal, recompute=recompute, window=window, window_skip=window_skip
    )


@functools.lru_cache(maxsize=64)
def _parts(shape: Shape) -> Parts:
    return shape.pattern.parts(0, shape.layers)


def _attention_width(shape: Shape) -> float:
    """Output width of the attention projections (QKV, or MLA's up projections)."""
    latent = shape.latent
    if latent is not None:
        return shape.heads * (latent.qk_head + latent.rope_head + latent.qk_head + latent.v_head)
    return (shape.heads + 2 * shape.groups) * shape.kv_channels


def stage_params(shape: Shape, layout: Layout, stage_layers: int) -> tuple[float, float]:
    """(dense, expert) parameters one GPU of the heaviest stage holds."""
    h = shape.hidden
    width = 3 if shape.gated else 2
    parts = _parts(shape)
    layers = max(shape.layers, 1)
    attention, mamba = layer_weights(shape)
    mlp = width * h * shape.ffn
    dense = (attention * parts.attention + mamba * parts.mamba + mlp * parts.mlp) / layers
    routed_width = shape.moe_latent or h
    expert = shape.experts * shape.moe_ffn * width * routed_width * parts.moe / layers
    # the shared expert and the latent projections are replicated over ep like dense weights
    dense += (shape.shared_ffn * width * h + 2 * h * shape.moe_latent) * parts.moe / layers
    embedding = shape.vocab * h / layout.tp
    dense_gpu = dense / layout.tp * stage_layers + embedding
    return dense_gpu, expert / (layout.ep * layout.etp) * stage_layers


def gemm_precision(dtype: str | None, training: TrainingSetup) -> str:
    """The precision whose peak runs the GEMMs (:meth:`TrainingSetup.gemms_in`; fp16 runs
    at bf16's peak: :meth:`Accelerator.peak_tflops`)."""
    return training.gemms_in(dtype)


@attrs.frozen(kw_only=True)
class PlanInputs:
    """What the model reads of a compiled training plan: :func:`predict`'s arguments."""

    shape: Shape
    layout: Layout
    hardware: Accelerator
    nproc_per_node: int
    precision: str
    window: tuple[int, int] | None
    window_skip: int | tuple[int, ...] | None
    bf16_share: float

    def predict(
        self, constants: Constants = DEFAULT, *, causal: bool = True, count_recompute: bool = False
    ) -> Prediction:
        return predict(
            self.shape, self.layout, self.hardware, nproc_per_node=self.nproc_per_node,
            precision=self.precision, constants=constants, causal=causal,
            count_recompute=count_recompute, window=self.window, window_skip=self.window_skip,
            bf16_share=self.bf16_share,
        )  # fmt: skip


def plan_inputs(plan: Plan) -> PlanInputs | None:
    """The model's inputs for a compiled training plan whose accelerator model is known;
    None for serving plans, or without ``accelerator_model`` or a complete ``[model]``."""
    hw, model, batch, memory = plan.hardware, plan.model, plan.batch, plan.memory
    if hw is None or model is None or batch is None or memory is None:
        return None
    shape = resolve_shape(model)
    if shape is None:
        return None
    s, t = plan.sizes, plan.training
    # the heaviest stage sets the pace, which need not be the one memory is estimated for
    heaviest = plan.stages.heaviest_layers() if plan.stages else memory.stage_layers
    last = plan.stages.layers_of(s.pp - 1) if plan.stages else None
    return PlanInputs(
        shape=shape,
        layout=layout_of(s, batch, t, model.dtype, plan.layout.order, heaviest, last),
        hardware=hw,
        nproc_per_node=plan.nproc_per_node,
        precision=gemm_precision(model.dtype, t),
        window=model.window_size,
        window_skip=model.window_attn_skip_freq,
        bf16_share=bf16_share(shape, t, bf16_stage(s, t), heaviest),
    )


def predict_plan(plan: Plan) -> Prediction | None:
    """The prediction for a compiled training plan (the ``predicted`` block of ``mdc
    explain``); None where :func:`plan_inputs` is."""
    inputs = plan_inputs(plan)
    return None if inputs is None else inputs.predict()


# only read: no generated ==, hash or repr (start-up time)
@attrs.frozen(kw_only=True, eq=False, repr=False)
class _Recomputed:
    """The share of each term's forward work the backward pass runs again."""

    dense: float = 0.0  # the dense GEMMs
    experts: float = 0.0  # the routed experts' GEMMs (and their weights' reads)
    attention: float = 0.0
    elementwise: float = 0.0
    tp: float = 0.0  # tensor parallelism's forward collectives
    ep: float = 0.0  # the all-to-alls


def _recomputed(shape: Shape, L: Layout, stage_layers: int) -> _Recomputed:
    if L.recompute == "full":
        # block recomputes the first recompute_num_layers layers of each model chunk
        # (Megatron-Core's TransformerBlock is one chunk), as the memory estimate counts them
        chunk = math.ceil(stage_layers / L.vpp)
        count = chunk if L.recompute_layers is None else min(L.recompute_layers, chunk)
        share = min(count * L.vpp, stage_layers) / stage_layers
        return _Recomputed(
            dense=share, experts=share, attention=share, elementwise=share, tp=share, ep=share
        )
    if per_op.counts(shape, L.recompute, L.recompute_per_op):
        # the kept outputs (mdc.plan.per_op) are not run again; the column-parallel layers'
        # all-gathers are, their reduce-scatters not
        dense = per_op.recomputed_gemm_share(shape, _parts(shape), L.recompute_per_op_forced)
        return _Recomputed(dense=dense, experts=1.0, elementwise=1.0, tp=0.5)
    if L.recompute == "selective":  # Megatron-Core's recompute_modules (default: core_attn)
        modules = L.recompute_modules or ("core_attn",)
        rerun = tuple(name for module in modules for name in _MODULE_GEMMS.get(module, ()))
        described = rerun and per_op.describes(shape)
        dense = per_op.gemm_share(shape, _parts(shape), rerun) if described else 0.0
        moe = float("moe" in modules)  # the whole MoE layer: its experts and all-to-alls
        return _Recomputed(
            attention=float("core_attn" in modules), dense=dense, experts=moe, ep=moe
        )
    return _Recomputed()


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


def layout_of(
    sizes: Sizes,
    batch: BatchPlan,
    training: TrainingSetup,
    dtype: str | None,
    order: str,
    stage_layers: int,
    last_stage_layers: int | None,
) -> Layout:
    """What the model needs of a layout: its sizes, the micro batches as the pipeline
    schedule runs them, and how the launcher trains it."""
    s, t = sizes, training
    micro, microbatches = scheduled_micro_batches(batch, t, s.pp)
    runs = batch.grad_accum_steps if t.schedule_per_accumulation and s.pp > 1 else 1
    # layers of each model chunk recomputed whole: block's first n, or every n-th
    # (TorchTitan's selective_ac_option = n); None: all of them
    recomputed = None
    if t.recompute == "full" and t.recompute_method == "block":
        recomputed = t.recompute_num_layers
    elif t.recompute == "full" and t.recompute_every:
        recomputed = math.ceil(stage_layers / (s.vpp or 1)) // t.recompute_every
    return Layout(
        tp=s.tp, pp=s.pp, cp=s.cp, ep=s.ep, etp=s.etp, dp=s.dp, vpp=s.vpp or 1,
        micro_batch_size=micro, microbatches=microbatches, schedules=runs,
        sequence_parallel=t.sequence_parallel and s.tp > 1, recompute=t.recompute,
        recompute_layers=recomputed,
        recompute_per_op=t.recompute == "selective" and t.recompute_per_op,
        recompute_per_op_forced=tuple(t.recompute_per_op_forced),
        recompute_modules=None if t.recompute_modules is None else tuple(t.recompute_modules),
        zero_stage=t.zero_stage, grad_bytes=t.gradient_bytes(dtype) or 4,
        optimizer_offload=t.optimizer_offload, param_offload=t.param_offload,
        moe_capacity=t.moe_capacity_factor or 1.0,
        overlap_grad_reduce=t.overlap_grad_reduce, overlap_param_gather=t.overlap_param_gather,
        overlap_p2p=t.overlap_p2p,
        tp_comm_overlap=t.tp_comm_overlap and t.sequence_parallel and s.tp > 1,
        ep_comm_overlap=t.ep_comm_overlap and s.ep > 1,
        dispatcher=t.moe_dispatcher,
        stage_layers=stage_layers, order=order, last_stage_layers=last_stage_layers,
    )  # fmt: skip


def bf16_share(shape: Shape, training: TrainingSetup, stage: str, stage_layers: int) -> float:
    """The share of a stage's layers kept in bf16 under fp8 / fp4 training: the model's first
    layers sit on the first stage, its last ones on the last (only, with pp = 1: both)."""
    first, last = training.bf16_layers
    if not (first or last) or not stage_layers or not quantized(shape, training):
        return 0.0
    if stage == "only":
        return min(first + last, stage_layers) / stage_layers
    held = {"first": first, "last": last}.get(stage, 0)
    return min(held, stage_layers) / stage_layers


def bf16_stage(sizes: Sizes, training: TrainingSetup) -> str:
    """The stage whose bf16 layers (Megatron's --first-last-layers-bf16) slow it most: the
    only one, or the end of the model that keeps more of them in bf16."""
    first, last = training.bf16_layers
    if sizes.pp == 1:
        return "only"
    return "first" if first >= last else "last"
