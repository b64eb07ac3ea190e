"""The serving memory check: weights and KV cache of one server's GPU.

A serving engine keeps ``share`` of each GPU's memory (vLLM ``--gpu-memory-utilization``,
default 0.9 in ``vllm/config/cache.py``; SGLang ``--mem-fraction-static``, where not given
the share SGLang picks itself for the server, :func:`sglang_shares`) for the weights and
the KV cache. Per GPU of the heaviest pipeline stage:

* weights: the stage's layers split over tp (experts over ep, each split over etp), the
  embedding on the first stage and the output layer on the last; ``dtype`` fp8 weights
  take one byte; an fp4 checkpoint's (NVFP4: 4-bit values under an FP8 scale per 16, so
  9/16 byte; MXFP4's 8-bit scale per 32 takes less) layers take 9/16 byte and its
  embedding and output layer, which the checkpoints keep unquantized, two;
* KV cache per token: per attention layer of the stage, 2 x the KV heads one tp rank holds
  (at least one: a head is replicated when there are fewer than tp) x head_dim bytes, or
  with multi-latent attention the compressed ``kv_lora_rank + qk_pos_emb_head_dim`` per
  token, which every tp rank holds; in the KV dtype (``fp8``: one byte; ``auto``: the
  activations', bf16 for an fp8 or fp4 checkpoint);
* a step's activations, where the engine profiles a step before it sizes its cache (vLLM
  runs ``--max-num-batched-tokens`` dummy tokens, TensorRT-LLM ``max_num_tokens``, and take
  the peak out of the cache; SGLang's ``--mem-fraction-static`` holds weights and cache
  only): per token the MLP's gate/up output and its activated product (``3 F``, ``F`` the
  widest MLP intermediate one GPU holds per token) beside the residual and the normed input
  (``2 hidden``), in bf16: ``tokens x (2 hidden + 3 F) x 2`` bytes (:func:`step_workspace`);
* the cache: ``share x capacity - weights - activations``, an upper bound (CUDA graphs
  and non-torch memory take some of it), in tokens and in sequences of ``max_model_len``;
* what the engine keeps outside its share (:func:`leaves_reserve`): the CUDA context and
  the CUDA graphs it captures after sizing the cache (SGLang also a step's activations),
  which a share raised by ``mdc tune`` must leave room for; SGLang's own rule for the share
  it picks when not told (:func:`sglang_default_share`), which the estimate takes where
  the spec sets none and ``mdc tune`` never exceeds.

Only the weights can make it an error (MDC280: they exceed the whole GPU); a cache that
cannot hold one full-length sequence is a warning (MDC281), since the estimate leaves the
engine's own profiling out.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Literal

import attrs

from mdc.errors import Finding, Severity
from mdc.plan.architecture import Parts
from mdc.plan.memory.params import embedding_params, layer_params, split_width
from mdc.plan.memory.records import GIB, Shape, gib

#: bytes per element of weights / KV cache by dtype name
DTYPE_BYTES = {
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "half": 2,
    "fp32": 4,
    "float32": 4,
    "float": 4,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}


def weight_bytes(dtype: str) -> Fraction:
    """Bytes per weight of the transformer layers of a checkpoint in ``dtype``."""
    return FP4_LAYER_BYTES if dtype == "fp4" else Fraction(DTYPE_BYTES.get(dtype, 2))


#: an fp4 checkpoint's layers: NVFP4 packs 16 4-bit values under one FP8 scale
FP4_LAYER_BYTES = Fraction(9, 16)


@attrs.frozen(kw_only=True)
class StepLimits:
    """An engine's per-step limits where the spec sets them, per attention group (a vLLM
    engine, an SGLang or TensorRT-LLM attention data-parallel rank)."""

    #: requests running at once (vLLM --max-num-seqs, SGLang --max-running-requests,
    #: TensorRT-LLM max_batch_size)
    max_batch: int | None = None
    #: tokens one step takes, prompt chunks included (vLLM --max-num-batched-tokens,
    #: SGLang --chunked-prefill-size, TensorRT-LLM max_num_tokens)
    step_tokens: int | None = None
    #: the role's engine memory share (vLLM --gpu-memory-utilization, SGLang
    #: --mem-fraction-static, TensorRT-LLM free_gpu_memory_fraction), where it has its own
    share: float | None = None
    #: the role's servers as SGLang's automatic share reads them, where the spec leaves the
    #: share to SGLang: the estimate sets ``share`` to the one SGLang picks
    #: (:func:`sglang_default_share`)
    sglang: SglangServer | None = None


@attrs.frozen(kw_only=True)
class ServingSetup:
    """What a serving launcher tells the check about one server and its engine."""

    #: "vLLM" or "SGLang", for messages
    engine: str
    tp: int
    pp: int = 1
    #: experts split over ep ranks, each expert over etp
    ep: int = 1
    etp: int = 1
    #: the engine's share of each GPU's memory, and where it came from
    share: float = 0.9
    share_source: str = "vLLM's default --gpu-memory-utilization"
    #: KV cache dtype ("auto": the weights')
    kv_dtype: str = "auto"
    #: the longest sequence (None: [model] seq_length)
    max_len: int | None = None
    #: what ``share`` is a share of: the whole GPU ("capacity": vLLM, SGLang), or what the
    #: weights leave ("free": TensorRT-LLM's free_gpu_memory_fraction, KvCacheConfig)
    share_of: Literal["capacity", "free"] = "capacity"
    #: the engine's limit on requests running at once, where the spec sets it (TensorRT-LLM
    #: max_batch_size): what mdc tune's serving model takes as the running batch's bound
    max_batch: int | None = None
    #: the engine's per-step token budget, where the spec sets it (:class:`StepLimits`)
    step_tokens: int | None = None
    #: a disaggregated job's limits per role ("prefill", "decode"), where the spec sets them
    roles: Mapping[str, StepLimits] = attrs.field(factory=dict)
    #: the tokens of the step the engine profiles before it sizes its KV cache (vLLM,
    #: TensorRT-LLM: the step budget, as set or by default); None: the engine's share
    #: leaves the activations out (SGLang)
    profiled_tokens: int | None = None
    #: the server as SGLang's automatic share reads it, where the spec leaves the share to
    #: SGLang: the estimate takes the one SGLang picks (:func:`sglang_default_share`) for
    #: ``share``, not the share written here
    sglang: SglangServer | None = None
    #: whether the engine decodes in captured CUDA graphs: False where the spec turns them
    #: off (vLLM --enforce-eager, SGLang --disable-cuda-graph, TensorRT-LLM's
    #: cuda_graph_config null)
    cuda_graphs: bool = True
    #: the largest decode batch, per rank, that runs in a CUDA graph, where the spec sets it
    #: (SGLang --cuda-graph-max-bs, the largest of --cuda-graph-bs; TensorRT-LLM's
    #: cuda_graph_config, its defaults included); larger steps run eager
    graph_batch: int | None = None


@attrs.frozen(kw_only=True)
class ServingMemory:
    """One server GPU's memory, in bytes."""

    engine: str
    capacity: int
    share: float
    share_source: str
    weights: int
    kv_per_token: int
    kv_dtype: str
    cache: int
    share_of: str
    tokens: int
    max_len: int
    sequences: int
    max_batch: int | None = None
    step_tokens: int | None = None
    roles: Mapping[str, StepLimits] = attrs.field(factory=dict)
    #: the profiled step's activations (bytes), taken out of the cache
    workspace: int = 0
    #: what the share leaves the cache (bytes), below 0 where the weights and activations
    #: alone overfill it (``cache`` is it, at least 0)
    room: int = 0
    profiled_tokens: int | None = None
    #: what the engine keeps outside its share (bytes): CUDA context and graphs, and an
    #: SGLang step's activations (:func:`leaves_reserve`)
    reserve: int = 0
    #: the roles ("server", "prefill", "decode") whose share SGLang picks itself
    picked: frozenset[str] = frozenset()
    #: the setup's :attr:`ServingSetup.cuda_graphs` and ``graph_batch``, for the serving model
    cuda_graphs: bool = True
    graph_batch: int | None = None


