"""mdc's pipeline splits against the frameworks' own code.

* Megatron: every combination of num_layers, pp, vpp, first/last stage layer counts and
  embedding/loss accounting on a grid goes through megatron-core 0.16.1's
  ``TransformerConfig`` and ``get_num_layers_to_build`` (plus the one rule only Megatron-LM's
  ``validate_args`` makes, quoted below); mdc must refuse exactly what they refuse and give
  every (rank, virtual stage) the layer count they build. Layout strings go through
  ``PipelineParallelLayerLayout`` (parser, ``validate_layer_layout``, per-stage counts).
* TorchTitan: test_torchtitan_pipeline.py.
"""

from __future__ import annotations

import itertools
import warnings
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mdc.errors import Severity
from mdc.plan.stages import Model, PipelineSplit, parse_layout, split_layers

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("megatron.core", reason="conformance needs megatron-core==0.16.1")
    import torch
    from megatron.core import parallel_state
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig


def megatron_counts(
    layers: int,
    pp: int,
    vpp: int | None,
    first: int | None,
    last: int | None,
    embedding: bool,
    loss: bool,
) -> list[list[int]] | None:
    """megatron-core's layers per (rank, virtual stage), or None when Megatron refuses."""
    # Megatron-LM's validate_args, without virtual stages or uneven first/last stages:
    # 'Number of layers should be divisible by the pipeline-model-parallel size'
    if vpp is None and first is None and last is None and (layers + embedding + loss) % pp:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = TransformerConfig(
                num_layers=layers,
                hidden_size=64,
                num_attention_heads=8,
                pipeline_model_parallel_size=pp,
                virtual_pipeline_model_parallel_size=vpp,
                pipeline_dtype=torch.float32,
                num_layers_in_first_pipeline_stage=first,
                num_layers_in_last_pipeline_stage=last,
                account_for_embedding_in_pipeline_split=embedding,
                account_for_loss_in_pipeline_split=loss,
            )
        return [
            [
                get_num_layers_to_build(config, vp_stage=v if vpp else None, pp_rank=rank)
                for v in range(vpp or 1)
            ]
            for rank in range(pp)
        ]
    except (ValueError, AssertionError):
        return None


def mdc_counts(
    layers: int,
    pp: int,
    vpp: int | None,
    first: int | None,
    last: int | None,
    embedding: bool,
    loss: bool,
) -> list[list[int]] | None:
    split = PipelineSplit(rule="megatron", first=first, last=last, embedding=embedding, loss=loss)
    stages, findings = split_layers(split, Model(layers=layers), pp, vpp)
    if stages is None:
        assert findings
        return None
    assert not [f for f in findings if f.severity == Severity.ERROR]
    return [list(stages.chunks_of(rank)) for rank in range(pp)]


GRID = list(
    itertools.product(
        range(1, 11),  # num_layers
        range(1, 6),  # pp
        (None, 2, 3),  # vpp
        (None, 1, 2, 4),  # first
        (None, 1, 3),  # last
        (False, True),  # embedding
        (False, True),  # loss
    )
)


@pytest.mark.parametrize("chunk", range(8))
def test_megatron_split_matches_megatron_core(chunk: int) -> None:
    disagreements = []
    for case in GRID[chunk::8]:
        layers, pp, vpp, *_ = case
        if vpp is not None and pp == 1:
            continue  # the interleaved schedule needs pp > 1 (MDC206, checked elsewhere)
        theirs = megatron_counts(*case)
        # a negative middle-stage count passes TransformerConfig; mdc refuses it
        if theirs is not None and any(c < 0 for row in theirs for c in row):
            theirs = None
        mine = mdc_counts(*case)
        if theirs != mine:
            disagreements.append((case, theirs, mine))
    assert not disagreements, disagreements[:5]


def test_grid_covers_acceptance_and_refusal() -> None:
    """The grid is not one-sided: both outcomes occur for each kind of split (uneven
    first/last stages with embedding/loss accounting is always refused)."""
    outcomes = {
        (c[3] is not None or c[4] is not None, c[5] or c[6], mdc_counts(*c) is None)
        for c in GRID[::7]
        if not (c[2] and c[1] == 1)
    }
    assert outcomes == set(itertools.product((False, True), (False, True), (False, True))) - {
        (True, True, False)
    }


PUBLISHED = [
    # (num_layers, pp, vpp, first, last, embedding, loss): Megatron-Bridge recipes
    (126, 8, 8, None, None, True, True),  # Llama 3.1 405B, H100 perf recipe
    (126, 8, 2, None, None, True, True),  # Llama 3.1 405B, 128K recipe
    (126, 16, None, None, None, True, True),
    (94, 4, 2, None, None, True, True),  # Qwen3-235B-A22B
    (94, 8, 4, None, None, True, True),
    (94, 8, 3, None, None, True, True),
    (94, 16, None, None, None, True, True),
    (70, 12, None, None, None, True, True),  # BLOOM-176B
    (78, 8, None, 14, 16, False, False),  # first/last stage counts (GLM-5 style)
]


@pytest.mark.parametrize("case", PUBLISHED)
def test_published_splits(case: tuple) -> None:  # type: ignore[type-arg]
    theirs = megatron_counts(*case)
    assert theirs is not None
    assert mdc_counts(*case) == theirs
    assert sum(map(sum, theirs)) == case[0]


layout_stage = st.lists(st.sampled_from("Ettm"), max_size=4).map("".join)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(layout_stage, min_size=1, max_size=8),
    st.sampled_from([1, 2, 4]),
    st.integers(0, 2),
)
def test_layout_parser_and_counts_match(stages: list[str], pp: int, mtp: int) -> None:
    text = "E" + "|".join(stages) + "L"
    assert parse_layout(text) == [
        [t.name for t in stage] for stage in PipelineParallelLayerLayout.parse_str_to_list(text)
    ]
    num_layers = text.count("t") or 1
    split = PipelineSplit(rule="megatron", layout=text)
    stages_mine, _ = split_layers(split, Model(layers=num_layers, mtp_layers=mtp or None), pp, None)
    try:
        layout = PipelineParallelLayerLayout(text, pp)
        layout.validate_layer_layout(num_layers=num_layers, mtp_num_layers=mtp or None)
        vpp = layout.virtual_pipeline_model_parallel_size
        with mock.patch.object(
            parallel_state,
            "get_virtual_pipeline_model_parallel_world_size",
            return_value=vpp if vpp > 1 else None,
        ):
            theirs = [
                [
                    layout.get_num_layers_to_build(LayerType.decoder, vp_stage=v, pp_rank=rank)
                    for v in range(vpp)
                ]
                for rank in range(pp)
            ]
    except (AssertionError, ValueError):
        theirs = None
    mine = None if stages_mine is None else [list(stages_mine.chunks_of(r)) for r in range(pp)]
    assert mine == theirs


@pytest.mark.parametrize(
    "text",
    ["Ettt|(tt|)*29,m|L", "E(t|)*4L", "Et*3|t*4L", "(Et|)*2,tL", "Ex|tL", "E|t*2|(t|)*3L"],
)
def test_layout_parser_examples(text: str) -> None:
    try:
        theirs = [[t.name for t in s] for s in PipelineParallelLayerLayout.parse_str_to_list(text)]
    except AssertionError:
        theirs = None
    mine = parse_layout(text)
    assert (None if isinstance(mine, str) else mine) == theirs


def test_layout_bomb_is_refused_unexpanded() -> None:
    assert isinstance(parse_layout("E(t|)*999999999999L"), str)
