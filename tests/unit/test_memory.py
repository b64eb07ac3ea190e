"""Parameter count and per-GPU memory estimate.

Expected values come from elsewhere: the classic formula of Narayanan et al. 2021,
published model sizes, megatron-core's own GPTModel (built on CPU, per rank), the
Megatron and ZeRO bytes-per-parameter tables and Korthikanti et al. 2022's activation
formulas, each written out here.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mdc.api import Launch, Role
from mdc.convert import structure_spec
from mdc.describe import explain_text, memory_json, plan_json
from mdc.errors import Diagnostic, SourceLocation
from mdc.plan import Plan, build_plan
from mdc.plan.memory import (
    GIB,
    MemoryEstimate,
    Shape,
    parameter_count,
    resolve_shape,
    stage_estimates,
)
from mdc.plan.model import TrainingSetup
from mdc.spec import ModelTable

LLAMA3_8B: dict[str, Any] = {
    "num_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_query_groups": 8,
    "ffn_hidden_size": 14336,
    "vocab_size": 128256,
    "seq_length": 8192,
    "gated_mlp": True,
    "tied_embeddings": False,
    "position_embedding": "rope",
    "bias": False,
    "normalization": "rmsnorm",
}


def shape_of(**model: Any) -> Shape:
    shape = resolve_shape(ModelTable(**model))
    assert shape is not None
    return shape


def job(
    *,
    nnodes: int = 1,
    nproc: int = 1,
    parallelism: dict[str, Any] | None = None,
    batch: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
    **distributed: Any,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "job": {"name": "mem", "command": "train.py"},
        "distributed": {
            "launcher": "torchrun",
            "nnodes": nnodes,
            "nproc_per_node": nproc,
            **distributed,
        },
    }
    for key, value in (("parallelism", parallelism), ("batch", batch), ("model", model)):
        if value is not None:
            data[key] = value
    return data


def plan_of(
    data: dict[str, Any], training: TrainingSetup | None = None, disaggregated: bool = False
) -> tuple[Plan | None, tuple[Diagnostic, ...]]:
    spec = structure_spec(data, {})
    return build_plan(
        spec,
        parallelism="data",
        disaggregated=disaggregated,
        training=training,
        locate=lambda pointer: SourceLocation(path="job.toml", pointer=pointer),
    )


def planned(data: dict[str, Any], training: TrainingSetup | None = None) -> Plan:
    plan, found = plan_of(data, training)
    assert plan is not None, [d.render() for d in found]
    return plan


def stages(plan: Plan) -> list[MemoryEstimate]:
    assert plan.model is not None
    shape = resolve_shape(plan.model)
    assert shape is not None
    return stage_estimates(shape, plan.sizes, plan.batch, plan.training)


# ------------------------------------------------------------------ parameter count


def classic(l: int, h: int, v: int, s: int) -> int:
    """Narayanan et al. 2021: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))."""
    p = 12 * l * h * h * (1 + Fraction(13, 12 * h) + Fraction(v + s, 12 * l * h))
    assert p.denominator == 1
    return int(p)


@pytest.mark.parametrize(
    ("l", "h", "a", "v", "s"),
    [
        (2, 64, 4, 100, 32),
        (24, 1024, 16, 50257, 1024),  # GPT-2 medium's shape
        (32, 4096, 32, 50304, 2048),
        (96, 12288, 96, 50257, 2048),  # GPT-3 175B
        (80, 8192, 64, 128256, 8192),
    ],
)
def test_defaults_reproduce_the_classic_formula(l: int, h: int, a: int, v: int, s: int) -> None:
    shape = shape_of(num_layers=l, hidden_size=h, num_attention_heads=a, vocab_size=v, seq_length=s)
    assert parameter_count(shape) == classic(l, h, v, s)


def test_gpt3_is_175_billion() -> None:
    """Brown et al. 2020: 175B parameters (96 layers, d_model 12288, 96 heads, 2048 tokens)."""
    shape = shape_of(
        num_layers=96, hidden_size=12288, num_attention_heads=96, vocab_size=50257, seq_length=2048
    )
    assert round(parameter_count(shape) / 1e9) == 175


def test_llama3_8b_is_8_03_billion() -> None:
    """Meta's model card: Llama 3 8B has 8.03B parameters (GQA, SwiGLU, untied, RoPE)."""
    assert round(parameter_count(shape_of(**LLAMA3_8B)) / 1e7) == 803


def test_mixtral_8x7b_is_46_7_billion() -> None:
    """Mistral AI: Mixtral 8x7B has 46.7B parameters in total (8 experts, top-2)."""
    shape = shape_of(**{**LLAMA3_8B, "vocab_size": 32000, "num_experts": 8})
    assert round(parameter_count(shape) / 1e8) == 467


