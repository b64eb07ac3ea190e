"""The architecture keys of [model]: which part each layer is, the parts' parameters and
activations, and the rules Megatron-Core applies to them (MDC270-277).

Expected values are derived independently: Hugging Face's module shapes for a Mamba-2
layer, NVIDIA's description of Nemotron-H's layers, brute-force counts of layer patterns,
and megatron-core's own functions where they refuse a shape without CUDA.
"""

from __future__ import annotations

import tomllib
import warnings
from fractions import Fraction
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mdc.convert import structure, structure_spec
from mdc.errors import SourceLocation
from mdc.plan import build_plan
from mdc.plan.architecture import LayerPattern, Parts, rules
from mdc.plan.memory import Shape, parameter_count, resolve_shape, stage_estimates
from mdc.plan.model import BatchPlan, Sizes, TrainingSetup
from mdc.plan.named_models import CATALOGUE_FILE
from mdc.spec import ModelTable

MODELS = tomllib.loads(Path(CATALOGUE_FILE).read_text())
BASE: dict[str, Any] = {
    "num_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "vocab_size": 100,
    "seq_length": 32,
    "bias": False,
    "normalization": "rmsnorm",
    "position_embedding": "rope",
}


def shape_of(**model: Any) -> Shape:
    shape = resolve_shape(structure({**BASE, **model}, ModelTable))
    assert shape is not None
    return shape


def codes(tp: int = 1, **model: Any) -> list[str]:
    return [f.code for f in rules(structure({**BASE, **model}, ModelTable), tp)]


# ------------------------------------------------------------------ layer patterns


@given(st.integers(1, 200), st.integers(1, 12), st.integers(0, 200), st.integers(0, 200))
def test_moe_frequency_counts_every_nth_layer(layers: int, every: int, a: int, b: int) -> None:
    pattern = LayerPattern(layers=layers, moe_every=every)
    start, stop = min(a, b), max(a, b)
    expected = sum(1 for i in range(start, min(stop, layers)) if i % every == 0)
    parts = pattern.parts(start, stop)
    assert parts.moe == expected
    assert parts.attention == max(0, min(stop, layers) - start)
    assert parts.mlp == parts.attention - parts.moe


def test_nemotron_h_56b_has_54_mamba_54_mlp_and_10_attention_layers() -> None:
    """NVIDIA's Nemotron-H page: 54 Mamba-2, 54 MLP and 10 self-attention layers."""
    model = structure(MODELS["nemotron-h-56b"]["model"], ModelTable)
    shape = resolve_shape(model)
    assert shape is not None
    assert shape.pattern.parts(0, 118) == Parts(attention=10, mlp=54, moe=0, mamba=54)


def test_deepseek_v3_has_three_dense_layers_then_moe() -> None:
    model = structure(MODELS["deepseek-v3"]["model"], ModelTable)
    shape = resolve_shape(model)
    assert shape is not None
    assert shape.pattern.parts(0, 61) == Parts(attention=61, mlp=3, moe=58)
    assert shape.pattern.parts(0, 4) == Parts(attention=4, mlp=3, moe=1)


# ------------------------------------------------------------------ parameters


def test_mamba_layer_has_the_hugging_face_module_shapes() -> None:
    """One Mamba-2 layer, tensor by tensor as Hugging Face's NemotronH mixer holds it."""
    h, heads, head_dim, groups, state, kernel = 64, 8, 16, 2, 16, 4
    d = heads * head_dim
    conv_dim = d + 2 * groups * state
    tensors = [
        (h,),  # the layer's RMSNorm
        (2 * d + 2 * groups * state + heads, h),  # in_proj: z, x, B, C, dt
        (conv_dim, 1, kernel),  # conv1d weight
        (conv_dim,),  # conv1d bias
        (heads,),  # dt_bias
        (heads,),  # A_log
        (heads,),  # D
        (d,),  # gated RMSNorm
        (h, d),  # out_proj
    ]
    expected = sum(_numel(t) for t in tensors)
    mamba = {
        "hybrid_override_pattern": "M",
        "num_layers": 1,
        "mamba_num_heads": heads,
        "mamba_head_dim": head_dim,
        "mamba_num_groups": groups,
        "mamba_state_dim": state,
    }
    embeddings = 2 * 100 * h  # input embedding and output layer, untied
    shape = shape_of(**mamba, tied_embeddings=False)
    assert parameter_count(shape) == expected + embeddings


