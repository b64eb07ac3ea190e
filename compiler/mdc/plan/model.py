"""The resolved plan: frozen, complete, and cheap at any scale."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs

from mdc.errors import Diagnostic
from mdc.hardware import Accelerator
from mdc.plan.ranks import GroupSet, RankGrid
from mdc.plan.stages import PipelineSplit, StageLayers
from mdc.spec import JobTable, ModelTable, WorkloadTable

if TYPE_CHECKING:
    from mdc.plan.memory.records import MemoryEstimate
    from mdc.plan.serving_memory import ServingMemory

#: Group kinds the plan exposes, and which grid (dense or expert) each comes from.
#: Names follow Megatron-Core: "tp-pp" is the model-parallel group, "dp-cp" the
#: gradient-reduction group; the expert grid's own tp/dp are "expert-tp"/"expert-dp".
GROUP_KINDS: Mapping[str, tuple[str, str]] = {
    "tp": ("dense", "tp"),
    "cp": ("dense", "cp"),
    "dp": ("dense", "dp"),
    "pp": ("dense", "pp"),
    "dp-cp": ("dense", "dp-cp"),
    "tp-pp": ("dense", "tp-pp"),
    "ep": ("expert", "ep"),
    "expert-tp": ("expert", "tp"),
    "expert-dp": ("expert", "dp"),
}


@attrs.frozen(kw_only=True)
class Sizes:
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    dp: int
    #: expert data parallel: world / (etp * ep * pp)
    edp: int
    #: virtual pipeline stages per pipeline rank (None: no interleaving)
    vpp: int | None = None
    #: the sizes the spec did not write that mdc derived from another value, and from which
    #: (``{"tp": "nproc_per_node", "pp": "nnodes"}``), for explain and plan.json
    defaults: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class RankLayout:
    """Both of Megatron-Core's grids: dense (tp, cp, dp, pp) and expert (etp, ep, edp, pp)."""

    order: str
    dense: RankGrid
    expert: RankGrid

    def groups(self, kind: str) -> GroupSet:
        grid, axes = GROUP_KINDS[kind]
        return (self.dense if grid == "dense" else self.expert).groups(axes)


@attrs.frozen(kw_only=True)
class BatchPlan:
    global_batch_size: int
    micro_batch_size: int
    #: gradient accumulation steps (microbatches per step): global / (micro * dp)
    grad_accum_steps: int


@attrs.frozen(kw_only=True)
class NodeRole:
    """A set of consecutive nodes that run the same role (``worker``, ``proxy``, ...)."""

    name: str
    first_node: int
    count: int

    @property
    def nodes(self) -> range:
        return range(self.first_node, self.first_node + self.count)


#: the role of the one node of a single-node disaggregated job (router, prefill, decode)
ONE_NODE_ROLE = "disagg"


@attrs.frozen(kw_only=True)
class DisaggSplit:
    """Disaggregated serving: node 0 the proxy, then prefill nodes, then decode nodes; on
    one node (``unit = "gpus"``) the node's GPUs split into prefill and decode GPUs."""

    prefill: int
    decode: int
    #: "auto" or "spec"
    origin: str
    #: what prefill and decode count: "nodes", or "gpus" when the servers and the router
    #: share the nodes (one or two nodes; prefill on the first GPUs, decode on the rest)
    unit: str = "nodes"


@attrs.frozen(kw_only=True)
class Rendezvous:
    #: the port written in the spec; when derived, the port hashed from the job name, which
    #: backends that fix the port in a manifest use (each pod has its own ports)
    master_port: int
    #: "spec" when written, "derived" when not: the backend's scripts then derive it at run
    #: time from the launch id (MDC_LAUNCH_ID), or use master_port where a manifest fixes it
    port_origin: str
    #: whether the backend's manifests fix the port (its record's ``fixed_port``)
    fixed: bool = False

    @property
    def derived(self) -> bool:
        return self.port_origin == "derived"

    def text(self) -> str:
        """The port as plan.json's worker env states it, for the backend that runs it."""
        if not self.derived:
            return str(self.master_port)
        if self.fixed:
            return f"{self.master_port}, hashed from the job name, fixed in the manifests"
        return "chosen at run time from a hash of MDC_LAUNCH_ID, the first free port on node 0"