def estimate(shape: Shape, setup: ServingSetup, capacity_gib: float) -> ServingMemory:
    picked = _picked(setup)
    setup = sglang_shares(shape, setup, capacity_gib)
    tp, pp = setup.tp, max(1, setup.pp)
    per_stage = -(-shape.layers // pp)
    layer_bytes = weight_bytes(shape.dtype)
    # an fp4 checkpoint keeps its embedding and output layer in bf16
    end_bytes = 2 if shape.dtype == "fp4" else layer_bytes
    output = 0 if shape.tied and pp == 1 else split_width(shape.vocab, tp) * shape.hidden
    ends = (
        [embedding_params(shape, tp) + output] if pp == 1 else [embedding_params(shape, tp), output]
    )
    starts = [0] if pp == 1 else [0, shape.layers - per_stage]
    weights, kv = 0, 0
    # "auto" caches in the activations' dtype: an fp8 checkpoint still computes in bf16
    auto = "bf16" if shape.dtype in ("fp8", "fp4") else shape.dtype
    kv_dtype = setup.kv_dtype if setup.kv_dtype != "auto" else auto
    kv_bytes = DTYPE_BYTES.get(kv_dtype, DTYPE_BYTES.get(shape.dtype, 2))
    for start, end in zip(starts, ends, strict=True):
        stop = min(shape.layers, start + per_stage)
        params = layer_params(shape, start, stop, tp, setup.ep, setup.etp)
        stage = int((params.dense + params.expert) * layer_bytes + end * end_bytes)
        weights = max(weights, stage)
        parts: Parts = shape.pattern.parts(start, stop)
        kv = max(kv, parts.attention * kv_per_layer(shape, tp) * kv_bytes)
    capacity = int(capacity_gib * GIB)
    share = Fraction(setup.share).limit_denominator(1000)
    workspace = 0
    if setup.profiled_tokens is not None:
        workspace = step_workspace(shape, setup.profiled_tokens, tp, setup.ep, setup.etp)
    if setup.share_of == "free":
        room = int(share * (capacity - weights - workspace))
    else:
        room = int(share * capacity) - weights - workspace
    cache = max(0, room)
    reserve = outside_share(shape, setup)
    tokens = cache // kv if kv else 0
    max_len = setup.max_len or shape.seq
    return ServingMemory(
        engine=setup.engine,
        capacity=capacity,
        share=setup.share,
        share_source=setup.share_source,
        weights=weights,
        kv_per_token=kv,
        kv_dtype=kv_dtype,
        cache=cache,
        room=room,
        share_of=setup.share_of,
        tokens=tokens,
        max_len=max_len,
        sequences=tokens // max_len if max_len else 0,
        max_batch=setup.max_batch,
        step_tokens=setup.step_tokens,
        roles=_own_limits(setup),
        workspace=workspace,
        profiled_tokens=setup.profiled_tokens,
        reserve=reserve,
        picked=picked,
        cuda_graphs=setup.cuda_graphs,
        graph_batch=setup.graph_batch,
    )


#: GiB an engine's process holds before it sizes its share: the CUDA context and the
#: libraries' handles (vLLM's startup log in vllm-project/vllm#21489: 177.66 of 178.36 GiB
#: free on a GPU of 178.36 when the engine starts)
CUDA_CONTEXT_GIB = 0.70
#: GiB of the CUDA graphs an engine captures after it sizes its KV cache, outside its share
#: (vllm-project/vllm#21489: Llama 4 Maverick's graphs about 1.3 GB, out of memory at
#: --gpu-memory-utilization 0.99; gemma-3-4b's 0.65 GiB in the same PR's log). vLLM up to
#: 0.20 captures them after sizing the cache; from 0.21 it profiles them first and sizes
#: the cache inside its share (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, on by default;
#: vllm-project/vllm#30515), where this is a margin. TensorRT-LLM captures its own after
#: allocating the cache (NVIDIA/TensorRT-LLM#8961's log) and publishes no size of them:
#: vLLM's stands in
CUDA_GRAPHS_GIB = 1.3
#: SGLang's default --chunked-prefill-size on 35 to 160 GB GPUs (server_args.py): the step
#: whose activations its --mem-fraction-static leaves outside
SGLANG_STEP_TOKENS = 8192


def outside_share(shape: Shape, setup: ServingSetup) -> int:
    """Bytes the engine keeps beside its share. vLLM's --gpu-memory-utilization and SGLang's
    --mem-fraction-static are shares of the whole GPU, so the rest holds the CUDA context
    and graphs (and SGLang's step activations, which its share leaves out); TensorRT-LLM's
    free_gpu_memory_fraction is a share of what the weights and its profiled step leave
    (the context already taken), so the rest holds the CUDA graphs."""
    graphs = int(CUDA_GRAPHS_GIB * GIB)
    if setup.share_of == "free":
        return graphs
    outside = graphs + int(CUDA_CONTEXT_GIB * GIB)
    if setup.profiled_tokens is None:  # SGLang: its share holds weights and cache only
        tokens = setup.step_tokens or SGLANG_STEP_TOKENS
        outside += step_workspace(shape, tokens, setup.tp, setup.ep, setup.etp)
    return outside


#: SGLang's automatic --mem-fraction-static (``_handle_gpu_memory_settings`` in
#: python/sglang/srt/server_args.py, read at sgl-project/sglang@001067f; the same terms in
#: the v0.5 releases): per GPU size (MiB, below the bound), its default
#: --chunked-prefill-size and CUDA-graph batch limit below tp 4 and from tp 4
SGLANG_TIERS = (
    (20 * 1024, 2048, 8, 8),
    (35 * 1024, 2048, 24, 80),
    (60 * 1024, 4096, 32, 160),
    (90 * 1024, 8192, 256, 512),
    (160 * 1024, 8192, 256, 512),
    (float("inf"), 16384, 512, 512),
)


@attrs.frozen(kw_only=True)
class SglangServer:
    """What SGLang's automatic share reads of one server: its role in a split ("server":
    aggregated), sizes, and its flags as written (None: SGLang's default)."""

    role: str = "server"
    tp: int = 1
    pp: int = 1
    #: DP attention ranks (1: none)
    dp: int = 1
    #: --chunked-prefill-size and --max-running-requests, the whole server's
    chunked_prefill: int | None = None
    max_running: int | None = None
    #: multi-head latent attention (its prefill CUDA graphs reserve a flat 1.5 GiB)
    mla: bool = False


def sglang_reserve_mib(capacity_gib: float, server: SglangServer) -> float:
    """MiB SGLang leaves outside the share it picks itself: 512 of attention metadata, 1.5
    per activation token (a decode server's running requests, else a prefill chunk; at
    least 2,048 tokens), tp x pp / 8 GiB for the parallel groups, CUDA graphs (2 per decode
    batch size, with DP attention 3 more per batch size and rank, 1.5 more again past 300;
    a prefill graph 8 per captured size, 1.5 GiB with latent attention), at least 10 GiB on
    GPUs over 60 GiB. Speculative decoding and DeepEP buffers (2 GiB each) are not
    counted: the search writes neither."""
    gpu = capacity_gib * 1024
    _, chunk, small, large = next(t for t in SGLANG_TIERS if gpu < t[0])
    graph_bs = small if server.tp < 4 else large
    chunk = server.chunked_prefill or chunk
    if server.role == "decode":
        tokens = max(server.max_running or graph_bs, 2048)
    else:
        tokens = max(chunk, 2048)
    reserve = 512 + 1.5 * tokens + server.tp * server.pp / 8 * 1024
    if server.role != "prefill":
        reserve += 2 * graph_bs
        if server.dp > 1:
            reserve += graph_bs * server.dp * (4.5 if graph_bs > 300 else 3)
    if server.role != "decode":
        reserve += 1.5 * 1024 if server.mla else 8 * len(_prefill_graph_sizes(chunk))
    if gpu > 60 * 1024:
        reserve = max(reserve, 10 * 1024)
    return reserve


def _prefill_graph_sizes(tokens: int) -> list[int]:
    """The token counts SGLang captures prefill CUDA graphs at, up to a chunk."""
    sizes = [
        *range(4, 33, 4),
        *range(48, 257, 16),
        *range(288, 513, 32),
        *range(576, 1025, 64),
        *range(1280, 4097, 256),
        *range(4608, tokens + 1, 512),
    ]
    return [s for s in sizes if s <= tokens]


def sglang_default_share(capacity_gib: float, server: SglangServer) -> float:
    """The --mem-fraction-static SGLang picks when not told: what its reserve leaves of the
    GPU, rounded to 3 places."""
    gpu = capacity_gib * 1024
    return round((gpu - sglang_reserve_mib(capacity_gib, server)) / gpu, 3)


#: the share's source in explain where SGLang picks it
SGLANG_OWN_SOURCE = "SGLang's own --mem-fraction-static for this GPU and server"


def sglang_shares(shape: Shape, setup: ServingSetup, capacity_gib: float) -> ServingSetup:
    """The setup with the share SGLang picks itself (:func:`sglang_default_share`) for the
    server and each role the spec leaves it to; those the spec writes as written."""
    mla = shape.latent is not None

    def own(server: SglangServer) -> float:
        return sglang_default_share(capacity_gib, attrs.evolve(server, mla=mla))

    roles = {
        name: limits if limits.sglang is None else attrs.evolve(limits, share=own(limits.sglang))
        for name, limits in setup.roles.items()
    }
    setup = attrs.evolve(setup, roles=roles)
    if setup.sglang is None:
        return setup
    return attrs.evolve(setup, share=own(setup.sglang), share_source=SGLANG_OWN_SOURCE)


def _picked(setup: ServingSetup) -> frozenset[str]:
    """The roles whose share the spec leaves to SGLang."""
    servers = [setup.sglang, *(limits.sglang for limits in setup.roles.values())]
    return frozenset(s.role for s in servers if s is not None)


def leaves_reserve(m: ServingMemory) -> bool:
    """Whether the engine's share leaves it room for what it keeps outside the share (the
    serving search raises a share only as far as this holds; a share as written is never
    refused by it)."""
    share = Fraction(m.share).limit_denominator(1000)
    if m.share_of == "free":
        rest = (1 - share) * max(0, m.capacity - m.weights - m.workspace)
    else:
        rest = (1 - share) * m.capacity
    return rest >= m.reserve


def _own_limits(setup: ServingSetup) -> dict[str, StepLimits]:
    """The roles' limits where the spec sets any, a role's share only where it is not the
    estimate's own (the tighter role's)."""
    out = {}
    for name, limits in setup.roles.items():
        limits = attrs.evolve(limits, sglang=None)
        if limits.share == setup.share:
            limits = attrs.evolve(limits, share=None)
        if limits != StepLimits():
            out[name] = limits
    return out


#: bytes of one activation element: the engines compute in bf16 (fp8 and fp4 checkpoints too)
ACTIVATION_BYTES = 2


def step_workspace(shape: Shape, tokens: int, tp: int, ep: int = 1, etp: int = 1) -> int:
    """The activation peak of one step of ``tokens`` tokens on one GPU: ``tokens x (2 hidden
    + 3 F) x 2`` bytes, ``F`` the widest MLP intermediate one GPU holds per token (a dense
    MLP's ``ffn / tp``; an MoE layer's routed ``topk x moe_ffn / (ep x etp)``, its tokens
    spread over the ep ranks, plus the shared expert's ``shared_ffn / etp``). Checked on
    vLLM's profiling peak for Llama-3.1-8B (tests/unit/test_serving_memory.py)."""
    parts = shape.pattern.parts(0, shape.layers)
    widest = Fraction(shape.ffn, tp) if parts.mlp or not shape.experts else Fraction(0)
    if shape.experts and parts.moe:
        moe = Fraction(shape.topk * shape.moe_ffn, ep * etp) + Fraction(shape.shared_ffn, etp)
        widest = max(widest, moe)
    return int(tokens * (2 * shape.hidden + 3 * widest) * ACTIVATION_BYTES)


def kv_per_layer(shape: Shape, tp: int) -> int:
    """KV cache elements per token of one attention layer on one tp rank."""
    if shape.latent is not None:
        return shape.latent.kv_lora + shape.latent.rope_head
    heads = max(1, -(-shape.groups // tp))
    return 2 * heads * shape.kv_channels


def findings(memory: ServingMemory) -> list[Finding]:
    m = memory
    found = []
    if m.weights > m.capacity:
        found.append(
            Finding(
                code="MDC280",
                pointer="/distributed/accelerator_memory_gib",
                message=f"the weights alone need {gib(m.weights)} per GPU of a {m.engine} "
                f"server, more than its {gib(m.capacity)}",
                hint="spread the weights over more GPUs (tp, pp, or ep for the experts), or "
                "serve a quantized model",
            )
        )
    elif m.tokens < m.max_len:
        found.append(
            Finding(
                code="MDC281",
                severity=Severity.WARNING,
                message=f"{m.engine}'s KV cache holds about {m.tokens} tokens per GPU "
                f"({gib(m.cache)} = {_cache_sum(m)}), less than one sequence of {m.max_len}",
                pointer="/distributed/accelerator_memory_gib",
                hint="raise the memory share, shard the weights over more GPUs, use an fp8 KV "
                "cache, or lower the maximum sequence length",
            )
        )
    return found


def _activations(m: ServingMemory) -> str:
    """explain's words for the profiled step's activations (none where not profiled)."""
    if m.profiled_tokens is None:
        return ""
    return f"a step's activations {gib(m.workspace)} ({m.profiled_tokens} tokens), "


def _cache_sum(m: ServingMemory) -> str:
    """How the cache was found, in words."""
    taken = f" - {gib(m.workspace)} of activations" if m.workspace else ""
    if m.share_of == "free":
        return f"{m.share:g} x ({gib(m.capacity)} - {gib(m.weights)} of weights{taken})"
    return f"{m.share:g} x {gib(m.capacity)} - {gib(m.weights)} of weights{taken}"


def lines(memory: ServingMemory | None) -> list[str]:
    """explain's lines for the estimate."""
    if memory is None:
        return []
    m = memory
    return [
        f"serving memory per GPU (estimate, {m.engine}): {gib(m.capacity)} x {m.share:g} "
        f"({m.share_source})"
        if m.share_of == "capacity"
        else f"serving memory per GPU (estimate, {m.engine}): {gib(m.capacity)}; the KV cache "
        f"takes {m.share:g} of what the weights leave ({m.share_source})",
        f"  weights {gib(m.weights)}, {_activations(m)}KV cache up to {gib(m.cache)}: "
        f"{m.kv_per_token} bytes per token ({m.kv_dtype}), about {m.tokens} tokens",
        f"  {m.sequences} full-length sequences of {m.max_len} tokens",
    ]


def to_json(memory: ServingMemory | None) -> dict[str, object] | None:
    if memory is None:
        return None
    # share_of is written only when it is not the share of the whole GPU, the limits and
    # the eager decode only where the spec sets them
    unwritten: dict[str, object] = {
        "cuda_graphs": True,
        "graph_batch": None,
        "share_of": "capacity",
        "max_batch": None,
        "step_tokens": None,
        "roles": {},
        "workspace": 0,
        "profiled_tokens": None,
    }
    # the reserve outside the share is the search's check, not the plan's; a role's share
    # only where it has its own (where SGLang picks it: share_source, and for a split's
    # other role its share)
    return attrs.asdict(
        memory,
        filter=lambda field, value: (
            field.name not in ("reserve", "picked", "sglang")
            and not (field.name == "share" and value is None)
            and (field.name not in unwritten or value != unwritten[field.name])
        ),
    )