def _numel(dims: tuple[int, ...]) -> int:
    n = 1
    for dim in dims:
        n *= dim
    return n


def test_each_attention_key_adds_its_own_term() -> None:
    l, h, a, g, d = 4, 64, 4, 2, 24
    base = parameter_count(shape_of(num_query_groups=g, kv_channels=d))
    # Q is a*d, K and V g*d each; the projection a*d x h
    wide = parameter_count(shape_of(num_query_groups=g, kv_channels=2 * d))
    assert wide - base == l * (h * (a + 2 * g) * d + a * d * h)
    # QK norms: two RMSNorms of the head width per layer
    normed = parameter_count(shape_of(num_query_groups=g, kv_channels=d, qk_layernorm=True))
    assert normed - base == l * 2 * d
    # a QKV bias without the others
    biased = parameter_count(shape_of(num_query_groups=g, kv_channels=d, add_qkv_bias=True))
    assert biased - base == l * (a + 2 * g) * d
    # attention sinks: one learned offset per head and layer
    sinks = parameter_count(shape_of(num_query_groups=g, kv_channels=d, softmax_type="learnable"))
    assert sinks - base == l * a
    # a sliding window has no parameters
    window = shape_of(num_query_groups=g, kv_channels=d, window_size=[8, 0])
    assert parameter_count(window) == base


def test_moe_layer_pattern_and_shared_expert_terms() -> None:
    l, h, f, e, fe, fs = 4, 64, 96, 4, 40, 48
    moe = {"num_experts": e, "moe_ffn_hidden_size": fe, "ffn_hidden_size": f, "gated_mlp": True}
    every = parameter_count(shape_of(**moe))
    # two dense layers instead of MoE ones: router and experts out, a dense MLP in
    dense_first = parameter_count(shape_of(**moe, moe_layer_freq=[0, 0, 1, 1]))
    assert every - dense_first == 2 * (e * h + e * 3 * h * fe - 3 * h * f)
    # every second layer (0 and 2) MoE: the same two dense layers as [1, 0, 1, 0]
    assert parameter_count(shape_of(**moe, moe_layer_freq=2)) == dense_first
    # a shared expert: one more gated MLP of its width in every MoE layer
    shared = parameter_count(shape_of(**moe, moe_shared_expert_intermediate_size=fs))
    assert shared - every == l * 3 * h * fs


def test_moe_latent_projections_narrow_the_routed_experts() -> None:
    """megatron-core's MoELayer with moe_latent_size L: fc1_latent_proj h x L and
    fc2_latent_proj L x h, and each routed expert's fc1 L x f, fc2 f x L (the shared
    expert keeps the hidden size)."""
    l, h, f, e, latent = 4, 64, 40, 4, 16
    moe = {"num_experts": e, "moe_ffn_hidden_size": f, "moe_shared_expert_intermediate_size": 8}
    full = parameter_count(shape_of(**moe))
    narrow = parameter_count(shape_of(**moe, moe_latent_size=latent))
    assert full - narrow == l * (e * 2 * f * (h - latent) - 2 * h * latent)


def test_mtp_layer_copies_the_last_layer_with_a_projection_and_three_norms() -> None:
    h = 64
    moe = {"num_experts": 4, "moe_ffn_hidden_size": 40, "gated_mlp": True}
    without = shape_of(**moe)
    with_mtp = attrs.evolve(without, mtp_layers=1)
    five = attrs.evolve(without, layers=5, pattern=LayerPattern(layers=5, moe_every=1))
    one_layer = parameter_count(five) - parameter_count(without)
    assert parameter_count(with_mtp) - parameter_count(without) == one_layer + 2 * h * h + 3 * h


