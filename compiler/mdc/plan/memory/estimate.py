"""The per-stage estimate: each rank's parameters, model state and activations summed."""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction

import attrs

from mdc.plan.architecture import (
    Parts,
)
from mdc.plan.memory.activations import activations_bytes, dispatch_buffer, recompute_name
from mdc.plan.memory.params import parameter_count
from mdc.plan.memory.records import MemoryEstimate, Shape, ceil_int
from mdc.plan.memory.spans import (
    bf16_spans,
    in_flight_micro_batches,
    layer_spans,
    parts_of,
    role_of,
    scheduled_micro_batches,
)
from mdc.plan.memory.state import StateBytes, stage_state
from mdc.plan.model import BatchPlan, Sizes, TrainingSetup
from mdc.plan.stages import StageLayers


def stage_estimates(
    shape: Shape,
    sizes: Sizes,
    batch: BatchPlan | None,
    training: TrainingSetup,
    capacity: int | None = None,
    stages: StageLayers | None = None,
) -> list[MemoryEstimate]:
    """Per-GPU memory of each pipeline rank that can be the heaviest (one entry when pp = 1).

    ``stages``: the layers of every stage (default: the launcher's rule applied to
    ``shape``).
    """
    return list(each_stage(shape, sizes, batch, training, capacity, stages))


def exceeds(
    shape: Shape,
    sizes: Sizes,
    batch: BatchPlan | None,
    training: TrainingSetup,
    capacity: int,
    stages: StageLayers | None = None,
) -> bool:
    """Whether :func:`estimate`'s total exceeds ``capacity``: whether one stage's does (the
    estimate is the largest), found without estimating the stages after that one."""
    return any(e.total > capacity for e in each_stage(shape, sizes, batch, training, None, stages))


def each_stage(
    shape: Shape,
    sizes: Sizes,
    batch: BatchPlan | None,
    training: TrainingSetup,
    capacity: int | None,
    stages: StageLayers | None,
) -> Iterator[MemoryEstimate]:
    """:func:`stage_estimates`, one stage at a time."""
    tp, pp, ep, etp = sizes.tp, sizes.pp, sizes.ep, sizes.etp
    micro, microbatches = scheduled_micro_batches(batch, training, pp)
    # a schedule holds only its own micro batches in flight
    runs = batch.grad_accum_steps if batch and training.schedule_per_accumulation else 1
    per_schedule = max(1, microbatches // runs)
    logits = (
        (training.logit_bytes or 4)
        * Fraction(shape.seq, sizes.cp)
        * micro
        * Fraction(shape.vocab, tp)
    )
    # multi-token prediction layers sit on the last stage, each with its own logits
    mtp_kept: Fraction | int = 0
    if shape.mtp_layers:
        mtp_kind = "moe" if shape.pattern.last_is_moe() else "mlp"
        mtp_parts = Parts(attention=1, **{mtp_kind: 1})
        mtp_kept = activations_bytes(shape, mtp_parts, 1, sizes, micro, training)[0]
    heads = logits * (1 + shape.mtp_layers)
    b = StateBytes.of(shape, sizes, training)
    for rank, spans in layer_spans(shape, sizes, training, stages).items():
        name = role_of(rank, pp)
        # the logits and the MTP layers' activations sit on the last stage
        head, extra_kept = (
            (heads, mtp_kept * shape.mtp_layers) if name in ("only", "last") else (0, 0)
        )
        in_flight, factor = in_flight_micro_batches(rank, pp, sizes.vpp, per_schedule)
        per_stage = sum(stop - start for start, stop in spans)
        parts = parts_of(shape, spans)
        wide = bf16_spans(shape, training, spans)
        params, weights, gradients, optimizer, step_gradients = stage_state(
            shape, spans, wide, name, tp, ep, etp, b
        )
        kept, recomputed = activations_bytes(shape, parts, per_stage, sizes, micro, training)
        # layers kept in bf16 under fp8 / fp4 training: 16-bit GEMM inputs
        wide_parts, wide_layers = parts_of(shape, wide), sum(stop - start for start, stop in wide)
        if wide_layers and training.recompute != "full":  # full keeps 16-bit inputs anyway
            act16 = attrs.evolve(training, gemm_input_bytes=4 if shape.dtype == "fp32" else 2)
            kept += activations_bytes(shape, wide_parts, wide_layers, sizes, micro, act16)[0]
            kept -= activations_bytes(shape, wide_parts, wide_layers, sizes, micro, training)[0]
        recomputing = recomputed + dispatch_buffer(shape, parts, sizes, micro, training)
        activations = ceil_int((kept + extra_kept) * in_flight * factor + recomputing + head)
        layer_w = b.layer_weights
        yield MemoryEstimate(
            params_total=parameter_count(shape),
            params_per_gpu=params,
            stage=name,
            stage_rank=rank,
            stage_layers=per_stage,
            dtype=shape.dtype,
            weight_bytes=int(layer_w) if layer_w.denominator == 1 else float(layer_w),
            grad_bytes=b.gradients,
            optimizer_bytes=b.optimizer,
            zero_stage=b.zero,
            shard=b.shard,
            expert_shard=b.expert_shard,
            micro_batch_size=micro,
            in_flight=in_flight,
            sequence_parallel=training.sequence_parallel and tp > 1,
            recompute=recompute_name(shape, training),
            weights=weights,
            gradients=gradients,
            optimizer=optimizer,
            activations=activations,
            total=weights + gradients + optimizer + max(activations, step_gradients),
            capacity=capacity,
            step_gradients=step_gradients,
        )


def estimate(
    shape: Shape,
    sizes: Sizes,
    batch: BatchPlan | None,
    training: TrainingSetup,
    capacity: int | None = None,
    stages: StageLayers | None = None,
) -> MemoryEstimate:
    """Per-GPU memory of the heaviest pipeline stage."""
    found = stage_estimates(shape, sizes, batch, training, capacity, stages)
    return max(found, key=lambda e: e.total)  # the first on a tie
