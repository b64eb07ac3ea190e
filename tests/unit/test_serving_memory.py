"""The serving memory check against what vLLM reports for known models."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from mdc.errors import SpecError
from mdc.pipeline import Compiled, Compiler
from mdc.plan.memory import GIB, resolve_shape
from mdc.plan.named_models import CATALOGUE_FILE
from mdc.plan.serving_memory import ServingSetup, estimate
from mdc.plugin_manager import load_plugins
from mdc.spec import ModelTable

MODELS = tomllib.loads(Path(CATALOGUE_FILE).read_text("utf-8"))
COMPILER = Compiler(load_plugins(autoload=False))


def model(name: str, **changes: Any) -> dict[str, Any]:
    return {**MODELS[name]["model"], **changes}


def compile_(tmp_path: Path, args: list[str], gib: float, **extra: Any) -> Compiled:
    data = {
        "job": {"name": "serve", "command": ["vllm", "serve"]},
        "distributed": {
            "launcher": "vllm",
            "nproc_per_node": extra.pop("nproc", 1),
            "accelerator_memory_gib": gib,
        },
        "vllm": {"model": "m", "args": args},
        "model": extra.pop("model", model("llama3.1-8b")),
        **extra,
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return COMPILER.compile(path)


# vllm-project/vllm issue #10517 (comment of 2024-12-02): meta-llama/Llama-3.1-8B-Instruct
# on an RTX 3090, gpu_memory_utilization 0.90, --max-model-len 29000, vLLM's log:
#   Loading model weights took 14.9888 GB      (vLLM divides by 2**30)
#   total_gpu_memory=23.58GiB peak_torch_memory=17.98GiB non_torch_memory=0.35GiB
#   kv_cache_size=2.89GiB, # GPU blocks: 1478 (16 tokens each) = 23648 tokens
ISSUE_10517 = {
    "weights": 14.9888,
    "total": 23.58,
    "peak_torch": 17.98,
    "non_torch": 0.35,
    "kv_cache": 2.89,
    "tokens": 1478 * 16,
}


def test_llama_8b_weights_and_kv_per_token_match_vllms_log(tmp_path: Path) -> None:
    r = ISSUE_10517
    # vLLM of then profiled a step of max(--max-model-len, 2048) tokens (chunked prefill
    # off below 32k): the same step as --max-num-batched-tokens 29000 today
    args = ["--max-model-len", "29000", "--max-num-batched-tokens", "29000"]
    memory = compile_(tmp_path, args, r["total"]).plan.serving_memory
    assert memory is not None
    assert memory.weights / GIB == pytest.approx(r["weights"], rel=0.005)
    # vLLM's cache of 2.89 GiB held 23648 tokens: its bytes per token (to the log's rounding)
    assert memory.kv_per_token == pytest.approx(r["kv_cache"] * GIB / r["tokens"], rel=0.002)
    # the profiled step's activations: the peak of vLLM's profiling run over the weights
    # (2.99 GiB, its sampler's logits included), to 10 %
    assert memory.profiled_tokens == 29000
    assert memory.workspace / GIB == pytest.approx(r["peak_torch"] - r["weights"], rel=0.10)
    # the estimate's share is what vLLM split between its KV cache, the activation peak of
    # its profiling run and non-torch memory (to the 0.03 GiB by which the counted weights
    # fall short of the loaded ones, and the log's rounding)
    used = r["kv_cache"] + (r["peak_torch"] - r["weights"]) + r["non_torch"]
    assert (memory.cache + memory.workspace) / GIB == pytest.approx(used, abs=0.05)
    assert memory.cache / GIB >= r["kv_cache"]  # an upper bound of the KV cache


def test_a_bigger_step_budget_costs_kv_room(tmp_path: Path) -> None:
    """vLLM takes the profiled step's activations out of its cache: 16,384 tokens per step
    leave the cache 8,192 tokens' activations fewer bytes than 8,192 do (the default)."""
    default = compile_(tmp_path, [], 80).plan.serving_memory
    big = compile_(tmp_path, ["--max-num-batched-tokens", "16384"], 80).plan.serving_memory
    assert default is not None and big is not None
    assert default.profiled_tokens == 8192 and big.profiled_tokens == 16384
    assert big.workspace == 2 * default.workspace
    assert default.cache - big.cache == pytest.approx(default.workspace, abs=1)
    assert big.tokens < default.tokens


