"""The serving model's records: its fitted constants, a deployment's roles, and what it
predicts (:mod:`mdc.tune.serving_perf` predicts; :mod:`mdc.tune.serving_server` prices one
server's steps)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from mdc.hardware import Accelerator
from mdc.plan.serving_memory import SGLANG_TIERS

#: the launchers' names of the two disaggregated roles (TensorRT-LLM: context, generation)
PREFILL_ROLES = frozenset({"prefill", "context"})
DECODE_ROLES = frozenset({"decode", "generation"})
#: the launchers whose engines profile a step of their token budget and take its
#: activations out of the KV cache (SGLang's memory share leaves them out)
PROFILING = frozenset({"vllm", "vllm_disagg", "trtllm"})


@attrs.frozen(kw_only=True)
class Constants:
    """The fitted efficiencies and overheads (bench/serving_fit.py fits them)."""

    #: share of the HBM bandwidth a decode step's reads reach
    hbm_efficiency: float = 0.7
    #: share of the dense tensor peak a prefill's GEMMs and attention reach
    prefill_efficiency: float = 0.65
    #: share of the peak a decode step's (small) GEMMs reach
    decode_efficiency: float = 0.3
    #: latency of one all-reduce and of one all-to-all, seconds
    allreduce_latency_s: float = 8e-6
    alltoall_latency_s: float = 25e-6
    #: per-step scheduler and launch overhead of each launcher's engine, seconds
    step_overhead_s: Mapping[str, float] = attrs.field(
        factory=lambda: {
            "vllm": 2.0e-3,
            "vllm_disagg": 2.0e-3,
            "sglang": 1.6e-3,
            "sglang_disagg": 1.6e-3,
            "trtllm": 1.0e-3,
        }
    )
    #: per-step host work for each running request of an engine process (preparing its
    #: inputs, sampling, detokenizing and streaming its token), seconds: vLLM's
    #: pre- and post-processing grows with the batch (WukLab's measurement of vLLM's
    #: scheduling overhead, mlsys.wuklab.io/posts/scheduling_overhead); fitted for vLLM,
    #: 0 where no measurement sets it
    request_overhead_s: Mapping[str, float] = attrs.field(
        factory=lambda: {"vllm": 30e-6, "vllm_disagg": 30e-6}
    )
    #: the running batch an engine allows unless told (vLLM --max-num-seqs, SGLang's
    #: --max-running-requests sized from memory, TensorRT-LLM max_batch_size)
    max_batch: Mapping[str, int] = attrs.field(
        factory=lambda: {"vllm": 1024, "vllm_disagg": 1024, "trtllm": 2048}
    )
    #: prompt tokens one step takes (vLLM --max-num-batched-tokens, SGLang
    #: --chunked-prefill-size, TensorRT-LLM max_num_tokens)
    chunk_tokens: int = 8192

    def overhead(self, launcher: str) -> float:
        return self.step_overhead_s.get(launcher, 1.6e-3)

    def batch_limit(self, launcher: str, hw: Accelerator) -> int:
        """The engine's running-batch limit where the spec sets none: vLLM's max_num_seqs
        is 256 on a GPU under 70 GiB and on an A100 (1024 elsewhere)."""
        if launcher.startswith("vllm") and _small_vllm_gpu(hw):
            return VLLM_SMALL_GPU[0]
        return self.max_batch.get(launcher, 1024)

    def step_budget(self, launcher: str, hw: Accelerator) -> int:
        """The engine's step budget where the spec sets none: vLLM's API server's
        max_num_batched_tokens is 2,048 on a GPU under 70 GiB and on an A100; SGLang's
        --chunked-prefill-size follows the GPU's memory (2,048 below 35 GiB, 4,096 below
        60, 8,192 below 160, 16,384 above: SGLANG_TIERS, as its server_args sets it)."""
        if launcher.startswith("vllm") and _small_vllm_gpu(hw):
            return VLLM_SMALL_GPU[1]
        if launcher.startswith("sglang"):
            mib = hw.memory_gib * 1024
            return next(chunk for bound, chunk, _, _ in SGLANG_TIERS if mib < bound)
        return self.chunk_tokens

    def request_overhead(self, launcher: str) -> float:
        return self.request_overhead_s.get(launcher, 0.0)


DEFAULT = Constants()

#: vLLM's max_num_seqs and its API server's max_num_batched_tokens on a GPU under 70 GiB and
#: on an A100 (vLLM's EngineArgs defaults by device, as its test_defaults_with_usage_context
#: states them: 1024 and 8192 on the others, Constants.max_batch and chunk_tokens)
VLLM_SMALL_GPU = (256, 2048)


def _small_vllm_gpu(hw: Accelerator) -> bool:
    return hw.memory_gib < 70 or hw.id.startswith("a100")


@attrs.frozen(kw_only=True)
class Role:
    """One kind of server of a deployment: its count and each server's sizes."""

    #: "server" (aggregated), "prefill" or "decode"
    name: str
    servers: int
    gpus: int
    tp: int = 1
    pp: int = 1
    #: attention groups inside the server (vLLM data-parallel engines, SGLang DP attention)
    dp: int = 1
    ep: int = 1
    #: the engine's running-batch limit per attention group (None: the launcher's default)
    max_batch: int | None = None
    #: the tokens one step takes per attention group, prompt chunks included (None: the
    #: launcher's default, :attr:`Constants.chunk_tokens`)
    step_tokens: int | None = None
    #: the engine's memory share on this role's GPUs (None: the deployment's)
    share: float | None = None

    @property
    def attn_tp(self) -> int:
        return max(1, self.gpus // (self.pp * self.dp))

    def to_json(self) -> dict[str, Any]:
        return {
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "ep": self.ep,
            "servers": self.servers,
            "gpus_per_server": self.gpus,
            "max_batch": self.max_batch,
            "step_tokens": self.step_tokens,
            "memory_share": self.share,
        }


@attrs.frozen(kw_only=True)
class Deployment:
    launcher: str
    roles: tuple[Role, ...]
    #: KV cache dtype, the engine's memory share and what it is a share of
    kv_dtype: str = "auto"
    share: float = 0.9
    share_of: str = "capacity"
    capacity_gib: float
    #: GPUs on one node (a server wider than that, or than the scale-up domain, talks over
    #: the scale-out network)
    nproc_per_node: int = 8
    #: whether the decode steps run in captured CUDA graphs (False: eager, each kernel
    #: launched from the host: :func:`eager_launches`), and the largest decode batch
    #: captured in one where the spec sets it (None: the engine's default, :func:`graph_limit`)
    cuda_graphs: bool = True
    graph_batch: int | None = None

    @property
    def mode(self) -> str:
        return "aggregated" if len(self.roles) == 1 else "disaggregated"

    @property
    def gpus(self) -> int:
        return sum(r.servers * r.gpus for r in self.roles)


@attrs.frozen(kw_only=True)
class ServingPrediction:
    ttft_ms: float
    tpot_ms: float
    output_tokens_per_s_per_gpu: float
    output_tokens_per_s_per_user: float
    requests_per_s: float
    #: what limits it: "compute", "HBM bandwidth", "KV capacity", "network", "queueing"
    binding: str
    #: the running batch of each role's server
    batch: Mapping[str, int]
    #: each role's memory per GPU (weights, a step's activations, the cache), GiB
    memory_gib: Mapping[str, float]
    #: False where the prefill servers (or the aggregated servers) cannot keep up
    overloaded: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "ttft_ms": _round(self.ttft_ms),
            "tpot_ms": _round(self.tpot_ms),
            "output_tokens_per_s_per_gpu": _round(self.output_tokens_per_s_per_gpu),
            "output_tokens_per_s_per_user": _round(self.output_tokens_per_s_per_user),
            "requests_per_s": _round(self.requests_per_s, 4),
            "binding": self.binding,
            "batch": dict(self.batch),
            "overloaded": self.overloaded,
        }


def _round(value: float, places: int = 2) -> float | None:
    return None if math.isinf(value) or math.isnan(value) else round(value, places)
