"""One server of a serving deployment and what its steps cost: a decode step's roofline,
a prefill's compute, their collectives, and the engines' measured kernels (the Triton
fused-MoE kernel, block-scaled FP8 GEMMs, eager launches without CUDA graphs).
docs/tune-serving.md documents every term with its formula and source;
:mod:`mdc.tune.serving_perf` composes servers into a deployment's prediction."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from mdc.hardware import Accelerator
from mdc.plan.memory import GIB, Shape
from mdc.plan.memory.params import layer_params
from mdc.plan.serving_memory import (
    SGLANG_TIERS,
    ServingMemory,
    ServingSetup,
    estimate,
    leaves_reserve,
    weight_bytes,
)
from mdc.spec import WorkloadTable
from mdc.tune.flops import token_flops
from mdc.tune.records import DEFAULT as MEASURED
from mdc.tune.serving_records import PROFILING, Constants, Deployment, Role
from mdc.tune.terms import gemm_level, hbm_level, scale_up_domain

#: the Triton fused-MoE kernel's marginal rate at many tokens per expert, as a share of the
#: chip's peak at its measured GEMM level (kernels.toml's [[fused_moe]]: vLLM's
#: benchmark_moe timings; a test holds these equal to mdc.tune.kernels.fused_moe_shares())
FUSED_MOE_SHARE = {"bf16": 0.5287, "fp8": 0.1203}
#: seconds of one fused-MoE launch beyond its weight reads (kernels.toml's
#: [[fused_moe_launch]]: the kernel at one token less its top-k experts' bytes at the
#: measured HBM bandwidth; a test holds it equal to mdc.tune.kernels.fused_moe_fixed_s())
FUSED_MOE_FIXED_S = 29.49e-6
#: bytes/s one 128-column tile of a block-scaled FP8 GEMM streams at a few rows on Hopper
#: (kernels.toml's [block_fp8]; a test holds it equal to kernels.block_fp8_tile_rate())
BLOCK_FP8_TILE_BYTES_S = 27.06e9
#: the kernel's rows per tile (its M tile); its columns per tile are the weights' scale
#: block ([model] weight_block_size's first number), and each of the chip's multiprocessors
#: (the catalogue's count: 132 on the H100 SXM and H200) runs one tile at a time
BLOCK_FP8_ROWS = 128
#: microseconds of block-scaled FP8 GEMMs timed one shape at a time, by accelerator and
#: (N, K), at rising rows (kernels.toml's [[block_fp8_gemm]]: aiter's CK kernel on an MI300X;
#: a test holds it equal to kernels.block_fp8_measured_us())
BLOCK_FP8_MEASURED_US: dict[str, dict[tuple[int, int], tuple[tuple[int, float], ...]]] = {
    "mi300x": {
        (2112, 7168): (
            (1, 19.5004), (2, 19.598), (4, 19.7582), (8, 19.7611), (16, 19.9561),
            (32, 19.8079), (64, 19.1577), (128, 19.7518), (256, 26.7667), (512, 33.9281),
            (1024, 57.3845),
        ),
        (3072, 1536): (
            (1, 6.6154), (2, 6.62), (4, 6.6883), (8, 6.7342), (16, 6.7699), (32, 6.7891),
            (64, 6.6606), (128, 7.987), (256, 10.7777), (512, 16.2427), (1024, 25.1534),
        ),
        (7168, 2048): (
            (1, 10.1574), (2, 8.1045), (4, 8.1083), (8, 7.9481), (16, 8.3748), (32, 9.236),
            (64, 11.0504), (128, 13.4382), (256, 20.8989), (512, 33.2011), (1024, 56.4329),
        ),
        (512, 7168): (
            (1, 19.1052), (2, 19.1258), (8, 19.6018), (16, 19.5986), (32, 19.4961),
            (64, 18.6645), (128, 17.8143), (256, 18.2481), (512, 19.5102), (1024, 26.3785),
        ),
    }
}  # fmt: skip


@attrs.frozen(kw_only=True)
class Server:
    """One role's server, with what its steps cost."""

    role: Role
    shape: Shape
    hw: Accelerator
    dep: Deployment
    c: Constants
    #: per GPU: dense weight bytes, expert weight bytes, KV bytes per token
    dense_bytes: float
    expert_bytes: float
    kv_per_token: float
    #: sequences of input + output tokens the server's cache holds
    capacity_seqs: int
    memory_gib: float
    #: whether the engine's share leaves room for what it keeps outside it
    leaves_reserve: bool
    #: the serving memory estimate of one of its GPUs (what no room for a request shows)
    memory: ServingMemory
    #: forward FLOPs of one decoding token (at the mean context) and of one prompt token
    decode_flops: float
    prefill_flops: float
    #: of them, the attention kernel's FLOPs of one decoding token (run at the KV cache's
    #: precision; MLA in its absorbed form, as the kernels that read the latent cache run it)
    decode_attention_flops: float = 0.0
    #: of them, the experts' GEMM FLOPs of one token (the same decoding or prefilling)
    expert_flops: float = 0.0
    #: FLOP/s of the experts' GEMMs in the engine's fused-MoE kernel (0: they run with the
    #: other GEMMs; :func:`fused_moe_rate`)
    moe_rate: float = 0.0
    #: seconds of a step's fused-MoE launches beyond their reads (:func:`moe_launches`)
    moe_launches_s: float = 0.0
    #: seconds an eager step's host launches add (:func:`eager_launches`; 0 in CUDA graphs)
    eager_s: float = 0.0
    #: the stage's block-scaled FP8 GEMMs, (layers, column tiles, seconds a wave of tiles
    #: streams, seconds of the weights at the HBM rate, seconds of FLOPs per row)
    fp8_gemms: tuple[tuple[int, int, float, float, float], ...] = ()
    #: the tiles one wave of those GEMMs runs: the chip's multiprocessors
    fp8_wave: int = 1
    #: the stage's block-scaled FP8 GEMMs timed on this accelerator (:func:`measured_fp8_costs`)
    fp8_measured: tuple[tuple[int, tuple[tuple[int, float], ...], float, float], ...] = ()

    @property
    def max_batch(self) -> int:
        limit = self.role.max_batch or self.c.batch_limit(self.dep.launcher, self.hw)
        return min(limit * self.role.dp, self.capacity_seqs)

    @property
    def step_tokens(self) -> int:
        """The prompt tokens one step prefills: the engine's budget as the spec sets it,
        else the launcher's default."""
        return self.role.step_tokens or self.c.step_budget(self.dep.launcher, self.hw)

    def bandwidth(self) -> float:
        """Bytes/s of one GPU's link for this server's collectives."""
        inside = self.role.gpus <= scale_up_domain(self.hw, self.dep.nproc_per_node)
        return link_rate(self.hw, inside)

    def comm(self, tokens_per_group: float) -> float:
        """Seconds of one pass's all-reduces and all-to-alls for these tokens per group."""
        r, s = self.role, self.shape
        stage = self.shape.pattern.parts(0, -(-s.layers // r.pp))
        act = 2 * s.hidden * tokens_per_group
        t = 0.0
        if r.attn_tp > 1:
            n = r.attn_tp
            per = self.c.allreduce_latency_s + 2 * (n - 1) / n * act / self.bandwidth()
            t += 2 * stage.attention * per
        if r.ep > 1 and stage.moe:
            t += stage.moe * self.alltoall(tokens_per_group / r.attn_tp)
        if self.gathers_groups():
            # the MLP's input gathered from every group, its output reduced and scattered
            n = r.gpus // r.pp
            per = self.c.allreduce_latency_s + (n - 1) / n * act * r.dp / self.bandwidth()
            t += 2 * (stage.moe + stage.mlp) * per
        return t

    def gathers_groups(self) -> bool:
        """Whether the attention groups' tokens meet in one tensor-parallel MLP over the
        server: SGLang's DP attention and TensorRT-LLM's attention data parallel without
        expert parallel gather every group's hidden states before each MLP or MoE layer and
        reduce-scatter its output back (SGLang's dp_gather / dp_scatter); vLLM's
        data-parallel engines without expert parallel are replicas, each with its own MLP."""
        r = self.role
        return r.dp > 1 and r.ep == 1 and _moe_over_server(self.dep.launcher)

    def alltoall(self, tokens: float) -> float:
        """Seconds of one MoE layer's dispatch and combine of ``tokens`` tokens from one GPU:
        each token goes once to every other rank holding one of its top-k experts (the
        expected distinct ranks of k uniform draws over ep), dispatched in the checkpoint's
        weight bytes (DeepEP and TensorRT-LLM's all-to-all send FP8 or FP4 activations) and
        combined in bf16. Past the scale-up domain a token crosses the scale-out network once
        per other node (DeepEP's internode kernels forward inside the node over NVLink)."""
        ep, k = self.role.ep, self.shape.topk
        per_node = max(1, min(self.dep.nproc_per_node, self.hw.scale_up_domain))
        inside = ep <= scale_up_domain(self.hw, self.dep.nproc_per_node)
        peers = ep if inside else -(-ep // per_node)
        others = peers * (1 - (1 - 1 / peers) ** k) * (peers - 1) / peers
        per_token = self.shape.hidden * (float(weight_bytes(self.shape.dtype)) + 2)
        wire = tokens * per_token * others / link_rate(self.hw, inside)
        return 2 * self.c.alltoall_latency_s + wire

    def decode_parts(self, batch: float, context: float) -> tuple[float, float, float]:
        """(HBM, compute, communication) seconds of one decode step at ``batch``: every
        stage in turn, each on its micro-batch of ``batch / pp`` (a token passes every
        stage, so pipeline stages add up: the bubble of a decode step)."""
        r = self.role
        micro = batch / r.dp / r.pp  # one attention group's tokens in one stage's turn
        bytes_read = self.dense_bytes + self.expert_bytes * self.touched(micro)
        bytes_read += micro * context * self.kv_per_token
        hbm = bytes_read / self.hbm_rate()
        # each GPU computes its group's tokens on its stage's layers: 1 / (attn_tp x pp)
        share = micro / (r.attn_tp * r.pp)
        grouped = self.moe_rate
        experts = self.expert_flops if grouped else 0.0
        dense = self.decode_flops - self.decode_attention_flops - experts
        attention = self.decode_attention_flops * share / self._attention_peak()
        compute = (dense * share / self._peak() + attention) / self.c.decode_efficiency
        if grouped:
            compute += experts * share / grouped
        return r.pp * hbm, r.pp * compute, r.pp * self.comm(micro)

    def touched(self, tokens: float) -> float:
        """The share of a stage's experts a step reads when one attention group routes
        ``tokens`` tokens (every group's with expert parallel, or where the groups' tokens
        meet in one MoE: :meth:`gathers_groups`): the expected distinct experts of that
        many uniform top-k draws, ``1 - (1 - k / E)^T``."""
        r, s = self.role, self.shape
        if not s.experts:
            return 1.0
        routed = tokens * r.dp if r.ep > 1 or self.gathers_groups() else tokens
        miss: float = (1.0 - s.topk / s.experts) ** max(routed, 1.0)
        return 1.0 - miss

    def chunk_reads(self, batch: float, chunk: float) -> float:
        """Seconds of the expert reads a prompt chunk adds to a decode step at ``batch``:
        the step routes the chunk's tokens with the batch's, so it reads the experts they
        touch too (a MoE model's prompt of a few hundred tokens touches nearly all)."""
        r = self.role
        micro = batch / r.dp / r.pp
        more = self.touched(micro + chunk / r.dp) - self.touched(micro)
        return r.pp * self.expert_bytes * more / self.hbm_rate()

    def mixes_prompts(self) -> bool:
        """Whether the engine runs prompt chunks in its decode steps: vLLM V1 (decode
        tokens first, then prompts up to max_num_batched_tokens) and TensorRT-LLM's
        in-flight batching do; SGLang runs a prefill batch alone while prompts wait and
        decodes in the steps between (its --enable-mixed-chunk is off unless set)."""
        return not self.dep.launcher.startswith("sglang")

    def prompt_steps(self, batch: float, prompt: int, context: float) -> tuple[float, float]:
        """(seconds of a prompt's own steps, seconds of them the prompt adds to the
        decode) at a running batch: mixed in, each chunk's step is the batch's decode and
        the chunk's compute or the experts its tokens add to the step's reads, whichever is
        longer; alone, the prompt's prefill steps (:meth:`prefill`), all of them its own."""
        if not self.mixes_prompts():
            alone = self.prefill(prompt, prompt)
            return alone, alone
        chunks = max(1, math.ceil(prompt / self.step_tokens))
        chunk = min(prompt, self.step_tokens)
        added = chunks * max(self.prefill_compute(chunk, prompt), self.chunk_reads(batch, chunk))
        return chunks * self.decode_step(batch, context) + added, added

    def decode_step(self, batch: float, context: float) -> float:
        """Seconds of one decode step at ``batch``: the roofline, the collectives, the
        engine's per-step overhead and its host work for each request of an attention
        group (each group's engine process does its own)."""
        hbm, compute, comm = self.decode_parts(batch, context)
        launcher = self.dep.launcher
        host = batch / self.role.dp * self.c.request_overhead(launcher)
        kernels = self.fused_moe_fixed() + self.block_fp8_tiles(batch) + self.eager(batch)
        return max(hbm, compute) + comm + kernels + self.c.overhead(launcher) + host

    def eager(self, batch: float) -> float:
        """Seconds of eager launches a step at ``batch`` adds: every step without CUDA
        graphs, and a step past the engine's largest captured batch."""
        limit = self.dep.graph_batch
        if limit is None:
            limit = graph_limit(self.dep.launcher, self.hw, self.role.attn_tp)
        if self.dep.cuda_graphs and (limit is None or batch / self.role.dp <= limit):
            return 0.0
        return self.eager_s

    def fused_moe_fixed(self) -> float:
        """Seconds a step's fused-MoE launches take beyond their weight reads (vLLM's and
        SGLang's Triton kernel: its routing sort, two grouped GEMMs, activation and sum),
        the measured one-token launch less its reads, once per MoE layer of every stage."""
        return self.moe_launches_s

    def block_fp8_tiles(self, batch: float) -> float:
        """Seconds a step's block-scaled FP8 GEMMs take beyond their roofline: on Hopper
        (:func:`block_fp8_costs`) ``ceil(rows / 128)`` tiles per scale block of columns, one
        wave of the chip's multiprocessors at a time, each streaming its block x K weights at
        the measured tile rate; where the kernel was timed shape by shape
        (:func:`measured_fp8_costs`: an MI300X), its measured time at the step's rows."""
        if not (self.fp8_gemms or self.fp8_measured):
            return 0.0
        r = self.role
        rows = batch / r.dp / r.pp
        row_tiles = math.ceil(rows / BLOCK_FP8_ROWS)
        total = 0.0
        for count, col_tiles, per_wave, read, flops in self.fp8_gemms:
            waves = math.ceil(row_tiles * col_tiles / self.fp8_wave)
            total += count * max(0.0, waves * per_wave - max(read, rows * flops))
        for count, points, read, flops in self.fp8_measured:
            total += count * max(0.0, measured_gemm_s(points, rows) - max(read, rows * flops))
        return r.pp * total

    def prefill_compute(self, tokens: float, prompt: int) -> float:
        """Seconds of the FLOPs (and communication) of ``tokens`` prompt tokens."""
        grouped = self.moe_rate
        experts = self.expert_flops if grouped else 0.0
        flops = (self.prefill_flops - experts) * tokens / self.role.gpus
        compute = flops / (self._peak() * self.c.prefill_efficiency)
        if grouped:
            compute += experts * tokens / self.role.gpus / grouped
        return compute + self.comm(tokens / self.role.dp)

    def prefill(self, tokens: float, prompt: int) -> float:
        """Seconds one server takes to prefill ``tokens`` prompt tokens alone."""
        weights = (self.dense_bytes + self.expert_bytes) * self.role.pp
        read = weights / self.hbm_rate()
        steps = max(1, math.ceil(tokens / self.step_tokens))
        overhead = steps * self.c.overhead(self.dep.launcher)
        return max(self.prefill_compute(tokens, prompt), steps * read) + overhead

    def hbm_rate(self) -> float:
        return hbm_rate(self.hw, self.c)

    def _attention_peak(self) -> float:
        """The decode attention kernel's peak: an fp8 KV cache's fp8 (FlashMLA, TensorRT-LLM's
        and FlashInfer's FP8 kernels), else bf16; at the measured GEMM level."""
        kv = self.dep.kv_dtype if self.dep.kv_dtype in self.hw.dense_tflops else "bf16"
        kv = "fp8" if kv == "fp8" else "bf16"
        return self.hw.peak_tflops(kv) * 1e12 * gemm_level(self.hw, kv)

    def _peak(self) -> float:
        return gemm_peak(self.shape, self.hw)


def hbm_rate(hw: Accelerator, c: Constants) -> float:
    """Bytes/s a decode step reads: the catalogue's bandwidth at the accelerator's measured
    HBM level (BabelStream, relative to the H100's) times the fitted e_hbm."""
    return hw.memory_bandwidth_gb_s * hbm_level(hw) * 1e9 * c.hbm_efficiency


def gemm_peak(shape: Shape, hw: Accelerator) -> float:
    """The GEMMs' peak: an fp8 checkpoint's fp8, an fp4 one's fp4 where the chip has FP4
    tensor cores (else its bf16: the 4-bit weights widened, as on Hopper), else bf16; at the
    accelerator's measured GEMM level in it (kernels.toml's [gemm], relative to the H100's
    bf16)."""
    dtype = shape.dtype if shape.dtype in ("fp8", "fp4") else "bf16"
    precision = dtype if dtype in hw.dense_tflops else "bf16"
    return hw.peak_tflops(dtype) * 1e12 * gemm_level(hw, precision)


def moe_launches(shape: Shape, pp: int, moe_rate: float) -> float:
    """Seconds of a step's fused-MoE launches beyond their reads: FUSED_MOE_FIXED_S for
    each MoE layer of every stage where the engine runs the Triton kernel (``moe_rate``);
    not for FP4 experts, whose weight-only kernels' launches are not measured."""
    if not moe_rate or shape.dtype == "fp4":
        return 0.0
    return pp * shape.pattern.parts(0, -(-shape.layers // pp)).moe * FUSED_MOE_FIXED_S


def block_fp8_costs(
    shape: Shape, hw: Accelerator, tp: int, pp: int, rates: tuple[float, float]
) -> tuple[tuple[int, int, float, float, float], ...]:
    """What each block-scaled FP8 GEMM of a stage costs on Hopper: (layers, column tiles,
    seconds a wave of tiles streams, seconds of its weights at the HBM rate, seconds of its
    FLOPs per row at the decode GEMMs' rate). A GEMM of N columns runs ceil(N / block) tiles
    per 128 rows (``block`` the weights' scale block in N, [model] weight_block_size's
    first number), one per multiprocessor, each streaming its block x K weights at the
    measured tile rate, so a narrow GEMM at a few rows reads its weights on a few SMs. Only
    checkpoints whose weights are scaled in blocks (DeepSeek-V3/R1, Qwen3's -FP8), on a
    Hopper whose multiprocessors the catalogue counts; the experts' GEMMs are the fused-MoE
    kernel's. Empty elsewhere."""
    if shape.weight_block is None or shape.dtype != "fp8" or not _hopper(hw):
        return ()
    if not hw.multiprocessors:
        return ()
    hbm, peak = rates
    block = shape.weight_block[0]
    stage = shape.pattern.parts(0, -(-shape.layers // pp))
    return tuple(
        (
            count,
            math.ceil(n / block),
            block * k / BLOCK_FP8_TILE_BYTES_S,
            n * k / hbm,
            2 * n * k / peak,
        )
        for count, gemms in block_fp8_gemms(shape, tp, stage)
        for n, k in gemms
        if count
    )


def measured_fp8_costs(
    shape: Shape, hw: Accelerator, tp: int, pp: int, rates: tuple[float, float]
) -> tuple[tuple[int, tuple[tuple[int, float], ...], float, float], ...]:
    """The stage's block-scaled FP8 GEMMs whose kernel was timed on this accelerator, shape by
    shape (BLOCK_FP8_MEASURED_US: aiter's CK kernel on an MI300X, which vLLM and SGLang run
    for such a checkpoint with aiter on; without it their Triton kernel, not timed there):
    (layers, the measured (rows, microseconds), seconds of the weights at the HBM rate,
    seconds of the FLOPs per row at the decode GEMMs' rate). GEMMs of a shape not timed add
    nothing; nor do per-tensor FP8 or unquantized checkpoints."""
    measured = BLOCK_FP8_MEASURED_US.get(hw.id)
    if not measured or shape.weight_block is None or shape.dtype != "fp8":
        return ()
    hbm, peak = rates
    stage = shape.pattern.parts(0, -(-shape.layers // pp))
    return tuple(
        (count, measured[(n, k)], n * k / hbm, 2 * n * k / peak)
        for count, gemms in block_fp8_gemms(shape, tp, stage)
        for n, k in gemms
        if count and (n, k) in measured
    )


def measured_gemm_s(points: Sequence[tuple[int, float]], rows: float) -> float:
    """Seconds of a timed GEMM at ``rows``: between two measured row counts the straight line
    through them, below the first its time (a GEMM at fewer rows runs the same kernel), past
    the last its time per row (the GEMM's FLOPs lead there)."""
    first, last = points[0], points[-1]
    if rows <= first[0]:
        return first[1] * 1e-6
    if rows >= last[0]:
        return last[1] * 1e-6 * rows / last[0]
    for (m0, t0), (m1, t1) in itertools.pairwise(points):
        if rows <= m1:
            return (t0 + (t1 - t0) * (rows - m0) / (m1 - m0)) * 1e-6
    raise AssertionError("unreachable: rows below the last point")


def link_rate(hw: Accelerator, scale_up: bool) -> float:
    """Bytes/s one GPU's collectives reach over its scale-up link or its scale-out NIC: the
    line rate times NCCL's measured bus bandwidth over it, the training model's own shares
    (``link_share``, ``nic_share``: kernels.toml's [collective])."""
    if scale_up:
        return hw.scale_up_gb_s * 1e9 * MEASURED.link_share
    return hw.scale_out_gb_s * 1e9 * MEASURED.nic_share


def server_of(
    role: Role, shape: Shape, hw: Accelerator, dep: Deployment, w: WorkloadTable, c: Constants
) -> Server:
    tp, pp = role.attn_tp, role.pp
    ep = role.ep
    etp = max(1, role.gpus // (pp * ep)) if ep > 1 or _moe_over_server(dep.launcher) else tp
    setup = ServingSetup(
        engine=dep.launcher,
        tp=tp,
        pp=pp,
        ep=ep,
        etp=etp,
        share=role.share if role.share is not None else dep.share,
        kv_dtype=dep.kv_dtype,
        share_of="free" if dep.share_of == "free" else "capacity",
        profiled_tokens=(
            role.step_tokens or c.step_budget(dep.launcher, hw)
            if dep.launcher in PROFILING
            else None
        ),
        # the step whose activations SGLang keeps outside its share (its budget, or its own)
        step_tokens=role.step_tokens,
    )
    memory = estimate(shape, setup, dep.capacity_gib)
    params = layer_params(shape, 0, -(-shape.layers // pp), tp, ep, etp)
    expert_bytes = float(params.expert * weight_bytes(shape.dtype))
    dense = memory.weights - expert_bytes
    per_seq = w.input_tokens + w.output_tokens
    groups = role.dp
    moe_rate = fused_moe_rate(shape, hw, dep.launcher, role.ep)
    rates = (hbm_rate(hw, c), gemm_peak(shape, hw) * c.decode_efficiency)
    return Server(
        role=role,
        shape=shape,
        hw=hw,
        dep=dep,
        c=c,
        dense_bytes=max(0.0, dense),
        expert_bytes=expert_bytes,
        kv_per_token=float(memory.kv_per_token),
        capacity_seqs=groups * memory.tokens // per_seq,
        memory_gib=(memory.weights + memory.workspace + memory.cache) / GIB,
        leaves_reserve=leaves_reserve(memory),
        memory=memory,
        decode_flops=_forward_flops(shape, int(mean_context(w)), causal=False),
        decode_attention_flops=_decode_attention_flops(shape, mean_context(w)),
        expert_flops=token_flops(attrs.evolve(shape, seq=1), causal=False).expert_gemm / 3,
        moe_rate=moe_rate,
        moe_launches_s=moe_launches(shape, pp, moe_rate),
        eager_s=eager_launches(shape),
        fp8_gemms=block_fp8_costs(shape, hw, tp, pp, rates),
        fp8_wave=hw.multiprocessors or 1,
        fp8_measured=measured_fp8_costs(shape, hw, tp, pp, rates),
        prefill_flops=_forward_flops(shape, w.input_tokens, causal=True),
    )


#: seconds a decode step without CUDA graphs spends beyond one in them, per layer, at one
#: request (sgl-project/sglang#1401, SGLang's bench_latency at batch 1 with and without
#: --disable-cuda-graph, Triton attention): a dense layer (Llama 3 8B, 9.28 against 7.06 ms
#: a token over 32 layers); a MoE layer (DeepSeek-Coder-V2-Lite: 6.22 ms a token in
#: graphs, "4x" without, its 26 MoE layers taking the rest of 3 x 6.22 ms beside its one
#: dense layer)
EAGER_LAYER_S = {"dense": (9.28 - 7.06) * 1e-3 / 32, "moe": (3 * 6.22e-3 - 2.22e-3 / 32) / 26}


def graph_limit(launcher: str, hw: Accelerator, tp: int) -> int | None:
    """The largest decode batch an engine captures a CUDA graph for by default: vLLM 512,
    SGLang its --cuda-graph-max-bs tier; None: not bounded here (TensorRT-LLM's launcher
    states its own, defaults included: ServingSetup.graph_batch)."""
    if launcher.startswith("vllm"):
        return 512
    if launcher.startswith("sglang"):
        mib = hw.memory_gib * 1024
        _, _, small, large = next(t for t in SGLANG_TIERS if mib < t[0])
        return small if tp < 4 else large
    return None


def eager_decode(dep: Deployment, hw: Accelerator, batch: Mapping[str, int]) -> str | None:
    """Why the decode servers' steps at their running batch run without CUDA graphs (the
    eager term), for ``mdc explain``; None where they replay one."""
    role = dep.roles[-1]
    if not dep.cuda_graphs:
        return "its CUDA graphs off"
    limit = dep.graph_batch
    if limit is None:
        limit = graph_limit(dep.launcher, hw, role.attn_tp)
    per_rank = batch.get(role.name, 0) / role.dp
    if limit is None or per_rank <= limit:
        return None
    return f"{per_rank:,.0f} requests a rank, past the {limit} its CUDA graphs replay"


def eager_launches(shape: Shape) -> float:
    """Seconds an eager decode step adds over one in CUDA graphs (:data:`EAGER_LAYER_S`,
    each layer by its kind, every stage's): the host launches each kernel one by one, and
    the measured difference is added whole, as measured at one request (no term hides it
    behind the GPU's work at larger batches)."""
    parts = shape.pattern.parts(0, shape.layers)
    moe = parts.moe
    return moe * EAGER_LAYER_S["moe"] + (shape.layers - moe) * EAGER_LAYER_S["dense"]


def fused_moe_rate(shape: Shape, hw: Accelerator, launcher: str, ep: int) -> float:
    """FLOP/s of the experts' GEMMs where the engine runs them in its Triton fused-MoE
    kernel (vLLM; SGLang without DeepEP's expert parallel): its measured rate as a share of
    the chip's peak at its measured GEMM level in the checkpoint's precision (kernels.toml's
    [[fused_moe]]). An FP4 checkpoint's experts on a chip without FP4 tensor cores run
    there in bf16 too: vLLM's MXFP4 MoE is weight-only below Blackwell (Marlin under compute
    capability 9, OpenAI's Triton matmul_ogs on Hopper), widening the 4-bit weights to bf16
    in a grouped GEMM, so the bf16 kernel's measured share stands for it. 0 elsewhere, their
    GEMMs counted with the others: TensorRT-LLM's own MoE kernels, SGLang's DeepEP and
    DeepGEMM, and FP4 experts on FP4 tensor cores (not measured)."""
    if not shape.experts or (shape.dtype == "fp4" and "fp4" in hw.dense_tflops):
        return 0.0
    if not (launcher.startswith("vllm") or (launcher.startswith("sglang") and ep == 1)):
        return 0.0
    dtype = "fp8" if shape.dtype == "fp8" and "fp8" in hw.dense_tflops else "bf16"
    return hw.peak_tflops(dtype) * 1e12 * gemm_level(hw, dtype) * FUSED_MOE_SHARE[dtype]


def _hopper(hw: Accelerator) -> bool:
    """An NVIDIA Hopper GPU (compute capability 9.x; ROCm reports the MI300X as 9.4 too)."""
    return hw.vendor.lower() == "nvidia" and hw.arch_major == 9


def block_fp8_gemms(shape: Shape, tp: int, stage: Any) -> list[tuple[int, list[tuple[int, int]]]]:
    """[(layers, [(N, K) of each block-scaled GEMM one GPU runs in such a layer])] of a
    stage: every attention layer's projections, the dense MLP layers' and the MoE layers'
    shared expert's gate/up and down projections (over ``tp``). Multi-latent attention: the
    fused q/kv down-projection (replicated: N = q_lora + kv_lora + rope), query up-projection
    and output projection (over ``tp``; the absorbed attention's matmuls run in bf16);
    grouped attention: the fused QKV projection (each GPU's heads and at least one KV
    group, replicated when tp passes the groups) and the output projection."""
    h, heads = shape.hidden, shape.heads
    lat = shape.latent
    if lat is not None:
        q_width = heads * (lat.qk_head + lat.rope_head) // tp
        attention = [(lat.q_lora + lat.kv_lora + lat.rope_head, h), (q_width, lat.q_lora or h)]
        attention.append((h, heads * lat.v_head // tp))
    else:
        d = shape.kv_channels
        qkv = (heads // tp + 2 * max(1, shape.groups // tp)) * d
        attention = [(qkv, h), (h, heads * d // tp)]
    up = 2 if shape.gated else 1

    def mlp(width: int) -> list[tuple[int, int]]:
        return [(up * width // tp, h), (h, width // tp)]

    out = [(stage.attention, attention), (stage.mlp, mlp(shape.ffn))]
    if shape.shared_ffn:
        out.append((stage.moe, mlp(shape.shared_ffn)))
    return out


def _moe_over_server(launcher: str) -> bool:
    """Whether the experts split over the whole server's GPUs without expert parallel:
    TensorRT-LLM's and SGLang's attention data parallel keeps the MoE tensor parallel over
    the server (moe_tensor_parallel_size, --tp-size); vLLM's data-parallel engines without
    expert parallel are replicas, each with its own copy over its tp GPUs."""
    return not launcher.startswith("vllm")


def _decode_attention_flops(shape: Shape, context: float) -> float:
    """The attention kernel's FLOPs of one decoding token over ``context`` keys: scores and
    values per head; multi-latent attention in its absorbed form (each head scores the
    latent and rope dims of every cached token and sums the latent: 2 x keys x heads x
    (2 kv_lora + rope)), else token_flops' attention (its forward third)."""
    layers = shape.pattern.parts(0, shape.layers).attention
    latent = shape.latent
    if latent is not None:
        return 2.0 * context * shape.heads * (2 * latent.kv_lora + latent.rope_head) * layers
    f = token_flops(attrs.evolve(shape, seq=max(1, int(context))), causal=False)
    return f.attention / 3


def _forward_flops(shape: Shape, context: int, causal: bool) -> float:
    """Forward FLOPs of one token that attends to ``context`` keys (half of them with
    ``causal``: a prompt's tokens on average)."""
    f = token_flops(attrs.evolve(shape, seq=max(1, context)), causal=causal)
    return f.total / 3  # training's count is three passes


def mean_context(w: WorkloadTable) -> float:
    """The mean context a decoding sequence attends to."""
    return w.input_tokens + w.output_tokens / 2