def test_a_cache_shorter_than_one_sequence_is_a_warning(tmp_path: Path) -> None:
    compiled = compile_(tmp_path, ["--max-model-len", "131072"], 23.58)
    (warning,) = [d for d in compiled.diagnostics if d.code == "MDC281"]
    assert "less than one sequence of 131072" in warning.message
    assert not warning.is_error


def test_the_engine_settings_in_the_args_are_read(tmp_path: Path) -> None:
    base = compile_(tmp_path, [], 80).plan.serving_memory
    fp8 = compile_(
        tmp_path, ["--kv-cache-dtype", "fp8", "--gpu-memory-utilization=0.5"], 80
    ).plan.serving_memory
    assert base is not None and fp8 is not None
    assert (base.share, base.kv_dtype) == (0.9, "bf16")
    assert (fp8.share, fp8.kv_dtype) == (0.5, "fp8")
    assert fp8.kv_per_token * 2 == base.kv_per_token
    assert base.max_len == MODELS["llama3.1-8b"]["model"]["seq_length"]


def test_weights_beyond_the_gpu_are_an_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        compile_(tmp_path, [], 80, model=model("llama3.1-70b"))
    (error,) = [d for d in caught.value.diagnostics if d.is_error]
    assert error.code == "MDC280" and "more than its 80.0 GiB" in error.message
    # over tp 8 the same model fits, with room for many full-length sequences
    fits = compile_(
        tmp_path, [], 80, model=model("llama3.1-70b"), nproc=8, parallelism={"tp": 8}
    ).plan.serving_memory
    assert fits is not None and fits.sequences > 1


def test_an_fp4_checkpoint_packs_its_layers_in_nine_sixteenths_of_a_byte(
    tmp_path: Path,
) -> None:
    """NVFP4: 16 4-bit values share one FP8 scale (4.5 bits a weight); the checkpoints keep
    the embedding and the output layer unquantized (bf16). Llama 3.1 8B's are untied:
    2 x vocab x hidden weights."""
    table = model("llama3.1-8b")
    ends = 2 * table["vocab_size"] * table["hidden_size"]
    bf16 = compile_(tmp_path, [], 80, model={**table, "dtype": "bf16"}).plan.serving_memory
    fp4 = compile_(tmp_path, [], 80, model={**table, "dtype": "fp4"}).plan.serving_memory
    assert bf16 is not None and fp4 is not None
    layers = bf16.weights // 2 - ends
    assert fp4.weights == pytest.approx(layers * 9 / 16 + ends * 2, abs=1)
    assert fp4.kv_dtype == "bf16"  # "auto" caches in the activations' dtype


def test_mla_caches_the_compressed_latent_on_every_tp_rank() -> None:
    """DeepSeek-V3 (config.json): kv_lora_rank 512, qk_rope_head_dim 64, 61 layers."""
    table = MODELS["deepseek-v3"]["model"]
    shape = resolve_shape(ModelTable(**{k: v for k, v in table.items() if k != "window_size"}))
    assert shape is not None and shape.latent is not None
    per_token = (table["kv_lora_rank"] + table["qk_pos_emb_head_dim"]) * table["num_layers"]
    for tp in (1, 8):
        memory = estimate(shape, ServingSetup(engine="vLLM", tp=tp, kv_dtype="fp8"), 141)
        assert memory.kv_per_token == per_token  # one byte each, not split over tp