def test_each_layout_key_changes_the_count_by_its_own_term() -> None:
    base = {
        "num_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "vocab_size": 1000,
        "seq_length": 128,
    }
    l, h, v, s = 4, 256, 1000, 128
    count = parameter_count(shape_of(**base))
    assert parameter_count(shape_of(**base, tied_embeddings=False)) - count == v * h
    assert count - parameter_count(shape_of(**base, position_embedding="rope")) == s * h
    # LayerNorm has weight and bias (2h); RMSNorm a weight (h); two per layer
    assert count - parameter_count(shape_of(**base, normalization="rmsnorm")) == l * 2 * h
    # biases: QKV 3h, projection h, fc1 4h, fc2 h
    assert count - parameter_count(shape_of(**base, bias=False)) == l * 9 * h
    # a gated MLP adds one more h x 4h matrix and its 4h bias
    assert parameter_count(shape_of(**base, gated_mlp=True)) - count == l * (4 * h * h + 4 * h)
    # 2 query groups of 8 heads: K and V shrink from h x h to h x h/4 (and their biases)
    assert count - parameter_count(shape_of(**base, num_query_groups=2)) == l * 2 * (
        h * h - h * h // 4 + h - h // 4
    )


# ------------------------------------------------------------------ megatron-core, per rank

MEGATRON_WORKER = r"""
# torch and megatron-core are imported once, here; the ranks are forked from this process
# (each spawned rank would import them again: about 5 CPU seconds a rank)
import json, os, sys, warnings

warnings.simplefilter("ignore")
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from megatron.core import parallel_state as ps
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_decoder_block_spec, get_gpt_mtp_block_spec)
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer.transformer_config import (
    MLATransformerConfig, TransformerConfig)
# With tied embeddings and pp > 1, megatron moves the last stage's copy to CUDA
# before its all-reduce; on CPU, leave it where it is. Learned softmax offsets
# (attention sinks) are allocated on the current CUDA device: use the CPU.
torch.Tensor.cuda = lambda self, *args, **kwargs: self
torch.cuda.current_device = lambda: "cpu"
from megatron.core.transformer import multi_latent_attention
from megatron.core.transformer.dot_product_attention import DotProductAttention

# megatron-core's MLA reads HAVE_TE from an import that succeeds without Transformer
# Engine installed (leaving TELinear None); this environment has none
multi_latent_attention.HAVE_TE = False


class LatentCoreAttention(DotProductAttention):
    def __init__(self, *args, k_channels=None, v_channels=None, **kwargs):
        super().__init__(*args, **kwargs)


def worker(rank, world, port, cases, out):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = []
    for case in cases:
        tp, pp, ep, m = case["tp"], case["pp"], case["ep"], case["model"]
        etp = case.get("etp", tp)
        ps.initialize_model_parallel(
            tp, pp, expert_model_parallel_size=ep, expert_tensor_parallel_size=etp)
        norm = "RMSNorm" if m.get("normalization") == "rmsnorm" else "LayerNorm"
        experts = m.get("num_experts")
        # the [model] keys named after TransformerConfig's fields pass through as they are
        same = {key: m[key] for key in (
            "kv_channels", "qk_layernorm", "add_qkv_bias", "softmax_type",
            "moe_shared_expert_intermediate_size", "moe_layer_freq", "mtp_num_layers",
            "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
        ) if key in m}
        latent = m.get("multi_latent_attention", False)
        if latent:
            same.setdefault("q_lora_rank", None)
            same["rope_type"] = "rope"
        config = (MLATransformerConfig if latent else TransformerConfig)(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
            expert_model_parallel_size=ep, expert_tensor_parallel_size=etp,
            num_layers=m["num_layers"],
            hidden_size=m["hidden_size"], num_attention_heads=m["num_attention_heads"],
            num_query_groups=m.get("num_query_groups"), ffn_hidden_size=m.get("ffn_hidden_size"),
            gated_linear_unit=m.get("gated_mlp", False), add_bias_linear=m.get("bias", True),
            normalization=norm, num_moe_experts=experts,
            moe_ffn_hidden_size=m.get("moe_ffn_hidden_size"),
            use_cpu_initialization=True, pipeline_dtype=torch.float32, **same)
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization=norm)
        if latent:  # the local core attention takes no k/v widths (TE's does); it has no weights
            for layer in spec.layer_specs:
                layer.submodules.self_attention.submodules.core_attention = LatentCoreAttention
        mtp = (get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False)
               if m.get("mtp_num_layers") else None)
        position = {"rope": "rope", "none": "none"}.get(
            m.get("position_embedding"), "learned_absolute")
        model = GPTModel(
            config=config, transformer_layer_spec=spec, vocab_size=m["vocab_size"],
            max_sequence_length=m["seq_length"], position_embedding_type=position,
            share_embeddings_and_output_weights=m.get("tied_embeddings", True),
            pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
            mtp_block_spec=mtp)
        params = dict(model.named_parameters())
        results.append({
            "pp_rank": ps.get_pipeline_model_parallel_rank(),
            "params": sum(p.numel() for p in params.values()),
            "final_norm": sum(
                p.numel() for n, p in params.items() if n.startswith("decoder.final_layernorm"))})
        del model
        ps.destroy_model_parallel()
    with open(f"{out}.{rank}", "w") as fh:
        json.dump(results, fh)
    dist.barrier()  # every rank is done before any closes its gloo connections
    dist.destroy_process_group()

if __name__ == "__main__":
    import socket
    cases, out, world = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(worker, args=(world, port, cases, out), nprocs=world, start_method="fork")
"""