# ------------------------------------------------------------------ memory


def _estimates(shape: Shape, pp: int = 1, tp: int = 1) -> dict[str, Any]:
    sizes = Sizes(tp=tp, pp=pp, cp=1, ep=1, etp=tp, dp=1, edp=1)
    batch = BatchPlan(global_batch_size=8, micro_batch_size=1, grad_accum_steps=8)
    return {e.stage: e for e in stage_estimates(shape, sizes, batch, TrainingSetup())}


def test_dense_first_layers_make_the_first_stage_lighter() -> None:
    moe = {"num_experts": 8, "moe_ffn_hidden_size": 128, "gated_mlp": True}
    shape = shape_of(**moe, moe_layer_freq=[0, 0, 1, 1], tied_embeddings=False)
    stages = _estimates(shape, pp=2)
    layers_first = stages["first"].params_per_gpu - 100 * 64
    layers_last = stages["last"].params_per_gpu - 100 * 64
    assert layers_first < layers_last


def test_mtp_sits_on_the_last_stage_with_an_embedding_copy_and_its_logits() -> None:
    shape = shape_of(tied_embeddings=False)
    with_mtp = attrs.evolve(shape, mtp_layers=1)
    before, after = _estimates(shape, pp=2), _estimates(with_mtp, pp=2)
    assert after["first"].params_per_gpu == before["first"].params_per_gpu
    grown = after["last"].params_per_gpu - before["last"].params_per_gpu
    assert grown == parameter_count(with_mtp) - parameter_count(shape) + 100 * 64
    logits = 4 * 32 * 100  # fp32 logits of one micro batch
    assert after["last"].activations - before["last"].activations > logits


def test_mamba_layers_keep_their_projection_scan_and_norm_outputs() -> None:
    """Per token of a Mamba layer: norm and in_proj inputs and a mask (2h + 2h + h bytes in
    bf16), and 2 bytes each of the in_proj output (z, x, B, C, dt), the scan output and the
    gated norm's output."""
    h, heads, head_dim, groups, state = 64, 8, 16, 2, 16
    d = heads * head_dim
    one = {
        "hybrid_override_pattern": "M",
        "num_layers": 1,
        "mamba_num_heads": heads,
        "mamba_head_dim": head_dim,
        "mamba_num_groups": groups,
        "mamba_state_dim": state,
    }
    stages = _estimates(shape_of(**one))
    tokens = 32
    kept = 2 * tokens * ((2 * d + 2 * groups * state + heads) + d + d) + 5 * tokens * h
    logits = 4 * tokens * 100
    assert stages["only"].activations == kept + logits


def test_multi_latent_attention_keeps_its_heads_and_latents() -> None:
    a, q_lora, kv_lora, nope, rope, v = 4, 32, 16, 16, 8, 12
    latent = {
        "multi_latent_attention": True,
        "q_lora_rank": q_lora,
        "kv_lora_rank": kv_lora,
        "qk_head_dim": nope,
        "qk_pos_emb_head_dim": rope,
        "v_head_dim": v,
        "num_layers": 1,
    }
    gqa = _estimates(shape_of(num_layers=1))["only"].activations
    mla = _estimates(shape_of(**latent))["only"].activations
    tokens = 32
    # Q, K of (nope + rope) per head, V and the projection input of v per head, and the
    # compressed q and kv, each kept twice (norm input, up-projection input)
    expected = 2 * tokens * (2 * a * (nope + rope) + 2 * a * v)
    expected += 2 * tokens * (2 * q_lora + 2 * kv_lora + rope)
    expected -= 2 * tokens * (4 * 64)  # GQA's Q, K, V and projection input (a*d = h)
    assert mla - gqa == expected


# ------------------------------------------------------------------ rules