def test_disaggregated_servers_get_the_tighter_roles_estimate(tmp_path: Path) -> None:
    data = {
        "job": {"name": "pd", "command": "python3"},
        "distributed": {
            "launcher": "sglang_disagg",
            "nnodes": 3,
            "nproc_per_node": 8,
            "accelerator_memory_gib": 80,
        },
        "sglang_disagg": {"model_path": "m"},
        "model": model("llama3.1-8b"),
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    compiled = COMPILER.compile(path)
    memory = compiled.plan.serving_memory
    assert memory is not None and memory.engine == "SGLang (decode)"
    # the same one-GPU weights as vLLM's tp 1 count, here per GPU of a tp 8 server
    assert memory.weights < 3 * GIB
    # no --mem-fraction-static: the share SGLang picks itself for each role on 80 GiB.
    # Decode: 512 + 2,048 x 1.5 + 8 / 8 x 1,024 + 2 x 512 = 5,632 MiB, up to the 10 GiB
    # floor: 1 - 10,240 / 81,920 = 0.875. Prefill: 512 + 8,192 x 1.5 + 1,024 + 8 x 58
    # prefill graphs = 14,288: 0.826
    assert memory.share == 0.875 and memory.roles["prefill"].share == 0.826
    assert memory.share_source.startswith("SGLang's own")
    assert not [d for d in compiled.diagnostics if d.code == "MDC261"]


def _serving_specs() -> list[Path]:
    from tests.tools import REPO

    return sorted(
        p
        for p in (REPO / "examples").iterdir()
        if p.suffix in {".toml", ".yaml", ".json"}
        and p.name.startswith(("vllm", "sglang", "trtllm", "tune-serving"))
    )


@pytest.mark.parametrize("path", _serving_specs(), ids=lambda p: p.name)
def test_every_published_serving_spec_leaves_its_engine_its_reserve(path: Path) -> None:
    """What an engine keeps outside its share (CUDA context and graphs, SGLang's step
    activations) never makes a spec that runs as written not fit: the reserve only bounds
    how far mdc tune raises a share."""
    from mdc.plan.serving_memory import leaves_reserve

    memory = COMPILER.compile(path, tree=False).plan.serving_memory
    if memory is not None:
        assert leaves_reserve(memory), (memory.share, memory.reserve / GIB)


def test_every_measured_deployment_leaves_its_engine_its_reserve() -> None:
    """Every deployment of bench/serving_data.toml, at the share it ran (TensorRT-LLM's
    overview: 0.9 to 0.95 of the free memory; the others the engines' 0.9), leaves its
    engine the reserve (each role of a deployment measured end to end)."""
    import attrs
    from bench import serving_fit

    from mdc.hardware import builtin
    from mdc.spec import WorkloadTable
    from mdc.tune.serving_records import DEFAULT, Deployment, Role
    from mdc.tune.serving_server import server_of

    measured = serving_fit.measurements()
    assert len(measured) >= 100
    rows = [
        {**row, **row[name], "role": name}
        for row in measured
        if serving_fit.disaggregated(row)
        for name in ("prefill", "decode")
    ]
    rows += [row for row in measured if not serving_fit.disaggregated(row)]
    assert any(r["role"] == "decode" and r["tp"] == 4 for r in rows if r.get("role"))
    for row in rows:
        hw = builtin()[row["accelerator_model"]]
        tp, pp = row.get("tp", row.get("gpus", 1)), row.get("pp", 1)
        gpus = row.get("gpus", tp * pp)
        role = Role(
            name=row.get("role", "server"),
            servers=1,
            gpus=gpus,
            tp=tp,
            pp=pp,
            dp=row.get("dp", 1),
            ep=row.get("ep", 1),
        )
        inp = row.get("input_tokens", row.get("context_tokens", 1))
        out = row.get("output_tokens", 1)
        work = WorkloadTable(input_tokens=inp, output_tokens=out, concurrency=1)
        shape = serving_fit._shape(row["model"], row["dtype"], inp + out)
        free = row["launcher"] == "trtllm"
        dep = Deployment(
            launcher=row["launcher"],
            roles=(role,),
            kv_dtype=row.get("kv_dtype", "auto"),
            share_of="free" if free else "capacity",
            capacity_gib=hw.memory_gib,
            nproc_per_node=row.get("nproc_per_node", 8),
        )
        for share in (0.9, 0.95) if row["source"] == "trtllm-perf-overview" else (0.9,):
            server = server_of(role, shape, hw, attrs.evolve(dep, share=share), work, DEFAULT)
            assert server.leaves_reserve, (row["source"], row["model"], row.get("tp"), share)


def test_the_reserve_is_the_engines_published_sizes(tmp_path: Path) -> None:
    """vLLM keeps the CUDA context (0.70 GiB, its startup log) and its CUDA graphs (1.3
    GiB, Llama 4 Maverick's) outside --gpu-memory-utilization: on a 24 GiB GPU 0.9 leaves
    them room, 0.95 does not; TensorRT-LLM keeps the graphs outside the share of what the
    weights leave."""
    from mdc.plan.serving_memory import leaves_reserve

    at = {}
    for share in ("0.9", "0.95"):
        memory = compile_(tmp_path, ["--gpu-memory-utilization", share], 24).plan.serving_memory
        assert memory is not None
        assert memory.reserve == pytest.approx(2.0 * GIB, abs=2)
        at[share] = leaves_reserve(memory)
    assert at == {"0.9": True, "0.95": False}
    shape = resolve_shape(ModelTable(**model("llama3.1-8b")))
    assert shape is not None
    setup = ServingSetup(engine="TensorRT-LLM", tp=1, share=0.95, share_of="free")
    memory = estimate(shape, setup, 24)
    assert memory.reserve == pytest.approx(1.3 * GIB, abs=2)
    free = memory.capacity - memory.weights
    assert leaves_reserve(memory) == (0.05 * free >= 1.3 * GIB)


def test_sglangs_reserve_holds_the_step_of_its_chunked_prefill_budget() -> None:
    """SGLang's --mem-fraction-static leaves a step's activations outside: DeepSeek-V3 on 8
    H200s (tp 8) at 0.97 leaves 4.2 GiB, room for the CUDA context and graphs (2.0 GiB) and
    a step of 8,192 tokens (0.3 GiB), not for one of 65,536 (2.6 GiB)."""
    from bench import serving_fit

    from mdc.hardware import builtin
    from mdc.spec import WorkloadTable
    from mdc.tune.serving_records import DEFAULT, Deployment, Role
    from mdc.tune.serving_server import server_of

    hw, shape = builtin()["h200"], serving_fit._shape("deepseek-v3", "fp8", 9216)
    work = WorkloadTable(input_tokens=8192, output_tokens=1024, concurrency=1)
    fits = {}
    for budget in (None, 65536):
        role = Role(name="decode", servers=1, gpus=8, tp=8, step_tokens=budget, share=0.97)
        dep = Deployment(launcher="sglang_disagg", roles=(role,), capacity_gib=hw.memory_gib)
        fits[budget] = server_of(role, shape, hw, dep, work, DEFAULT).leaves_reserve
    assert fits == {None: True, 65536: False}


H200_GIB = 143771 / 1024  # nvidia-smi's 143,771 MiB


@pytest.mark.parametrize(
    ("server", "reserve_mib", "share"),
    [
        # DeepSeek-class (MLA) on one 8-GPU H200 server: 512 + 8,192 x 1.5 + 8 / 8 x 1,024,
        # decode graphs 2 x 512, MLA prefill graphs 1,536 = 16,384 MiB
        ({"tp": 8, "mla": True}, 16384, 0.886),
        # its prefill servers: no decode graphs
        ({"role": "prefill", "tp": 8, "mla": True}, 15360, 0.893),
        # its decode servers: 2,048 tokens, no prefill graphs, up to the 10 GiB floor
        ({"role": "decode", "tp": 8, "mla": True}, 10240, 0.929),
        # with DP attention over 8 ranks: 512 x 8 x (3 + 1.5) more for the graphs
        ({"role": "decode", "tp": 8, "dp": 8, "mla": True}, 24064, 0.833),
        # a small dense model on one GPU: 512 + 12,288 + 128 + 512 + 58 prefill graphs x 8
        ({"tp": 1}, 13904, 0.903),
        # the same at a 2,048-token chunk: the floor
        ({"tp": 1, "chunked_prefill": 2048}, 10240, 0.929),
    ],
)
def test_sglangs_own_share_follows_its_rule(
    server: dict[str, Any], reserve_mib: int, share: float
) -> None:
    """SGLang's automatic --mem-fraction-static (server_args.py) for H200 servers: the
    reserve for activations, CUDA graphs and the parallel groups, then (GPU - reserve) /
    GPU rounded to 3 places."""
    from mdc.plan.serving_memory import SglangServer, sglang_default_share, sglang_reserve_mib

    s = SglangServer(**server)
    assert sglang_reserve_mib(H200_GIB, s) == reserve_mib
    assert sglang_default_share(H200_GIB, s) == share == round(1 - reserve_mib / 143771, 3)


def test_sglangs_rule_takes_the_gpus_defaults() -> None:
    """SGLang's defaults by GPU size: an 80 GB H100 and an A100 40GB take 8,192- and
    4,096-token chunks, a B200 16,384; only GPUs over 60 GiB have the 10 GiB floor."""
    from mdc.plan.serving_memory import SglangServer, sglang_reserve_mib

    # H100: 512 + 12,288 + 1,024 + 2 x 512 + 8 x 58 (dense prefill graphs to 8,192)
    assert sglang_reserve_mib(81559 / 1024, SglangServer(tp=8)) == 15312
    # A100 40GB, tp 8: 512 + 6,144 + 1,024 + 2 x 160 + 8 x 50 graphs to 4,096; no floor
    assert sglang_reserve_mib(40, SglangServer(tp=8)) == 8400
    # B200, tp 1: 512 + 24,576 + 128 + 2 x 512 + 8 x 74 graphs to 16,384
    assert sglang_reserve_mib(183359 / 1024, SglangServer(tp=1)) == 26832


def _sglang_r1(tmp_path: Path, args: list[str]) -> Compiled:
    """DeepSeek-R1 behind one SGLang server of 8 H200s, the share as ``args`` write it."""
    data = {
        "job": {"name": "r1", "command": ["python", "-m", "sglang.launch_server"]},
        "distributed": {
            "launcher": "sglang",
            "nproc_per_node": 8,
            "accelerator_model": "h200",
        },
        "parallelism": {"tp": 8},
        "model": {"name": "deepseek-ai/DeepSeek-R1", "seq_length": 4096, "dtype": "fp8"},
        "sglang": {"model": "deepseek-ai/DeepSeek-R1", "args": args},
        "workload": {"input_tokens": 1000, "output_tokens": 1000, "concurrency": 64},
    }
    path = tmp_path / "r1.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return COMPILER.compile(path, tree=False)


@pytest.mark.parametrize(
    ("args", "share"),
    [
        # SGLang's own: 512 + 8,192 x 1.5 + 8 / 8 x 1,024 + 2 x 512 decode graphs + 1,536
        # (MLA prefill graphs) = 16,384 of 143,771 MiB
        ([], round(1 - 16384 / 143771, 3)),
        # with DP attention over 8 ranks: 512 x 8 x 4.5 = 18,432 more (batch 512 > 300)
        (["--enable-dp-attention", "--dp-size", "8"], round(1 - 34816 / 143771, 3)),
        # a share the spec writes is kept
        (["--mem-fraction-static", "0.85"], 0.85),
    ],
)
def test_an_sglang_server_without_a_share_is_estimated_at_sglangs_own(
    tmp_path: Path, args: list[str], share: float
) -> None:
    """The estimate, and explain's prediction from it, take the share SGLang picks itself
    where the spec writes no --mem-fraction-static (0.886, 0.758 with DP attention)."""
    from mdc.describe import plan_json
    from mdc.tune.serving_perf import deployment_of

    compiled = _sglang_r1(tmp_path, args)
    memory = compiled.plan.serving_memory
    assert memory is not None and memory.share == share
    written = "--mem-fraction-static" in args
    assert memory.share_source.startswith("--mem" if written else "SGLang's own")
    dep = deployment_of(compiled.plan, compiled.launch.servers)
    assert dep is not None and [r.share for r in dep.roles] == [share]
    block = plan_json(compiled.plan, compiled.launch)["serving_memory"]
    assert isinstance(block, dict) and block["share"] == share
