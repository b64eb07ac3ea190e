"""The throughput model's inputs: its calibrated constants and what it reads of a layout.

The constants' values are the fit that docs/tune-model.md reports (bench/tune_fit.py); the
terms that read them are in :mod:`mdc.tune.terms`.
"""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class Constants:
    """The calibrated constants (defaults: the fit in docs/tune.md)."""

    #: share of the dense peak a large GEMM reaches
    gemm_peak: float = 0.6428
    #: token dimension (M) at which a GEMM's efficiency halves: d / (d + knee); also every
    #: dimension of the routed experts' grouped GEMMs, and FlashAttention's head dimension
    shape_knee: float = 380.5
    #: weight dimension (N, K) of a dense GEMM at which its efficiency halves, sharper:
    #: d^2 / (d^2 + knee^2), so a weight a few tiles wide runs near the peak
    width_knee: float = 840.9
    #: share of the bf16 dense peak FlashAttention reaches (forward and backward)
    attention_peak: float = 1.0
    #: query tokens per attention kernel (the sequence over cp) at which FlashAttention's
    #: efficiency halves: measured, not fitted (kernels.toml, docs/tune.md)
    attention_seq_knee: float = 234.0
    #: HBM bytes moved by elementwise kernels per activation byte Korthikanti counts
    elementwise: float = 2.101
    #: share of the scale-up link's rate NCCL's collectives reach (bus bandwidth over the
    #: line rate), measured: kernels.toml's [collective] (set, not fitted)
    link_share: float = 370 / 450  # NVLink 4: 370 of 450 GB/s
    #: share of a NIC's rate NCCL's collectives reach across nodes, measured likewise
    nic_share: float = 47 / 50  # NDR InfiniBand: 47 of 50 GB/s
    #: share of the forward tensor-parallel collectives not hidden behind GEMMs (the
    #: backward ones overlap the weight-gradient GEMM: see predict); set, not fitted: the
    #: measured rows leave it open (docs/tune.md), the recipes' own layouts pin it
    tp_exposed: float = 0.3
    #: share of an overlapped data-parallel collective's time the compute still loses
    #: (NCCL's channels occupy SMs and HBM bandwidth while the GEMMs run)
    overlap_tax: float = 0.2
    #: share of the expert all-to-all not hidden (overlap, node-limited routing, fp8 dispatch);
    #: with Megatron-Core's overlap_moe_expert_parallel_comm, of what the compute cannot hide
    ep_exposed: float = 1.0
    #: Megatron-Core's Mamba-2 layer (conv1d, SSD kernels, gated norm, forward and backward)
    #: over its work counted at the measured SSD kernels' and the HBM's rates (terms.mamba)
    mamba_overhead: float = 3.09
    #: share of NVFP4's measured GEMM level (terms.FP4_LEVEL) an FP4 GEMM of the layers
    #: reaches: the recipe's quantization around every GEMM (16-element blocks under two
    #: scales, random Hadamard transforms of the weight-gradient inputs, stochastically
    #: rounded gradients), which no kernel table here times
    fp4_peak: float = 0.8907
    #: microseconds each local expert costs per MoE layer and pass whatever its tokens (its
    #: two GEMMs in Transformer Engine's per-expert grouped GEMM): measured, not fitted
    #: (kernels.toml's [grouped_gemm], mdc.tune.kernels.expert_overhead_us)
    expert_overhead_us: float = 49.5

    def to_json(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in attrs.fields(Constants)}


DEFAULT = Constants()


#: cache_hash: the search looks each one up among its predictions, then stores it
@attrs.frozen(kw_only=True, cache_hash=True)
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
    #: group-limited routing as (groups, groups per token) (Megatron-Core's
    #: moe_router_num_groups, moe_router_group_topk); None: every expert open to every token
    router_groups: tuple[int, int] | None = None
    #: layers on the heaviest pipeline stage (None: ceil(layers / pp))
    stage_layers: int | None = None
    #: layers on the last pipeline stage, which also runs the output layer and the loss
    #: (None: stage_layers; fewer where the loss counts as a layer in the split)
    last_stage_layers: int | None = None
    order: str = "tp-cp-ep-dp-pp"
    #: elementwise operators run as eager PyTorch kernels (TrainingSetup.eager_kernels)
    eager: bool = False
    #: fp8 GEMMs cast by torchao's Float8Linear (TrainingSetup.float8_casts, fp8 only)
    float8_casts: bool = False
    #: bytes per element FSDP gathers the layers' weights in (embeddings and experts: 2)
    gather_bytes: float = 2.0
