"""The megatron launcher's command lines against megatron-core 0.16.1 and torch's torchrun.

Megatron-LM's own argument parser (``megatron/training/arguments.py``) is not part of the
megatron-core wheel, so the flags are checked in two steps:

* ``FLAGS`` lists every flag the launcher may emit with its argparse form in Megatron-LM
  core_v0.16.1 and the megatron-core 0.16.1 field or parameter it ends up in; a test
  checks that each of those fields exists in the installed megatron-core.
* every compiled example and a spread of written specs is then parsed as Megatron-LM
  would see it: ``launch/worker.sh``'s exec line through torch's torchrun parser, the
  script's arguments through a parser built from ``FLAGS``. The values must be the plan's,
  and megatron-core's own code must accept them: ``initialize_model_parallel`` (with
  torch.distributed faked, stopped at its first process group, as in
  ``test_rank_generator.py``), ``RankGenerator`` for every group kind,
  ``ModelParallelConfig``/``TransformerConfig``, ``DistributedDataParallelConfig`` and the
  micro-batch calculator.

Run as a script (under torchrun), this module is the program of
``examples/megatron-cpu-2x2.toml``: it parses its arguments the same way, initializes
megatron-core's groups on gloo and writes what it got; ``test_cpu_example_runs`` runs it.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import inspect
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple
from unittest import mock

import pytest

with warnings.catch_warnings():
    # megatron-core warns at import about Transformer Engine/Apex and torch.jit deprecations.
    warnings.simplefilter("ignore")
    pytest.importorskip(
        "megatron.core",
        reason="conformance needs megatron-core==0.16.1 and torch==2.13.0: run scripts/test",
    )
    import torch
    import torch.distributed
    import torch.distributed.run as torchrun
    from megatron.core import parallel_state
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.mamba.mamba_model import MambaModel
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from megatron.core.parallel_state import RankGenerator
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

from mdc.cli import main

pytestmark = pytest.mark.torch

#: not tests.tools.REPO: this module also runs as a script, where tests/ is not importable
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(
    p
    for p in (REPO / "examples").glob("megatron-*")
    if p.suffix in (".toml", ".yaml", ".yml", ".json")
)
DEFAULT_ORDER, TP_PP_DP_ORDER = "tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"
NODE_RANK, MASTER_ADDR = 1, "10.0.0.1"
#: the worker (this module run as a script) writes rank-<RANK>.json here
REPORT_DIR = "MDC_MEGATRON_CHECK_DIR"


def tuple_type(value: str) -> tuple[int, ...]:
    """Megatron-LM's tuple_type (arguments.py): "128,0" or "(128,0)"."""
    return tuple(int(i) for i in value.strip("()").split(","))


def moe_freq_type(value: str) -> int | list[int]:
    """Megatron-LM's moe_freq_type: an integer, or a list expression of 0s and 1s."""
    if value.strip().isdigit():
        return int(value)
    parsed = ast.literal_eval(value)
    assert isinstance(parsed, list)
    return parsed


class Flag(NamedTuple):
    """A Megatron-LM flag: its argparse type and the megatron-core place its value goes."""

    kind: Any
    owner: object
    name: str


#: Every flag the megatron launcher may emit, as Megatron-LM core_v0.16.1 declares it
#: (type int, store_true or store_false, or a string choice), and where megatron-core 0.16.1
#: takes it.
FLAGS: dict[str, Flag] = {
    "--tensor-model-parallel-size": Flag(int, ModelParallelConfig, "tensor_model_parallel_size"),
    "--pipeline-model-parallel-size": Flag(
        int, ModelParallelConfig, "pipeline_model_parallel_size"
    ),
    "--context-parallel-size": Flag(int, ModelParallelConfig, "context_parallel_size"),
    "--expert-model-parallel-size": Flag(int, ModelParallelConfig, "expert_model_parallel_size"),
    "--expert-tensor-parallel-size": Flag(int, ModelParallelConfig, "expert_tensor_parallel_size"),
    "--num-virtual-stages-per-pipeline-rank": Flag(
        int, ModelParallelConfig, "virtual_pipeline_model_parallel_size"
    ),
    "--decoder-first-pipeline-num-layers": Flag(
        int, TransformerConfig, "num_layers_in_first_pipeline_stage"
    ),
    "--decoder-last-pipeline-num-layers": Flag(
        int, TransformerConfig, "num_layers_in_last_pipeline_stage"
    ),
    "--account-for-embedding-in-pipeline-split": Flag(
        bool, TransformerConfig, "account_for_embedding_in_pipeline_split"
    ),
    "--account-for-loss-in-pipeline-split": Flag(
        bool, TransformerConfig, "account_for_loss_in_pipeline_split"
    ),
    "--pipeline-model-parallel-layout": Flag(
        str, TransformerConfig, "pipeline_model_parallel_layout"
    ),
    "--use-tp-pp-dp-mapping": Flag(bool, parallel_state.initialize_model_parallel, "order"),
    "--sequence-parallel": Flag(bool, ModelParallelConfig, "sequence_parallel"),
    "--use-distributed-optimizer": Flag(
        bool, DistributedDataParallelConfig, "use_distributed_optimizer"
    ),
    "--overlap-grad-reduce": Flag(bool, DistributedDataParallelConfig, "overlap_grad_reduce"),
    "--overlap-param-gather": Flag(bool, DistributedDataParallelConfig, "overlap_param_gather"),
    # store_false (kind False): Megatron-LM's dest overlap_p2p_comm, on unless this is passed
    "--no-overlap-p2p-communication": Flag(False, ModelParallelConfig, "overlap_p2p_comm"),
    "--tp-comm-overlap": Flag(bool, ModelParallelConfig, "tp_comm_overlap"),
    "--overlap-moe-expert-parallel-comm": Flag(
        bool, ModelParallelConfig, "overlap_moe_expert_parallel_comm"
    ),
    "--micro-batch-size": Flag(int, ConstantNumMicroBatchesCalculator, "micro_batch_size"),
    "--global-batch-size": Flag(int, ConstantNumMicroBatchesCalculator, "global_batch_size"),
    "--num-layers": Flag(int, TransformerConfig, "num_layers"),
    "--hidden-size": Flag(int, TransformerConfig, "hidden_size"),
    "--ffn-hidden-size": Flag(int, TransformerConfig, "ffn_hidden_size"),
    "--num-attention-heads": Flag(int, TransformerConfig, "num_attention_heads"),
    # Megatron-LM passes num_query_groups on only with --group-query-attention
    "--group-query-attention": Flag(bool, TransformerConfig, "num_query_groups"),
    "--num-query-groups": Flag(int, TransformerConfig, "num_query_groups"),
    "--seq-length": Flag(int, GPTDatasetConfig, "sequence_length"),
    "--max-position-embeddings": Flag(int, GPTModel.__init__, "max_sequence_length"),
    "--num-experts": Flag(int, TransformerConfig, "num_moe_experts"),
    "--moe-ffn-hidden-size": Flag(int, TransformerConfig, "moe_ffn_hidden_size"),
    "--moe-router-topk": Flag(int, TransformerConfig, "moe_router_topk"),
    "--swiglu": Flag(bool, TransformerConfig, "gated_linear_unit"),
    "--untie-embeddings-and-output-weights": Flag(
        bool, GPTModel.__init__, "share_embeddings_and_output_weights"
    ),
    "--position-embedding-type": Flag(str, GPTModel.__init__, "position_embedding_type"),
    "--disable-bias-linear": Flag(bool, TransformerConfig, "add_bias_linear"),
    "--normalization": Flag(str, TransformerConfig, "normalization"),
    "--bf16": Flag(bool, ModelParallelConfig, "bf16"),
    "--fp16": Flag(bool, ModelParallelConfig, "fp16"),
    "--fp8-format": Flag(str, TransformerConfig, "fp8"),
    "--kv-channels": Flag(int, TransformerConfig, "kv_channels"),
    "--qk-layernorm": Flag(bool, TransformerConfig, "qk_layernorm"),
    "--add-qkv-bias": Flag(bool, TransformerConfig, "add_qkv_bias"),
    "--softmax-type": Flag(str, TransformerConfig, "softmax_type"),
    "--window-size": Flag(tuple_type, TransformerConfig, "window_size"),
    "--window-attn-skip-freq": Flag(moe_freq_type, TransformerConfig, "window_attn_skip_freq"),
    "--multi-latent-attention": Flag(bool, TransformerConfig, "multi_latent_attention"),
    "--q-lora-rank": Flag(int, MLATransformerConfig, "q_lora_rank"),
    "--kv-lora-rank": Flag(int, MLATransformerConfig, "kv_lora_rank"),
    "--qk-head-dim": Flag(int, MLATransformerConfig, "qk_head_dim"),
    "--qk-pos-emb-head-dim": Flag(int, MLATransformerConfig, "qk_pos_emb_head_dim"),
    "--v-head-dim": Flag(int, MLATransformerConfig, "v_head_dim"),
    "--moe-shared-expert-intermediate-size": Flag(
        int, TransformerConfig, "moe_shared_expert_intermediate_size"
    ),
    "--moe-layer-freq": Flag(moe_freq_type, TransformerConfig, "moe_layer_freq"),
    "--moe-latent-size": Flag(int, TransformerConfig, "moe_latent_size"),
    "--mtp-num-layers": Flag(int, TransformerConfig, "mtp_num_layers"),
    "--is-hybrid-model": Flag(bool, TransformerConfig, "is_hybrid_model"),
    "--hybrid-override-pattern": Flag(str, MambaModel.__init__, "hybrid_override_pattern"),
    "--mamba-state-dim": Flag(int, TransformerConfig, "mamba_state_dim"),
    "--mamba-head-dim": Flag(int, TransformerConfig, "mamba_head_dim"),
    "--mamba-num-groups": Flag(int, TransformerConfig, "mamba_num_groups"),
    "--mamba-num-heads": Flag(int, TransformerConfig, "mamba_num_heads"),
    "--recompute-granularity": Flag(str, TransformerConfig, "recompute_granularity"),
    "--recompute-method": Flag(str, TransformerConfig, "recompute_method"),
    "--recompute-num-layers": Flag(int, TransformerConfig, "recompute_num_layers"),
    "--recompute-modules": Flag(list, TransformerConfig, "recompute_modules"),
    "--use-megatron-fsdp": Flag(bool, DistributedDataParallelConfig, "use_megatron_fsdp"),
    "--ckpt-format": Flag(str, DistributedOptimizer.sharded_state_dict, "sharding_type"),
    "--data-parallel-sharding-strategy": Flag(
        str, DistributedDataParallelConfig, "data_parallel_sharding_strategy"
    ),
    # Megatron-LM: grad_reduce_in_fp32 = accumulate_allreduce_grads_in_fp32, off with it
    "--grad-reduce-in-bf16": Flag(bool, DistributedDataParallelConfig, "grad_reduce_in_fp32"),
    "--accumulate-allreduce-grads-in-fp32": Flag(
        bool, DistributedDataParallelConfig, "grad_reduce_in_fp32"
    ),
    "--fp8-recipe": Flag(str, TransformerConfig, "fp8_recipe"),
    "--fp8-param-gather": Flag(bool, TransformerConfig, "fp8_param"),
    "--fp4-format": Flag(str, TransformerConfig, "fp4"),
    "--fp4-recipe": Flag(str, TransformerConfig, "fp4_recipe"),
    "--fp4-quantizer-factory": Flag(str, TransformerConfig, "fp4_quantizer_factory"),
    "--fp4-param-gather": Flag(bool, TransformerConfig, "fp4_param"),
    "--use-precision-aware-optimizer": Flag(bool, OptimizerConfig, "use_precision_aware_optimizer"),
    "--main-grads-dtype": Flag(str, OptimizerConfig, "main_grads_dtype"),
    "--main-params-dtype": Flag(str, OptimizerConfig, "main_params_dtype"),
    "--exp-avg-dtype": Flag(str, OptimizerConfig, "exp_avg_dtype"),
    "--exp-avg-sq-dtype": Flag(str, OptimizerConfig, "exp_avg_sq_dtype"),
    "--optimizer-cpu-offload": Flag(bool, OptimizerConfig, "optimizer_cpu_offload"),
    "--optimizer-offload-fraction": Flag(float, OptimizerConfig, "optimizer_offload_fraction"),
    "--cpu-offloading-num-layers": Flag(int, TransformerConfig, "cpu_offloading_num_layers"),
    "--moe-token-dispatcher-type": Flag(str, TransformerConfig, "moe_token_dispatcher_type"),
    "--moe-expert-capacity-factor": Flag(float, TransformerConfig, "moe_expert_capacity_factor"),
    "--moe-pad-expert-input-to-capacity": Flag(
        bool, TransformerConfig, "moe_pad_expert_input_to_capacity"
    ),
    "--moe-router-num-groups": Flag(int, TransformerConfig, "moe_router_num_groups"),
    "--moe-router-group-topk": Flag(int, TransformerConfig, "moe_router_group_topk"),
    "--cp-comm-type": Flag(list, TransformerConfig, "cp_comm_type"),
    "--hierarchical-context-parallel-sizes": Flag(
        list, TransformerConfig, "hierarchical_context_parallel_sizes"
    ),
    "--first-last-layers-bf16": Flag(bool, TransformerConfig, "first_last_layers_bf16"),
    "--num-layers-at-start-in-bf16": Flag(int, TransformerConfig, "num_layers_at_start_in_bf16"),
    "--num-layers-at-end-in-bf16": Flag(int, TransformerConfig, "num_layers_at_end_in_bf16"),
    "--optimizer": Flag(str, OptimizerConfig, "optimizer"),
    "--attention-backend": Flag(str, TransformerConfig, "attention_backend"),
    "--num-distributed-optimizer-instances": Flag(
        int, parallel_state.initialize_model_parallel, "num_distributed_optimizer_instances"
    ),
}
#: mdc group kind -> (megatron generator, get_ranks token)
MEGATRON_TOKENS = {
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


def megatron_parser(*, user_flags: bool = True) -> argparse.ArgumentParser:
    """A parser for the flags in FLAGS, typed as Megatron-LM types them (no abbreviations);
    with ``user_flags``, also one that users pass themselves and the checks read."""
    parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    for flag, spec in FLAGS.items():
        if spec.kind is bool:
            parser.add_argument(flag, action="store_true")
        elif spec.kind is False:
            parser.add_argument(flag, action="store_false", dest=spec.name)
        elif spec.kind is list:
            parser.add_argument(flag, nargs="+", default=None)
        else:
            parser.add_argument(flag, type=spec.kind, default=None)
    if user_flags:
        parser.add_argument("--distributed-backend", default="nccl", choices=["nccl", "gloo"])
        # read by the recompute_modules rule; the user passes it
        parser.add_argument("--moe-grouped-gemm", action="store_true")
    return parser


# ------------------------------------------------------------------ compiling and reading


def compile_spec(spec: Path, out: Path) -> tuple[int, str, dict[str, Any] | None]:
    """``mdc compile`` with only mdc's own plugins; (exit code, stderr, plan.json)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    code = main(
        ["compile", str(spec), "-o", str(out), "--no-plugin-autoload"], stdout=stdout, stderr=stderr
    )
    plan = json.loads((out / "plan.json").read_text(encoding="utf-8")) if code == 0 else None
    return code, stderr.getvalue(), plan


def write_spec(tmp_path: Path, spec: dict[str, Any]) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    return path


def read_script(out: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """The argv launch/worker.sh execs (runtime variables put in as a backend would) and the
    variables it exports."""
    script = (out / "launch" / "worker.sh").read_text(encoding="utf-8")
    values = {
        "NODE_RANK": str(NODE_RANK),
        "MASTER_ADDR": MASTER_ADDR,
        "MASTER_PORT": str(port),
        "MDC_OUT": str(out),
    }
    expanded = re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], script)
    env = {}
    for line in expanded.splitlines():
        if line.startswith("export ") and "=" in line:
            name, _, value = line[len("export ") :].partition("=")
            env[name] = shlex.split(value)[0]
    _, sep, command = expanded.partition("\nexec ")
    assert sep, script
    return shlex.split(command), env


def program_args(plan: dict[str, Any]) -> list[str]:
    """The user's own arguments after the program (what precedes mdc's Megatron args)."""
    words = list(plan["job"]["command"])
    if re.fullmatch(r"python(\d+(\.\d+)?)?", os.path.basename(words[0])):
        words = words[1:]
        while words and words[0] == "-u":
            words = words[1:]
        if words[0] == "-m":
            words = words[1:]
    return words[1:]


# ------------------------------------------------------------------ megatron-core's verdicts


class _Validated(Exception):
    """Raised instead of creating megatron's first process group: every check has passed."""