SMALL_GQA = {
    "num_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 8,
    "num_query_groups": 2,
    "ffn_hidden_size": 96,
    "gated_mlp": True,
    "vocab_size": 128,
    "seq_length": 32,
}
LATENT_MOE: dict[str, Any] = {
    "num_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "multi_latent_attention": True,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_head_dim": 16,
    "qk_pos_emb_head_dim": 8,
    "v_head_dim": 12,
    "qk_layernorm": True,
    "ffn_hidden_size": 96,
    "num_experts": 4,
    "moe_ffn_hidden_size": 40,
    "moe_shared_expert_intermediate_size": 48,
    "moe_layer_freq": [0, 1, 1, 1],
    "mtp_num_layers": 1,
    "gated_mlp": True,
    "bias": False,
    "tied_embeddings": False,
    "position_embedding": "rope",
    "normalization": "rmsnorm",
    "vocab_size": 128,
    "seq_length": 32,
}
MEGATRON_CASES: list[dict[str, Any]] = [
    # world 4: tp 2 x pp 2, tied embeddings (the last stage keeps a copy), learned positions
    {"tp": 2, "pp": 2, "ep": 1, "model": SMALL_GQA},
    # tp 4 > 2 query groups: each rank holds one K/V group
    {
        "tp": 4,
        "pp": 1,
        "ep": 1,
        "model": {
            **SMALL_GQA,
            "tied_embeddings": False,
            "position_embedding": "rope",
            "bias": False,
            "normalization": "rmsnorm",
        },
    },
    # the classic layout, untied, pp 4 (one layer per stage)
    {
        "tp": 1,
        "pp": 4,
        "ep": 1,
        "model": {
            "num_layers": 4,
            "hidden_size": 48,
            "num_attention_heads": 4,
            "vocab_size": 96,
            "seq_length": 16,
            "tied_embeddings": False,
        },
    },
    # MoE: 4 experts over ep 2 (dp 4), expert width 40
    {
        "tp": 1,
        "pp": 1,
        "ep": 2,
        "model": {**SMALL_GQA, "num_experts": 4, "moe_ffn_hidden_size": 40, "bias": False},
    },
    # everything on one rank per replica: the whole model's count
    {"tp": 1, "pp": 1, "ep": 1, "model": {**SMALL_GQA, "tied_embeddings": False}},
    # DeepSeek-V3's layout: multi-latent attention with compressed queries and QK norms,
    # a dense first layer, MoE layers with a shared expert, one MTP layer (on the last
    # stage, with its own copy of the embedding); tp 1, as Megatron-Core's local spec
    # splits MLA's down projections over tp where Transformer Engine's (mdc's) does not
    {"tp": 1, "pp": 2, "ep": 2, "model": LATENT_MOE},
    {"tp": 1, "pp": 1, "ep": 1, "model": {**LATENT_MOE, "normalization": "layernorm"}},
    # MLA without query compression, tied embeddings
    {
        "tp": 1,
        "pp": 1,
        "ep": 4,
        "model": {
            **LATENT_MOE,
            "q_lora_rank": None,
            "tied_embeddings": True,
            "moe_layer_freq": 2,
        },
    },
    # Qwen3 / gpt-oss attention: head width not hidden / heads, QK norms, a QKV bias
    # without the others, learned softmax offsets (sinks)
    {
        "tp": 2,
        "pp": 2,
        "ep": 1,
        "model": {
            **SMALL_GQA,
            "kv_channels": 24,
            "qk_layernorm": True,
            "add_qkv_bias": True,
            "bias": False,
            "softmax_type": "learnable",
            "position_embedding": "rope",
            "normalization": "rmsnorm",
        },
    },
    # gpt-oss's MoE: biased router and experts (Megatron-Core: only with etp 1), sinks
    {
        "tp": 2,
        "pp": 1,
        "ep": 2,
        "etp": 1,
        "model": {
            **SMALL_GQA,
            "kv_channels": 16,
            "num_experts": 4,
            "moe_ffn_hidden_size": 40,
            "softmax_type": "learnable",
            "tied_embeddings": False,
        },
    },
]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.xdist_group("loopback")  # 4 real ranks on loopback: never beside another real run
def test_per_gpu_parameters_match_megatron_core(tmp_path: Path) -> None:
    """Build each model with megatron-core on 4 CPU ranks; every rank's count must match.

    megatron-core also builds the final norm, which the classic count leaves out.
    """
    script = tmp_path / "megatron_params.py"
    script.write_text(MEGATRON_WORKER)
    world = 4
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            json.dumps(MEGATRON_CASES),
            str(tmp_path / "out"),
            str(world),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(world)]
    for index, case in enumerate(MEGATRON_CASES):
        plan = planned(
            job(
                nproc=world,
                model=case["model"],
                parallelism={
                    "tp": case["tp"],
                    "pp": case["pp"],
                    "ep": case["ep"],
                    "etp": case.get("etp", case["tp"]),
                },
            )
        )
        by_stage = {e.stage: e.params_per_gpu for e in stages(plan)}
        for rank in range(world):
            got = ranks[rank][index]
            pp_rank = got["pp_rank"]
            stage = (
                "only"
                if case["pp"] == 1
                else "first"
                if pp_rank == 0
                else "last"
                if pp_rank == case["pp"] - 1
                else "middle"
            )
            if stage == "middle":  # layers only: the first stage without its embedding
                m, tp = case["model"], case["tp"]
                learned = m.get("position_embedding", "learned") == "learned"
                embedding = m["vocab_size"] // tp * m["hidden_size"] + (
                    m["seq_length"] * m["hidden_size"] if learned else 0
                )
                assert got["params"] == by_stage["first"] - embedding, (case, rank, got)
                continue
            assert got["params"] == by_stage[stage] + got["final_norm"], (case, rank, got)
        if case["tp"] == case["pp"] == case["ep"] == 1:
            assert (
                ranks[0][index]["params"]
                == parameter_count(shape_of(**case["model"])) + ranks[0][index]["final_norm"]
            )