@attrs.frozen(kw_only=True, cache_hash=True)
class TrainingSetup:
    """How a launcher trains, as far as memory goes (its record's ``training`` says). Hashed
    once: mdc tune keys each layout family by it."""

    #: ZeRO-style sharding over the dp-cp group: 0 none, 1 optimizer state,
    #: 2 also gradients, 3 also weights (Megatron's distributed optimizer is 1)
    zero_stage: int = 0
    #: bytes per gradient element (Megatron keeps fp32 main grads: 4; ZeRO: the weight dtype)
    grad_bytes: int | None = None
    #: (dtype, bytes) pairs: the bytes per gradient element under that [model] dtype where
    #: it differs from grad_bytes (Megatron-LM keeps an fp16 model's gradients in fp16
    #: unless --accumulate-allreduce-grads-in-fp32); see :meth:`gradient_bytes`
    dtype_grad_bytes: tuple[tuple[str, int], ...] = ()
    #: bytes per parameter of the copy the optimizer step makes of a narrower gradient
    #: buffer, sharded as the optimizer state and alive only while the step runs (Megatron's
    #: mixed-precision optimizers: ``main_grad.float()``, 4); the peak holds it or the
    #: activations, whichever is larger. 0: no copy
    step_grad_bytes: int = 0
    #: activations split over tp along the sequence (Megatron --sequence-parallel)
    sequence_parallel: bool = False
    #: activation recomputation: "none", "selective" (attention core) or "full"
    recompute: str = "none"
    #: the ZeRO stage when pp > 1, where the launcher's framework shards differently with
    #: pipelining (TorchTitan's default reshard policy keeps the gathered weights: 2); None:
    #: zero_stage
    pp_zero_stage: int | None = None
    #: hybrid sharding (HSDP): the dp-cp group holds this many full replicas, and the ZeRO
    #: stage shards within each (over dp * cp / replicas ranks); must divide dp * cp
    replicas: int = 1
    #: how the launcher's framework places layers on pipeline stages
    pipeline: PipelineSplit = PipelineSplit()
    #: [model] values the launcher's framework fixes (e.g. TorchTitan's flavor), as (key,
    #: value) pairs: they fill what [model] leaves out, and a different written value is
    #: refused; "source" names them
    model_shape: tuple[tuple[str, object], ...] = ()
    model_source: str = ""
    #: [model] values the launcher's own table sets (TorchTitan's [torchtitan] seq_len for
    #: seq_length): they fill what [model] leaves out; the launcher checks a disagreement
    model_defaults: tuple[tuple[str, object], ...] = ()
    #: bytes per weight element when the launcher keeps them in another precision than
    #: [model] dtype (TorchTitan's float32 sharded parameters: 4); None: the dtype's
    weight_bytes: int | None = None
    #: bytes per element of the transformer layers' weights when the launcher keeps them
    #: in another precision than [model] dtype (fp8 parameters: 1, NVFP4 ones: 1.125);
    #: None: the dtype's
    layer_weight_bytes: float | None = None
    #: bytes per parameter of optimizer state; None: Adam's 12 (mixed precision) or 8 (fp32)
    optimizer_bytes: int | None = None
    #: bytes per parameter of the embeddings' and output layer's optimizer state when it
    #: differs from the layers' (Megatron's Muon leaves them to Adam: 12); None: the same
    end_optimizer_bytes: int | None = None
    #: share of the optimizer state kept in host memory, 0 to 1
    optimizer_offload: float = 0.0
    #: weights and gradients kept in host memory (ZeRO-3 offload_param, FSDP2 CPU offload)
    param_offload: bool = False
    #: full recompute: "uniform" or "block", and how many layers (None: every layer)
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    #: full recompute of every n-th layer only (TorchTitan's selective_ac_option = n)
    recompute_every: int | None = None
    #: selective recompute: the modules, in Megatron-Core's names (None: the attention core)
    recompute_modules: tuple[str, ...] | None = None
    #: selective recompute by operator instead of by module (TorchTitan's
    #: selective_ac_option = "op"): each layer keeps its input, every other matmul's output,
    #: its attention kernel's output and its collectives' outputs, and recomputes the rest
    #: (see mdc.plan.per_op); read only when recompute is "selective"
    recompute_per_op: bool = False
    #: per-op recompute: module paths within a block (matched as substrings) whose matmuls
    #: are always recomputed and not counted, with every matmul of the same weight shape
    #: (TorchTitan's per_op_sac_force_recompute_mm_shapes_by_fqns)
    recompute_per_op_forced: tuple[str, ...] = ()
    #: the layers keep 1-byte dropout masks beside their residual adds (Megatron-Core's
    #: bias-dropout-add); False: the model has no dropout (TorchTitan's models)
    dropout_masks: bool = True
    #: the gated MLP keeps its activation function's output apart from its inputs and the
    #: product (an eager ``w2(silu(w1 x) * w3 x)``, as TorchTitan runs an uncompiled
    #: model): four MLP-wide tensors per token where a fused SwiGLU keeps three
    eager_gated_mlp: bool = False
    #: the layers' elementwise work runs as eager PyTorch kernels, one per operator (an
    #: uncompiled TorchTitan model: its RMSNorm, rotary embedding and SwiGLU), not fused
    eager_kernels: bool = False
    #: fp8 GEMMs through torchao's Float8Linear (TorchTitan's float8 converter): each linear
    #: casts its input and its output gradient itself, apart from the kernels before it
    float8_casts: bool = False
    #: tensor parallelism's collectives micro-pipelined with the matmuls beside them, as
    #: tp_comm_overlap times them (TorchTitan's parallelism.enable_async_tensor_parallel,
    #: compiled: PyTorch's async TP); unlike Megatron-LM's flag, harmless at tp 1
    async_tp: bool = False
    #: bytes per element FSDP all-gathers the layers' weights in under fp8 GEMMs when not
    #: 2 (torchao's float8 all-gather, TorchTitan's enable_fsdp_float8_all_gather: 1)
    fp8_gather_bytes: float | None = None
    #: bytes per gradient element the data-parallel reduce-scatter moves when not the
    #: gradient buffer's (TorchTitan's training.mixed_precision_reduce: float32 4,
    #: bfloat16 2)
    reduce_bytes: int | None = None
    #: layers whose activations are offloaded to host memory (Megatron's CPU offloading)
    offload_layers: int = 0
    #: MoE token dispatcher: "allgather" gathers the etp * ep group's tokens in every layer
    moe_dispatcher: str | None = None
    #: MoE: each expert's input padded to this capacity factor (None: dropless)
    moe_capacity_factor: float | None = None
    #: MoE group-limited routing as (groups, groups per token): the routed experts split into
    #: equal groups and each token's experts chosen from its best few (Megatron-Core's
    #: moe_router_num_groups, moe_router_group_topk); None: every expert open to every token
    moe_router_groups: tuple[int, int] | None = None
    #: the interleaved pipeline schedule overlaps its sends with compute (Megatron-LM's
    #: overlap_p2p_comm, its default): the throughput model hides them then
    overlap_p2p: bool = True
    #: tensor parallelism's collectives overlapped with the GEMMs next to them (Megatron-LM's
    #: --tp-comm-overlap: Transformer Engine's userbuffers, with sequence parallelism)
    tp_comm_overlap: bool = False
    #: the expert all-to-alls of one micro batch run beside another micro batch's compute
    #: (Megatron-Core's overlap_moe_expert_parallel_comm, its combined 1F1B schedule)
    ep_comm_overlap: bool = False
    #: the data-parallel gradient reduce overlapped with the backward pass, and the
    #: parameter all-gather with the forward (Megatron-LM's --overlap-grad-reduce and
    #: --overlap-param-gather, off by default there): the throughput model hides them then
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    #: with pp > 1, the micro batch the pipeline schedule runs when the launcher splits each
    #: [batch] micro batch further (TorchTitan's pipeline_parallel_microbatch_size, default
    #: 1); None: the [batch] micro batch
    pipeline_micro_batch: int | None = None
    #: each gradient-accumulation step runs the pipeline schedule anew, with its own fill
    #: and drain (TorchTitan's train_step: one pp_schedule.step per local batch); False: one
    #: schedule runs every micro batch of the step (Megatron-Core)
    schedule_per_accumulation: bool = False
    #: bytes per element of the linear layers' inputs kept for the backward pass when the
    #: launcher quantizes them (NVFP4: 4 bits and an E4M3 scale per 16 values, 0.5625);
    #: None: the dtype's (fp8: 1)
    gemm_input_bytes: float | None = None
    #: the precision the transformer layers' GEMMs run in when the launcher quantizes them
    #: beyond [model] dtype ("fp8", "fp4": Megatron's --fp8-format, --fp4-format); None: the
    #: dtype's. Throughput (mdc tune, explain's prediction) takes the peak of this precision.
    gemm_precision: str | None = None
    #: (first, last) transformer layers of the model kept out of fp8 / fp4 training
    #: (Megatron's --first-last-layers-bf16): when the GEMMs are quantized, these layers'
    #: weights and saved GEMM inputs take the 16-bit dtype's bytes and their GEMMs the
    #: bf16 peak
    bf16_layers: tuple[int, int] = (0, 0)
    #: bytes per logit the loss holds at its peak on the last stage; None: 4 (the fp32
    #: logits alone). Megatron's vocab-parallel cross entropy: the bf16 logits and their fp32
    #: copy, 6; a float() cross entropy (TorchTitan): 12 in its backward run eagerly, 4 compiled
    logit_bytes: int | None = None
    #: what the memory hint may propose, as the launcher spells it: (lever, setting) pairs
    #: for the levers "zero 1".."zero 3", "sequence parallel", "recompute selective",
    #: "recompute full", "optimizer offload"; a lever not listed is not proposed
    levers: tuple[tuple[str, str], ...] = ()

    def gradient_bytes(self, dtype: str | None) -> int | None:
        """Bytes per gradient element under [model] ``dtype`` (None: the weight bytes)."""
        return dict(self.dtype_grad_bytes).get(dtype or "", self.grad_bytes)

    def gemms_in(self, dtype: str | None) -> str:
        """The precision the GEMMs run in under [model] ``dtype``: the launcher's
        quantization (Megatron's --fp4-format on a bf16 model), else the dtype's fp8, fp4
        or fp16, else bf16."""
        if self.gemm_precision is not None:
            return self.gemm_precision
        return dtype if dtype in ("fp8", "fp4", "fp16") else "bf16"