def _stop(*args: object, **kwargs: object) -> None:
    raise _Validated


def initialize_verdict(world: int, ns: argparse.Namespace) -> str | None:
    """None if megatron-core's initialize_model_parallel accepts the sizes, else its error."""
    with contextlib.ExitStack() as stack:
        for name, fake in (
            ("is_initialized", lambda: True),
            ("get_world_size", lambda group=None: world),
            ("get_rank", lambda group=None: 0),
        ):
            stack.enter_context(mock.patch.object(torch.distributed, name, fake))
        stack.enter_context(mock.patch.object(parallel_state, "create_group", _stop))
        try:
            parallel_state.initialize_model_parallel(**model_parallel_kwargs(ns))
        except _Validated:
            return None
        except (RuntimeError, AssertionError) as exc:
            return str(exc)
    raise AssertionError("initialize_model_parallel returned without creating a group")


def model_parallel_kwargs(ns: argparse.Namespace) -> dict[str, Any]:
    return {
        "tensor_model_parallel_size": ns.tensor_model_parallel_size,
        "pipeline_model_parallel_size": ns.pipeline_model_parallel_size,
        "virtual_pipeline_model_parallel_size": ns.num_virtual_stages_per_pipeline_rank,
        "context_parallel_size": ns.context_parallel_size,
        "expert_model_parallel_size": ns.expert_model_parallel_size,
        "expert_tensor_parallel_size": ns.expert_tensor_parallel_size,
        "order": TP_PP_DP_ORDER if ns.use_tp_pp_dp_mapping else DEFAULT_ORDER,
        "num_distributed_optimizer_instances": ns.num_distributed_optimizer_instances or 1,
    }