@pytest.mark.parametrize(("pattern", "layers"), [("M*-", 3), ("M*-", 4), ("M*-E", 3), ("MMMM", 4)])
@pytest.mark.torch
def test_pattern_length_refused_exactly_when_megatron_core_refuses(
    pattern: str, layers: int
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.ssm.mamba_hybrid_layer_allocation import (
            allocate_layers,
        )

    try:
        allocate_layers(layers, 0.0, 0.0, pattern)
        refused = False
    except ValueError:
        refused = True
    found = codes(num_layers=layers, hybrid_override_pattern=pattern, num_experts=4)
    assert ("MDC270" in found) == refused


@pytest.mark.parametrize("freq", [[0, 1, 1, 1], [0, 1, 1], [1] * 5, 2])
@pytest.mark.torch
def test_moe_layer_list_refused_exactly_when_megatron_core_refuses(freq: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.models.gpt.gpt_layer_specs import (
            get_gpt_decoder_layer_specs,
        )
        from megatron.core.transformer.transformer_config import (
            TransformerConfig,
        )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # megatron-core's notes on unset MoE options
        config = TransformerConfig(
            num_layers=4,
            hidden_size=64,
            num_attention_heads=4,
            num_moe_experts=4,
            moe_ffn_hidden_size=32,
            moe_layer_freq=freq,
            add_bias_linear=False,
        )
        try:
            get_gpt_decoder_layer_specs(config, use_transformer_engine=False)
            refused = False
        except AssertionError:
            refused = True
    found = codes(num_experts=4, moe_layer_freq=freq)
    assert ("MDC271" in found) == refused


def test_each_rule_names_its_key() -> None:
    assert codes(multi_latent_attention=True, num_query_groups=2) == ["MDC272"]
    assert codes(multi_latent_attention=True, num_query_groups=4) == []  # = heads: no GQA
    assert codes(num_experts=4, moe_shared_expert_intermediate_size=8, bias=True) == ["MDC273"]
    assert codes(num_layers=2, hybrid_override_pattern="ME", mamba_num_groups=1) == ["MDC274"]
    assert codes(mtp_num_layers=1, position_embedding="learned") == ["MDC275"]
    assert codes(mtp_num_layers=1, position_embedding="none") == []
    mamba: dict[str, Any] = {"num_layers": 1, "hybrid_override_pattern": "M", "mamba_num_groups": 3}
    assert codes(**mamba, mamba_num_heads=8) == ["MDC276"]
    assert codes(2, **mamba, mamba_num_heads=6) == ["MDC277"]  # groups 3
    assert codes(4, **mamba, mamba_num_heads=6) == ["MDC277", "MDC277"]


def test_megatron_rules_apply_to_the_megatron_launcher_only() -> None:
    model = structure({**BASE, "mtp_num_layers": 1, "position_embedding": "learned"}, ModelTable)
    assert [f.code for f in rules(model, 1, megatron=True)] == ["MDC275"]
    assert list(rules(model, 1, megatron=False)) == []
    # a pattern that does not describe every layer is wrong for any launcher
    broken = structure({**BASE, "hybrid_override_pattern": "M*"}, ModelTable)
    assert [f.code for f in rules(broken, 1, megatron=False)] == ["MDC270"]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_published_model_plans_on_megatron(name: str) -> None:
    data = {
        "job": {"name": "published", "command": "pretrain_gpt.py"},
        "distributed": {"launcher": "megatron", "nnodes": 1, "nproc_per_node": 8},
        "parallelism": {"tp": 1, "pp": 1},
        "model": MODELS[name]["model"],
    }
    plan, found = build_plan(
        structure_spec(data, {}),
        parallelism="data",
        disaggregated=False,
        training=None,
        locate=lambda pointer: SourceLocation(path="job.toml", pointer=pointer),
    )
    assert plan is not None, [d.render() for d in found]
    assert plan.memory is not None and plan.memory.params_total == parameter_count(
        resolve_shape(plan.model)  # type: ignore[arg-type]
    )
    assert isinstance(plan.memory.activations, int) and Fraction(plan.memory.activations) > 0
