"""Write TorchTitan's model registry facts as mdc package data.

compile and validate never import torch or torchtitan, so the shape of every model flavor
TorchTitan registers (``get_train_spec(name).model_args``) is read once, here, with the
pinned torchtitan installed, and stored in
``plugins/mdc_builtin/launchers/torchtitan/flavors.json``. Each flavor's values are named as
the spec's ``[model]`` keys. Run it after changing the pinned torchtitan version; the test
tests/conformance/test_torchtitan_pipeline.py regenerates the facts and compares.

    python scripts/torchtitan_flavors.py
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
import sys
import types
import warnings
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "plugins/mdc_builtin/launchers/torchtitan/flavors.json"


def _stub_triton() -> None:
    """torchtitan's package imports its triton MoE kernels, absent from CPU builds of torch;
    nothing here runs them."""
    if importlib.util.find_spec("triton") is None:
        kernels = types.ModuleType("torchtitan.models.moe.kernels")
        kernels.generate_permute_indices = None  # type: ignore[attr-defined]
        sys.modules.setdefault("torchtitan.models.moe.kernels", kernels)


def _layer_facts(model_cls: Any, args: Any) -> dict[str, Any]:
    """Facts read off one dense layer built on the meta device (no memory, no weights)."""
    import torch

    model = None
    # two layers: Llama 4 interleaves, its layer 1 is its first MoE layer; one layer when
    # an MoE layer cannot be built here (DeepSeek-V3's in 0.2.2 lacks an argument)
    for count in (2, 1):
        small = {"n_layers": count}
        if hasattr(args, "n_dense_layers"):
            small["n_dense_layers"] = 1  # DeepSeek: its first layers are dense
        try:
            with torch.device("meta"), contextlib.redirect_stdout(io.StringIO()):
                model = model_cls(dataclasses.replace(args, **small))
            break
        except Exception:
            continue
    if model is None:  # a flavor that cannot be built here gives only its arguments
        return {}
    facts: dict[str, Any] = {}
    layers = list(model.layers.values()) if hasattr(model.layers, "values") else []
    layer = layers[0] if layers else None
    for each in layers:
        feed = getattr(each, "feed_forward", None)
        if feed is not None and hasattr(feed, "w1") and "ffn_hidden_size" not in facts:
            facts["ffn_hidden_size"] = feed.w1.out_features
            facts["gated_mlp"] = hasattr(feed, "w3")
        experts = getattr(getattr(each, "moe", None), "experts", None)
        if experts is not None and "moe_ffn_hidden_size" not in facts:
            if hasattr(experts, "w1"):  # (experts, hidden, dim); w3 the gate
                facts["moe_ffn_hidden_size"] = experts.w1.shape[1]
                facts["gated_mlp"] = hasattr(experts, "w3")
            else:  # gpt-oss: one fused gate-and-up matrix, twice the expert width
                facts["moe_ffn_hidden_size"] = experts.mlp1_weight.shape[1] // 2
                facts["gated_mlp"] = True
    output, embeddings = getattr(model, "output", None), getattr(model, "tok_embeddings", None)
    if output is not None and embeddings is not None:
        facts["tied_embeddings"] = output.weight is embeddings.weight
    norm = getattr(model, "norm", None)
    if isinstance(norm, torch.nn.RMSNorm):
        facts["normalization"] = "rmsnorm"
    attention = getattr(layer, "attention", None)
    query = getattr(attention, "wq", None)
    if isinstance(query, torch.nn.Linear):
        facts["bias"] = query.bias is not None
    return facts


def flavor_facts() -> dict[str, Any]:
    """{"torchtitan": version, "models": {name: {flavor: {[model] key: value}}}}."""
    _stub_triton()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torchtitan
        from torchtitan.models import _supported_models
        from torchtitan.protocols.train_spec import get_train_spec

    models: dict[str, Any] = {}
    for name in sorted(_supported_models):
        try:
            spec = get_train_spec(name)
        except Exception:  # a model whose optional dependencies are missing
            continue
        flavors: dict[str, Any] = {}
        for flavor, args in sorted(spec.model_args.items()):
            if not hasattr(args, "n_layers"):
                continue  # not a decoder-only language model (e.g. flux)
            facts: dict[str, Any] = {
                "num_layers": args.n_layers,
                "hidden_size": args.dim,
                "num_attention_heads": args.n_heads,
                "vocab_size": args.vocab_size,
            }
            if hasattr(args, "rope_theta"):
                facts["position_embedding"] = "rope"
            if hasattr(args, "n_kv_heads"):
                facts["num_query_groups"] = args.n_kv_heads or args.n_heads
            moe = getattr(args, "moe_args", None)
            if moe is not None and getattr(args, "moe_enabled", True):
                facts["num_experts"] = moe.num_experts
                facts["moe_router_topk"] = moe.top_k
            facts.update(_layer_facts(spec.model_cls, args))
            if "num_experts" in facts and "moe_ffn_hidden_size" not in facts:
                facts["moe_ffn_hidden_size"] = args.moe_inter_dim
            flavors[flavor] = dict(sorted(facts.items()))
        if flavors:
            models[name] = flavors
    version = getattr(torchtitan, "__version__", None)
    if version is None:
        from importlib.metadata import version as installed

        version = installed("torchtitan")
    return {"torchtitan": str(version), "models": models}


def render(facts: dict[str, Any]) -> str:
    return json.dumps(facts, indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    OUT.write_text(render(flavor_facts()), encoding="utf-8")
    print(f"wrote {OUT}")
