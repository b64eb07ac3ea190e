"""TorchTitan 0.2.2's pipeline split against mdc's: the stage shares of
``generate_llm_fqn_per_model_part``, the ranks each stage runs on, the layers-per-stage
TorchTitan's ``pipeline_llm`` turns into a stage count, and its flavor registry."""

from __future__ import annotations

import importlib.util
import itertools
import sys
import types
import warnings

import pytest

from mdc.plan.stages import Model, PipelineSplit, split_layers, torchtitan_shares

if importlib.util.find_spec("triton") is None:
    # torchtitan's package __init__ imports its triton MoE kernels, which the CPU build of
    # torch does not ship; nothing here runs them
    _kernels = types.ModuleType("torchtitan.models.moe.kernels")
    _kernels.generate_permute_indices = None  # type: ignore[attr-defined]
    sys.modules.setdefault("torchtitan.models.moe.kernels", _kernels)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("torchtitan", reason="conformance needs torchtitan==0.2.2")
    from torchtitan.distributed.pipeline_parallel import generate_llm_fqn_per_model_part

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("first_less,last_less", [(1, 1), (0, 0), (2, 1), (0, 3)])
def test_torchtitan_shares_match(first_less: int, last_less: int) -> None:
    for layers in range(1, 40):
        for stages in range(1, 25):
            try:
                parts = generate_llm_fqn_per_model_part(stages, layers, first_less, last_less)
                theirs = [sum(m.startswith("layers.") for m in part) for part in parts]
            except ValueError:
                theirs = None
            share = torchtitan_shares(stages, layers, first_less, last_less)
            mine = None if isinstance(share, str) else [share(i) for i in range(stages)]
            assert mine == theirs, (layers, stages)


@pytest.mark.parametrize("v_shaped", [False, True])
def test_torchtitan_ranks_hold_their_stages(v_shaped: bool) -> None:
    """Rank r runs stages r, r + pp, ... (looped) or r and 2 pp - 1 - r (V): TorchTitan's
    pipeline_module_split; the runs must give each rank exactly its stages' layers."""
    for layers, pp in itertools.product(range(4, 40, 3), range(2, 7)):
        vpp = 2 if v_shaped else 3
        split = PipelineSplit(rule="torchtitan", v_shaped=v_shaped)
        stages, _ = split_layers(split, Model(layers=layers), pp, vpp)
        try:
            parts = generate_llm_fqn_per_model_part(pp * vpp, layers, 1, 1)
        except ValueError:
            assert stages is None
            continue
        counts = [sum(m.startswith("layers.") for m in part) for part in parts]
        assert stages is not None
        for rank in range(pp):
            own = (rank, 2 * pp - 1 - rank) if v_shaped else range(rank, pp * vpp, pp)
            assert list(stages.chunks_of(rank)) == [counts[s] for s in own]


def test_flavor_facts_are_torchtitans_registry() -> None:
    """The package data compile reads is what the pinned torchtitan registers, regenerated."""
    import importlib.util as util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "torchtitan_flavors.py"
    loader = util.spec_from_file_location("torchtitan_flavors", script)
    assert loader is not None and loader.loader is not None
    module = util.module_from_spec(loader)
    loader.loader.exec_module(module)
    assert module.OUT.read_text(encoding="utf-8") == module.render(module.flavor_facts())


def test_flavor_parameter_counts_match_torchtitan_models() -> None:
    """The flavor's shape, counted by mdc, is the parameter count of TorchTitan's own model
    (dense Llama 3 and Qwen3 flavors, built on the meta device)."""
    import torch
    from torchtitan.protocols.train_spec import get_train_spec

    from mdc.plan.memory import parameter_count, resolve_shape
    from mdc.spec import ModelTable
    from mdc_builtin.launchers.torchtitan import flavors

    # (Qwen3's explicit head_dim and the MoE flavors' shared experts need [model] keys of
    # their own; the dense Llama 3 flavors are counted exactly)
    for name, flavor in (("llama3", "8B"), ("llama3", "70B"), ("llama3", "debugmodel")):
        facts = flavors()[name][flavor]
        shape = resolve_shape(ModelTable(**facts, seq_length=2048))
        assert shape is not None
        spec = get_train_spec(name)
        with torch.device("meta"):
            model = spec.model_cls(spec.model_args[flavor])
        # torchtitan counts its final norm; mdc leaves it out (h parameters)
        theirs = sum(p.numel() for p in model.parameters()) - facts["hidden_size"]
        assert parameter_count(shape) == theirs
