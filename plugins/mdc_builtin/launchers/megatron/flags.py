"""Megatron-LM's flags the megatron launcher knows: the [megatron] options a flag in
extra_args is read into, the flags whose value another table decides, and how [model]
keys are spelled as flags (Megatron-LM core_v0.16.1, megatron/training/arguments.py)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs

from mdc.api.flags import ArgPlace, FlagReading, FlagTable, KnownFlag
from mdc_builtin.launchers.megatron.bf16_layers import BF16_LAYER_FLAGS
from mdc_builtin.launchers.megatron.optimizer import OPTIMIZER_FLAGS
from mdc_builtin.launchers.megatron.precision import FP4_FLAGS

#: Megatron-LM's flags that select the same setting as one mdc emits (a second spelling).
ALIASES: Mapping[str, tuple[str, ...]] = {
    "--num-layers": ("--encoder-num-layers",),
    "--tensor-model-parallel-size": ("--model-parallel-size",),
    "--micro-batch-size": ("--batch-size",),
}


#: Megatron-LM's switch that turns the interleaved schedule's send/compute overlap off
#: (dest overlap_p2p_comm, on by default since 2023; forced off without interleaving)
NO_P2P_OVERLAP = "--no-overlap-p2p-communication"


#: the [megatron] keys that place layers on pipeline stages, and their flags
PIPELINE_KEYS: Mapping[str, str] = {
    "decoder_first_pipeline_num_layers": "--decoder-first-pipeline-num-layers",
    "decoder_last_pipeline_num_layers": "--decoder-last-pipeline-num-layers",
    "account_for_embedding_in_pipeline_split": "--account-for-embedding-in-pipeline-split",
    "account_for_loss_in_pipeline_split": "--account-for-loss-in-pipeline-split",
    "pipeline_model_parallel_layout": "--pipeline-model-parallel-layout",
}


#: Megatron-LM core_v0.16.1's choices (megatron/training/arguments.py, TransformerConfig)
SHARDING_STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")


FP8_RECIPES = ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")


OPTIMIZER_DTYPES = {
    "main_grads_dtype": ("fp32", "bf16"),
    "main_params_dtype": ("fp32", "fp16"),
    "exp_avg_dtype": ("fp32", "fp16", "bf16", "fp8"),
    "exp_avg_sq_dtype": ("fp32", "fp16", "bf16", "fp8"),
}


RECOMPUTE_MODULES = (
    "core_attn",
    "moe_act",
    "layernorm",
    "mla_up_proj",
    "mlp",
    "moe",
    "shared_experts",
)


DISPATCHERS = ("allgather", "alltoall", "flex")


def _option_flag(
    key: str,
    nargs: Literal[0, 1, "+"] = 0,
    convert: Callable[[str], Any] = str,
    choices: tuple[str, ...] = (),
) -> KnownFlag:
    """A flag read into the [megatron] option of the same name (flag: --key-in-kebab-case)."""
    return KnownFlag(
        name="--" + key.replace("_", "-"),
        source=f"[megatron] {key}",
        key=key,
        nargs=nargs,
        convert=convert,
        choices=choices,
    )


#: [megatron] options a flag in extra_args may stand for: read into the plan as if written
OPTION_FLAGS = (
    _option_flag("use_megatron_fsdp"),
    _option_flag("use_torch_fsdp2"),
    _option_flag("data_parallel_sharding_strategy", 1, choices=SHARDING_STRATEGIES),
    _option_flag("grad_reduce_in_bf16"),
    _option_flag("accumulate_allreduce_grads_in_fp32"),
    _option_flag("fp8_recipe", 1, choices=FP8_RECIPES),
    _option_flag("fp8_param_gather"),
    _option_flag("use_precision_aware_optimizer"),
    *(_option_flag(key, 1, choices=values) for key, values in OPTIMIZER_DTYPES.items()),
    _option_flag("optimizer_cpu_offload"),
    _option_flag("optimizer_offload_fraction", 1, float),
    _option_flag("cpu_offloading_num_layers", 1, int),
    _option_flag("recompute_modules", "+", choices=RECOMPUTE_MODULES),
    _option_flag("moe_token_dispatcher_type", 1, choices=DISPATCHERS),
    _option_flag("moe_expert_capacity_factor", 1, float),
    _option_flag("moe_pad_expert_input_to_capacity"),
    _option_flag("moe_router_num_groups", 1, int),
    _option_flag("moe_router_group_topk", 1, int),
    _option_flag("cp_comm_type", "+"),
    _option_flag("hierarchical_context_parallel_sizes", "+", int),
    _option_flag("overlap_moe_expert_parallel_comm"),
)


#: [model] values -> Megatron-LM's choices for --position-embedding-type and --normalization
POSITION_EMBEDDINGS: Mapping[str, str] = {
    "learned": "learned_absolute",
    "rope": "rope",
    "none": "none",
}


#: [model] keys emitted as Megatron-LM's flag of the same name, with a value
ARCHITECTURE_VALUES = (
    "kv_channels",
    "softmax_type",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_head_dim",
    "qk_pos_emb_head_dim",
    "v_head_dim",
    "moe_shared_expert_intermediate_size",
    "moe_latent_size",
    "mtp_num_layers",
    "mamba_state_dim",
    "mamba_head_dim",
    "mamba_num_groups",
    "mamba_num_heads",
    # DeepSeek-V4 (Megatron-LM's dev branch, 2026-08: not in core_v0.16)
    "experimental_attention_variant",
    "o_groups",
    "o_lora_rank",
    "dsa_indexer_n_heads",
    "dsa_indexer_head_dim",
    "num_residual_streams",
    "moe_n_hash_layers",
)


#: and the switches
ARCHITECTURE_SWITCHES = (
    "qk_layernorm",
    "add_qkv_bias",
    "multi_latent_attention",
    "enable_hyper_connections",
)


def flag_of(key: str) -> str:
    return "--" + key.replace("_", "-")


NORMALIZATIONS: Mapping[str, str] = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}


#: where the value of a flag mdc emits from [batch] and [model] comes from
SOURCES: Mapping[str, str] = {
    "--micro-batch-size": "[batch] micro_batch_size",
    "--global-batch-size": "[batch] global_batch_size",
    "--num-layers": "[model] num_layers",
    "--hidden-size": "[model] hidden_size",
    "--ffn-hidden-size": "[model] ffn_hidden_size",
    "--num-attention-heads": "[model] num_attention_heads",
    "--group-query-attention": "[model] num_query_groups",
    "--num-query-groups": "[model] num_query_groups",
    "--seq-length": "[model] seq_length",
    "--max-position-embeddings": "[megatron] max_position_embeddings ([model] seq_length)",
    "--num-experts": "[model] num_experts",
    "--moe-ffn-hidden-size": "[model] moe_ffn_hidden_size",
    "--moe-router-topk": "[model] moe_router_topk",
    "--swiglu": "[model] gated_mlp",
    "--untie-embeddings-and-output-weights": "[model] tied_embeddings",
    "--position-embedding-type": "[model] position_embedding",
    "--disable-bias-linear": "[model] bias",
    "--normalization": "[model] normalization",
    **{flag_of(key): f"[model] {key}" for key in (*ARCHITECTURE_VALUES, *ARCHITECTURE_SWITCHES)},
    **{
        flag_of(key): f"[model] {key}"
        for key in ("window_size", "window_attn_skip_freq", "moe_layer_freq", "csa_compress_ratios")
    },
    "--is-hybrid-model": "[model] hybrid_override_pattern",
    "--hybrid-override-pattern": "[model] hybrid_override_pattern",
    "--bf16": "[model] dtype",
    "--fp16": "[model] dtype",
    "--fp8-format": "[model] dtype and [megatron] fp8_format",
}


def _readable(key: str, nargs: Literal[0, 1, "+"] = 0, **how: Any) -> KnownFlag:
    return attrs.evolve(_option_flag(key, nargs), **how)


def _keyed(flag: KnownFlag) -> KnownFlag:
    """A flag read into a [megatron] option stands for that key of the spec."""
    if flag.key is None or flag.spec_key is not None:
        return flag
    return attrs.evolve(flag, spec_key=f"/megatron/{flag.key}")


#: Megatron-LM's flags of the parallel sizes and the rank order: [parallelism] keys
PARALLEL_FLAGS = tuple(
    KnownFlag(
        name=flag,
        source=f"[parallelism] {key}",
        spec_key=f"/parallelism/{key}",
        nargs=1,
        convert=int,
        aliases=ALIASES.get(flag, ()),
    )
    for flag, key in (
        ("--tensor-model-parallel-size", "tp"),
        ("--pipeline-model-parallel-size", "pp"),
        ("--context-parallel-size", "cp"),
        ("--expert-model-parallel-size", "ep"),
        ("--expert-tensor-parallel-size", "etp"),
        ("--num-virtual-stages-per-pipeline-rank", "vpp"),
    )
)
ORDER_FLAG = KnownFlag(
    name="--use-tp-pp-dp-mapping",
    source="[parallelism] order",
    spec_key="/parallelism/order",
    switch_value="tp-cp-ep-pp-dp",
)
#: another way to give the virtual stages (layers per stage), which Megatron-LM refuses
#: together with --num-virtual-stages-per-pipeline-rank; read as given where mdc sets no vpp
VPP_LAYERS = "--num-layers-per-virtual-pipeline-stage"


def _model_flag(flag: str, key: str, nargs: Literal[0, 1] = 1, **how: Any) -> KnownFlag:
    """A flag of a [model] key, read only where the spec has a [model] table."""
    return KnownFlag(
        name=flag,
        source=f"[model] {key}",
        spec_key=f"/model/{key}",
        nargs=nargs,
        needs_table=True,
        **how,
    )


#: [model] keys whose Megatron-LM flag says the same thing; the other [model] flags
#: (--group-query-attention, --bf16, --normalization, ...) have no key of their own
MODEL_FLAGS = (
    *(
        _model_flag(flag, key, convert=int, aliases=ALIASES.get(flag, ()))
        for flag, key in (
            ("--num-layers", "num_layers"),
            ("--hidden-size", "hidden_size"),
            ("--ffn-hidden-size", "ffn_hidden_size"),
            ("--num-attention-heads", "num_attention_heads"),
            ("--seq-length", "seq_length"),
            ("--num-experts", "num_experts"),
            ("--moe-ffn-hidden-size", "moe_ffn_hidden_size"),
            ("--moe-router-topk", "moe_router_topk"),
        )
    ),
    _model_flag("--swiglu", "gated_mlp", 0),
    _model_flag("--untie-embeddings-and-output-weights", "tied_embeddings", 0, switch_value=False),
    _model_flag("--disable-bias-linear", "bias", 0, switch_value=False),
    *(_model_flag(flag_of(key), key, 0) for key in ARCHITECTURE_SWITCHES),
)
#: the [batch] keys' flags, read only where the spec has a [batch] table
BATCH_FLAGS = (
    KnownFlag(
        name="--micro-batch-size",
        source="[batch] micro_batch_size",
        spec_key="/batch/micro_batch_size",
        nargs=1,
        convert=int,
        needs_table=True,
        aliases=ALIASES["--micro-batch-size"],
    ),
    KnownFlag(
        name="--global-batch-size",
        source="[batch] global_batch_size",
        spec_key="/batch/global_batch_size",
        nargs=1,
        convert=int,
        needs_table=True,
    ),
)
#: flags mdc writes from keys with no flag of their own (compared with mdc's value)
_KEYED = {f.name for f in (*PARALLEL_FLAGS, ORDER_FLAG, *MODEL_FLAGS, *BATCH_FLAGS)}


def tuple_type(value: str) -> tuple[int, ...]:
    """Megatron-LM's tuple_type: "128,0" or "(128,0)"."""
    try:
        return tuple(int(i) for i in value.strip("()").split(","))
    except ValueError:
        raise ValueError(value) from None


