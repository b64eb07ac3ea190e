"""The memory estimate's cached pieces and the bounds mdc tune prunes with (the model-state
floor, a stage over the capacity).

The estimate caches the pieces many layouts share (a stage's parameters, a layer's
activations); a piece keyed without a value it reads would hand one layout another's
result. So each value an estimate takes is changed alone, after the unchanged estimate
filled the caches, and the estimate must equal the one made from empty caches.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import attrs
import pytest

from mdc.plan import memory
from mdc.plan.memory import (
    Shape,
    estimate,
    exceeds,
    resolve_shape,
    stage_estimates,
    state_floor,
)
from mdc.plan.model import BatchPlan, Sizes, TrainingSetup
from mdc.plan.named_models import CATALOGUE_FILE
from mdc.plan.stages import PipelineSplit
from mdc.spec import ModelTable

MODELS = Path(CATALOGUE_FILE)


def _shape(name: str, **edits: Any) -> Shape:
    table = tomllib.loads(MODELS.read_text(encoding="utf-8"))[name]["model"]
    shape = resolve_shape(ModelTable(**(table | edits)))
    assert shape is not None
    return shape


#: MLA, MoE with dense first layers and MTP, in fp8; a Mamba hybrid with MoE; a dense model
SHAPES = {
    "deepseek-v3": _shape("deepseek-v3", dtype="fp8"),
    "nemotron-3-super": _shape("nemotron-3-super"),
    "llama3-70b": _shape("llama3-70b", num_layers=78),
}
SIZES = Sizes(tp=2, pp=4, cp=2, ep=4, etp=1, dp=4, edp=8, vpp=2)
BATCH = BatchPlan(global_batch_size=64, micro_batch_size=2, grad_accum_steps=8)
#: the recompute settings each change is tried under (some values matter under one only)
BASES = {
    "full": TrainingSetup(
        zero_stage=1, grad_bytes=4, sequence_parallel=True, recompute="full",
        recompute_method="uniform", recompute_num_layers=1, moe_dispatcher="alltoall",
        gemm_precision="fp8", bf16_layers=(1, 1), logit_bytes=6,
    ),
    "selective": TrainingSetup(
        zero_stage=1, grad_bytes=4, sequence_parallel=True, recompute="selective",
        moe_dispatcher="allgather", gemm_precision="fp8", bf16_layers=(1, 1),
    ),
    "none": TrainingSetup(zero_stage=3, replicas=2, gemm_input_bytes=0.5625,
                          gemm_precision="fp4", pipeline_micro_batch=1),
}  # fmt: skip
#: another value for every TrainingSetup field: a new field must be listed here
CHANGES: dict[str, Any] = {
    "zero_stage": 2,
    "grad_bytes": 2,
    "dtype_grad_bytes": (("bf16", 2), ("fp8", 2)),
    "step_grad_bytes": 8,
    "sequence_parallel": False,
    "recompute": "none",
    "pp_zero_stage": 0,
    "replicas": 4,
    "pipeline": PipelineSplit(rule="megatron", embedding=True, loss=True),
    "model_shape": (("num_layers", 1),),
    "model_defaults": (("seq_length", 1024),),
    "model_source": "elsewhere",
    "weight_bytes": 4,
    "layer_weight_bytes": 1,
    "optimizer_bytes": 8,
    "end_optimizer_bytes": 16,
    "optimizer_offload": 0.5,
    "param_offload": True,
    "recompute_method": "block",
    "recompute_num_layers": 2,
    "recompute_every": 2,
    "recompute_modules": ("core_attn", "mlp", "layernorm"),
    "recompute_per_op": True,
    "recompute_per_op_forced": ("attention.wk",),
    "dropout_masks": False,
    "eager_gated_mlp": True,
    "eager_kernels": True,
    "float8_casts": True,
    "async_tp": True,
    "fp8_gather_bytes": 1,
    "reduce_bytes": 2,
    "offload_layers": 3,
    "moe_dispatcher": "flex",
    "moe_capacity_factor": 1.25,
    "moe_router_groups": (8, 4),
    "overlap_p2p": False,
    "tp_comm_overlap": True,
    "ep_comm_overlap": True,
    "overlap_grad_reduce": True,
    "overlap_param_gather": True,
    "pipeline_micro_batch": 2,
    "schedule_per_accumulation": True,
    "gemm_input_bytes": 1,
    "gemm_precision": None,
    "bf16_layers": (2, 0),
    "logit_bytes": 12,
    "levers": (("zero 3", "x"),),
}
#: the same for the sizes (world 64) and the batch
SIZE_CHANGES: dict[str, Any] = {
    "tp": 4, "pp": 2, "cp": 1, "ep": 8, "etp": 2, "dp": 2, "edp": 4, "vpp": None,
    "defaults": {"tp": "nproc_per_node"},
}  # fmt: skip
BATCH_CHANGES: dict[str, Any] = {"global_batch_size": 128, "micro_batch_size": 1,
                                 "grad_accum_steps": 4}  # fmt: skip

Case = tuple[Shape, Sizes, BatchPlan, TrainingSetup]


def _clear() -> None:
    for module in (memory.activations, memory.params, memory.records, memory.spans, memory.state):
        for piece in vars(module).values():
            if hasattr(piece, "cache_clear"):
                piece.cache_clear()


def _changed(base: Case) -> list[tuple[str, Case]]:
    shape, sizes, batch, training = base
    found = [(f"training.{k}", (shape, sizes, batch, attrs.evolve(training, **{k: v})))
             for k, v in CHANGES.items()]  # fmt: skip
    found += [(f"sizes.{k}", (shape, attrs.evolve(sizes, **{k: v}), batch, training))
              for k, v in SIZE_CHANGES.items()]  # fmt: skip
    found += [(f"batch.{k}", (shape, sizes, attrs.evolve(batch, **{k: v}), training))
              for k, v in BATCH_CHANGES.items()]  # fmt: skip
    return found


def test_every_training_field_has_a_change() -> None:
    assert set(CHANGES) == set(attrs.fields_dict(TrainingSetup))
    assert set(SIZE_CHANGES) == set(attrs.fields_dict(Sizes))
    assert set(BATCH_CHANGES) == set(attrs.fields_dict(BatchPlan))


@pytest.mark.slow
@pytest.mark.parametrize("base", sorted(BASES))
@pytest.mark.parametrize("model", sorted(SHAPES))
def test_an_estimate_from_full_caches_equals_one_from_empty_caches(model: str, base: str) -> None:
    start: Case = (SHAPES[model], SIZES, BATCH, BASES[base])
    differs = 0
    for name, case in _changed(start):
        _clear()
        cold = stage_estimates(*case)
        _clear()
        before = stage_estimates(*start)  # fills the caches with the unchanged layout's pieces
        warm = stage_estimates(*case)
        assert warm == cold, name
        differs += warm != before
    # the changes reach the estimate: a cache that ignored them would have been caught
    assert differs >= 15


@pytest.mark.parametrize("base", sorted(BASES))
@pytest.mark.parametrize("model", sorted(SHAPES))
def test_state_floor_is_the_largest_stage_state_and_never_above_the_total(
    model: str, base: str
) -> None:
    for _, (shape, sizes, batch, training) in _changed((SHAPES[model], SIZES, BATCH, BASES[base])):
        stages = stage_estimates(shape, sizes, batch, training)
        floor = state_floor(shape, sizes, training)
        assert floor == max(
            e.weights + e.gradients + e.optimizer + e.step_gradients for e in stages
        )
        assert floor <= estimate(shape, sizes, batch, training).total
        # and the same for any micro batch: the floor does not depend on it
        for micro in (1, 4, 8):
            rebatched = BatchPlan(global_batch_size=64, micro_batch_size=micro,
                                  grad_accum_steps=64 // (micro * sizes.dp))  # fmt: skip
            assert floor <= estimate(shape, sizes, rebatched, training).total


def test_equal_model_tables_resolve_to_one_shape_object() -> None:
    # the cached pieces (and the throughput model's) then match a new search's shape by
    # identity, without comparing each field on every lookup
    first = _shape("deepseek-v3", dtype="fp8")
    assert _shape("deepseek-v3", dtype="fp8") is first
    assert _shape("deepseek-v3") is not first


@pytest.mark.parametrize("model", sorted(SHAPES))
def test_exceeds_is_the_estimate_over_the_capacity(model: str) -> None:
    for _, case in _changed((SHAPES[model], SIZES, BATCH, BASES["full"])):
        shape, sizes, batch, training = case
        stages = stage_estimates(shape, sizes, batch, training)
        total = estimate(shape, sizes, batch, training).total
        # at each stage's total and either side of it: the first stage found over stops it
        for capacity in {e.total + d for e in stages for d in (-1, 0, 1)}:
            assert exceeds(shape, sizes, batch, training, capacity) == (total > capacity)


def test_a_launcher_giving_lists_is_estimated_as_with_tuples() -> None:
    # the cached pieces hash what they take: a list from a launcher is read as its tuple
    modules = ["core_attn", "mlp"]
    # a list where the record holds a tuple, as a caller may pass it: the key must not care
    listed = attrs.evolve(BASES["selective"], recompute_modules=modules)  # type: ignore[arg-type]
    tupled = attrs.evolve(BASES["selective"], recompute_modules=tuple(modules))
    for shape in SHAPES.values():
        assert stage_estimates(shape, SIZES, BATCH, listed) == stage_estimates(
            shape, SIZES, BATCH, tupled
        )
