"""Which layers each pipeline rank holds (its spans and parts) and how many micro batches are
in flight on it."""

from __future__ import annotations

from fractions import Fraction

from mdc.plan.architecture import (
    Parts,
)
from mdc.plan.memory.records import Shape, Spans, cached, ceil_int
from mdc.plan.model import BatchPlan, Sizes, TrainingSetup
from mdc.plan.stages import Model, PipelineSplit, StageLayers, split_layers


def stage_split(shape: Shape, sizes: Sizes, training: TrainingSetup) -> StageLayers | None:
    """The launcher's split of the layers over the stages (None: its framework refuses)."""
    model = Model(layers=shape.layers, mtp_layers=shape.mtp_layers or None)
    stages, _ = split_layers(training.pipeline, model, sizes.pp, sizes.vpp)
    return stages


def layer_spans(
    shape: Shape, sizes: Sizes, training: TrainingSetup, stages: StageLayers | None
) -> dict[int, Spans]:
    """The layer index ranges of each pipeline rank that can be the heaviest; a split the
    framework refuses falls back to ceil(layers / pp) on the first and the last rank."""
    return dict(_rank_spans(shape, stages, training.pipeline, sizes.pp, sizes.vpp))


@cached
def _rank_spans(
    shape: Shape, stages: StageLayers | None, pipeline: PipelineSplit, pp: int, vpp: int | None
) -> tuple[tuple[int, Spans], ...]:
    """:func:`layer_spans` as (rank, spans) pairs."""
    if stages is None:
        model = Model(layers=shape.layers, mtp_layers=shape.mtp_layers or None)
        stages, _ = split_layers(pipeline, model, pp, vpp)
    if stages is None:
        even = ceil_int(Fraction(shape.layers, pp))
        return tuple(
            {0: ((0, even),), pp - 1: ((max(shape.layers - even, 0), shape.layers),)}.items()
        )
    return tuple((rank, tuple(stages.layer_spans(rank))) for rank in stages.candidate_ranks())


@cached
def parts_of(shape: Shape, spans: Spans) -> Parts:
    each = [shape.pattern.parts(start, stop) for start, stop in spans]
    return Parts(
        attention=sum(p.attention for p in each),
        mlp=sum(p.mlp for p in each),
        moe=sum(p.moe for p in each),
        mamba=sum(p.mamba for p in each),
        csa=sum(p.csa for p in each),
        hca=sum(p.hca for p in each),
    )


def scheduled_micro_batches(
    batch: BatchPlan | None, training: TrainingSetup, pp: int
) -> tuple[int, int]:
    """(micro batch size, micro batches per step) as the pipeline schedule runs them: a
    launcher that splits each [batch] micro batch further for its pipeline (TorchTitan's
    pipeline_parallel_microbatch_size) runs, and keeps activations of, the smaller ones."""
    micro = batch.micro_batch_size if batch else 1
    microbatches = batch.grad_accum_steps if batch else 1
    split = training.pipeline_micro_batch
    if pp > 1 and split and micro % split == 0:
        return split, microbatches * (micro // split)
    return micro, microbatches


def quantized(shape: Shape, training: TrainingSetup) -> bool:
    """Whether the transformer layers' GEMMs run below 16 bits (fp8 or fp4)."""
    return shape.dtype == "fp8" or training.gemm_precision in ("fp8", "fp4")


def bf16_spans(shape: Shape, training: TrainingSetup, spans: Spans) -> Spans:
    """The parts of ``spans`` (layer index ranges) that the launcher keeps in bf16 when the
    rest is quantized: the model's first and last layers (TrainingSetup.bf16_layers)."""
    first, last = training.bf16_layers
    if not quantized(shape, training) or not (first or last):
        return ()
    ends = [(0, min(first, shape.layers)), (max(shape.layers - last, 0), shape.layers)]
    if ends[0][1] >= ends[1][0]:  # the two ends meet: every layer
        ends = [(0, shape.layers)]
    found = []
    for start, stop in spans:
        for low, high in ends:
            if max(start, low) < min(stop, high):
                found.append((max(start, low), min(stop, high)))
    return tuple(found)


def in_flight_micro_batches(
    rank: int, pp: int, vpp: int | None, microbatches: int
) -> tuple[int, Fraction]:
    """(micro batches whose activations pipeline rank ``rank`` holds at once, the share of
    its layers' activations each holds). 1F1B: pp - rank, at most the micro batches.
    Megatron's interleaved schedule warms up (pp - rank - 1) * 2 + (vpp - 1) * pp model
    chunks (at most microbatches * vpp) and holds one more: that many chunks of
    layers / vpp each."""
    held = min(pp - rank, microbatches)
    if not vpp:
        return held, Fraction(1)
    chunks = min((pp - rank - 1) * 2 + (vpp - 1) * pp + 1, microbatches * vpp)
    return held, Fraction(chunks, vpp * held)


def role_of(rank: int, pp: int) -> str:
    if pp == 1:
        return "only"
    return "first" if rank == 0 else "last" if rank == pp - 1 else "middle"