def moe_freq_type(value: str) -> int | list[int]:
    """Megatron-LM's moe_freq_type: an integer, or a list expression of 0s and 1s such as
    "[1]*3+[0]" (which Megatron-LM evaluates; read here without evaluating code)."""
    if value.strip().isdigit():
        return int(value)
    try:
        parsed = _int_list(ast.parse(value.strip(), mode="eval").body)
    except (SyntaxError, RecursionError):
        raise ValueError(value) from None
    if not isinstance(parsed, list):
        raise ValueError(value)
    return parsed


def _int_list(node: ast.expr) -> int | list[int]:
    """An expression of int literals, lists of them, + and * (at most a few thousand long)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.List):
        items = [_int_list(item) for item in node.elts]
        if all(isinstance(item, int) for item in items):
            return [item for item in items if isinstance(item, int)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
        left, right = _int_list(node.left), _int_list(node.right)
        if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
            return left + right
        if isinstance(node.op, ast.Mult) and isinstance(left, list) and isinstance(right, int):
            return _repeated(left, right)
        if isinstance(left, int) and isinstance(right, int):
            return left + right if isinstance(node.op, ast.Add) else left * right
    raise ValueError(ast.dump(node))


def _repeated(items: list[int], times: int) -> list[int]:
    if not 0 <= times * len(items) <= 65536:
        raise ValueError(f"{times} repeats")
    return items * times


#: how Megatron-LM types the flags mdc writes from another key (arguments.py)
DERIVED_TYPES: Mapping[str, Callable[[str], Any]] = {
    "--window-size": tuple_type,
    "--window-attn-skip-freq": moe_freq_type,
    "--moe-layer-freq": moe_freq_type,
    **{
        flag_of(key): int
        for key in (
            "num_query_groups",
            "kv_channels",
            "q_lora_rank",
            "kv_lora_rank",
            "qk_head_dim",
            "qk_pos_emb_head_dim",
            "v_head_dim",
            "moe_shared_expert_intermediate_size",
            "moe_latent_size",
            "mtp_num_layers",
            "mamba_state_dim",
            "mamba_head_dim",
            "mamba_num_groups",
            "mamba_num_heads",
        )
    },
}


def _derived(flag: str, source: str) -> KnownFlag:
    """A flag mdc writes from a key that is not the flag's own (its value is compared with
    mdc's, typed as Megatron-LM types it); how many values it takes, from its parser."""
    switch = flag in ("--group-query-attention", "--is-hybrid-model", "--bf16", "--fp16")
    convert = DERIVED_TYPES.get(flag, str)
    return KnownFlag(name=flag, source=source, nargs=0 if switch else 1, convert=convert)


