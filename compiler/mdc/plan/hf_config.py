"""A Hugging Face ``config.json`` read as ``[model]`` keys (the table in docs/model.md).

Only the model types whose layers mdc knows are read; for any other the caller says to
write the keys. The defaults a config leaves out are those of the model type's own
``transformers`` configuration class (e.g. ``tie_word_embeddings`` is false for Llama).
"""

from __future__ import annotations

from typing import Any

#: Llama-style decoders: RMSNorm, rotary positions, a gated (SwiGLU) MLP
LLAMA_LIKE = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gpt_oss"})
#: DeepSeek's multi-latent attention stacks (Kimi K2 is DeepSeek-V3's architecture)
DEEPSEEK_LIKE = frozenset({"deepseek_v2", "deepseek_v3", "kimi_k2"})
KNOWN = LLAMA_LIKE | DEEPSEEK_LIKE


def model_keys(config: dict[str, Any]) -> dict[str, Any]:
    """The ``[model]`` keys of ``config``; ValueError names what cannot be read."""
    kind = config.get("model_type")
    if kind not in KNOWN:
        raise ValueError(
            f"model_type {kind!r} is not one mdc reads (it reads {', '.join(sorted(KNOWN))})"
        )
    keys: dict[str, Any] = {
        "num_layers": _int(config, "num_hidden_layers"),
        "hidden_size": _int(config, "hidden_size"),
        "num_attention_heads": _int(config, "num_attention_heads"),
        "ffn_hidden_size": _int(config, "intermediate_size"),
        "vocab_size": _int(config, "vocab_size"),
        "gated_mlp": True,
        "tied_embeddings": bool(config.get("tie_word_embeddings", False)),
        "position_embedding": "rope",
        "normalization": "rmsnorm",
        "bias": kind == "gpt_oss",  # gpt-oss: biased attention, router and experts
    }
    if kind != "gpt_oss" and (config.get("attention_bias") or config.get("mlp_bias")):
        raise ValueError("attention_bias or mlp_bias on a Llama-style model has no [model] key")
    if kind in DEEPSEEK_LIKE:
        keys |= _latent_attention(config)
    else:
        keys |= _grouped_attention(config, keys)
    if kind == "qwen2":  # Qwen2's attention always has a QKV bias (no config key says so)
        keys["add_qkv_bias"] = True
    if kind in ("qwen3", "qwen3_moe"):  # q_norm and k_norm on every head
        keys["qk_layernorm"] = True
    if kind == "gpt_oss":
        keys |= _sinks_and_windows(config)
    elif kind in ("mistral", "mixtral") and config.get("sliding_window"):
        keys["window_size"] = [config["sliding_window"], 0]  # every layer slides
    elif config.get("use_sliding_window"):  # Qwen's max_window_layers split: not a [model] key
        raise ValueError("use_sliding_window (windows on some layers) has no [model] key")
    keys |= _experts(config, kind, keys["num_layers"])
    keys |= _weight_blocks(config)
    return keys


def _int(config: dict[str, Any], key: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{key} is {value!r}, not a positive integer")
    return value


def _grouped_attention(config: dict[str, Any], keys: dict[str, Any]) -> dict[str, Any]:
    heads, hidden = keys["num_attention_heads"], keys["hidden_size"]
    found: dict[str, Any] = {}
    groups = config.get("num_key_value_heads") or heads
    if groups != heads:
        found["num_query_groups"] = groups
    head_dim = config.get("head_dim")
    if head_dim and head_dim * heads != hidden:  # the default width needs no key
        found["kv_channels"] = head_dim
    return found


def _latent_attention(config: dict[str, Any]) -> dict[str, Any]:
    """Multi-latent attention; its compressed query and key/value have norms (qk_layernorm)."""
    found: dict[str, Any] = {
        "multi_latent_attention": True,
        "kv_lora_rank": _int(config, "kv_lora_rank"),
        "qk_head_dim": _int(config, "qk_nope_head_dim"),
        "qk_pos_emb_head_dim": _int(config, "qk_rope_head_dim"),
        "v_head_dim": _int(config, "v_head_dim"),
        "qk_layernorm": True,
    }
    if config.get("q_lora_rank"):  # null: queries are not compressed (DeepSeek-V2-Lite)
        found["q_lora_rank"] = _int(config, "q_lora_rank")
    mtp = config.get("num_nextn_predict_layers") or 0
    if mtp:
        found["mtp_num_layers"] = mtp
    return found


def _sinks_and_windows(config: dict[str, Any]) -> dict[str, Any]:
    """gpt-oss: a learned sink per head, and sliding-window layers among full ones."""
    found: dict[str, Any] = {"softmax_type": "learnable"}
    window = config.get("sliding_window")
    types = config.get("layer_types") or []
    if window:
        found["window_size"] = [window, 0]
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        every = full[0] + 1 if full else 0
        if full and full != list(range(every - 1, len(types), every)):
            raise ValueError("layer_types mixes full and sliding attention irregularly")
        if every:
            found["window_attn_skip_freq"] = every
    return found


def _experts(config: dict[str, Any], kind: str, layers: int) -> dict[str, Any]:
    experts = (
        config.get("num_local_experts")  # Mixtral, gpt-oss
        or config.get("n_routed_experts")  # DeepSeek
        or (config.get("num_experts") if kind == "qwen3_moe" else None)
    )
    if not experts:
        return {}
    found: dict[str, Any] = {
        "num_experts": experts,
        "moe_router_topk": _int(config, "num_experts_per_tok"),
    }
    width = config.get("moe_intermediate_size")
    if width:
        found["moe_ffn_hidden_size"] = width
    elif kind == "gpt_oss":  # its experts are intermediate_size wide, as is no dense MLP
        found["moe_ffn_hidden_size"] = _int(config, "intermediate_size")
    shared = config.get("n_shared_experts") or 0
    if shared:
        found["moe_shared_expert_intermediate_size"] = shared * _int(
            config, "moe_intermediate_size"
        )
    dense = set(range(config.get("first_k_dense_replace") or 0))
    dense |= set(config.get("mlp_only_layers") or ())
    step = config.get("decoder_sparse_step") or 1
    dense |= {i for i in range(layers) if (i + 1) % step}
    if dense:
        found["moe_layer_freq"] = [0 if i in dense else 1 for i in range(layers)]
    return found


def _weight_blocks(config: dict[str, Any]) -> dict[str, Any]:
    """FP8 weights scaled per block (quantization_config's quant_method fp8 with a
    weight_block_size); per-tensor FP8 and other methods set nothing."""
    quant = config.get("quantization_config") or {}
    block = quant.get("weight_block_size") if quant.get("quant_method") == "fp8" else None
    if not block:
        return {}
    if len(block) != 2 or not all(isinstance(b, int) and b > 0 for b in block):
        raise ValueError(f"weight_block_size is {block!r}, not two positive integers")
    return {"weight_block_size": list(block)}
