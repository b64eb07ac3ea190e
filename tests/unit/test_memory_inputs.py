"""The memory inputs real runs use: each launcher key changes the estimate by the amount the
framework's own formula gives, and a flag in extra_args counts as its key.

The expected bytes are derived here from published formulas, not from mdc's code:

* Megatron-Core's distributed optimizer and Megatron-FSDP (docs: "6 + 12/d bytes per
  parameter"; the sharding strategies shard optimizer state, then gradients, then weights),
  ZeRO (Rajbhandari et al. 2020: 2 + 2 + 12 bytes per parameter, stage k divides the first
  k of optimizer, gradients, weights by N_d), FSDP2 under TorchTitan (float32 sharded
  parameters and gradients, Adam's two float32 moments: 16 / d);
* Korthikanti et al. 2022 for one layer's activations: s*b*h*34 with fused attention and
  t = 1 (19 of it the MLP: its input 2, the 4h-wide intermediates 8 + 8, a mask 1; 4 the
  two norms' inputs; the norm outputs are the QKV and MLP inputs, 2 + 2), plus
  5*a*s/h with eager attention, and 2*s*b*h kept by full recompute.
"""

from __future__ import annotations

import io
import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from tests.tools import published_model

from mdc.cli import main
from mdc.errors import SpecError
from mdc.pipeline import Compiler
from mdc.plan.memory import MemoryEstimate

GIB = 1 << 30
#: Llama 3 70B (80 layers, untied embeddings), in bf16
LLAMA3_70B: dict[str, Any] = published_model("llama3-70b", dtype="bf16")
#: a classic GPT layer (LayerNorm, 4h GeLU MLP, biases, learned positions): Korthikanti's terms
L, H, A, V, S = 8, 1024, 16, 32000, 2048
CLASSIC: dict[str, Any] = {
    "num_layers": L,
    "hidden_size": H,
    "num_attention_heads": A,
    "vocab_size": V,
    "seq_length": S,
    "dtype": "bf16",
}


def spec(
    launcher: str,
    table: dict[str, Any] | None = None,
    *,
    model: dict[str, Any] | None = None,
    nnodes: int = 16,
    nproc: int = 4,
    parallelism: dict[str, Any] | None = None,
    batch: dict[str, Any] | None = None,
    capacity: float | None = None,
) -> dict[str, Any]:
    distributed: dict[str, Any] = {
        "launcher": launcher,
        "nnodes": nnodes,
        "nproc_per_node": nproc,
        "accelerator": "nvidia",
    }
    if capacity is not None:
        distributed["accelerator_memory_gib"] = capacity
    return {
        "job": {"name": "memory", "command": ["python", "train.py"]},
        "distributed": distributed,
        "parallelism": parallelism or {"tp": 1, "pp": 1},
        "batch": batch or {"global_batch_size": nnodes * nproc, "micro_batch_size": 1},
        "model": model or LLAMA3_70B,
        launcher: table or {},
    }


