"""Megatron-LM's optimizer choice, distributed-optimizer instances and bf16 first/last layers:
each key (or its flag in extra_args) changes the estimate by what the framework keeps.

Expected bytes are derived here, not from mdc's code: Adam keeps fp32 main parameters and two
fp32 moments (12 bytes a parameter), SGD the main parameters and a momentum buffer (8; 4
without momentum), Muon (megatron/core/optimizer/muon.py) a momentum buffer for the layers'
2-D weights and Adam for the embeddings and the output layer. The distributed optimizer
shards that state over dp * cp ranks, each of n instances over dp * cp / n
(parallel_state.initialize_model_parallel's intra-partial groups). Under fp8 parameters the
layers' weights are 1 byte; --first-last-layers-bf16 keeps its layers in bf16 (2 bytes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.tools import published_model

from mdc.errors import SpecError
from mdc.pipeline import Compiled, Compiler
from mdc.plan.memory import MemoryEstimate
from mdc.tune.perf import predict_plan

#: Llama 3 70B (80 layers, untied embeddings), in bf16
LLAMA3_70B: dict[str, Any] = published_model("llama3-70b", dtype="bf16")
EMBEDDINGS = 2 * 128256 * 8192  # input and output


def spec(
    table: dict[str, Any],
    *,
    model: dict[str, Any] | None = None,
    parallelism: dict[str, Any] | None = None,
    hardware: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "job": {"name": "optimizer", "command": ["python", "pretrain_gpt.py"]},
        "distributed": {
            "launcher": "megatron",
            "nnodes": 16,
            "nproc_per_node": 4,
            "accelerator": "nvidia",
            **(hardware or {}),
        },
        "parallelism": parallelism or {"tp": 1, "pp": 1},
        "batch": {"global_batch_size": 64, "micro_batch_size": 1},
        "model": model or LLAMA3_70B,
        "megatron": table,
    }


def compiled(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> Compiled:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return compiler.compile(path, tree=False)


def estimate(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> MemoryEstimate:
    memory = compiled(compiler, tmp_path, data).plan.memory
    assert memory is not None
    return memory


def errors(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as caught:
        compiled(compiler, tmp_path, data)
    return [d.render() for d in caught.value.diagnostics if d.is_error]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ------------------------------------------------------------------ optimizer instances


@pytest.mark.parametrize("instances", [1, 2, 4, 64])
def test_each_optimizer_instance_shards_over_its_share_of_dp(
    compiler: Compiler, tmp_path: Path, instances: int
) -> None:
    m = estimate(compiler, tmp_path, spec({"num_distributed_optimizer_instances": instances}))
    assert m.optimizer == ceil_div(12 * m.params_total, 64 // instances)
    assert m.gradients == 4 * m.params_total  # the distributed optimizer keeps full gradients
    flag = ["--num-distributed-optimizer-instances", str(instances)]
    assert estimate(compiler, tmp_path, spec({"extra_args": flag})).total == m.total


def test_megatron_fsdp_with_instances_shards_within_each(
    compiler: Compiler, tmp_path: Path
) -> None:
    """Megatron-FSDP turns instances > 1 into hybrid sharding: the strategy within each."""
    table = {
        "use_megatron_fsdp": True,
        "data_parallel_sharding_strategy": "optim_grads_params",
        "num_distributed_optimizer_instances": 4,
    }
    m = estimate(compiler, tmp_path, spec(table))
    p = m.params_total
    assert (m.weights, m.gradients, m.optimizer) == (
        ceil_div(2 * p, 16),
        ceil_div(4 * p, 16),
        ceil_div(12 * p, 16),
    )


def test_instances_that_do_not_divide_dp_are_refused(compiler: Compiler, tmp_path: Path) -> None:
    (error,) = errors(compiler, tmp_path, spec({"num_distributed_optimizer_instances": 3}))
    assert "MDC474" in error and "partial DistOpt shard factor" in error
    assert "1, 2, 4, 8, 16, 32, 64" in error


def test_expert_data_parallel_size_must_divide_too(compiler: Compiler, tmp_path: Path) -> None:
    """64 ranks at tp 2: dp 32; experts at ep 8 (etp 2): expert dp 4, which 8 does not
    divide (initialize_model_parallel's expert assert)."""
    model = {**LLAMA3_70B, "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 2048}
    table = {"num_distributed_optimizer_instances": 8}
    data = spec(table, model=model, parallelism={"tp": 2, "pp": 1, "ep": 8})
    (error,) = errors(compiler, tmp_path, data)
    assert "MDC474" in error and "Expert data parallel size" in error


def test_a_zero_count_in_extra_args_is_refused(compiler: Compiler, tmp_path: Path) -> None:
    data = spec({"extra_args": ["--num-distributed-optimizer-instances", "0"]})
    (error,) = errors(compiler, tmp_path, data)
    assert "MDC359" in error


# ------------------------------------------------------------------ optimizer choice


@pytest.mark.parametrize(
    ("table", "per_param"),
    [
        ({}, 12),
        ({"optimizer": "adam"}, 12),
        ({"optimizer": "sgd"}, 8),
        ({"optimizer": "sgd", "extra_args": ["--sgd-momentum", "0"]}, 4),
        ({"extra_args": ["--optimizer", "sgd"]}, 8),
    ],
)
def test_optimizer_state_per_parameter(
    compiler: Compiler, tmp_path: Path, table: dict[str, Any], per_param: int
) -> None:
    m = estimate(compiler, tmp_path, spec(table))
    assert m.optimizer == ceil_div(per_param * m.params_total, 64)


def test_muon_keeps_a_momentum_for_the_layers_and_adam_for_the_embeddings(
    compiler: Compiler, tmp_path: Path
) -> None:
    """Muon runs without the distributed optimizer: nothing sharded."""
    m = estimate(compiler, tmp_path, spec({"optimizer": "muon"}))
    layers = m.params_total - EMBEDDINGS
    assert m.zero_stage == 0
    assert m.optimizer == 8 * layers + 12 * EMBEDDINGS
    result = compiled(compiler, tmp_path, spec({"optimizer": "muon"}))
    assert "--use-distributed-optimizer" not in map(str, result.launch.roles[0].argv)
    # dist_muon: the same state, sharded layer by layer over dp
    dist = estimate(compiler, tmp_path, spec({"optimizer": "dist_muon"}))
    assert dist.zero_stage == 1
    assert abs(dist.optimizer - m.optimizer / 64) <= 2


@pytest.mark.parametrize(
    ("table", "quote"),
    [
        ({"use_distributed_optimizer": True}, "does not support distributed optimizer"),
        ({"overlap_grad_reduce": True}, "does not support overlap grad reduce"),
        ({"use_megatron_fsdp": True}, "does not support Megatron-FSDP"),
        ({"extra_args": ["--ckpt-format", "torch_dcp"]}, "supports torch and torch_dist"),
    ],
)
def test_muon_is_refused_where_megatron_lm_refuses_it(
    compiler: Compiler, tmp_path: Path, table: dict[str, Any], quote: str
) -> None:
    found = errors(compiler, tmp_path, spec({"optimizer": "muon", **table}))
    assert any("MDC476" in e and quote in e for e in found), found


def test_muon_with_fp16_is_refused(compiler: Compiler, tmp_path: Path) -> None:
    data = spec({"optimizer": "dist_muon"}, model={**LLAMA3_70B, "dtype": "fp16"})
    (error,) = errors(compiler, tmp_path, data)
    assert "MDC476" in error and "muon with fp16 is not supported" in error


# ------------------------------------------------------------------ bf16 first/last layers

FP8 = {**LLAMA3_70B, "dtype": "fp8"}
FP8_PARAMS = {"fp8_recipe": "tensorwise", "fp8_param_gather": True}


def layer_params() -> int:
    """One Llama layer: Q and O (h x h), K and V (h x groups * head), the gated MLP's three
    matrices (h x ffn) and two RMSNorm weights."""
    h, ffn, kv = 8192, 28672, 8 * 128
    return 2 * h * h + 2 * h * kv + 3 * h * ffn + 2 * h


@pytest.mark.parametrize(("start", "end"), [(None, None), (2, 0), (0, 3), (2, 3)])
def test_bf16_layers_keep_their_weights_in_two_bytes(
    compiler: Compiler, tmp_path: Path, start: int | None, end: int | None
) -> None:
    table: dict[str, Any] = {**FP8_PARAMS, "first_last_layers_bf16": True}
    for key, value in (("num_layers_at_start_in_bf16", start), ("num_layers_at_end_in_bf16", end)):
        if value is not None:
            table[key] = value
    m = estimate(compiler, tmp_path, spec(table, model=FP8))
    wide = (1 if start is None else start) + (1 if end is None else end)
    fp8 = estimate(compiler, tmp_path, spec(FP8_PARAMS, model=FP8))
    assert m.weights - fp8.weights == wide * layer_params() * (2 - 1)


def test_bf16_layers_on_their_pipeline_stages(compiler: Compiler, tmp_path: Path) -> None:
    """pp 4: the model's first 3 layers are on the first stage, its last one on the last;
    the heaviest stage (the first: the input embedding) holds 3 more bytes-per-parameter
    layers."""
    table = {**FP8_PARAMS, "first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 3}
    pp4 = {"tp": 1, "pp": 4}
    m = estimate(compiler, tmp_path, spec(table, model=FP8, parallelism=pp4))
    fp8 = estimate(compiler, tmp_path, spec(FP8_PARAMS, model=FP8, parallelism=pp4))
    assert (m.stage, fp8.stage) == ("first", "first")
    assert m.weights - fp8.weights == 3 * layer_params()


def test_bf16_layers_keep_their_gemm_inputs_in_16_bits(compiler: Compiler, tmp_path: Path) -> None:
    """Transformer Engine saves fp8 copies of the QKV and both MLP matrices' inputs
    (h + h + ffn bytes per token, ffn = 28672 for the second), bf16 ones in a bf16 layer:
    one more byte each per token."""
    base = {"fp8_recipe": "tensorwise"}
    table = {**base, "first_last_layers_bf16": True}
    fp8 = estimate(compiler, tmp_path, spec(base, model=FP8))
    wide = estimate(compiler, tmp_path, spec(table, model=FP8))
    h, ffn, s = 8192, 28672, 8192
    assert wide.activations - fp8.activations == 2 * s * (h + h + ffn)


def test_bf16_layers_change_nothing_in_bf16_training(compiler: Compiler, tmp_path: Path) -> None:
    data = spec({"first_last_layers_bf16": True})
    result = compiled(compiler, tmp_path, data)
    plain = estimate(compiler, tmp_path, spec({}))
    assert result.plan.memory is not None and result.plan.memory.total == plain.total
    warnings = [d.render() for d in result.diagnostics if not d.is_error]
    assert any("MDC475" in w and "no effect" in w for w in warnings), warnings


def test_bf16_layers_with_delayed_scaling_are_refused(compiler: Compiler, tmp_path: Path) -> None:
    (error,) = errors(compiler, tmp_path, spec({"first_last_layers_bf16": True}, model=FP8))
    assert "MDC475" in error and "Delayed scaling does not support" in error


def test_bf16_layers_are_read_from_extra_args(compiler: Compiler, tmp_path: Path) -> None:
    keyed = {**FP8_PARAMS, "first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 2}
    flags = ["--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "2"]
    flagged = {**FP8_PARAMS, "extra_args": flags}
    a = estimate(compiler, tmp_path, spec(keyed, model=FP8))
    b = estimate(compiler, tmp_path, spec(flagged, model=FP8))
    assert a == b


#: a known accelerator for the throughput model, and room for the state of one GPU
H100 = {"accelerator_model": "h100-sxm", "accelerator_memory_gib": 100000}


def test_bf16_layers_run_at_the_bf16_peak(compiler: Compiler, tmp_path: Path) -> None:
    def predicted(table: dict[str, Any], model: dict[str, Any] = FP8) -> Any:
        data = spec(table, model=model, hardware=H100)
        return predict_plan(compiled(compiler, tmp_path, data).plan)

    base = {"fp8_recipe": "tensorwise"}
    fp8 = predicted(base)
    wide_table = {
        **base,
        "first_last_layers_bf16": True,
        "num_layers_at_start_in_bf16": 40,
        "num_layers_at_end_in_bf16": 40,
    }
    wide = predicted(wide_table)
    bf16 = predicted({}, LLAMA3_70B)
    assert fp8 is not None and wide is not None and bf16 is not None
    # every layer in bf16: the bf16 run's GEMM time (the output layer stays at fp8's peak)
    assert fp8.step_time_s < wide.step_time_s <= bf16.step_time_s


# ------------------------------------------------------------------ attention backend


@pytest.mark.parametrize(
    ("flash", "backend", "refused"),
    [
        (None, "unfused", True),  # eager attention estimated as fused: too little
        (None, "local", True),
        (False, "flash", True),  # fused attention estimated as eager: too much
        (False, "unfused", False),
        (None, "fused", False),
        (None, "auto", False),
    ],
)
def test_attention_backend_agrees_with_flash_attention(
    compiler: Compiler, tmp_path: Path, flash: bool | None, backend: str, refused: bool
) -> None:
    model = LLAMA3_70B if flash is None else {**LLAMA3_70B, "flash_attention": flash}
    data = spec({"extra_args": ["--attention-backend", backend]}, model=model)
    if refused:
        (error,) = errors(compiler, tmp_path, data)
        assert "MDC479" in error and "/megatron/extra_args/0" in error
    else:
        compiled(compiler, tmp_path, data)


def test_eager_attention_is_run_eagerly(compiler: Compiler, tmp_path: Path) -> None:
    """flash_attention = false counts the scores; Megatron-Core's default (auto) would pick
    a fused kernel, so the launcher passes --attention-backend unfused."""
    result = compiled(compiler, tmp_path, spec({}, model={**LLAMA3_70B, "flash_attention": False}))
    argv = [str(w) for w in result.launch.roles[0].argv]
    assert argv[argv.index("--attention-backend") + 1] == "unfused"
    fused = compiled(compiler, tmp_path, spec({}))
    assert "--attention-backend" not in [str(w) for w in fused.launch.roles[0].argv]


# ------------------------------------------------------------------ --moe-layer-recompute

MOE_70B = {**LLAMA3_70B, "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 4096}
EP8 = {"tp": 1, "pp": 1, "ep": 8}


def test_moe_layer_recompute_is_read_as_megatron_core_reads_it(
    compiler: Compiler, tmp_path: Path
) -> None:
    """megatron-core's TransformerConfig turns the deprecated flag into selective recompute
    with "moe" added to its default modules; the estimate reads the same."""
    core = pytest.importorskip("megatron.core.transformer")
    with pytest.warns(UserWarning, match="deprecated"):
        config = core.TransformerConfig(
            num_layers=2, hidden_size=64, num_attention_heads=4, num_moe_experts=8,
            moe_ffn_hidden_size=32,
            moe_layer_recompute=True,
        )  # fmt: skip
    assert config.recompute_granularity == "selective"
    modules = tuple(config.recompute_modules)
    flagged = estimate(
        compiler,
        tmp_path,
        spec({"extra_args": ["--moe-layer-recompute"]}, model=MOE_70B, parallelism=EP8),
    )
    keyed = estimate(
        compiler,
        tmp_path,
        spec(
            {"recompute_granularity": "selective", "recompute_modules": list(modules)},
            model=MOE_70B,
            parallelism=EP8,
        ),
    )
    plain = estimate(compiler, tmp_path, spec({}, model=MOE_70B, parallelism=EP8))
    assert flagged == keyed and flagged.activations < plain.activations


def test_moe_layer_recompute_with_full_recompute_is_refused(
    compiler: Compiler, tmp_path: Path
) -> None:
    core = pytest.importorskip("megatron.core.transformer")
    with pytest.raises(ValueError, match="full recompute granularity"), pytest.warns(UserWarning):
        core.TransformerConfig(
            num_layers=2, hidden_size=64, num_attention_heads=4, num_moe_experts=8,
            moe_ffn_hidden_size=32,
            moe_layer_recompute=True, recompute_granularity="full", recompute_method="uniform",
            recompute_num_layers=1,
        )  # fmt: skip
    table = {
        "recompute_granularity": "full",
        "recompute_method": "uniform",
        "recompute_num_layers": 1,
        "extra_args": ["--moe-layer-recompute"],
    }
    (error,) = errors(compiler, tmp_path, spec(table, model=MOE_70B, parallelism=EP8))
    assert "MDC357" in error and "/megatron/extra_args/0" in error
