"""What the user wrote: frozen attrs classes, ``None`` meaning "not given".

These mirror the core schema table by table (a test keeps them in step).
Defaults are not applied here; the plan pass resolves them.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

import attrs


@attrs.frozen(kw_only=True)
class EnvValue:
    """A ``[job] env`` value in its explicit form: exactly one of ``prepend``/``append`` (to
    the variable's value at run time, joined by ``separator`` when it is set) and ``ref`` (the
    value of another variable at run time)."""

    prepend: str | None = None
    append: str | None = None
    separator: str = ":"
    ref: str | None = None


@attrs.frozen(kw_only=True)
class JobTable:
    name: str
    command: str | tuple[str, ...]
    image: str | None = None
    workdir: str | None = None
    #: a literal string (passed as written, never expanded) or an :class:`EnvValue`
    env: Mapping[str, str | EnvValue] = attrs.field(factory=dict)

    @property
    def argv(self) -> list[str]:
        """The command as words (a string is split like a shell would, without expansion)."""
        return shlex.split(self.command) if isinstance(self.command, str) else list(self.command)


@attrs.frozen(kw_only=True)
class NetworkTable:
    """The cluster's scale-out network, where it differs from the catalogue's system."""

    nics_per_node: int
    nic_gbit_s: float


@attrs.frozen(kw_only=True)
class DistributedTable:
    launcher: str
    backend: str | None = None
    nnodes: int | None = None
    min_nnodes: int | None = None
    nproc_per_node: int | None = None
    master_port: int | None = None
    accelerator: str | None = None
    prefill_nodes: int | None = None
    decode_nodes: int | None = None
    prefill_gpus: int | None = None
    decode_gpus: int | None = None
    accelerator_memory_gib: float | None = None
    accelerator_model: str | None = None
    network: NetworkTable | None = None


@attrs.frozen(kw_only=True)
class ParallelismTable:
    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    ep: int | None = None
    etp: int | None = None
    vpp: int | None = None
    dp: int | None = None
    order: str | None = None


@attrs.frozen(kw_only=True)
class BatchTable:
    global_batch_size: int | None = None
    micro_batch_size: int | None = None


@attrs.frozen(kw_only=True)
class ModelTable:
    num_layers: int | None = None
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_query_groups: int | None = None
    ffn_hidden_size: int | None = None
    vocab_size: int | None = None
    seq_length: int | None = None
    num_experts: int | None = None
    dtype: str | None = None
    gated_mlp: bool | None = None
    tied_embeddings: bool | None = None
    position_embedding: str | None = None
    bias: bool | None = None
    normalization: str | None = None
    flash_attention: bool | None = None
    moe_ffn_hidden_size: int | None = None
    moe_router_topk: int | None = None
    kv_channels: int | None = None
    qk_layernorm: bool | None = None
    add_qkv_bias: bool | None = None
    softmax_type: str | None = None
    window_size: tuple[int, int] | None = None
    window_attn_skip_freq: int | tuple[int, ...] | None = None
    multi_latent_attention: bool | None = None
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_head_dim: int | None = None
    qk_pos_emb_head_dim: int | None = None
    v_head_dim: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    moe_layer_freq: int | tuple[int, ...] | None = None
    moe_latent_size: int | None = None
    weight_block_size: tuple[int, int] | None = None
    mtp_num_layers: int | None = None
    hybrid_override_pattern: str | None = None
    mamba_state_dim: int | None = None
    mamba_head_dim: int | None = None
    mamba_num_groups: int | None = None
    mamba_num_heads: int | None = None
    experimental_attention_variant: str | None = None
    csa_compress_ratios: tuple[int, ...] | None = None
    o_groups: int | None = None
    o_lora_rank: int | None = None
    dsa_indexer_n_heads: int | None = None
    dsa_indexer_head_dim: int | None = None
    enable_hyper_connections: bool | None = None
    num_residual_streams: int | None = None
    moe_n_hash_layers: int | None = None


@attrs.frozen(kw_only=True)
class SloTable:
    """Latency targets of a serving workload, in milliseconds."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None


@attrs.frozen(kw_only=True)
class WorkloadTable:
    """A serving job's traffic: mean prompt and output lengths, and either the requests in
    flight (closed loop) or their arrival rate (open loop)."""

    input_tokens: int
    output_tokens: int
    concurrency: int | None = None
    request_rate: float | None = None
    slo: SloTable | None = None


#: Core top-level tables and their classes; every other table belongs to a plugin.
CORE_TABLES: Mapping[str, type] = {
    "job": JobTable,
    "distributed": DistributedTable,
    "parallelism": ParallelismTable,
    "batch": BatchTable,
    "model": ModelTable,
    "workload": WorkloadTable,
}


@attrs.frozen(kw_only=True)
class JobSpec:
    job: JobTable
    distributed: DistributedTable
    parallelism: ParallelismTable = ParallelismTable()
    batch: BatchTable | None = None
    model: ModelTable | None = None
    workload: WorkloadTable | None = None
    #: plugin table name -> the plugin's structured options (its ``options_type``)
    plugin_tables: Mapping[str, object] = attrs.field(factory=dict)