def estimate_of(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> MemoryEstimate:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    memory = compiler.compile(path, tree=False).plan.memory
    assert memory is not None
    return memory


def refusal(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> list[str]:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        compiler.compile(path, tree=False)
    return [d.render() for d in caught.value.diagnostics if d.is_error]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ------------------------------------------------------------------ weights, grads, optimizer

#: Megatron-FSDP's strategies: which of weights (2 B), fp32 gradients (4 B) and Adam (12 B)
#: are sharded over dp
FSDP = {
    "no_shard": (False, False, False),
    "optim": (False, False, True),
    "optim_grads": (False, True, True),
    "optim_grads_params": (True, True, True),
}


@pytest.mark.parametrize("strategy", list(FSDP))
def test_megatron_fsdp_shards_as_its_strategy_says(
    compiler: Compiler, tmp_path: Path, strategy: str
) -> None:
    table = {
        "use_megatron_fsdp": True,
        "data_parallel_sharding_strategy": strategy,
        "use_distributed_optimizer": False,
    }
    m = estimate_of(compiler, tmp_path, spec("megatron", table))
    p, d = m.params_total, 64
    weights, grads, optim = FSDP[strategy]
    assert m.weights == ceil_div(2 * p, d if weights else 1)
    assert m.gradients == ceil_div(4 * p, d if grads else 1)
    assert m.optimizer == ceil_div(12 * p, d if optim else 1)


#: what Megatron-LM asks of --use-torch-fsdp2 (validate_args): no distributed optimizer, no
#: gradient accumulation fusion, untied embeddings (LLAMA3_70B has them)
TORCH_FSDP2 = {
    "use_torch_fsdp2": True,
    "use_distributed_optimizer": False,
    "extra_args": ["--no-gradient-accumulation-fusion"],
}


def test_torch_fsdp2_shards_weights_gradients_and_optimizer(
    compiler: Compiler, tmp_path: Path
) -> None:
    m = estimate_of(compiler, tmp_path, spec("megatron", TORCH_FSDP2))
    p, d = m.params_total, 64
    assert (m.weights, m.gradients, m.optimizer) == (
        ceil_div(2 * p, d),
        ceil_div(4 * p, d),
        ceil_div(12 * p, d),
    )
    # the flag in extra_args is the key
    extra = {
        **TORCH_FSDP2,
        "extra_args": ["--use-torch-fsdp2", "--no-gradient-accumulation-fusion"],
    }
    del extra["use_torch_fsdp2"]
    assert estimate_of(compiler, tmp_path, spec("megatron", extra)).total == m.total


@pytest.mark.parametrize(
    ("change", "quote"),
    [
        ({"parallelism": {"tp": 1, "pp": 2}}, "is not supported with pipeline parallelism"),
        ({"table": {"extra_args": []}}, "is not supported with gradient accumulation fusion"),
        ({"model": {**LLAMA3_70B, "tied_embeddings": True}}, "requires --untie-embeddings"),
        ({"table": {"use_distributed_optimizer": True}}, "MCore's distributed optimizer"),
    ],
)
def test_torch_fsdp2_is_refused_where_megatron_lm_refuses_it(
    compiler: Compiler, tmp_path: Path, change: dict[str, Any], quote: str
) -> None:
    table = {**TORCH_FSDP2, **change.get("table", {})}
    data = spec(
        "megatron",
        table,
        model=change.get("model"),
        parallelism=change.get("parallelism"),
    )
    errors = refusal(compiler, tmp_path, data)
    assert len(errors) == 1 and quote in errors[0], errors


def test_llama3_70b_fsdp_64_on_gb200_is_about_18_bytes_over_64(
    compiler: Compiler, tmp_path: Path
) -> None:
    """The issue's case: 70.6e9 parameters * 18 B / 64 = 18.5 GiB of state per GPU."""
    table = {"use_megatron_fsdp": True, "data_parallel_sharding_strategy": "optim_grads_params"}
    m = estimate_of(compiler, tmp_path, spec("megatron", table))
    state = m.weights + m.gradients + m.optimizer
    assert abs(state - 70.6e9 * 18 / 64) < 0.01 * state


def test_grad_reduce_in_bf16_halves_the_gradients(compiler: Compiler, tmp_path: Path) -> None:
    fp32 = estimate_of(compiler, tmp_path, spec("megatron"))
    bf16 = estimate_of(compiler, tmp_path, spec("megatron", {"grad_reduce_in_bf16": True}))
    assert fp32.gradients == 4 * fp32.params_total and bf16.gradients == 2 * bf16.params_total
    assert bf16.total == fp32.total - 2 * fp32.params_total


def test_fp16_gradients_take_two_bytes_unless_accumulated_in_fp32(
    compiler: Compiler, tmp_path: Path
) -> None:
    """Megatron-LM turns on fp32 gradient accumulation and all-reduce for bf16 only
    (validate_args); megatron-core's buffer otherwise holds the parameter's dtype."""
    model = {**LLAMA3_70B, "dtype": "fp16"}
    fp16 = estimate_of(compiler, tmp_path, spec("megatron", model=model))
    assert fp16.gradients == 2 * fp16.params_total
    for table in (
        {"accumulate_allreduce_grads_in_fp32": True},
        {"extra_args": ["--accumulate-allreduce-grads-in-fp32"]},
    ):
        fp32 = estimate_of(compiler, tmp_path, spec("megatron", table, model=model))
        assert fp32.gradients == 4 * fp32.params_total
    fp32_model = {**LLAMA3_70B, "dtype": "fp32"}
    plain = estimate_of(compiler, tmp_path, spec("megatron", model=fp32_model))
    assert plain.gradients == 4 * plain.params_total


def test_the_optimizer_step_copies_16_bit_gradients_to_fp32(
    compiler: Compiler, tmp_path: Path
) -> None:
    """Megatron-Core's mixed-precision optimizers step on ``main_grad.float()``: a 2-byte
    buffer is copied (4 bytes per parameter of the optimizer's shard), while the step runs,
    when the activations are gone: the peak is the larger of the two."""
    model = {**LLAMA3_70B, "dtype": "fp16"}
    dp = 64  # spec(): 16 nodes x 4 GPUs, tp = pp = 1
    for table, shard in (({}, dp), ({"use_distributed_optimizer": False}, 1)):
        m = estimate_of(compiler, tmp_path, spec("megatron", table, model=model))
        assert abs(m.step_gradients - 4 * m.params_per_gpu / shard) <= 1
        state = m.weights + m.gradients + m.optimizer
        assert m.total == state + max(m.activations, m.step_gradients)
    reduced = estimate_of(compiler, tmp_path, spec("megatron", {"grad_reduce_in_bf16": True}))
    assert reduced.step_gradients > 0
    tables: list[dict[str, Any]] = [
        {},
        {"use_precision_aware_optimizer": True, "main_grads_dtype": "bf16"},
    ]
    for table in tables:
        assert estimate_of(compiler, tmp_path, spec("megatron", table)).step_gradients == 0


def test_fp32_accumulation_with_bf16_main_gradients_is_refused(
    compiler: Compiler, tmp_path: Path
) -> None:
    table = {
        "accumulate_allreduce_grads_in_fp32": True,
        "use_precision_aware_optimizer": True,
        "main_grads_dtype": "bf16",
    }
    (error,) = refusal(compiler, tmp_path, spec("megatron", table))
    assert "MDC356" in error and "can only be fp32" in error


def test_fp8_parameters_keep_the_layers_in_one_byte(compiler: Compiler, tmp_path: Path) -> None:
    model = {**LLAMA3_70B, "dtype": "fp8"}
    table = {"fp8_param_gather": True, "fp8_recipe": "tensorwise"}
    m = estimate_of(compiler, tmp_path, spec("megatron", table, model=model))
    embeddings = 2 * LLAMA3_70B["vocab_size"] * LLAMA3_70B["hidden_size"]  # input and output
    assert m.weights == (m.params_total - embeddings) * 1 + embeddings * 2
    plain = estimate_of(
        compiler, tmp_path, spec("megatron", {"fp8_recipe": "tensorwise"}, model=model)
    )
    assert plain.weights == 2 * plain.params_total


def test_nvfp4_parameters_keep_the_layers_in_nine_eighths_of_a_byte(
    compiler: Compiler, tmp_path: Path
) -> None:
    """NVFP4 (Transformer Engine's NVFP4BlockScaling): 4-bit values plus one 1-byte E4M3
    scale per 16-value block, 9/16 byte per value, in the row-wise and the column-wise
    (transposed) copy each: 9/8 byte. The embeddings stay bf16 (2 bytes)."""
    table = {"fp4_format": "e2m1", "fp4_recipe": "nvfp4", "fp4_param_gather": True}
    m = estimate_of(compiler, tmp_path, spec("megatron", table))
    embeddings = 2 * LLAMA3_70B["vocab_size"] * LLAMA3_70B["hidden_size"]  # input and output
    assert m.weights == ceil_div((m.params_total - embeddings) * 9, 8) + embeddings * 2
    assert m.weight_bytes == 1.125
    # FP4 GEMMs alone keep the bf16 weights; so does the same flag read from extra_args
    gemms = estimate_of(compiler, tmp_path, spec("megatron", {"fp4_format": "e2m1"}))
    assert gemms.weights == 2 * gemms.params_total
    extra = {"extra_args": ["--fp4-format", "e2m1", "--fp4-param-gather"]}
    assert estimate_of(compiler, tmp_path, spec("megatron", extra)).weights == m.weights


def test_fp4_with_fp8_is_refused_as_megatron_lm_refuses_it(
    compiler: Compiler, tmp_path: Path
) -> None:
    model = {**LLAMA3_70B, "dtype": "fp8"}
    errors = refusal(compiler, tmp_path, spec("megatron", {"fp4_format": "e2m1"}, model=model))
    assert len(errors) == 1 and "MDC394" in errors[0] and "simultaneously" in errors[0]


@pytest.mark.parametrize(
    ("dtypes", "per_param"),
    [
        ({}, 2 + 4 + 4),  # fp32 master as a 16-bit remainder beside the bf16 weight
        ({"exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}, 2 + 2 + 2),
        ({"exp_avg_dtype": "fp8", "exp_avg_sq_dtype": "bf16", "main_params_dtype": "fp16"}, 5),
    ],
)
def test_precision_aware_optimizer_keeps_its_dtypes(
    compiler: Compiler, tmp_path: Path, dtypes: dict[str, str], per_param: int
) -> None:
    table = {"use_precision_aware_optimizer": True, **dtypes}
    m = estimate_of(compiler, tmp_path, spec("megatron", table))
    assert m.optimizer == ceil_div(per_param * m.params_total, 64)


@pytest.mark.parametrize("fraction", [None, 0.5, 0.25])
def test_optimizer_offload_moves_its_share_to_the_host(
    compiler: Compiler, tmp_path: Path, fraction: float | None
) -> None:
    table: dict[str, Any] = {"optimizer_cpu_offload": True, "use_precision_aware_optimizer": True}
    if fraction is not None:
        table["optimizer_offload_fraction"] = fraction
    m = estimate_of(compiler, tmp_path, spec("megatron", table))
    on_gpu = 1 - (1.0 if fraction is None else fraction)
    assert m.optimizer == pytest.approx(on_gpu * 10 * m.params_total / 64, abs=1)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_deepspeed_zero_stages_follow_the_zero_paper(
    compiler: Compiler, tmp_path: Path, stage: int
) -> None:
    data = spec("deepspeed", {"zero_stage": stage, "precision": "bf16"}, nnodes=2, nproc=8)
    m = estimate_of(compiler, tmp_path, data)
    p, d = m.params_total, 16
    assert m.weights == ceil_div(2 * p, d if stage >= 3 else 1)
    assert m.gradients == ceil_div(2 * p, d if stage >= 2 else 1)
    assert m.optimizer == ceil_div(12 * p, d if stage >= 1 else 1)


def test_deepspeed_offload_keeps_state_on_the_host(compiler: Compiler, tmp_path: Path) -> None:
    offload = {"device": "cpu"}
    config = {"zero_optimization": {"offload_optimizer": offload, "offload_param": offload}}
    table = {"zero_stage": 3, "precision": "bf16", "config": config}
    m = estimate_of(compiler, tmp_path, spec("deepspeed", table, nnodes=2, nproc=8))
    assert m.weights == m.gradients == m.optimizer == 0
    config = {"zero_optimization": {"offload_optimizer": offload}}
    table = {"zero_stage": 2, "precision": "bf16", "config": config}
    m = estimate_of(compiler, tmp_path, spec("deepspeed", table, nnodes=2, nproc=8))
    assert m.optimizer == 0 and m.gradients == ceil_div(2 * m.params_total, 16)


def test_torchtitan_pipelining_keeps_the_gathered_weights(
    compiler: Compiler, tmp_path: Path
) -> None:
    """TorchTitan's default reshard policy does not reshard after forward with pp > 1
    (apply_fsdp: reshard_after_forward = not pp_enabled): each stage's weights stay whole,
    gradients and optimizer state sharded."""
    pp = {"tp": 1, "pp": 2}
    m = estimate_of(compiler, tmp_path, spec("torchtitan", {"flavor": "70B"}, parallelism=pp))
    assert m.weights == 4 * m.params_per_gpu
    always = {"flavor": "70B", "config": {"parallelism": {"fsdp_reshard_after_forward": "always"}}}
    m = estimate_of(compiler, tmp_path, spec("torchtitan", always, parallelism=pp))
    assert m.weights == ceil_div(4 * m.params_per_gpu, m.shard)


def test_torchtitan_runs_a_schedule_per_local_batch(compiler: Compiler, tmp_path: Path) -> None:
    """A local batch of 4 run as pipeline microbatches of 1 is one schedule of 4: the first
    of 2 stages holds 2 in flight. 4 accumulated local batches of 1 are 4 schedules of one
    microbatch each (TorchTitan's train_step calls pp_schedule.step per local batch): every
    stage holds 1, and the last one, with the logits, is the heaviest."""
    pp = {"tp": 1, "pp": 2}
    split = spec(
        "torchtitan",
        {"flavor": "70B", "pipeline_microbatch_size": 1},
        parallelism=pp,
        batch={"global_batch_size": 4 * 32, "micro_batch_size": 4},
    )
    accumulated = spec(
        "torchtitan",
        {"flavor": "70B", "pipeline_microbatch_size": 1},
        parallelism=pp,
        batch={"global_batch_size": 4 * 32, "micro_batch_size": 1},
    )
    found = estimate_of(compiler, tmp_path, split)
    assert (found.stage, found.in_flight, found.micro_batch_size) == ("first", 2, 1)
    one = estimate_of(compiler, tmp_path, accumulated)
    assert (one.stage, one.in_flight, one.micro_batch_size) == ("last", 1, 1)
    assert one.activations < found.activations


@pytest.mark.parametrize("replicate", [1, 2, 4])
def test_torchtitan_fsdp2_keeps_16_bytes_over_the_shard_group(
    compiler: Compiler, tmp_path: Path, replicate: int
) -> None:
    table = {"flavor": "70B", "dp_replicate": replicate}
    m = estimate_of(compiler, tmp_path, spec("torchtitan", table))
    shard = 64 // replicate
    assert m.weights + m.gradients + m.optimizer == pytest.approx(
        16 * m.params_total / shard, abs=3
    )


def test_torchtitan_cpu_offload_and_no_reshard(compiler: Compiler, tmp_path: Path) -> None:
    base = estimate_of(compiler, tmp_path, spec("torchtitan", {"flavor": "70B"}))
    offload = {"training": {"enable_cpu_offload": True}}
    off = estimate_of(compiler, tmp_path, spec("torchtitan", {"flavor": "70B", "config": offload}))
    assert off.weights == off.gradients == off.optimizer == 0
    assert off.activations == base.activations
    never = {"parallelism": {"fsdp_reshard_after_forward": "never"}}
    kept = estimate_of(compiler, tmp_path, spec("torchtitan", {"flavor": "70B", "config": never}))
    assert kept.weights == 4 * kept.params_total  # gathered from forward to backward
    assert kept.optimizer == base.optimizer


# ------------------------------------------------------------------ activations


def classic_spec(table: dict[str, Any], *, model: dict[str, Any] | None = None) -> dict[str, Any]:
    return spec(
        "megatron",
        table,
        model={**CLASSIC, **(model or {})},
        nnodes=1,
        nproc=1,
        batch={"global_batch_size": 1, "micro_batch_size": 1},
    )


#: bytes of one classic layer for micro batch 1, t = 1, fused attention (Korthikanti: 34 sbh)
LAYER = 34 * S * H
#: what full recompute keeps of a layer: its input
INPUT = 2 * S * H
#: what Megatron's loss holds per logit at the end of the forward pass: the output layer's
#: bf16 logits (2 bytes) and vocab_parallel_cross_entropy's fp32 copy (4 bytes), which it
#: keeps (as exp(logits)) for its backward
LOGITS = (2 + 4) * S * V


def activations(compiler: Compiler, tmp_path: Path, table: dict[str, Any], **model: Any) -> int:
    return estimate_of(compiler, tmp_path, classic_spec(table, model=model)).activations


def test_no_recompute_keeps_34_sbh_per_layer(compiler: Compiler, tmp_path: Path) -> None:
    assert activations(compiler, tmp_path, {}) == L * LAYER + LOGITS


@pytest.mark.parametrize("count", [1, 2, 3, 8])
def test_block_recompute_keeps_the_other_layers_whole(
    compiler: Compiler, tmp_path: Path, count: int
) -> None:
    table = {"recompute_granularity": "full", "recompute_method": "block"}
    found = activations(compiler, tmp_path, {**table, "recompute_num_layers": count})
    # the first `count` layers keep their input, the rest everything; one layer recomputes
    assert found == count * INPUT + (L - count) * LAYER + LAYER + LOGITS


@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_uniform_recompute_keeps_one_input_per_run(
    compiler: Compiler, tmp_path: Path, count: int
) -> None:
    table = {"recompute_granularity": "full", "recompute_method": "uniform"}
    found = activations(compiler, tmp_path, {**table, "recompute_num_layers": count})
    # each run of `count` layers keeps its input and recomputes as a whole
    assert found == (L // count) * INPUT + count * LAYER + LOGITS


@pytest.mark.parametrize(
    ("modules", "dropped"),
    [
        (["core_attn"], 5 * A * S / H * S * H),  # eager attention's scores, softmax, dropout
        (["mlp"], 16 * S * H),  # the MLP's two 4h-wide intermediates
        (["layernorm"], 4 * S * H),  # the two norms' outputs
        (["mlp", "layernorm", "core_attn"], (16 + 4 + 5 * A * S / H) * S * H),
    ],
)
def test_selective_recompute_drops_the_listed_modules(
    compiler: Compiler, tmp_path: Path, modules: list[str], dropped: float
) -> None:
    eager = {"flash_attention": False}
    kept = L * (LAYER + 5 * A * S * S) + LOGITS
    assert activations(compiler, tmp_path, {}, **eager) == kept
    table = {"recompute_granularity": "selective", "recompute_modules": modules}
    assert activations(compiler, tmp_path, table, **eager) == kept - L * dropped


def test_mla_up_proj_recompute_drops_the_up_projected_q_k_v(
    compiler: Compiler, tmp_path: Path
) -> None:
    """Megatron-Core's "mla_up_proj" (multi_latent_attention.py: CheckpointWithoutOutput
    around the up-projection and RoPE, discarded after core attention): per token, the
    bf16 Q and K of every head (qk + rope head dims each) and V (v head dim) go; the
    latents they are recomputed from stay."""
    heads, qk, rope, v = 16, 64, 32, 64
    mla = {
        "multi_latent_attention": True,
        "q_lora_rank": 256,
        "kv_lora_rank": 128,
        "qk_head_dim": qk,
        "qk_pos_emb_head_dim": rope,
        "v_head_dim": v,
    }
    table = {"recompute_granularity": "selective"}
    kept = activations(compiler, tmp_path, table, **mla)
    dropped = activations(
        compiler, tmp_path, {**table, "recompute_modules": ["mla_up_proj"]}, **mla
    )
    assert kept - dropped == L * 2 * S * heads * (2 * (qk + rope) + v)


@pytest.mark.parametrize("count", [1, 3, 7])
def test_activation_offloading_keeps_the_other_layers(
    compiler: Compiler, tmp_path: Path, count: int
) -> None:
    found = activations(compiler, tmp_path, {"cpu_offloading_num_layers": count})
    assert found == (L - count) * LAYER + LOGITS


def test_fp8_keeps_linear_inputs_in_one_byte(compiler: Compiler, tmp_path: Path) -> None:
    """Transformer Engine saves the QKV, first and second MLP matrices' inputs in fp8:
    h + h + 4h bytes per token less than bf16's 2 bytes each."""
    bf16 = activations(compiler, tmp_path, {})
    fp8 = activations(compiler, tmp_path, {}, dtype="fp8")
    assert bf16 - fp8 == L * S * (H + H + 4 * H)


def test_nvfp4_keeps_linear_inputs_quantized(compiler: Compiler, tmp_path: Path) -> None:
    """With --fp4-format e2m1, Transformer Engine saves the NVFP4 copy of the QKV and MLP
    matrices' inputs (4 bits and an E4M3 scale per 16 values: 9/16 byte), not bf16's 2."""
    bf16 = activations(compiler, tmp_path, {})
    fp4 = activations(compiler, tmp_path, {"fp4_format": "e2m1"})
    assert bf16 - fp4 == L * S * (H + H + 4 * H) * (2 - 9 / 16)


MOE: dict[str, Any] = {**CLASSIC, "num_experts": 8, "moe_router_topk": 2}


def moe_spec(table: dict[str, Any], ep: int = 4) -> dict[str, Any]:
    return spec(
        "megatron",
        table,
        model=MOE,
        nnodes=1,
        nproc=ep,
        parallelism={"tp": 1, "pp": 1, "ep": ep},
        batch={"global_batch_size": ep, "micro_batch_size": 1},
    )


def test_allgather_dispatcher_holds_the_ep_groups_tokens(
    compiler: Compiler, tmp_path: Path
) -> None:
    alltoall = estimate_of(compiler, tmp_path, moe_spec({"moe_token_dispatcher_type": "alltoall"}))
    allgather = estimate_of(compiler, tmp_path, moe_spec({}))  # Megatron-Core's default
    assert allgather.activations - alltoall.activations == 2 * S * 4 * H


def test_allgather_dispatcher_gathers_over_the_expert_tensor_and_ep_group(
    compiler: Compiler, tmp_path: Path
) -> None:
    """Megatron-Core gathers over its tp_ep group, etp x ep ranks: with tp 2 and sequence
    parallel each rank holds half the sequence, and etp 1 gathers the 4 ep ranks' halves
    where etp 2 gathers all 8 (the whole sequence 4 times)."""

    def buffer(etp: int) -> int:
        base = spec(
            "megatron",
            {"sequence_parallel": True},
            model=MOE,
            nnodes=1,
            nproc=8,
            parallelism={"tp": 2, "pp": 1, "ep": 4, "etp": etp},
            batch={"global_batch_size": 4, "micro_batch_size": 1},
        )
        alltoall = json.loads(json.dumps(base))
        alltoall["megatron"]["moe_token_dispatcher_type"] = "alltoall"
        return (
            estimate_of(compiler, tmp_path, base).activations
            - estimate_of(compiler, tmp_path, alltoall).activations
        )

    assert buffer(1) == 2 * 4 * (S // 2) * H
    assert buffer(2) == 2 * 8 * (S // 2) * H


def test_padding_to_capacity_scales_the_routed_tokens(compiler: Compiler, tmp_path: Path) -> None:
    base = {"moe_token_dispatcher_type": "alltoall"}
    dropless = estimate_of(compiler, tmp_path, moe_spec(base))
    padded = estimate_of(
        compiler,
        tmp_path,
        moe_spec(
            {**base, "moe_expert_capacity_factor": 1.5, "moe_pad_expert_input_to_capacity": True}
        ),
    )
    # per layer, each of the top-k copies: its input (2h) and the 4h-wide intermediates (8h + 8h)
    routed = S * 2 * (2 * H + 16 * H)
    assert padded.activations - dropless.activations == L * routed // 2


# ------------------------------------------------------------------ extra_args and hints


def compile_cli(tmp_path: Path, data: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    out = tmp_path / "out"
    err = io.StringIO()
    code = main(
        ["compile", str(path), "-o", str(out), "--no-plugin-autoload"],
        stdout=io.StringIO(),
        stderr=err,
    )
    assert code == 0, err.getvalue()
    script = (out / "launch" / "worker.sh").read_text(encoding="utf-8")
    plan = json.loads((out / "plan.json").read_text(encoding="utf-8"))
    return shlex.split(script.rpartition("\nexec ")[2]), plan


KEYED = {
    "use_megatron_fsdp": True,
    "data_parallel_sharding_strategy": "optim_grads_params",
    "grad_reduce_in_bf16": True,
    "recompute_granularity": "full",
    "recompute_method": "block",
    "recompute_num_layers": 4,
    "moe_token_dispatcher_type": "alltoall",
}
FLAGGED = [
    "--use-megatron-fsdp",
    "--data-parallel-sharding-strategy=optim_grads_params",
    "--grad-reduce-in-bf16",
    "--recompute-granularity",
    "full",
    "--recompute-method",
    "block",
    "--recompute-num-layers",
    "4",
    "--moe-token-dispatcher-type",
    "alltoall",
    "--lr",
    "1e-4",
]


def test_flags_in_extra_args_are_read_as_their_keys(tmp_path: Path) -> None:
    keyed_words, keyed = compile_cli(
        tmp_path / "a", spec("megatron", {**KEYED, "extra_args": ["--lr", "1e-4"]}, capacity=288)
    )
    flagged_words, flagged = compile_cli(
        tmp_path / "b", spec("megatron", {"extra_args": FLAGGED}, capacity=288)
    )
    assert flagged["memory"] == keyed["memory"]
    assert flagged_words == keyed_words  # each flag once, where mdc writes it
    assert flagged_words[-2:] == ["--lr", "1e-4"]
    assert keyed["memory"]["sharding"]["zero_stage"] == 3
    assert keyed["memory"]["bytes_per_param"]["gradients"] == 2


def test_a_flag_whose_key_is_set_too_is_an_error(compiler: Compiler, tmp_path: Path) -> None:
    data = spec("megatron", {"use_megatron_fsdp": False, "extra_args": ["--use-megatron-fsdp"]})
    (error,) = refusal(compiler, tmp_path, data)
    assert "MDC323" in error and "[megatron] use_megatron_fsdp" in error


def test_a_bad_value_in_extra_args_is_an_error(compiler: Compiler, tmp_path: Path) -> None:
    data = spec("megatron", {"extra_args": ["--data-parallel-sharding-strategy", "full"]})
    (error,) = refusal(compiler, tmp_path, data)
    assert "MDC359" in error and "no_shard, optim, optim_grads, optim_grads_params" in error


def test_hints_name_the_launchers_own_keys(compiler: Compiler, tmp_path: Path) -> None:
    (megatron,) = refusal(compiler, tmp_path, spec("megatron", capacity=186))
    assert "MDC260" in megatron and "zero stage" not in megatron
    assert 'data_parallel_sharding_strategy = "optim_grads_params"' in megatron
    (deepspeed,) = refusal(
        compiler, tmp_path, spec("deepspeed", {"precision": "bf16"}, capacity=186)
    )
    assert "[deepspeed] zero_stage = 3" in deepspeed
    (torchrun,) = refusal(compiler, tmp_path, spec("torchrun", capacity=186))
    assert "zero" not in torchrun and "recompute" not in torchrun


def test_the_issues_fsdp_run_fits_gb200(compiler: Compiler, tmp_path: Path) -> None:
    table = {"use_megatron_fsdp": True, "data_parallel_sharding_strategy": "optim_grads_params"}
    data = spec(
        "megatron",
        {**table, "cpu_offloading_num_layers": 40},
        model={**LLAMA3_70B, "dtype": "fp8"},
        batch={"global_batch_size": 256, "micro_batch_size": 2},
        capacity=186,
    )
    assert estimate_of(compiler, tmp_path, data).total <= 186 * GIB


def test_torchtitans_default_checkpointing_still_offers_full_recompute(
    compiler: Compiler, tmp_path: Path
) -> None:
    """TorchTitan's default recomputes every 2nd layer: recomputing all is still a lever."""
    (error,) = refusal(compiler, tmp_path, spec("torchtitan", {"flavor": "70B"}, capacity=16))
    assert '[torchtitan.config.activation_checkpoint] mode = "full"' in error