def megatron_groups(world: int, ns: argparse.Namespace) -> dict[str, list[list[int]]]:
    tp, pp, cp = (
        ns.tensor_model_parallel_size,
        ns.pipeline_model_parallel_size,
        ns.context_parallel_size,
    )
    ep, etp = ns.expert_model_parallel_size, ns.expert_tensor_parallel_size
    order = model_parallel_kwargs(ns)["order"]
    generators = {
        "dense": RankGenerator(tp=tp, ep=1, dp=world // (tp * pp * cp), pp=pp, cp=cp, order=order),
        "expert": RankGenerator(
            tp=etp, ep=ep, dp=world // (etp * ep * pp), pp=pp, cp=1, order=order
        ),
    }
    return {
        kind: generators[grid].get_ranks(token) for kind, (grid, token) in MEGATRON_TOKENS.items()
    }


def dtype_of(ns: argparse.Namespace) -> torch.dtype:
    return torch.bfloat16 if ns.bf16 else torch.float16 if ns.fp16 else torch.float32


def transformer_config(ns: argparse.Namespace) -> TransformerConfig:
    """megatron-core's config from the parsed flags, as Megatron-LM builds it from its args
    (placeholders for shape values the spec left to the user's own arguments)."""
    heads = ns.num_attention_heads or ns.tensor_model_parallel_size
    architecture: dict[str, Any] = {
        key: getattr(ns, key)
        for key in (
            "kv_channels",
            "softmax_type",
            "window_size",
            "window_attn_skip_freq",
            "moe_shared_expert_intermediate_size",
            "moe_layer_freq",
            "moe_latent_size",
            "mtp_num_layers",
            "mamba_state_dim",
            "mamba_head_dim",
            "mamba_num_groups",
            "mamba_num_heads",
        )
        if getattr(ns, key) is not None
    }
    architecture.update(
        qk_layernorm=ns.qk_layernorm,
        add_qkv_bias=ns.add_qkv_bias or not ns.disable_bias_linear,
        is_hybrid_model=ns.is_hybrid_model,
    )
    config_class = TransformerConfig
    if ns.multi_latent_attention:  # Megatron-LM builds an MLATransformerConfig for MLA
        config_class = MLATransformerConfig
        architecture.update(
            {
                key: getattr(ns, key)
                for key in (
                    "q_lora_rank",
                    "kv_lora_rank",
                    "qk_head_dim",
                    "qk_pos_emb_head_dim",
                    "v_head_dim",
                )
                if getattr(ns, key) is not None
            }
        )
        architecture.setdefault("q_lora_rank", None)  # Megatron-LM's default: no q compression
    overlap_p2p = ns.overlap_p2p_comm and ns.num_virtual_stages_per_pipeline_rank is not None
    return config_class(
        **architecture,
        tensor_model_parallel_size=ns.tensor_model_parallel_size,
        pipeline_model_parallel_size=ns.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=ns.num_virtual_stages_per_pipeline_rank,
        context_parallel_size=ns.context_parallel_size,
        expert_model_parallel_size=ns.expert_model_parallel_size,
        expert_tensor_parallel_size=ns.expert_tensor_parallel_size,
        sequence_parallel=ns.sequence_parallel,
        # Megatron-LM's validate_args turns the send overlap off without virtual stages,
        # and batches the sends exactly when they are not overlapped
        overlap_p2p_comm=overlap_p2p,
        batch_p2p_comm=not overlap_p2p,
        tp_comm_overlap=ns.tp_comm_overlap,
        overlap_moe_expert_parallel_comm=ns.overlap_moe_expert_parallel_comm,
        pipeline_dtype=dtype_of(ns),
        params_dtype=dtype_of(ns),
        bf16=ns.bf16,
        fp16=ns.fp16,
        num_layers=ns.num_layers
        or ns.pipeline_model_parallel_size * (ns.num_virtual_stages_per_pipeline_rank or 1),
        hidden_size=ns.hidden_size or 8 * heads,
        ffn_hidden_size=ns.ffn_hidden_size,
        num_attention_heads=heads,
        num_query_groups=ns.num_query_groups if ns.group_query_attention else None,
        num_moe_experts=ns.num_experts,
        add_bias_linear=not ns.disable_bias_linear,
        gated_linear_unit=ns.swiglu,
        normalization=ns.normalization or "LayerNorm",
        moe_ffn_hidden_size=ns.moe_ffn_hidden_size,
        moe_router_topk=ns.moe_router_topk or 2,
        fp8=ns.fp8_format,
        recompute_granularity=ns.recompute_granularity,
        recompute_method=ns.recompute_method,
        recompute_num_layers=ns.recompute_num_layers,
        recompute_modules=ns.recompute_modules,
        fp8_recipe=ns.fp8_recipe or "delayed",
        fp8_param=ns.fp8_param_gather,
        fp4=ns.fp4_format,
        fp4_recipe=ns.fp4_recipe or "nvfp4",
        fp4_quantizer_factory=ns.fp4_quantizer_factory,
        fp4_param=ns.fp4_param_gather,
        # Megatron-LM: cpu_offloading follows cpu_offloading_num_layers > 0
        cpu_offloading=bool(ns.cpu_offloading_num_layers),
        cpu_offloading_num_layers=ns.cpu_offloading_num_layers or 0,
        moe_token_dispatcher_type=ns.moe_token_dispatcher_type or "allgather",
        moe_expert_capacity_factor=ns.moe_expert_capacity_factor,
        moe_pad_expert_input_to_capacity=ns.moe_pad_expert_input_to_capacity,
        moe_router_num_groups=ns.moe_router_num_groups,
        moe_router_group_topk=ns.moe_router_group_topk,
        moe_grouped_gemm=ns.moe_grouped_gemm,
        first_last_layers_bf16=ns.first_last_layers_bf16,
        # TransformerConfig's defaults: one layer at each end
        num_layers_at_start_in_bf16=ns.num_layers_at_start_in_bf16
        if ns.num_layers_at_start_in_bf16 is not None
        else 1,
        num_layers_at_end_in_bf16=ns.num_layers_at_end_in_bf16
        if ns.num_layers_at_end_in_bf16 is not None
        else 1,
    )


def optimizer_config(ns: argparse.Namespace) -> OptimizerConfig:
    """megatron-core's optimizer config as Megatron-LM builds it from the parsed flags."""
    dtypes = {
        "fp32": torch.float32,
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "fp8": torch.uint8,
    }
    return OptimizerConfig(
        optimizer=ns.optimizer or "adam",
        use_distributed_optimizer=ns.use_distributed_optimizer,
        use_precision_aware_optimizer=ns.use_precision_aware_optimizer,
        main_grads_dtype=dtypes[ns.main_grads_dtype or "fp32"],
        main_params_dtype=dtypes[ns.main_params_dtype or "fp32"],
        exp_avg_dtype=dtypes[ns.exp_avg_dtype or "fp32"],
        exp_avg_sq_dtype=dtypes[ns.exp_avg_sq_dtype or "fp32"],
        optimizer_cpu_offload=ns.optimizer_cpu_offload,
        optimizer_offload_fraction=ns.optimizer_offload_fraction or 1.0,
    )


def resolve_torchrun(args: Any, plan: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's own resolution of its parsed flags (config_from_args) matches the plan."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # keep config_from_args off this process's env
    config, _, _ = torchrun.config_from_args(args)
    assert (config.min_nodes, config.max_nodes) == (plan["min_nnodes"], plan["nnodes"])
    assert config.nproc_per_node == plan["nproc_per_node"]
    if plan["nnodes"] > 1:
        assert config.rdzv_endpoint == f"{MASTER_ADDR}:{plan['rendezvous']['master_port']}"


# ------------------------------------------------------------------ one compiled job


def check_job(
    out: Path, plan: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> argparse.Namespace:
    """Parse and check launch/worker.sh against plan.json and megatron-core; the parsed flags."""
    argv, env = read_script(out, plan["rendezvous"]["master_port"])
    assert argv[0] == "torchrun"
    for name in [k for k in os.environ if k.startswith("PET_")]:
        monkeypatch.delenv(name)  # torchrun's parser takes its defaults from PET_*
    args = torchrun.get_args_parser().parse_args(argv[1:])
    assert args.nproc_per_node == str(plan["nproc_per_node"])
    assert args.nnodes == str(plan["nnodes"])
    resolve_torchrun(args, plan, monkeypatch)
    script_args = list(args.training_script_args)

    ns = megatron_parser().parse_known_args(script_args)[0]
    rest = megatron_parser(user_flags=False).parse_known_args(script_args)[1]
    options = plan["options"].get("megatron") or {}
    extra_args = list(options.get("extra_args", []))
    own = program_args(plan)
    # flags in FLAGS that a user may also pass (switches mdc does not emit, and flags mdc
    # reads from extra_args into their keys and emits in its place) are parsed away too
    theirs = megatron_parser(user_flags=False).parse_known_args([*own, *extra_args])[1]
    assert rest == theirs, "mdc's flags must come after the user's own arguments"
    assert script_args[: len(own)] == own
    for flag in FLAGS:  # each flag once: Megatron-LM's parser keeps the last one silently
        assert script_args.count(flag) <= 1, flag

    p, world = plan["parallelism"], plan["world_size"]
    assert (
        ns.tensor_model_parallel_size,
        ns.pipeline_model_parallel_size,
        ns.context_parallel_size,
        ns.expert_model_parallel_size,
        ns.expert_tensor_parallel_size,
    ) == (p["tp"], p["pp"], p["cp"], p["ep"], p["etp"])
    assert ns.num_virtual_stages_per_pipeline_rank == p["vpp"]
    # Megatron-LM's own derivation of dp (world from torchrun's WORLD_SIZE)
    assert world // (p["tp"] * p["pp"] * p["cp"]) == p["dp"]

    error = initialize_verdict(world, ns)
    assert error is None, error
    groups = megatron_groups(world, ns)
    for kind, expected in groups.items():
        assert plan["groups"][kind]["size"] == len(expected[0]), kind
        if "ranks" in plan["groups"][kind]:
            assert plan["groups"][kind]["ranks"] == expected, kind

    codes = {w["code"] for w in plan["warnings"]}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            transformer_config(ns)
            bias_refused = False
        except AssertionError as exc:  # mdc warns (MDC324): the user's arguments may fix it
            assert "Bias in Moe is only supported when ETP==1" in str(exc)
            bias_refused = True
    assert bias_refused == ("MDC324" in codes)
    ep_without_sp = [w for w in caught if "sequence parallelism must be used" in str(w.message)]
    assert bool(ep_without_sp) == ("MDC325" in codes)
    # Megatron-LM's validate_args: bf16 accumulates and all-reduces in fp32 unless
    # --grad-reduce-in-bf16 or bf16 main gradients; other dtypes only when asked to
    fp32_reduce = bool(ns.accumulate_allreduce_grads_in_fp32)
    if ns.bf16:
        fp32_reduce = not ns.grad_reduce_in_bf16 and (ns.main_grads_dtype or "fp32") == "fp32"
    ddp = DistributedDataParallelConfig(
        use_distributed_optimizer=ns.use_distributed_optimizer,
        overlap_grad_reduce=ns.overlap_grad_reduce,
        overlap_param_gather=ns.overlap_param_gather,
        use_megatron_fsdp=ns.use_megatron_fsdp,
        data_parallel_sharding_strategy=ns.data_parallel_sharding_strategy or "no_shard",
        grad_reduce_in_fp32=fp32_reduce,
    )
    if plan.get("memory") is not None and not getattr(ns, "use_torch_fsdp2", False):
        # megatron-core's DistributedDataParallel: the gradient buffer holds
        # `torch.float if ddp_config.grad_reduce_in_fp32 else param.dtype`
        grad_dtype = torch.float32 if ddp.grad_reduce_in_fp32 else dtype_of(ns)
        assert plan["memory"]["bytes_per_param"]["gradients"] == grad_dtype.itemsize
    if ns.use_megatron_fsdp:  # Megatron-LM's validate_args
        assert ns.ckpt_format == "fsdp_dtensor"
    if not ns.use_precision_aware_optimizer:  # (which needs Transformer Engine to check)
        optimizer_config(ns)
    if plan["batch"] is not None:
        assert (ns.micro_batch_size, ns.global_batch_size) == (
            plan["batch"]["micro_batch_size"],
            plan["batch"]["global_batch_size"],
        )
        calculator = ConstantNumMicroBatchesCalculator(
            ns.global_batch_size, ns.micro_batch_size, p["dp"], False, 0
        )
        assert calculator.get() == plan["batch"]["grad_accum_steps"]
    else:
        assert ns.micro_batch_size is None and ns.global_batch_size is None

    model = plan["model"] or {}
    for flag_dest, key in (
        ("num_layers", "num_layers"),
        ("hidden_size", "hidden_size"),
        ("num_attention_heads", "num_attention_heads"),
        ("ffn_hidden_size", "ffn_hidden_size"),
        ("seq_length", "seq_length"),
        ("num_experts", "num_experts"),
    ):
        assert getattr(ns, flag_dest) == model.get(key), flag_dest
    for key in (
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
        "hybrid_override_pattern",
        "mamba_state_dim",
        "mamba_head_dim",
        "mamba_num_groups",
        "mamba_num_heads",
        "window_attn_skip_freq",
        "moe_layer_freq",
    ):
        assert getattr(ns, key) == model.get(key), key
    assert ns.window_size == (tuple(model["window_size"]) if model.get("window_size") else None)
    for key in ("qk_layernorm", "add_qkv_bias", "multi_latent_attention"):
        assert getattr(ns, key) == bool(model.get(key)), key
    assert ns.is_hybrid_model == (model.get("hybrid_override_pattern") is not None)
    groups_given = model.get("num_query_groups")
    if groups_given not in (None, model.get("num_attention_heads")):
        assert ns.group_query_attention and ns.num_query_groups == groups_given
    else:
        assert not ns.group_query_attention
    if model.get("seq_length"):
        assert ns.max_position_embeddings >= model["seq_length"]
    assert (ns.bf16, ns.fp16) == (
        model.get("dtype") in ("bf16", "fp8"),
        model.get("dtype") == "fp16",
    )
    assert ns.sequence_parallel == (p["tp"] > 1 and options.get("sequence_parallel") is not False)

    # the environment contract
    assert env["TENSOR_MODEL_PARALLEL_SIZE"] == str(p["tp"])
    assert env["PIPELINE_MODEL_PARALLEL_SIZE"] == str(p["pp"])
    assert env["CONTEXT_PARALLEL_SIZE"] == str(p["cp"])
    # Megatron-LM asserts it is not 1 under Megatron-FSDP, and only warns with the EP
    # overlap (which wants more connections)
    wanted = (
        plan["accelerator"] != "cpu"
        and (p["tp"] > 1 or p["cp"] > 1)
        and not ns.use_megatron_fsdp
        and not ns.overlap_moe_expert_parallel_comm
    )
    assert env.get("CUDA_DEVICE_MAX_CONNECTIONS") == ("1" if wanted else None)
    for name in (
        "TENSOR_MODEL_PARALLEL_SIZE",
        "PIPELINE_MODEL_PARALLEL_SIZE",
        "CONTEXT_PARALLEL_SIZE",
    ):
        assert plan["worker_env"][name] == env[name]
    return ns


# ------------------------------------------------------------------ the tests


def test_every_flag_lands_in_megatron_core() -> None:
    for flag, spec in FLAGS.items():
        owner = spec.owner
        if dataclasses.is_dataclass(owner):
            names = {f.name for f in dataclasses.fields(owner)}
        else:
            names = set(inspect.signature(owner).parameters)  # type: ignore[arg-type]
        assert spec.name in names, f"{flag}: {owner} has no {spec.name}"
        assert flag.startswith("--") and flag == flag.lower()


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_is_what_megatron_core_accepts(
    example: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    code, stderr, plan = compile_spec(example, tmp_path / "out")
    assert code == 0 and plan is not None, stderr
    check_job(tmp_path / "out", plan, monkeypatch)


def spec(
    tp: int,
    pp: int,
    cp: int = 1,
    ep: int = 1,
    etp: int | None = None,
    vpp: int | None = None,
    order: str | None = None,
    nnodes: int = 2,
    nproc: int = 8,
    model: dict[str, Any] | None = None,
    batch: dict[str, int] | None = None,
    megatron: dict[str, Any] | None = None,
    command: list[str] | None = None,
    accelerator: str = "nvidia",
) -> dict[str, Any]:
    parallelism: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "ep": ep}
    for key, value in (("etp", etp), ("vpp", vpp), ("order", order)):
        if value is not None:
            parallelism[key] = value
    data: dict[str, Any] = {
        "job": {
            "name": "megatron-conformance",
            "command": command or ["python", "pretrain_gpt.py", "--mock-data"],
        },
        "distributed": {
            "launcher": "megatron",
            "nnodes": nnodes,
            "nproc_per_node": nproc,
            "accelerator": accelerator,
        },
        "parallelism": parallelism,
    }
    for key, table in (("model", model), ("batch", batch), ("megatron", megatron)):
        if table is not None:
            data[key] = table
    return data


DENSE = {"num_layers": 16, "hidden_size": 256, "num_attention_heads": 8, "seq_length": 512}
MOE = {**DENSE, "num_experts": 8}
#: DeepSeek-V3's architecture at a small size: MLA, shared experts, a dense first layer, MTP
LATENT_MOE = {
    **MOE,
    "num_layers": 4,
    "multi_latent_attention": True,
    "q_lora_rank": 64,
    "kv_lora_rank": 32,
    "qk_head_dim": 32,
    "qk_pos_emb_head_dim": 16,
    "v_head_dim": 32,
    "qk_layernorm": True,
    "moe_shared_expert_intermediate_size": 128,
    "moe_layer_freq": [0, 1, 1, 1],
    "mtp_num_layers": 1,
    "bias": False,
    "position_embedding": "rope",
    "normalization": "rmsnorm",
}
#: Qwen3 / gpt-oss attention: explicit head width, QK norms, sinks, sliding windows
WIDE_HEADS = {
    **DENSE,
    "kv_channels": 64,
    "num_query_groups": 2,
    "qk_layernorm": True,
    "add_qkv_bias": True,
    "bias": False,
    "softmax_type": "learnable",
    "window_size": [128, 0],
    "window_attn_skip_freq": 2,
}
#: a Nemotron-H style hybrid stack
HYBRID = {
    **DENSE,
    "num_layers": 8,
    "hybrid_override_pattern": "M-M*-M*-",
    "mamba_state_dim": 16,
    "mamba_head_dim": 16,
    "mamba_num_groups": 2,
    "mamba_num_heads": 16,
    "position_embedding": "none",
    "bias": False,
}
#: written specs: every size, the two orders, vpp, MoE, GQA, each dtype, the options
SPECS: dict[str, dict[str, Any]] = {
    "tp8-pp2": spec(8, 2),
    "tp1-pp1-dp16-cpu": spec(
        1, 1, accelerator="cpu", batch={"global_batch_size": 64, "micro_batch_size": 2}
    ),
    "tp2-cp4-pp2": spec(
        2,
        2,
        cp=4,
        model={**DENSE, "dtype": "bf16"},
        batch={"global_batch_size": 8, "micro_batch_size": 1},
    ),
    "tp2-pp2-vpp4": spec(2, 2, vpp=4, model={**DENSE, "num_query_groups": 2}),
    "no-p2p-overlap": spec(
        2, 4, vpp=2, nnodes=4, model=DENSE, megatron={"overlap_p2p_comm": False}
    ),
    "tp-comm-overlap": spec(4, 2, model=DENSE, megatron={"tp_comm_overlap": True}),
    "tp-comm-overlap-flag": spec(2, 2, model=DENSE, megatron={"extra_args": ["--tp-comm-overlap"]}),
    "tp-pp-dp-order": spec(2, 2, order=TP_PP_DP_ORDER, model=DENSE),
    "latent-moe-mtp": spec(1, 2, ep=8, model=LATENT_MOE),
    "wide-heads": spec(2, 1, model=WIDE_HEADS),
    "hybrid-mamba": spec(2, 1, model=HYBRID),
    "short-order": spec(2, 2, order="tp-pp-dp", model=DENSE),
    "moe-etp1": spec(2, 2, ep=4, etp=1, model={**MOE, "dtype": "bf16"}),
    "moe-etp-tp-no-sp": spec(
        2,
        1,
        ep=2,
        model=MOE,
        megatron={"sequence_parallel": False, "extra_args": ["--disable-bias-linear"]},
    ),
    "moe-tp-pp-dp-order": spec(2, 2, ep=2, etp=1, order=TP_PP_DP_ORDER, model=MOE),
    "fp16-gqa-ffn": spec(
        4, 1, model={**DENSE, "num_query_groups": 8, "ffn_hidden_size": 1024, "dtype": "fp16"}
    ),
    "fp16-fp32-grads": spec(
        2,
        1,
        model={**DENSE, "dtype": "fp16"},
        megatron={"extra_args": ["--accumulate-allreduce-grads-in-fp32"]},
    ),
    "fp8": spec(8, 1, model={**DENSE, "dtype": "fp8"}, megatron={"fp8_format": "e4m3"}),
    "no-dist-opt-no-sp": spec(
        4,
        2,
        model=DENSE,
        megatron={
            "use_distributed_optimizer": False,
            "sequence_parallel": False,
            "overlap_grad_reduce": True,
        },
    ),
    "overlap-recompute-full": spec(
        2,
        4,
        model=DENSE,
        megatron={
            "overlap_grad_reduce": True,
            "overlap_param_gather": True,
            "recompute_granularity": "full",
            "recompute_method": "block",
            "recompute_num_layers": 2,
            "max_position_embeddings": 4096,
        },
    ),
    "recompute-selective-extra": spec(
        8,
        2,
        model=DENSE,
        megatron={"recompute_granularity": "selective", "extra_args": ["--lr", "3e-4", "--swiglu"]},
    ),
    "bare-command": spec(
        2, 2, command=["bash", "-c", 'exec python pretrain_gpt.py "$@"', "pretrain"]
    ),
    "megatron-fsdp-fp8-params": spec(
        1,
        1,
        model={**DENSE, "dtype": "fp8"},
        megatron={
            "use_megatron_fsdp": True,
            "data_parallel_sharding_strategy": "optim_grads_params",
            "fp8_recipe": "tensorwise",
            "fp8_param_gather": True,
            "grad_reduce_in_bf16": True,
            "cpu_offloading_num_layers": 4,
        },
    ),
    "nvfp4-params": spec(
        2,
        1,
        model={**DENSE, "dtype": "bf16"},
        megatron={"fp4_format": "e2m1", "fp4_recipe": "nvfp4", "fp4_param_gather": True},
    ),
    "nvfp4-from-extra-args": spec(
        2,
        1,
        model={**DENSE, "dtype": "bf16"},
        megatron={"extra_args": ["--fp4-format", "e2m1", "--fp4-param-gather", "--lr", "3e-4"]},
    ),
    "fsdp-and-offload-from-extra-args": spec(
        2,
        1,
        model=DENSE,
        megatron={
            "extra_args": [
                "--use-megatron-fsdp",
                "--data-parallel-sharding-strategy=optim_grads",
                "--use-precision-aware-optimizer",
                "--optimizer-cpu-offload",
                "--optimizer-offload-fraction",
                "0.5",
                "--exp-avg-dtype",
                "bf16",
                "--lr",
                "3e-4",
            ]
        },
    ),
    "bf16-layers-and-optimizer-instances-from-extra-args": spec(
        2,
        1,
        model={**DENSE, "dtype": "fp8"},
        megatron={
            "fp8_recipe": "tensorwise",
            "extra_args": [
                "--first-last-layers-bf16",
                "--num-layers-at-end-in-bf16",
                "2",
                "--num-distributed-optimizer-instances",
                "2",
                "--lr",
                "3e-4",
            ],
        },
    ),
    "muon": spec(2, 1, model={**DENSE, "dtype": "bf16"}, megatron={"optimizer": "muon"}),
    "eager-attention": spec(2, 1, model={**DENSE, "flash_attention": False}),
    # a migrated script's flags in the job's command: read as their keys, emitted once
    "migrated-command-flags": spec(
        2,
        1,
        model={**DENSE, "dtype": "fp8"},
        megatron={"fp8_recipe": "tensorwise"},
        command=[
            "python",
            "pretrain_gpt.py",
            "--mock-data",
            "--tensor-model-parallel-size=2",
            "--recompute-granularity",
            "selective",
            "--recompute-modules",
            "core_attn",
            "mlp",
            "--grad-reduce-in-bf16",
            "--fp8-param-gather",
        ],
    ),
    "migrated-command-moe": spec(  # ep also written, to the same value: one setting
        2,
        1,
        ep=2,
        etp=1,
        model={**MOE, "bias": False, "dtype": "bf16"},
        command=[
            "python",
            "pretrain_gpt.py",
            "--mock-data",
            "--expert-model-parallel-size",
            "2",
            "--moe-token-dispatcher-type=alltoall",
        ],
    ),
    "selective-modules-moe-alltoall": spec(
        2,
        1,
        ep=2,
        model=MOE,
        megatron={
            "recompute_granularity": "selective",
            "recompute_modules": ["core_attn", "layernorm", "moe_act"],
            "moe_token_dispatcher_type": "alltoall",
            "moe_expert_capacity_factor": 1.25,
            "moe_pad_expert_input_to_capacity": True,
            "extra_args": ["--disable-bias-linear", "--moe-grouped-gemm"],
        },
    ),
}

#: option sets each megatron-core 0.16.1 config refuses or accepts; mdc must agree
RULES: dict[str, tuple[dict[str, Any], dict[str, Any], bool]] = {
    # (model overrides, [megatron] options, megatron-core refuses)
    "offload-all-layers": ({}, {"cpu_offloading_num_layers": 16}, True),
    "offload-some-layers": ({}, {"cpu_offloading_num_layers": 15}, False),
    "offload-with-recompute": (
        {},
        {"cpu_offloading_num_layers": 2, "recompute_granularity": "selective"},
        True,
    ),
    "moe-act-without-grouped-gemm": (
        {"num_experts": 8},
        {"recompute_granularity": "selective", "recompute_modules": ["moe_act"]},
        True,
    ),
    "layernorm-with-delayed-fp8": (
        {"dtype": "fp8"},
        {"recompute_granularity": "selective", "recompute_modules": ["layernorm"]},
        True,
    ),
    "layernorm-bf16": (
        {},
        {"recompute_granularity": "selective", "recompute_modules": ["layernorm", "mlp"]},
        False,
    ),
    "pad-without-capacity": (
        {"num_experts": 8},
        {"moe_pad_expert_input_to_capacity": True, "moe_token_dispatcher_type": "alltoall"},
        True,
    ),
    "flex-deepep-pad": (
        {"num_experts": 8},
        {
            "moe_pad_expert_input_to_capacity": True,
            "moe_expert_capacity_factor": 1.0,
            "moe_token_dispatcher_type": "flex",
        },
        True,
    ),
    "fp8-params-without-fp8": ({}, {"fp8_param_gather": True}, True),
    "fp4-params-without-fp4": ({}, {"fp4_param_gather": True}, True),
    "fp4-with-fp8": ({"dtype": "fp8"}, {"fp4_format": "e2m1"}, True),
    "fp4-params": ({}, {"fp4_format": "e2m1", "fp4_param_gather": True}, False),
    "fp4-custom-without-factory": ({}, {"fp4_format": "e2m1", "fp4_recipe": "custom"}, True),
    "fp4-custom-with-factory": (
        {},
        {"fp4_format": "e2m1", "fp4_recipe": "custom", "fp4_quantizer_factory": "pkg.factory"},
        False,
    ),
    "bf16-main-grads-without-precision-aware": ({}, {"main_grads_dtype": "bf16"}, True),
    "bf16-layers-delayed-fp8": ({"dtype": "fp8"}, {"first_last_layers_bf16": True}, True),
    "bf16-layers-tensorwise-fp8": (
        {"dtype": "fp8"},
        {
            "first_last_layers_bf16": True,
            "fp8_recipe": "tensorwise",
            "num_layers_at_start_in_bf16": 3,
        },
        False,
    ),
    "bf16-layers-a-whole-stage": (
        {"dtype": "fp8"},
        {"first_last_layers_bf16": True, "fp8_recipe": "mxfp8", "num_layers_at_end_in_bf16": 16},
        False,
    ),
    "bf16-layers-more-than-a-stage": (
        {"dtype": "fp8"},
        {"first_last_layers_bf16": True, "fp8_recipe": "mxfp8", "num_layers_at_end_in_bf16": 17},
        True,
    ),
    "bf16-layers-under-fp4": (
        {},
        {"first_last_layers_bf16": True, "fp4_format": "e2m1", "num_layers_at_end_in_bf16": 17},
        False,
    ),
    "precision-aware-sgd": (
        {},
        {"optimizer": "sgd", "use_precision_aware_optimizer": True},
        True,
    ),
    "sgd": ({}, {"optimizer": "sgd"}, False),
    "precision-aware-without-distributed-optimizer": (
        {},
        {
            "use_precision_aware_optimizer": True,
            "optimizer_cpu_offload": True,
            "use_distributed_optimizer": False,
        },
        True,
    ),
}


def core_refuses(model: dict[str, Any], options: dict[str, Any]) -> bool:
    """Whether megatron-core's TransformerConfig or OptimizerConfig refuses the options, as
    Megatron-LM passes them (its flag names mapped to the configs' fields)."""
    words: list[str] = ["--num-layers", str(model["num_layers"])]
    words += ["--hidden-size", str(model["hidden_size"])]
    words += ["--num-attention-heads", str(model["num_attention_heads"])]
    words += ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1"]
    words += ["--context-parallel-size", "1", "--expert-model-parallel-size", "1"]
    words += ["--expert-tensor-parallel-size", "1", "--disable-bias-linear"]
    if model.get("num_experts"):
        words += ["--num-experts", str(model["num_experts"])]
    if model.get("dtype") == "fp8":
        words += ["--bf16", "--fp8-format", "hybrid"]
    if options.get("use_distributed_optimizer", True):
        words.append("--use-distributed-optimizer")
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if key == "use_distributed_optimizer":
            continue
        if value is True:
            words.append(flag)
        elif isinstance(value, list):
            words += [flag, *value]
        else:
            words += [flag, str(value)]
    ns = megatron_parser().parse_args(words)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            transformer_config(ns)
            optimizer_config(ns)
    except (ValueError, AssertionError):
        return True
    except TypeError:  # past its checks, the precision-aware path asks Transformer Engine
        assert ns.use_precision_aware_optimizer
    return False


@pytest.mark.parametrize("case", sorted(RULES))
def test_memory_options_refused_exactly_when_megatron_core_refuses(
    case: str, tmp_path: Path
) -> None:
    overrides, options, refused = RULES[case]
    model = {**DENSE, **overrides}
    assert core_refuses(model, options) == refused
    code, err, _ = compile_spec(
        write_spec(tmp_path, spec(2, 1, model=model, megatron=options)), tmp_path / "out"
    )
    mine = re.findall(r"error\[(MDC35[4-8]|MDC394|MDC47[4-6])\]", err)
    assert bool(mine) == refused, err
    assert code == (1 if refused else 0), err


@pytest.mark.parametrize("case", sorted(SPECS))
def test_written_spec_is_what_megatron_core_accepts(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, stderr, plan = compile_spec(write_spec(tmp_path, SPECS[case]), tmp_path / "out")
    assert code == 0 and plan is not None, stderr
    ns = check_job(tmp_path / "out", plan, monkeypatch)
    if case == "fp8":
        assert ns.fp8_format == "e4m3" and ns.bf16
    if case.startswith("bf16-layers"):
        assert (ns.first_last_layers_bf16, ns.num_layers_at_end_in_bf16) == (True, 2)
        assert ns.num_distributed_optimizer_instances == 2
    if case == "eager-attention":  # Megatron-Core's unfused attention keeps the scores
        assert ns.attention_backend == "unfused"
        assert AttnBackend[ns.attention_backend] in (AttnBackend.unfused, AttnBackend.local)
    if case == "muon":  # Megatron-LM runs Muon without the distributed optimizer
        assert ns.optimizer == "muon" and not ns.use_distributed_optimizer
    if case.startswith("nvfp4"):
        assert (ns.fp4_format, ns.fp4_param_gather, ns.bf16) == ("e2m1", True, True)
    if case.startswith("migrated-command"):  # each flag once, where mdc writes its key
        script = (tmp_path / "out/launch/worker.sh").read_text(encoding="utf-8")
        if case == "migrated-command-flags":
            assert ns.recompute_modules == ["core_attn", "mlp"]
            assert ns.grad_reduce_in_bf16 and ns.fp8_param_gather
            flags = ["--tensor-model-parallel-size", "--recompute-modules", "--fp8-param-gather"]
        else:
            assert (ns.moe_token_dispatcher_type, ns.expert_model_parallel_size) == ("alltoall", 2)
            flags = ["--moe-token-dispatcher-type", "--expert-model-parallel-size"]
        for flag in flags:
            assert script.count(flag) == 1, flag
    if case == "no-p2p-overlap":  # transformer_config gave it to megatron-core
        assert ns.overlap_p2p_comm is False
    else:
        assert ns.overlap_p2p_comm is True  # Megatron-LM's default
    # mdc's rule is validate_args' (sequence parallelism on), so megatron-core gets both
    assert ns.tp_comm_overlap == case.startswith("tp-comm-overlap")
    if ns.tp_comm_overlap:
        assert ns.sequence_parallel and ns.tensor_model_parallel_size > 1
    if case == "overlap-recompute-full":
        assert (ns.recompute_granularity, ns.recompute_method, ns.recompute_num_layers) == (
            "full",
            "block",
            2,
        )
        assert ns.overlap_param_gather and ns.overlap_grad_reduce
        assert ns.max_position_embeddings == 4096


ORDERS = (
    "tp-cp-ep-dp-pp",
    "tp-cp-ep-pp-dp",
    "tp-pp-dp",
    "tp-dp-pp",
    "cp-tp-ep-dp-pp",
    "tp-ep-cp-dp-pp",
    "dp-tp-cp-ep-pp",
    "tp-cp-pp-ep-dp",
    "pp-tp-cp-ep-dp",
)
SIZES = (
    (2, 2, 1, 1, 2),
    (2, 2, 2, 1, 2),
    (4, 1, 2, 2, 1),
    (2, 2, 1, 2, 1),
    (1, 2, 2, 2, 1),
    (2, 1, 1, 4, 2),
)


def order_cases() -> Iterator[tuple[str, tuple[int, ...]]]:
    for order in ORDERS:
        for sizes in SIZES:
            yield order, sizes


@pytest.mark.parametrize(
    ("order", "sizes"),
    list(order_cases()),
    ids=[f"{o}-{'.'.join(map(str, s))}" for o, s in order_cases()],
)
def test_order_is_accepted_exactly_when_megatron_lm_can_lay_it_out(
    order: str, sizes: tuple[int, int, int, int, int], tmp_path: Path
) -> None:
    """An order compiles iff it gives the groups of one of Megatron-LM's two orders."""
    tp, pp, cp, ep, etp = sizes
    model = {**DENSE, "num_experts": 8} if ep > 1 else DENSE
    code, stderr, plan = compile_spec(
        write_spec(
            tmp_path,
            spec(tp, pp, cp=cp, ep=ep, etp=etp, order=order, model=model, nnodes=2, nproc=8),
        ),
        tmp_path / "out",
    )
    world = 16
    dense_dp, expert_dp = world // (tp * pp * cp), world // (etp * ep * pp)
    try:
        wanted = {
            "dense": RankGenerator(tp=tp, ep=1, dp=dense_dp, pp=pp, cp=cp, order=order),
            "expert": RankGenerator(tp=etp, ep=ep, dp=expert_dp, pp=pp, cp=1, order=order),
        }
        layout = {
            kind: wanted[grid].get_ranks(token) for kind, (grid, token) in MEGATRON_TOKENS.items()
        }
    except RuntimeError:  # the order leaves out an axis larger than 1: the core says MDC204
        assert code != 0 and "MDC204" in stderr
        return
    expressible = []
    for megatron_order in (DEFAULT_ORDER, TP_PP_DP_ORDER):
        same = {
            "dense": RankGenerator(tp=tp, ep=1, dp=dense_dp, pp=pp, cp=cp, order=megatron_order),
            "expert": RankGenerator(tp=etp, ep=ep, dp=expert_dp, pp=pp, cp=1, order=megatron_order),
        }
        if all(
            same[grid].get_ranks(token) == layout[kind]
            for kind, (grid, token) in MEGATRON_TOKENS.items()
        ):
            expressible.append(megatron_order)
    if code != 0 and "MDC320" not in stderr:
        # the core's rule for pp not last (dp and expert dp differ) stops the plan first
        assert "MDC205" in stderr, stderr
        return
    assert (code == 0) == bool(expressible), stderr
    if code != 0:
        return
    assert plan is not None
    script = (tmp_path / "out" / "launch" / "worker.sh").read_text(encoding="utf-8")
    mapped = "--use-tp-pp-dp-mapping" in script
    assert (TP_PP_DP_ORDER if mapped else DEFAULT_ORDER) in expressible
    for kind, expected in layout.items():
        assert plan["groups"][kind]["ranks"] == expected, kind


INSTANCES = [(tp, cp, n) for tp, cp in ((2, 1), (2, 2), (4, 2)) for n in (1, 2, 3, 4, 8)]


@pytest.mark.parametrize(
    ("tp", "cp", "instances"), INSTANCES, ids=[f"tp{t}-cp{c}-x{n}" for t, c, n in INSTANCES]
)
def test_optimizer_instances_refused_exactly_when_megatron_core_refuses(
    tp: int, cp: int, instances: int, tmp_path: Path
) -> None:
    """num_distributed_optimizer_instances must divide dp * cp: initialize_model_parallel's
    assert, asked with the same sizes (16 ranks)."""
    words = ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", "1"]
    words += ["--context-parallel-size", str(cp), "--expert-model-parallel-size", "1"]
    words += ["--expert-tensor-parallel-size", "1"]
    words += ["--num-distributed-optimizer-instances", str(instances)]
    verdict = initialize_verdict(16, megatron_parser().parse_args(words))
    options = {"num_distributed_optimizer_instances": instances}
    code, err, _ = compile_spec(
        write_spec(tmp_path, spec(tp, 1, cp=cp, model=DENSE, megatron=options)), tmp_path / "out"
    )
    assert ("MDC474" in err) == (verdict is not None), (verdict, err)
    assert (code == 0) == (verdict is None), err


RECOMPUTE = [
    (g, m, n)
    for g in ("selective", "full")
    for m in (None, "uniform", "block")
    for n in (None, 1, 2)
]


@pytest.mark.parametrize(
    ("granularity", "method", "count"), RECOMPUTE, ids=[f"{g}-{m}-{n}" for g, m, n in RECOMPUTE]
)
def test_recompute_settings_rejected_exactly_when_megatron_core_rejects_them(
    granularity: str, method: str | None, count: int | None, tmp_path: Path
) -> None:
    options: dict[str, Any] = {"recompute_granularity": granularity}
    if method is not None:
        options["recompute_method"] = method
    if count is not None:
        options["recompute_num_layers"] = count
    code, stderr, _ = compile_spec(
        write_spec(tmp_path, spec(2, 2, model=DENSE, megatron=options)), tmp_path / "out"
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # advice about Transformer Engine's fused attention
            TransformerConfig(
                num_layers=16,
                hidden_size=256,
                num_attention_heads=8,
                pipeline_model_parallel_size=2,
                pipeline_dtype=torch.float32,
                recompute_granularity=granularity,
                recompute_method=method,
                recompute_num_layers=count,
            )
        rejected = False
    except ValueError:
        rejected = True
    # Megatron-LM's validate_args adds one rule of its own: 'recompute method is not yet
    # supported for selective recomputing granularity'
    rejected = rejected or (granularity == "selective" and method is not None)
    assert (code != 0 and "MDC322" in stderr) == rejected, stderr


def test_recompute_settings_without_granularity_are_refused(tmp_path: Path) -> None:
    """megatron-core ignores them; mdc says they do nothing rather than drop them silently."""
    code, stderr, _ = compile_spec(
        write_spec(
            tmp_path,
            spec(
                2, 2, model=DENSE, megatron={"recompute_method": "block", "recompute_num_layers": 1}
            ),
        ),
        tmp_path / "out",
    )
    assert code == 1 and stderr.count("MDC322") == 2


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5])
def test_uniform_recompute_runs_must_divide_the_model_chunk(count: int, tmp_path: Path) -> None:
    """16 layers over pp 2 x vpp 2: chunks of 4 layers, walked in runs of ``count``."""
    code, stderr, _ = compile_spec(
        write_spec(
            tmp_path,
            spec(
                2,
                2,
                vpp=2,
                model=DENSE,
                megatron={
                    "recompute_granularity": "full",
                    "recompute_method": "uniform",
                    "recompute_num_layers": count,
                },
            ),
        ),
        tmp_path / "out",
    )
    chunk = 16 // (2 * 2)
    assert (code == 0) == (chunk % count == 0), stderr


@pytest.mark.parametrize(("etp", "disable_bias"), [(1, False), (2, False), (2, True)])
def test_moe_bias_warning_matches_transformer_config(
    etp: int, disable_bias: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """check_job holds MDC324 against TransformerConfig's own refusal of MoE bias with etp > 1."""
    extra = ["--disable-bias-linear"] if disable_bias else []
    code, stderr, plan = compile_spec(
        write_spec(tmp_path, spec(2, 1, ep=2, etp=etp, model=MOE, megatron={"extra_args": extra})),
        tmp_path / "out",
    )
    assert code == 0 and plan is not None, stderr
    assert ("MDC324" in stderr) == (etp > 1 and not disable_bias)
    check_job(tmp_path / "out", plan, monkeypatch)


@pytest.mark.parametrize("tp", [1, 2])
def test_sequence_parallel_follows_tp(tp: int, tmp_path: Path) -> None:
    """With tp = 1 ModelParallelConfig refuses --sequence-parallel; mdc never passes it then."""
    code, stderr, _ = compile_spec(
        write_spec(tmp_path, spec(tp, 1, model=DENSE, megatron={"sequence_parallel": True})),
        tmp_path / "out",
    )
    assert code == 0, stderr
    script = (tmp_path / "out" / "launch" / "worker.sh").read_text(encoding="utf-8")
    assert ("--sequence-parallel" in script) == (tp > 1)
    assert ("MDC325" in stderr) == (tp == 1)
    with pytest.raises(ValueError, match="Cannot use sequence parallelism"):
        ModelParallelConfig(tensor_model_parallel_size=1, sequence_parallel=True)


@pytest.mark.parametrize(
    ("options", "code_wanted"),
    [
        ({"overlap_param_gather": True}, "MDC321"),
        (
            {
                "overlap_param_gather": True,
                "overlap_grad_reduce": True,
                "use_distributed_optimizer": False,
            },
            "MDC321",
        ),
        ({"extra_args": ["--use-torch-fsdp2"]}, "MDC321"),
        ({"extra_args": ["--tensor-model-parallel-size", "4"]}, "MDC323"),
        ({"extra_args": ["--num-layers-per-virtual-pipeline-stage=2"]}, "MDC323"),
        ({"extra_args": ["--micro-batch-size", "4"]}, "MDC323"),
        ({"max_position_embeddings": 256}, "MDC326"),
        ({"fp8_format": "hybrid"}, "MDC326"),
    ],
    ids=[
        "param-gather-alone",
        "param-gather-no-dist-opt",
        "fsdp2-dist-opt",
        "tp-twice",
        "vpp-alias",
        "batch-twice",
        "positions-below-seq",
        "fp8-format-without-fp8",
    ],
)
def test_megatron_lm_rules_are_errors(
    options: dict[str, Any], code_wanted: str, tmp_path: Path
) -> None:
    code, stderr, _ = compile_spec(
        write_spec(
            tmp_path,
            spec(
                2,
                2,
                model=DENSE,
                batch={"global_batch_size": 16, "micro_batch_size": 1},
                megatron=options,
            ),
        ),
        tmp_path / "out",
    )
    assert code == 1 and f"error[{code_wanted}]" in stderr, stderr


@pytest.mark.parametrize(
    "written", [{"overlap_p2p_comm": False}, {"extra_args": ["--no-overlap-p2p-communication"]}]
)
@pytest.mark.parametrize(("pp", "vpp"), [(2, 2), (4, 2), (2, None)])
def test_interleaving_without_send_overlap_needs_pp_above_2(
    written: dict[str, Any], pp: int, vpp: int | None, tmp_path: Path
) -> None:
    """Megatron-LM's validate_args refuses --no-overlap-p2p-communication with virtual
    stages unless pp > 2; written as the key or passed in extra_args, mdc refuses it there."""
    code, stderr, _ = compile_spec(
        write_spec(tmp_path, spec(2, pp, vpp=vpp, nnodes=pp, model=DENSE, megatron=written)),
        tmp_path / "out",
    )
    refused = vpp is not None and pp <= 2
    assert (code == 1 and "error[MDC321]" in stderr) == refused, stderr
    if refused:
        where = "extra_args/0" if "extra_args" in written else "overlap_p2p_comm"
        assert f"(at /megatron/{where})" in stderr


def core_refuses_router_groups(groups: int | None, chosen: int) -> bool:
    """Whether megatron-core's TransformerConfig refuses group-limited routing of 8 experts,
    2 per token, over ``groups`` groups with ``chosen`` groups per token."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its advice on defaults it fills in
            TransformerConfig(
                num_layers=2, hidden_size=64, num_attention_heads=8, num_moe_experts=8,
                moe_ffn_hidden_size=256, moe_router_topk=2, moe_router_num_groups=groups,
                moe_router_group_topk=chosen,
            )  # fmt: skip
    except (AssertionError, ValueError):
        return True
    return False


@pytest.mark.parametrize("how", ["key", "extra_args"])
@pytest.mark.parametrize(("groups", "chosen"), [(4, 2), (2, 2), (None, 2), (3, 1), (2, 4)])
def test_router_groups_refused_exactly_when_megatron_core_refuses(
    how: str, groups: int | None, chosen: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group-limited routing (--moe-router-num-groups, --moe-router-group-topk), written as
    keys or passed in extra_args: refused where megatron-core's TransformerConfig refuses
    it (MDC321 at the group top-k), else passed to Megatron-LM as written."""
    keys = {"moe_router_group_topk": chosen}
    if groups is not None:
        keys["moe_router_num_groups"] = groups
    written: dict[str, Any] = dict(keys)
    if how == "extra_args":
        words = [w for k, v in keys.items() for w in ("--" + k.replace("_", "-"), str(v))]
        written = {"extra_args": words}
    written["moe_token_dispatcher_type"] = "alltoall"
    code, stderr, plan = compile_spec(
        write_spec(tmp_path, spec(2, 1, ep=2, model=MOE, megatron=written)), tmp_path / "out"
    )
    refused = core_refuses_router_groups(groups, chosen)
    assert (code == 1 and "error[MDC321]" in stderr) == refused, stderr
    if refused:
        where = "moe_router_group_topk" if how == "key" else "extra_args/"
        assert f"(at /megatron/{where}" in stderr
    else:
        assert plan is not None
        ns = check_job(tmp_path / "out", plan, monkeypatch)
        assert (ns.moe_router_num_groups, ns.moe_router_group_topk) == (groups, chosen)


def validate_args_refuses_tp_comm_overlap(tp: int, sequence_parallel: bool) -> bool:
    """Megatron-LM core_v0.16.1's validate_args (megatron/training/arguments.py, not in the
    wheel): sequence parallelism off when tp is 1, then `assert args.sequence_parallel` for
    --tp-comm-overlap. megatron-core's ModelParallelConfig adds no rule of its own."""
    if tp == 1:
        sequence_parallel = False
    config = ModelParallelConfig(
        tensor_model_parallel_size=tp, sequence_parallel=sequence_parallel, tp_comm_overlap=True
    )
    return not config.sequence_parallel


@pytest.mark.parametrize("how", ["key", "extra_args"])
@pytest.mark.parametrize(("tp", "sequence_parallel"), [(1, None), (2, None), (2, False)])
def test_tp_comm_overlap_needs_sequence_parallelism(
    how: str,
    tp: int,
    sequence_parallel: bool | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--tp-comm-overlap, written as the key or passed in extra_args, is refused exactly
    where Megatron-LM's validate_args refuses it, at the key or the extra_args word."""
    written: dict[str, Any] = (
        {"tp_comm_overlap": True} if how == "key" else {"extra_args": ["--tp-comm-overlap"]}
    )
    if sequence_parallel is not None:
        written["sequence_parallel"] = sequence_parallel
    code, stderr, plan = compile_spec(
        write_spec(tmp_path, spec(tp, 2, model=DENSE, megatron=written)), tmp_path / "out"
    )
    # mdc passes --sequence-parallel unless sequence_parallel = false
    refused = validate_args_refuses_tp_comm_overlap(tp, sequence_parallel is not False)
    assert (code == 1 and "error[MDC321]" in stderr) == refused, stderr
    if refused:
        where = "extra_args/0" if how == "extra_args" else "tp_comm_overlap"
        assert f"(at /megatron/{where})" in stderr
        assert "sequence parallelism is enabled" in stderr
    else:
        assert plan is not None
        ns = check_job(tmp_path / "out", plan, monkeypatch)
        assert ns.tp_comm_overlap and ns.sequence_parallel
        script = (tmp_path / "out" / "launch" / "worker.sh").read_text(encoding="utf-8")
        assert script.count("--tp-comm-overlap") == 1


ALLTOALL = {"moe_token_dispatcher_type": "alltoall"}
MOE_BF16 = {**MOE, "dtype": "bf16"}
LATENT_BF16 = {**LATENT_MOE, "dtype": "bf16"}

#: (parallelism, [model], [megatron] without the overlap) for --overlap-moe-expert-parallel-comm
EP_OVERLAP: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "ep2": ({"ep": 2}, MOE_BF16, ALLTOALL),
    "ep2-flex": ({"ep": 2}, MOE_BF16, {"moe_token_dispatcher_type": "flex"}),
    "ep2-pp2-vpp2": ({"ep": 2, "pp": 2, "vpp": 2}, MOE_BF16, ALLTOALL),
    "ep2-pp2": ({"ep": 2, "pp": 2}, MOE_BF16, ALLTOALL),
    "ep1": ({}, MOE_BF16, ALLTOALL),
    "allgather": ({"ep": 2}, MOE_BF16, {}),
    "full-recompute": (
        {"ep": 2},
        MOE_BF16,
        {
            **ALLTOALL,
            "recompute_granularity": "full",
            "recompute_method": "uniform",
            "recompute_num_layers": 1,
        },
    ),  # fmt: skip
    "selective-recompute": (
        {"ep": 2},
        MOE_BF16,
        {**ALLTOALL, "recompute_granularity": "selective"},
    ),
    "fp32": ({"ep": 2}, {**MOE, "dtype": "fp32"}, ALLTOALL),
    "no-dtype": ({"ep": 2}, MOE, ALLTOALL),
    "mtp1-pp1": ({"ep": 2}, LATENT_BF16, ALLTOALL),
    "mtp1-pp2-vpp2": ({"ep": 2, "pp": 2, "vpp": 2}, LATENT_BF16, ALLTOALL),
    "mtp2-pp2-vpp2": (
        {"ep": 2, "pp": 2, "vpp": 2},
        {**LATENT_BF16, "mtp_num_layers": 2},
        ALLTOALL,
    ),  # fmt: skip
}


@pytest.mark.parametrize("how", ["key", "extra_args"])
@pytest.mark.parametrize("case", sorted(EP_OVERLAP))
def test_ep_overlap_refused_exactly_when_megatron_core_refuses(
    case: str, how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spec compiles without the overlap; megatron-core's TransformerConfig of that very
    job, with the overlap turned on, raises exactly where mdc refuses the overlap (MDC321 at
    the key or the extra_args word); where it does not, the job with it passes check_job."""
    sizes, model, options = EP_OVERLAP[case]
    layout = {"tp": 2, "pp": 1, "etp": 1, **sizes}
    base = spec(nnodes=layout["pp"], model=model, megatron=options, **layout)
    code, stderr, plan = compile_spec(write_spec(tmp_path, base), tmp_path / "base")
    assert code == 0 and plan is not None, stderr
    ns = check_job(tmp_path / "base", plan, monkeypatch)
    ns.overlap_moe_expert_parallel_comm = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            transformer_config(ns)
        refused = False
    except AssertionError:
        refused = True
    before = list(options.get("extra_args", []))
    written = (
        {**options, "overlap_moe_expert_parallel_comm": True}
        if how == "key"
        else {**options, "extra_args": [*before, "--overlap-moe-expert-parallel-comm"]}
    )
    code, stderr, plan = compile_spec(
        write_spec(tmp_path, {**base, "megatron": written}), tmp_path / "out"
    )
    mine = re.findall(r"error\[MDC321\].*\(at (/megatron/[^)]*)\)", stderr)
    assert bool(mine) == refused, stderr
    if refused:
        where = (
            f"extra_args/{len(before)}"
            if how == "extra_args"
            else "overlap_moe_expert_parallel_comm"
        )
        assert set(mine) == {f"/megatron/{where}"}, stderr
    else:
        assert code == 0 and plan is not None, stderr
        assert check_job(tmp_path / "out", plan, monkeypatch).overlap_moe_expert_parallel_comm


def test_a_flag_in_the_command_is_an_error_but_other_flags_pass(tmp_path: Path) -> None:
    command = ["python", "pretrain_gpt.py", "--hidden-size", "512", "--lr", "1e-4"]
    code, stderr, _ = compile_spec(
        write_spec(tmp_path, spec(2, 2, model=DENSE, command=command)), tmp_path / "out"
    )
    assert code == 1 and stderr.count("MDC323") == 1 and "/job/command/2" in stderr
    without = {k: v for k, v in DENSE.items() if k != "hidden_size"}
    code, stderr, _ = compile_spec(
        write_spec(tmp_path, spec(2, 2, model=without, command=command)), tmp_path / "out2"
    )
    assert code == 0, stderr


def test_fsdp_flags_keep_cuda_device_max_connections_unset(tmp_path: Path) -> None:
    code, stderr, _ = compile_spec(
        write_spec(
            tmp_path,
            spec(
                2,
                1,
                model=DENSE,
                megatron={
                    "use_distributed_optimizer": False,
                    "extra_args": ["--use-megatron-fsdp"],
                },
            ),
        ),
        tmp_path / "out",
    )
    assert code == 0, stderr
    _, env = read_script(tmp_path / "out", 29500)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in env


def test_fp16_with_expert_parallelism_is_an_error(tmp_path: Path) -> None:
    code, stderr, _ = compile_spec(
        write_spec(tmp_path, spec(2, 1, ep=2, etp=1, model={**MOE, "dtype": "fp16"})),
        tmp_path / "out",
    )
    assert code == 1 and "error[MDC324]" in stderr


# ------------------------------------------------------------------ a real run on the CPU


def worker() -> None:
    """The program of examples/megatron-cpu-2x2.toml: megatron-core's groups on gloo."""
    ns, _ = megatron_parser().parse_known_args(sys.argv[1:])
    torch.distributed.init_process_group(ns.distributed_backend)
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    parallel_state.initialize_model_parallel(**model_parallel_kwargs(ns))
    transformer_config(ns)
    DistributedDataParallelConfig(use_distributed_optimizer=ns.use_distributed_optimizer)
    dp = parallel_state.get_data_parallel_world_size()
    calculator = ConstantNumMicroBatchesCalculator(
        ns.global_batch_size, ns.micro_batch_size, dp, False, rank
    )
    ranks = torch.distributed.get_process_group_ranks
    groups = {
        "tp": ranks(parallel_state.get_tensor_model_parallel_group()),
        "pp": ranks(parallel_state.get_pipeline_model_parallel_group()),
        "cp": ranks(parallel_state.get_context_parallel_group()),
        "dp": ranks(parallel_state.get_data_parallel_group()),
        "dp-cp": ranks(parallel_state.get_data_parallel_group(with_context_parallel=True)),
        "tp-pp": ranks(parallel_state.get_model_parallel_group()),
        "ep": ranks(parallel_state.get_expert_model_parallel_group()),
        "expert-tp": ranks(parallel_state.get_expert_tensor_parallel_group()),
        "expert-dp": ranks(parallel_state.get_expert_data_parallel_group()),
    }
    total = torch.tensor([float(rank)])
    torch.distributed.all_reduce(total, group=parallel_state.get_tensor_model_parallel_group())
    report = {
        "rank": rank,
        "world": world,
        "groups": groups,
        "microbatches": calculator.get(),
        "tp_sum": total.item(),
        "env": {
            name: os.environ.get(name)
            for name in (
                "TENSOR_MODEL_PARALLEL_SIZE",
                "PIPELINE_MODEL_PARALLEL_SIZE",
                "CONTEXT_PARALLEL_SIZE",
                "CUDA_DEVICE_MAX_CONNECTIONS",
            )
        },
    }
    Path(os.environ[REPORT_DIR], f"rank-{rank}.json").write_text(json.dumps(report) + "\n")
    # every rank is done before any closes its gloo connections (as rank_probe.py says)
    torch.distributed.barrier()
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


def run_local(
    out: Path, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``bash out/local/run.sh`` from the repository root, in its own process group."""
    process = subprocess.Popen(
        ["bash", str(out / "local" / "run.sh")],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"the job did not finish in {timeout} s:\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.mark.slow
@pytest.mark.xdist_group("loopback")  # a real CPU run on loopback ports
def test_cpu_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 2 x 2 CPU example under the local backend: megatron-core builds the plan's groups."""
    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    code, stderr, plan = compile_spec(REPO / "examples" / "megatron-cpu-2x2.toml", out)
    assert code == 0 and plan is not None, stderr
    reports = tmp_path / "reports"
    reports.mkdir()
    venv_bin = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        REPORT_DIR: str(reports),
        "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONWARNINGS": "ignore",
    }
    result = run_local(out, env)
    assert result.returncode == 0, result.stderr[-5000:]
    found = sorted(reports.glob("rank-*.json"))
    assert len(found) == plan["world_size"]
    for path in found:
        report = json.loads(path.read_text(encoding="utf-8"))
        rank = report["rank"]
        assert report["world"] == plan["world_size"]
        for kind, got in report["groups"].items():
            mine = [g for g in plan["groups"][kind]["ranks"] if rank in g]
            assert mine == [got], (kind, rank)
        assert report["microbatches"] == plan["batch"]["grad_accum_steps"]
        tp_group = next(g for g in plan["groups"]["tp"]["ranks"] if rank in g)
        assert report["tp_sum"] == sum(tp_group)
        assert report["env"] == {
            "TENSOR_MODEL_PARALLEL_SIZE": "2",
            "PIPELINE_MODEL_PARALLEL_SIZE": "1",
            "CONTEXT_PARALLEL_SIZE": "1",
            "CUDA_DEVICE_MAX_CONNECTIONS": None,
        }


if __name__ == "__main__":
    worker()


def test_the_flags_read_as_keys_have_megatron_lms_shapes() -> None:
    """Every flag the megatron launcher reads as a spec key takes its values as Megatron-LM
    declares it (FLAGS above: a switch, store_false, one typed value, or several)."""
    from mdc_builtin.launchers.megatron.flags import READING

    checked = 0
    for flag in READING.table.flags:  # read as keys, or compared with what mdc writes
        spec = FLAGS.get(flag.name)
        if spec is None:
            continue
        checked += 1
        if spec.kind in (bool, False):  # a switch (the value its key takes: test_flags_as_keys)
            assert flag.nargs == 0, flag.name
        elif spec.kind is list:
            assert flag.nargs == "+", flag.name
        else:
            assert flag.nargs == 1, flag.name
            if spec.kind in (int, float):
                assert flag.convert("3") == spec.kind("3"), flag.name
                assert type(flag.convert("3")) is spec.kind, flag.name
            for sample in {tuple_type: ["(128,0)", "64,0"], moe_freq_type: ["2", "[0,1,1]"]}.get(
                spec.kind, []
            ):
                assert flag.convert(sample) == spec.kind(sample), flag.name
    assert checked >= 50