# ------------------------------------------------------------------ weights, grads, optimizer


def state_bytes(e: MemoryEstimate) -> int:
    return e.weights + e.gradients + e.optimizer


BIG = {
    "num_layers": 8,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "vocab_size": 32768,
    "seq_length": 2048,
}


@pytest.mark.parametrize(
    ("training", "per_param"),
    [
        # Megatron's distributed-optimizer docs: bf16 params + fp32 grads
        (TrainingSetup(grad_bytes=4), lambda d: Fraction(18)),
        (TrainingSetup(zero_stage=1, grad_bytes=4), lambda d: 6 + Fraction(12, d)),
        # ZeRO (Rajbhandari et al. 2020), mixed-precision Adam, K = 12
        (TrainingSetup(), lambda d: Fraction(16)),
        (TrainingSetup(zero_stage=1), lambda d: 4 + Fraction(12, d)),
        (TrainingSetup(zero_stage=2), lambda d: 2 + Fraction(14, d)),
        (TrainingSetup(zero_stage=3), lambda d: Fraction(16, d)),
    ],
)
@pytest.mark.parametrize("d", [1, 8, 64])
def test_bytes_per_parameter_follow_megatron_and_zero(
    training: TrainingSetup, per_param: Any, d: int
) -> None:
    plan = planned(job(nnodes=d, nproc=1, model=BIG), training)
    e = stages(plan)[0]
    assert e.shard == d
    expected = per_param(d) * e.params_per_gpu
    assert abs(state_bytes(e) - expected) <= 3  # each term rounds up to a byte


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_hybrid_sharding_shards_within_each_replica(replicas: int) -> None:
    """HSDP: dp = 8 ranks hold ``replicas`` full copies, each sharded ZeRO-3 over 8 / replicas."""
    plan = planned(
        job(nnodes=8, nproc=1, model=BIG), TrainingSetup(zero_stage=3, replicas=replicas)
    )
    e = stages(plan)[0]
    assert e.shard == 8 // replicas
    assert abs(state_bytes(e) - Fraction(16 * replicas, 8) * e.params_per_gpu) <= 3


def test_fp32_training_needs_no_master_copy() -> None:
    plan = planned(job(model={**BIG, "dtype": "fp32"}))
    e = stages(plan)[0]
    assert (e.weight_bytes, e.grad_bytes, e.optimizer_bytes) == (4, 4, 8)
    assert state_bytes(e) == 16 * e.params_per_gpu