#: Every Megatron-LM flag the launcher knows: each read as its spec key wherever the user
#: passes it (the job's command, extra_args), or compared with the value mdc writes.
FLAGS = FlagTable(
    [
        *(
            _keyed(flag)
            for flag in (
                _readable("sequence_parallel"),
                _readable("use_distributed_optimizer"),
                _readable("overlap_grad_reduce"),
                _readable("overlap_param_gather"),
                _readable("overlap_p2p_comm", name=NO_P2P_OVERLAP, switch_value=False),
                _readable("tp_comm_overlap"),
                _readable("recompute_granularity", 1, choices=("full", "selective")),
                KnownFlag(
                    name="--recompute-activations",
                    source="[megatron] recompute_granularity",
                    key="recompute_granularity",
                    switch_value="selective",
                ),
                _readable("recompute_method", 1, choices=("uniform", "block")),
                _readable("recompute_num_layers", 1, convert=int),
                _readable("max_position_embeddings", 1, convert=int),
                _readable("fp8_format", 1, choices=("e4m3", "hybrid")),
                _readable("decoder_first_pipeline_num_layers", 1, convert=int),
                _readable("decoder_last_pipeline_num_layers", 1, convert=int),
                _readable("account_for_embedding_in_pipeline_split"),
                _readable("account_for_loss_in_pipeline_split"),
                _readable("pipeline_model_parallel_layout", 1),
                *OPTION_FLAGS,
                *FP4_FLAGS,
                *BF16_LAYER_FLAGS,
                *OPTIMIZER_FLAGS,
            )
        ),
        *PARALLEL_FLAGS,
        ORDER_FLAG,
        *MODEL_FLAGS,
        *BATCH_FLAGS,
        KnownFlag(name=VPP_LAYERS, source="[parallelism] vpp", nargs=1, convert=int),
        *(
            _derived(flag, source)
            for flag, source in SOURCES.items()
            if flag not in _KEYED and flag not in ("--max-position-embeddings", "--fp8-format")
        ),
    ]
)


#: where a user passes Megatron-LM's flags, in the order Megatron-LM reads them: the
#: job's command, then extra_args (after mdc's own flags)
COMMAND = ArgPlace(pointer="/job/command", where="the job's command")
EXTRA_ARGS = ArgPlace(
    pointer="/megatron/extra_args", where="[megatron] extra_args", table="/megatron"
)
READING = FlagReading(
    table=FLAGS,
    places=(COMMAND, EXTRA_ARGS),
    code="MDC323",
    refused_code="MDC359",
    framework="Megatron-LM",
)
