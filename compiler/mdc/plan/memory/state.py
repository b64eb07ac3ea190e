"""Model state per rank: weights, gradients and optimizer state of the layers it holds."""

from __future__ import annotations

from fractions import Fraction

import attrs

from mdc.plan.memory.params import embedding_params, mtp_params, part_params, split_width
from mdc.plan.memory.records import WEIGHT_BYTES, LayerParams, Shape, Spans, cached, ceil_int
from mdc.plan.memory.spans import bf16_spans, layer_spans, parts_of, role_of
from mdc.plan.model import Sizes, TrainingSetup
from mdc.plan.stages import StageLayers


# a cache key: compared and hashed, never printed (no generated repr: start-up time)
@attrs.frozen(cache_hash=True, repr=False)
class StateBytes:
    """Bytes per parameter of the model state and the sharding that divides them: what the
    state reads from the launcher's TrainingSetup and the sizes (the key of its cache; made
    once per distinct value, :func:`_state_bytes`, and hashed once)."""

    #: the dtype's weights (the ends'), the layers' (NVFP4: a fraction), gradients, optimizer
    weights: int
    layer_weights: Fraction
    gradients: int
    optimizer: int
    #: the embeddings' and output layer's optimizer state (Muon: Adam's)
    end_optimizer: int
    #: the optimizer step's wider copy of the gradients (TrainingSetup.step_grad_bytes)
    step_gradients: int
    #: the share of the optimizer state kept on the GPU
    on_gpu: Fraction
    param_offload: bool
    zero: int
    shard: int
    expert_shard: int

    @classmethod
    def of(cls, shape: Shape, sizes: Sizes, training: TrainingSetup) -> StateBytes:
        pp, t = sizes.pp, training
        stage = t.pp_zero_stage if pp > 1 and t.pp_zero_stage is not None else None
        # HSDP / distributed-optimizer instances: state sharded within each replica's ranks
        replicas = t.replicas if sizes.dp * sizes.cp % max(t.replicas, 1) == 0 else 1
        return _state_bytes(
            shape.dtype, t.weight_bytes, t.layer_weight_bytes, t.gradient_bytes(shape.dtype),
            t.step_grad_bytes, t.optimizer_bytes, t.end_optimizer_bytes, t.optimizer_offload,
            t.param_offload,
            max(0, min(3, t.zero_stage if stage is None else stage)),
            sizes.dp * sizes.cp // replicas, max(sizes.edp // replicas, 1),
        )  # fmt: skip


@cached
def _state_bytes(
    dtype: str,
    weight_bytes: int | None,
    layer_weight_bytes: float | None,
    grad_bytes: int | None,
    step_grad_bytes: int,
    optimizer_bytes: int | None,
    end_optimizer_bytes: int | None,
    optimizer_offload: float,
    param_offload: bool,
    zero: int,
    shard: int,
    expert_shard: int,
) -> StateBytes:
    """The :class:`StateBytes` of these values, the [model] dtype's where unset (one object
    per distinct value)."""
    w = weight_bytes or WEIGHT_BYTES.get(dtype, 2)
    o = optimizer_bytes or (8 if WEIGHT_BYTES.get(dtype, 2) >= 4 else 12)
    g = grad_bytes or w
    return StateBytes(
        weights=w,
        layer_weights=Fraction(layer_weight_bytes or w),
        gradients=g,
        optimizer=o,
        end_optimizer=end_optimizer_bytes or o,
        step_gradients=step_grad_bytes if g < step_grad_bytes else 0,
        on_gpu=1 - Fraction(optimizer_offload).limit_denominator(1000),
        param_offload=param_offload,
        zero=zero,
        shard=shard,
        expert_shard=expert_shard,
    )


@cached
def _ends(shape: Shape, role: str, tp: int, ep: int, etp: int) -> tuple[int, LayerParams]:
    """(the embedding and output parameters a stage holds, its multi-token prediction
    layers'): those sit on the last stage, which with pp > 1 also holds a copy of the input
    embedding for them."""
    embedding = embedding_params(shape, tp)
    output = split_width(shape.vocab, tp) * shape.hidden
    if role == "only":
        return embedding + (0 if shape.tied else output), mtp_params(shape, tp, ep, etp)
    if role == "last":
        return output + (embedding if shape.mtp_layers else 0), mtp_params(shape, tp, ep, etp)
    return (embedding if role == "first" else 0), LayerParams(dense=0, expert=0)


@cached
def stage_state(
    shape: Shape, spans: Spans, wide: Spans, role: str, tp: int, ep: int, etp: int, b: StateBytes
) -> tuple[int, int, int, int, int]:
    """(parameters on one GPU of a stage, before ZeRO-3 sharding; its weights, gradients and
    optimizer state in bytes; the optimizer step's copy of the gradients, which the
    activations' memory holds once they are freed). ``wide``: its layers kept in bf16
    (:func:`bf16_spans`)."""
    ends, extra_params = _ends(shape, role, tp, ep, etp)
    params = part_params(shape, parts_of(shape, spans), tp, ep, etp) + extra_params
    dense, expert = params.dense + ends, params.expert

    def sharded(
        per_param: Fraction, stage: int, dense: int = dense, expert: int = expert
    ) -> Fraction:
        on = b.zero >= stage
        return per_param * (
            Fraction(dense, b.shard if on else 1) + Fraction(expert, b.expert_shard if on else 1)
        )

    w, layer_w, o = b.weights, b.layer_weights, b.optimizer
    # layers kept in bf16 under fp8 / fp4 training: 16-bit weights
    wide_params = part_params(shape, parts_of(shape, wide), tp, ep, etp)
    # fp8/fp4 parameters: the layers' weights in 1 (1.125) bytes, the embeddings in the
    # dtype's
    wide_w = (w - layer_w) * sharded(Fraction(1), 3, wide_params.dense, wide_params.expert)
    weights = ceil_int(
        sharded(layer_w, 3) + (w - layer_w) * sharded(Fraction(1), 3, ends, 0) + wide_w
    )
    gradients = ceil_int(sharded(Fraction(b.gradients), 2))
    if b.param_offload:
        weights = gradients = 0
    # Muon: Adam's state for the embeddings and the output layer
    optimizer = ceil_int(
        sharded(o * b.on_gpu, 1)
        + (b.end_optimizer - o) * b.on_gpu * sharded(Fraction(1), 1, ends, 0)
    )
    step_gradients = ceil_int(sharded(b.step_gradients * b.on_gpu, 1))
    return dense + expert, weights, gradients, optimizer, step_gradients


def state_floor(
    shape: Shape, sizes: Sizes, training: TrainingSetup, stages: StageLayers | None = None
) -> int:
    """The largest model state (weights, gradients and optimizer, and the optimizer step's
    copy of the gradients) of the pipeline ranks that can be the heaviest: a lower bound on
    :func:`estimate`'s total under every batch and recompute setting, as that total is one
    of those ranks' state plus the larger of its activations and that copy (sizes, never
    negative). Cheap: the state is cached per stage."""
    b = StateBytes.of(shape, sizes, training)
    return max(
        sum(stage_state(shape, spans, bf16_spans(shape, training, spans),
                         role_of(rank, sizes.pp), sizes.tp, sizes.ep, sizes.etp, b)[1:])
        for rank, spans in layer_spans(shape, sizes, training, stages).items()
    )  # fmt: skip
