"""DeepSeek-V4's parts in [model]: hyper-connections, the hybrid attention with its
compressors and indexer, the grouped low-rank output projection, hash-routed MoE layers.

The expected counts are the tensor shapes of Hugging Face transformers' DeepseekV4 modules
(models/deepseek_v4/modeling_deepseek_v4.py: DeepseekV4Attention, DeepseekV4CSACompressor,
DeepseekV4HCACompressor, DeepseekV4Indexer, DeepseekV4HyperConnection, DeepseekV4HyperHead,
DeepseekV4SparseMoeBlock), listed here one tensor at a time and multiplied out, not mdc's
formulas. Megatron-Core (Megatron-LM dev, 2026-08: DSv4HybridSelfAttention, csa.Compressor,
CSAIndexer, HyperConnectionModule) builds the same tensors; its hyper-connection keeps the
three gates as three scalars where Hugging Face has one tensor of three.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import attrs
import pytest

from mdc.errors import SpecError
from mdc.pipeline import Compiler
from mdc.plan.architecture import rules
from mdc.plan.memory import parameter_count, resolve_shape
from mdc.plugin_manager import load_plugins
from mdc.spec import ModelTable

#: a small DeepSeek-V4: every kind of layer (window only, CSA, HCA), MTP with ratio 0
SMALL: dict[str, Any] = {
    "num_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "multi_latent_attention": True,
    "experimental_attention_variant": "dsv4_hybrid",
    "q_lora_rank": 32,
    "v_head_dim": 16,
    "qk_pos_emb_head_dim": 8,
    "o_groups": 2,
    "o_lora_rank": 24,
    "csa_compress_ratios": (0, 4, 128, 4, 0),
    "dsa_indexer_n_heads": 3,
    "dsa_indexer_head_dim": 8,
    "enable_hyper_connections": True,
    "num_residual_streams": 3,
    "num_experts": 8,
    "moe_ffn_hidden_size": 12,
    "moe_shared_expert_intermediate_size": 12,
    "moe_router_topk": 2,
    "moe_n_hash_layers": 1,
    "mtp_num_layers": 1,
    "vocab_size": 100,
    "seq_length": 32,
    "gated_mlp": True,
    "tied_embeddings": False,
    "position_embedding": "rope",
    "bias": False,
    "normalization": "rmsnorm",
    "qk_layernorm": True,
}


def tensors(c: dict[str, Any], ratio: int) -> dict[str, tuple[int, ...]]:
    """One Hugging Face DeepseekV4DecoderLayer's parameters, by name."""
    h, heads, d = c["hidden_size"], c["num_attention_heads"], c["v_head_dim"]
    q, g, r = c["q_lora_rank"], c["o_groups"], c["o_lora_rank"]
    n, e, f = c["num_residual_streams"], c["num_experts"], c["moe_ffn_hidden_size"]
    found: dict[str, tuple[int, ...]] = {
        "input_layernorm": (h,),
        "post_attention_layernorm": (h,),
        "self_attn.q_a_proj": (q, h),
        "self_attn.q_a_norm": (q,),
        "self_attn.q_b_proj": (heads * d, q),
        "self_attn.kv_proj": (d, h),
        "self_attn.kv_norm": (d,),
        "self_attn.o_a_proj": (g * r, heads * d // g),
        "self_attn.o_b_proj": (h, g * r),
        "self_attn.sinks": (heads,),
        "mlp.gate.weight": (e, h),
        "mlp.experts.gate_up_proj": (e, 2 * f, h),
        "mlp.experts.down_proj": (e, h, f),
        "mlp.shared_experts.gate_proj": (c["moe_shared_expert_intermediate_size"], h),
        "mlp.shared_experts.up_proj": (c["moe_shared_expert_intermediate_size"], h),
        "mlp.shared_experts.down_proj": (h, c["moe_shared_expert_intermediate_size"]),
    }
    for hc in ("attn_hc", "ffn_hc"):
        found[f"{hc}.fn"] = ((2 + n) * n, n * h)
        found[f"{hc}.base"] = ((2 + n) * n,)
        found[f"{hc}.scale"] = (3,)
    if ratio == 4:  # DeepseekV4CSACompressor: overlapping windows, and its indexer
        ih, idim = c["dsa_indexer_n_heads"], c["dsa_indexer_head_dim"]
        found |= {
            "compressor.kv_proj": (2 * d, h),
            "compressor.gate_proj": (2 * d, h),
            "compressor.position_bias": (4, 2 * d),
            "compressor.kv_norm": (d,),
            "indexer.kv_proj": (2 * idim, h),
            "indexer.gate_proj": (2 * idim, h),
            "indexer.position_bias": (4, 2 * idim),
            "indexer.kv_norm": (idim,),
            "indexer.q_b_proj": (ih * idim, q),
            "indexer.scorer.weights_proj": (ih, h),
        }
    elif ratio == 128:  # DeepseekV4HCACompressor
        found |= {
            "compressor.kv_proj": (d, h),
            "compressor.gate_proj": (d, h),
            "compressor.position_bias": (128, d),
            "compressor.kv_norm": (d,),
        }
    return found


def expected(c: dict[str, Any]) -> int:
    """Embedding, layers, the stream head and the output layer (no final norm: mdc's
    convention), and each MTP layer: a layer of its own ratio, two input norms, the e and h
    projections, its final norm and its own stream head."""
    h, n, v = int(c["hidden_size"]), int(c["num_residual_streams"]), int(c["vocab_size"])
    ratios, layers = c["csa_compress_ratios"], int(c["num_layers"])
    head = n * n * h + n + 1
    total: int = 2 * v * h + head
    for ratio in ratios[:layers]:
        total += sum(math.prod(s) for s in tensors(c, ratio).values())
    for ratio in ratios[layers : layers + c["mtp_num_layers"]]:
        layer = sum(math.prod(s) for s in tensors(c, ratio).values())
        total += layer + 2 * h + 2 * h * h + h + head
    return total


def shape_of(model: dict[str, Any]) -> Any:
    shape = resolve_shape(ModelTable(**model))
    assert shape is not None
    return shape


def test_small_model_counts_every_tensor() -> None:
    assert parameter_count(shape_of(SMALL)) == expected(SMALL)


@pytest.mark.parametrize(
    "ratios", [(0, 0, 0, 0, 0), (4, 4, 4, 4, 4), (128, 0, 4, 128, 128), (0, 4, 128, 4, 4)]
)
def test_each_compress_ratio_adds_its_branch(ratios: tuple[int, ...]) -> None:
    model = {**SMALL, "csa_compress_ratios": ratios}
    assert parameter_count(shape_of(model)) == expected(model)


def test_hyper_connections_add_two_modules_a_layer_and_a_head() -> None:
    plain = {**SMALL, "enable_hyper_connections": False}
    n, h, layers = 3, 64, 4 + 1  # four layers and the MTP layer
    module = (2 + n) * n * n * h + (2 + n) * n + 3
    head = n * n * h + n + 1
    assert parameter_count(shape_of(SMALL)) - parameter_count(shape_of(plain)) == (
        2 * module * layers + head * 2  # the main model's head and the MTP layer's
    )


def test_hash_routed_layers_have_the_parameters_of_learned_ones() -> None:
    """The token-id to expert table is a buffer: the gate's weight stays a parameter."""
    learned = {**SMALL, "moe_n_hash_layers": 0}
    assert parameter_count(shape_of(SMALL)) == parameter_count(shape_of(learned))


#: DeepSeek-V4-Flash's config.json (deepseek-ai/DeepSeek-V4-Flash at 60d8d70)
FLASH: dict[str, Any] = {
    **SMALL,
    "num_layers": 43,
    "hidden_size": 4096,
    "num_attention_heads": 64,
    "q_lora_rank": 1024,
    "v_head_dim": 512,
    "qk_pos_emb_head_dim": 64,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "csa_compress_ratios": (0, 0, *[4, 128] * 20, 4, 0),
    "dsa_indexer_n_heads": 64,
    "dsa_indexer_head_dim": 128,
    "num_residual_streams": 4,
    "num_experts": 256,
    "moe_ffn_hidden_size": 2048,
    "moe_shared_expert_intermediate_size": 2048,
    "moe_router_topk": 6,
    "moe_n_hash_layers": 3,
    "vocab_size": 129280,
    "seq_length": 4096,
}


def test_deepseek_v4_flash_main_model_is_284_billion() -> None:
    """The model card's 284B total is the main model, without the MTP layer."""
    main = attrs.evolve(shape_of(FLASH), mtp_layers=0)
    assert parameter_count(main) == expected({**FLASH, "mtp_num_layers": 0})
    assert math.isclose(parameter_count(main), 284e9, rel_tol=0.01)


# ------------------------------------------------------------------ Megatron-Core's rules


@pytest.mark.parametrize(
    ("change", "tp", "quote"),
    [
        ({"multi_latent_attention": False}, 1, "requires multi_latent_attention"),
        ({"csa_compress_ratios": (0, 4, 128, 4)}, 1, "at least num_layers + mtp_num_layers"),
        ({"dsa_indexer_n_heads": None}, 1, "indexer's sizes"),
        ({"o_groups": 3}, 1, "divisible by o_groups"),
        ({}, 2, "only supports TP size 1"),
    ],
)
def test_megatron_core_asserts_are_refused(change: dict[str, Any], tp: int, quote: str) -> None:
    found = [f for f in rules(ModelTable(**{**SMALL, **change}), tp) if f.code == "MDC477"]
    assert len(found) == 1 and quote in found[0].message, found


def test_the_small_model_passes_every_rule() -> None:
    assert list(rules(ModelTable(**SMALL), 1)) == []


def test_variant_keys_without_the_variant_are_refused() -> None:
    model = {**SMALL, "experimental_attention_variant": None}
    found = {f.pointer for f in rules(ModelTable(**model), 1) if f.code == "MDC477"}
    assert found == {"/model/csa_compress_ratios", "/model/o_groups", "/model/o_lora_rank"}


# ------------------------------------------------------------------ the megatron launcher


def spec(pp: int = 1, megatron: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "job": {"name": "dsv4", "command": ["python", "pretrain_gpt.py"]},
        "distributed": {"launcher": "megatron", "nnodes": 2, "nproc_per_node": 4},
        "parallelism": {"tp": 1, "pp": pp, "ep": 4},
        "batch": {"global_batch_size": 8, "micro_batch_size": 1},
        "model": {**SMALL, "csa_compress_ratios": list(SMALL["csa_compress_ratios"])},
        "megatron": megatron or {},
    }


def compile_spec(tmp_path: Path, data: dict[str, Any]) -> Any:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return Compiler(load_plugins(autoload=False)).compile(path, tree=False)


def test_the_flags_of_megatron_lms_deepseek_v4_support(tmp_path: Path) -> None:
    argv = [str(w) for w in compile_spec(tmp_path, spec()).launch.roles[0].argv]
    words = " ".join(argv)
    for flags in (
        "--experimental-attention-variant dsv4_hybrid",
        "--o-groups 2 --o-lora-rank 24",
        "--dsa-indexer-n-heads 3 --dsa-indexer-head-dim 8",
        "--enable-hyper-connections",
        "--num-residual-streams 3",
        "--moe-n-hash-layers 1",
        "--csa-compress-ratios [0,4,128,4,0]",
    ):
        assert flags in words, flags


def test_hash_layers_with_pipelining_need_a_layout(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        compile_spec(tmp_path, spec(pp=2))
    errors = [d.render() for d in caught.value.diagnostics if d.is_error]
    assert len(errors) == 1 and "MDC478" in errors[0]