@attrs.frozen(kw_only=True)
class Plan:
    """Everything a launcher and a backend need, resolved and checked."""

    job: JobTable
    launcher: str
    backend: str
    nnodes: int
    #: equals nnodes unless the job is elastic
    min_nnodes: int
    nproc_per_node: int
    accelerator: str
    sizes: Sizes
    layout: RankLayout
    batch: BatchPlan | None
    rendezvous: Rendezvous
    roles: tuple[NodeRole, ...]
    disagg: DisaggSplit | None
    model: ModelTable | None
    #: plugin table name -> options as structured by that plugin's options type
    options: Mapping[str, object]
    #: each node's host name, when the backend knows it before the job runs
    hosts: tuple[str, ...] | None = None
    #: how the launcher trains (for the memory estimate)
    training: TrainingSetup = TrainingSetup()
    #: the decoder layers of every pipeline stage (None without [model] num_layers)
    stages: StageLayers | None = None
    #: parameter count and per-GPU memory (None without a complete [model] table)
    memory: MemoryEstimate | None = None
    #: a serving launcher's weights and KV cache per GPU (None without [model] and memory)
    serving_memory: ServingMemory | None = None
    #: warnings found while planning (errors stop the plan)
    warnings: tuple[Diagnostic, ...] = ()
    #: the catalogue entry [distributed] accelerator_model names (None: not named)
    hardware: Accelerator | None = None
    #: a serving job's traffic ([workload]; None when not given)
    workload: WorkloadTable | None = None

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def elastic(self) -> bool:
        return self.min_nnodes != self.nnodes

    def node_of(self, rank: int) -> int:
        return rank // self.nproc_per_node

    def role_of_name(self, name: str) -> NodeRole:
        for role in self.roles:
            if role.name == name:
                return role
        raise KeyError(name)

    def role_of(self, node: int) -> NodeRole:
        for role in self.roles:
            if node in role.nodes:
                return role
        raise IndexError(node)