def test_experts_split_over_ep_and_shard_over_expert_dp() -> None:
    model = {**SMALL_GQA, "num_experts": 8, "moe_ffn_hidden_size": 40, "bias": False}
    h, f, experts = 64, 40, 8
    one_expert = 3 * h * f
    dense_only = planned(
        job(
            nproc=8,
            model={
                k: v for k, v in model.items() if k not in ("num_experts", "moe_ffn_hidden_size")
            },
        )
    )
    # dense: attention + norms; MoE adds a router (E x h) and replaces the MLP by experts
    dense_mlp = 3 * h * 96
    for ep in (1, 2, 4, 8):
        plan = planned(
            job(nproc=8, model=model, parallelism={"ep": ep}), TrainingSetup(zero_stage=1)
        )
        e = stages(plan)[0]
        layers = 4
        expected = stages(dense_only)[0].params_per_gpu + layers * (
            experts * h - dense_mlp + experts // ep * one_expert
        )
        assert e.params_per_gpu == expected
        assert e.expert_shard == 8 // ep and e.shard == 8
        expert_params = layers * experts // ep * one_expert
        dense_params = e.params_per_gpu - expert_params
        assert e.optimizer == math.ceil(
            12 * (Fraction(dense_params, 8) + Fraction(expert_params, 8 // ep))
        )


# ------------------------------------------------------------------ activations (Korthikanti)

L, H, A, V, S = 8, 1024, 16, 32000, 2048


def korthikanti_layer(
    s: Fraction | int, b: int, t: int, *, sp: bool = False, selective: bool = False, keys: int = S
) -> Fraction:
    """Per-layer bytes, Korthikanti et al. 2022 (Table 2), with s queries against `keys` keys."""
    scores = Fraction(0) if selective else Fraction(5 * A * keys, H)
    sbh = Fraction(s) * b * H
    if sp:
        return sbh * (34 + scores) / t
    return sbh * (10 + Fraction(24, t) + scores / t)


def logits(s: Fraction | int, b: int, t: int) -> Fraction:
    return 4 * s * b * Fraction(V, t)


def classic_plan(
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    vpp: int | None = None,
    micro: int = 2,
    gas: int = 1,
    **training: Any,
) -> Plan:
    parallelism = {"tp": tp, "pp": pp, "cp": cp, **({"vpp": vpp} if vpp else {})}
    dp = 1
    return planned(
        job(
            nnodes=pp,
            nproc=tp * cp,
            parallelism=parallelism,
            batch={"micro_batch_size": micro, "global_batch_size": micro * dp * gas},
            model={
                "num_layers": L,
                "hidden_size": H,
                "num_attention_heads": A,
                "vocab_size": V,
                "seq_length": S,
                "flash_attention": False,
            },
        ),
        TrainingSetup(**training),
    )


@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize(
    ("sp", "selective"), [(False, False), (True, False), (True, True), (False, True)]
)
def test_activations_follow_korthikanti(t: int, sp: bool, selective: bool) -> None:
    plan = classic_plan(tp=t, sequence_parallel=sp, recompute="selective" if selective else "none")
    (e,) = stages(plan)
    expected = L * korthikanti_layer(S, 2, t, sp=sp and t > 1, selective=selective) + logits(
        S, 2, t
    )
    assert e.activations == math.ceil(expected)


def test_flash_attention_keeps_no_scores() -> None:
    """The default: fused attention stores what selective recompute would keep."""
    eager = classic_plan(tp=2, recompute="selective")
    model = {**(attrs.asdict(eager.model) if eager.model else {}), "flash_attention": None}
    flash = planned(
        job(
            nproc=2,
            parallelism={"tp": 2},
            model={k: v for k, v in model.items() if v is not None},
            batch={"micro_batch_size": 2, "global_batch_size": 2},
        )
    )
    assert (
        stages(flash)[0].activations
        == stages(eager)[0].activations
        == math.ceil(L * korthikanti_layer(S, 2, 2, selective=True) + logits(S, 2, 2))
    )


def test_full_recompute_keeps_each_layers_input_and_one_layer() -> None:
    (e,) = stages(classic_plan(tp=4, recompute="full"))
    expected = L * 2 * S * 2 * H + korthikanti_layer(S, 2, 4) + logits(S, 2, 4)
    assert e.activations == math.ceil(expected)
    (e,) = stages(classic_plan(tp=4, recompute="full", sequence_parallel=True))
    expected = (
        L * 2 * S * 2 * Fraction(H, 4) + korthikanti_layer(S, 2, 4, sp=True) + logits(S, 2, 4)
    )
    assert e.activations == math.ceil(expected)


def test_context_parallel_divides_the_sequence() -> None:
    (e,) = stages(classic_plan(tp=2, cp=4))
    s = Fraction(S, 4)
    assert e.activations == math.ceil(L * korthikanti_layer(s, 2, 2) + logits(s, 2, 2))


@pytest.mark.parametrize(
    ("pp", "gas", "vpp"), [(2, 8, None), (4, 8, None), (4, 2, None), (4, 8, 2), (2, 4, 4)]
)
def test_pipeline_first_stage_holds_pp_microbatches(pp: int, gas: int, vpp: int | None) -> None:
    first, last = stages(classic_plan(tp=2, pp=pp, gas=gas, vpp=vpp))
    per_layer = korthikanti_layer(S, 2, 2)
    if vpp:
        # Megatron's interleaved schedule: rank r warms up (pp - r - 1) * 2 + (vpp - 1) * pp
        # model chunks of L / (pp * vpp) layers (at most gas * vpp), and holds one more
        def held(rank: int) -> Fraction:
            chunks = min((pp - rank - 1) * 2 + (vpp - 1) * pp + 1, gas * vpp)
            return chunks * Fraction(L, pp * vpp)

        assert first.activations == math.ceil(held(0) * per_layer)
        assert last.activations == math.ceil(held(pp - 1) * per_layer + logits(S, 2, 2))
    else:
        assert first.activations == math.ceil(L // pp * per_layer * min(pp, gas))
        assert last.activations == math.ceil(L // pp * per_layer + logits(S, 2, 2))
    assert (first.in_flight, last.in_flight) == (min(pp, gas), 1)


def test_gated_gqa_layer_counts_its_own_intermediates() -> None:
    """Generalised split part: Q + K + V + projection input, and 3 MLP intermediates."""
    model = {**LLAMA3_8B, "num_layers": 4}
    plan = planned(
        job(nproc=4, parallelism={"tp": 4}, model=model), TrainingSetup(recompute="selective")
    )
    (e,) = stages(plan)
    s, b, h, t, f, kv = 8192, 1, 4096, 4, 14336, 8 * 128
    replicated = 10 * s * b * h
    split = 2 * s * b * (2 * h + 2 * kv) // t + 2 * s * b * 3 * f // t
    assert e.activations == 4 * (replicated + split) + 4 * s * b * 128256 // t


def test_moe_layers_hold_top_k_copies_of_the_expert_work() -> None:
    """Each token reaches top-k experts: k copies of its input (h) and of the gated
    intermediates (3 * moe_ffn, over etp); attention as in a dense layer."""
    model = {
        **LLAMA3_8B,
        "num_layers": 2,
        "num_experts": 8,
        "moe_ffn_hidden_size": 2048,
        "moe_router_topk": 3,
    }
    plan = planned(
        job(nproc=8, parallelism={"tp": 2, "ep": 4, "etp": 1}, model=model),
        TrainingSetup(recompute="selective", sequence_parallel=True),
    )
    (e,) = stages(plan)
    s, b, h, t, kv = 8192, 1, 4096, 2, 8 * 128
    replicated = 10 * s * b * h // t  # sequence parallel
    attention = 2 * s * b * (2 * h + 2 * kv) // t
    experts = 2 * s * b * 3 * (3 * 2048 + h)  # k = 3, etp = 1
    assert e.activations == 2 * (replicated + attention + experts) + 4 * s * b * 128256 // t


# ------------------------------------------------------------------ the fit check


def codes(found: tuple[Diagnostic, ...]) -> list[str]:
    return [d.code for d in found]


LLAMA_JOB = job(
    nnodes=2,
    nproc=8,
    parallelism={"tp": 2, "pp": 2},
    batch={"global_batch_size": 64, "micro_batch_size": 2},
    model=LLAMA3_8B,
)


def with_capacity(data: dict[str, Any], gib: float) -> dict[str, Any]:
    return {**data, "distributed": {**data["distributed"], "accelerator_memory_gib": gib}}


def test_a_larger_optimizer_step_copy_than_the_activations_is_what_the_warning_names() -> None:
    """Megatron's optimizer step copies a 2-byte gradient buffer to fp32 after the
    activations are freed: the total counts the larger, and MDC262 says which it was."""
    training = TrainingSetup(grad_bytes=2, step_grad_bytes=4, recompute="full",
                             recompute_method="uniform", recompute_num_layers=1)  # fmt: skip
    memory = planned(LLAMA_JOB, training).memory
    assert memory is not None and memory.step_gradients > memory.activations
    state = memory.weights + memory.gradients + memory.optimizer
    assert memory.total == state + memory.step_gradients
    plan, found = plan_of(with_capacity(LLAMA_JOB, (state + memory.total) / 2 / GIB), training)
    assert plan is not None and codes(found) == ["MDC262"]
    assert "the optimizer step's fp32 gradients" in found[0].message


def test_estimate_is_shown_without_a_check() -> None:
    plan, found = plan_of(LLAMA_JOB)
    assert plan is not None and plan.memory is not None and found == ()
    assert plan.memory.capacity is None
    assert plan.memory.total == max(e.total for e in stages(plan))


def test_model_state_over_the_limit_is_an_error_with_the_numbers() -> None:
    memory = planned(LLAMA_JOB).memory
    assert memory is not None
    state = memory.weights + memory.gradients + memory.optimizer
    plan, found = plan_of(with_capacity(LLAMA_JOB, state * 0.9 / GIB))
    assert plan is None and codes(found) == ["MDC260"]
    (d,) = found
    assert d.is_error and d.location.pointer == "/distributed/accelerator_memory_gib"
    assert f"{state / GIB:.1f} GiB" in d.message and f"{memory.total / GIB:.1f} GiB" in d.message
    for part in ("weights", "gradients", "optimizer"):
        assert re.search(rf"{part} \d+\.\d GiB", d.message), d.message
    assert d.hint and "GiB" in d.hint


def test_activations_over_the_limit_are_a_warning_not_a_refusal() -> None:
    """Activations are an estimate: a total over the limit whose model state fits is a
    warning, so a layout that really runs is never refused on them."""
    memory = planned(LLAMA_JOB).memory
    assert memory is not None
    state = memory.weights + memory.gradients + memory.optimizer
    assert state < memory.total
    plan, found = plan_of(with_capacity(LLAMA_JOB, (state + memory.total) / 2 / GIB))
    assert plan is not None and codes(found) == ["MDC262"]
    (d,) = found
    assert not d.is_error and "not refused" in d.message
    for part in ("weights", "gradients", "optimizer", "activations"):
        assert re.search(rf"{part} \d+\.\d GiB", d.message), d.message
    assert d.hint and "GiB" in d.hint


#: the levers a launcher lets the hint propose, labelled so that apply_lever reads them
LEVER_LABELS = (
    *((f"zero {n}", f"zero stage {n}") for n in (1, 2, 3)),
    ("sequence parallel", "sequence parallel"),
    *((f"recompute {mode}", f'recompute "{mode}"') for mode in ("selective", "full")),
)
LEVER = re.compile(
    r'(tp|pp|cp|micro_batch_size|zero stage) (\d+)|recompute "(\w+)"'
    r"|(sequence parallel)"
)


def apply_lever(
    data: dict[str, Any], training: TrainingSetup, lever: str
) -> tuple[dict[str, Any], TrainingSetup]:
    match = LEVER.match(lever)
    assert match, lever
    key, value, recompute, sp = match.groups()
    if key in ("tp", "pp", "cp"):
        return {**data, "parallelism": {**data["parallelism"], key: int(value)}}, training
    if key == "micro_batch_size":
        return {**data, "batch": {**data["batch"], key: int(value)}}, training
    if key == "zero stage":
        return data, attrs.evolve(training, zero_stage=int(value))
    if recompute:
        return data, attrs.evolve(training, recompute=recompute)
    assert sp
    return data, attrs.evolve(training, sequence_parallel=True)


@pytest.mark.parametrize("capacity", [20, 40, 60])
def test_every_lever_said_to_fit_does_fit(capacity: int) -> None:
    data = with_capacity(LLAMA_JOB, capacity)
    training = TrainingSetup(grad_bytes=4, levers=LEVER_LABELS)
    _, found = plan_of(data, training)
    (d,) = found
    assert d.code in ("MDC260", "MDC262") and d.hint
    levers = re.findall(
        r"([^:,;]+) gives (\d+\.\d) GiB( \((?:fits|under 90\.0%)\))?",
        d.hint.removeprefix("estimated per-GPU total with one change each: "),
    )
    assert levers, d.hint
    totals = [float(t) for _, t, _ in levers]
    assert totals == sorted(totals)
    for label, shown, fits in levers:
        changed, trained = apply_lever(data, training, label.strip().removesuffix(" (spans nodes)"))
        plan, again = plan_of(changed, trained)
        if fits:
            assert plan is not None and plan.memory is not None, [x.render() for x in again]
            assert f"{plan.memory.total / GIB:.1f}" == shown
        elif plan is not None and plan.memory is not None:  # over the hint's target
            assert f"{plan.memory.total / GIB:.1f}" == shown
        else:
            assert codes(again) == ["MDC260"]
            assert f"estimated {shown} GiB" in again[0].message


def test_nearly_full_is_a_warning() -> None:
    total = planned(LLAMA_JOB).memory.total  # type: ignore[union-attr]
    plan, found = plan_of(with_capacity(LLAMA_JOB, total / 0.95 / GIB))
    assert plan is not None and codes(found) == ["MDC262"]
    assert "95%" in found[0].message or "94%" in found[0].message
    plan, found = plan_of(with_capacity(LLAMA_JOB, total / 0.8 / GIB))
    assert plan is not None and found == ()
    assert plan.memory is not None and plan.memory.capacity is not None


def test_capacity_without_model_is_a_warning() -> None:
    plan, found = plan_of(with_capacity(job(), 80))
    assert plan is not None and plan.memory is None and codes(found) == ["MDC261"]
    assert found[0].location.pointer == "/distributed/accelerator_memory_gib"


def test_incomplete_model_names_the_missing_keys() -> None:
    partial = {"num_layers": 4, "num_attention_heads": 8}
    plan, found = plan_of(with_capacity(job(model=partial), 80))
    assert plan is not None and plan.memory is None and codes(found) == ["MDC261"]
    assert "hidden_size, vocab_size, seq_length" in found[0].message
    assert found[0].location.pointer == "/model"
    plan, found = plan_of(job(model=partial))
    assert plan is not None and plan.memory is None and found == ()


def test_serving_launchers_get_no_training_estimate() -> None:
    plan, found = plan_of(with_capacity(job(nnodes=3, model=LLAMA3_8B), 80), disaggregated=True)
    # the serving estimate (or MDC261 without one) is the pipeline's (test_serving_memory.py)
    assert plan is not None and plan.memory is None and codes(found) == []


def test_a_million_ranks_plan_with_an_estimate_and_a_hint() -> None:
    """1,048,576 ranks: the estimate and the hint's alternatives are arithmetic, not loops."""
    data = with_capacity(
        job(
            nnodes=131072,
            nproc=8,
            parallelism={"tp": 8, "pp": 16, "cp": 2},
            batch={"global_batch_size": 32768, "micro_batch_size": 1},
            model={**LLAMA3_8B, "num_layers": 128, "seq_length": 131072},
        ),
        80,
    )
    _, found = plan_of(data)
    assert codes(found) in (["MDC260"], ["MDC262"]) and found[0].hint
    assert "gives" in found[0].hint


# ------------------------------------------------------------------ plan.json and explain


def test_plan_json_and_explain_show_the_breakdown() -> None:
    plan = planned(with_capacity(LLAMA_JOB, 400))
    launch = Launch(roles=(Role(name="worker", argv=("true",)),))
    m = plan.memory
    assert m is not None
    entry = plan_json(plan, launch)["memory"]
    assert entry == memory_json(m)
    assert isinstance(entry, dict)
    assert entry["bytes"] == {
        "weights": m.weights,
        "gradients": m.gradients,
        "optimizer": m.optimizer,
        "activations": m.activations,
        "total": m.total,
    }
    assert entry["fits"] is True and entry["capacity_bytes"] == 400 * GIB
    assert m.weights + m.gradients + m.optimizer + m.activations == m.total
    text = explain_text(plan, launch)
    assert f"{m.params_total:,} in total" in text
    assert f"{m.total / GIB:.2f} GiB" in text and "of 400 GiB" in text
    assert plan_json(planned(job()), launch)["memory"] is None
    assert "memory per GPU" not in explain_text(planned(job()), launch)


# ------------------------------------------------------------------ properties


@settings(max_examples=60, deadline=None)
@given(
    tp=st.sampled_from([1, 2, 4, 8]),
    dp=st.sampled_from([1, 2, 4]),
    micro=st.integers(1, 4),
    gated=st.booleans(),
    groups=st.sampled_from([2, 4, 8, 16]),
)
def test_more_sharding_or_recompute_never_needs_more(
    tp: int, dp: int, micro: int, gated: bool, groups: int
) -> None:
    model = {
        "num_layers": 4,
        "hidden_size": 512,
        "num_attention_heads": 16,
        "num_query_groups": groups,
        "vocab_size": 5000,
        "seq_length": 256,
        "gated_mlp": gated,
        "flash_attention": False,
    }
    data = job(
        nproc=tp * dp, parallelism={"tp": tp}, model=model, batch={"micro_batch_size": micro}
    )
    totals = [
        planned(data, TrainingSetup(zero_stage=z)).memory.total  # type: ignore[union-attr]
        for z in range(4)
    ]
    assert totals == sorted(totals, reverse=True)
    none, selective = (
        planned(data, TrainingSetup(recompute=r)).memory.activations  # type: ignore[union-attr]
        for r in ("none", "selective")
    )
    assert selective < none
    flash = planned({**data, "model": {**model, "flash_attention": True}}).memory
    assert flash is not None and flash.activations == selective
    if tp > 1:
        plain = planned(data).memory
        split = planned(data, TrainingSetup(sequence_parallel=True)).memory
        assert split.activations < plain.activations  # type: ignore[union-attr]
