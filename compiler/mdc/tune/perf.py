"""The throughput model: one training step's time for a layout on an accelerator.

Every term, with its formula and source, is in docs/tune-model.md and in its function's
docstring in :mod:`mdc.tune.terms`. In short, per GPU::

    step = (m + (p - 1)/v) * t_micro          1F1B pipeline, bubble (p-1)/(v*m) (Narayanan 2021)
         + exposed data-parallel communication
         + optimizer step (memory bound)

    t_micro = compute + elementwise + TP + CP (exposed) + EP all-to-all + p2p

Compute runs the executed FLOPs (the model's, plus recompute's extra forward) at the
dense peak of the GEMM precision times an efficiency that falls with the per-rank GEMM
shape. Collectives are bandwidth terms over the scale-up network when the group lies in
one scale-up domain, over each GPU's NIC otherwise. The calibrated constants are the
fields of :class:`Constants`; bench/tune_fit.py fits them on published measured runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs

from mdc.hardware import Accelerator
from mdc.plan.memory import Shape, quantized, resolve_shape, scheduled_micro_batches
from mdc.plan.model import BatchPlan, Plan, Sizes, TrainingSetup
from mdc.tune import terms
from mdc.tune.records import DEFAULT, Constants, Layout
from mdc.tune.terms import scale_up_domain, stage_params

__all__ = [
    "DEFAULT", "Constants", "Layout", "PlanInputs", "Prediction", "bf16_share", "bf16_stage",
    "gemm_precision", "layout_of", "plan_inputs", "predict", "predict_plan",
    "scale_up_domain", "stage_params",
]  # fmt: skip


@attrs.frozen(kw_only=True)
class Prediction:
    step_time_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float
    bubble: float
    #: seconds per step of each exposed term
    breakdown: Mapping[str, float]

    @property
    def dominant_communication(self) -> str:
        comm = {k: v for k, v in self.breakdown.items() if k not in ("compute", "elementwise")}
        name, value = max(sorted(comm.items()), key=lambda kv: kv[1])
        return name if value > 0 else "none"

    def to_json(self) -> dict[str, object]:
        return {
            "step_time_s": _round(self.step_time_s),
            "tokens_per_s_per_gpu": _round(self.tokens_per_s_per_gpu),
            "model_tflops_per_gpu": _round(self.model_tflops_per_gpu),
            "mfu": _round(self.mfu),
            "bubble": _round(self.bubble),
            "dominant_communication": self.dominant_communication,
            "breakdown_s": {k: _round(v) for k, v in sorted(self.breakdown.items())},
        }


def _round(value: float) -> float:
    """Four significant digits: the model is no more precise, and JSON stays stable."""
    return float(f"{value:.4g}")


def predict(
    shape: Shape,
    layout: Layout,
    hw: Accelerator,
    *,
    nproc_per_node: int,
    precision: str = "bf16",
    constants: Constants = DEFAULT,
    causal: bool = True,
    count_recompute: bool = False,
    window: tuple[int, int] | None = None,
    window_skip: int | tuple[int, ...] | None = None,
    bf16_share: float = 0.0,
) -> Prediction:
    """The predicted step of ``layout``: the terms of :mod:`mdc.tune.terms` added up (see
    the module docstring and docs/tune-model.md).

    ``bf16_share``: the share of the heaviest stage's layers whose GEMMs run at the bf16
    peak although ``precision`` is fp8 or fp4 (Megatron's --first-last-layers-bf16).

    ``causal`` and ``count_recompute`` choose the model-FLOPs convention the TFLOP/s and
    MFU are reported in (:func:`mdc.tune.flops.token_flops`); the time does not depend on it.
    """
    L = layout
    st = terms.Step(shape, L, hw, constants, terms.scale_up_domain(hw, nproc_per_node))
    recomputes = count_recompute and L.recompute == "full"
    flops = terms.flops_of(shape, causal, recomputes, window, window_skip)
    # what the kernels execute: causal attention skips the masked half either way
    executed = terms.flops_of(shape, True, False, None, None)

    # ---- one micro batch on the heaviest stage
    peak = terms.gemm_rate(hw, precision, constants, bf16_share)
    dense_eff = terms.dense_efficiency(st)
    t_dense = terms.dense_gemms(st, executed, peak, dense_eff)
    t_attention = terms.attention(st, executed)
    compute = t_dense + terms.expert_gemms(st, executed, peak) + t_attention
    t_logits = terms.output_layer(st, executed, peak, dense_eff)  # the last stage's
    t_tp = terms.tp_comm(st, t_dense)
    t_cp = terms.cp_comm(st, t_attention)
    t_ep = terms.ep_comm(st, compute)
    t_p2p = terms.pp_p2p(st, compute)
    dense_params, expert_params = terms.stage_params(shape, L, st.stage_layers)
    elementwise = terms.elementwise(st) + (
        terms.moe_permute(st, precision)
        + terms.expert_overhead(st)
        + terms.mamba(st)
        + terms.expert_weights(st, expert_params)
        + terms.eager_kernels(st)
        + terms.float8_casts(st)
        + (terms.fp4_casts(st, bf16_share) if precision == "fp4" else 0.0)
    )

    # ---- the schedule runs at the pace of the slowest stage
    layers_time = compute + elementwise + t_tp + t_cp + t_ep
    scale, t_logits = terms.last_stage_scale(st, layers_time, t_logits)
    compute, elementwise = compute * scale + t_logits, elementwise * scale
    t_tp, t_cp, t_ep = t_tp * scale, t_cp * scale, t_ep * scale
    micro = compute + elementwise + t_tp + t_cp + t_ep + t_p2p
    fill, slots = terms.bubble_slots(L)
    pipeline = slots * micro

    # ---- once per step
    t_dp = terms.dp_comm(st, micro, pipeline, dense_params, expert_params)
    t_opt = terms.optimizer(st, dense_params, expert_params)

    step = pipeline + t_dp + t_opt
    world = st.world
    tokens_step = L.microbatches * L.micro_batch_size * L.dp * shape.seq
    tflops = tokens_step * flops.total / step / world / 1e12
    # the stage works m micro batches and idles the fill: the terms add up to the step
    m = L.microbatches
    breakdown = {
        "compute": m * compute,
        "elementwise": m * elementwise,
        "tp": m * t_tp,
        "cp": m * t_cp,
        "ep": m * t_ep,
        "pp-p2p": m * t_p2p,
        "pp-bubble": fill * micro,
        "dp": t_dp,
        "optimizer": t_opt,
    }
    return Prediction(
        step_time_s=step,
        tokens_per_s_per_gpu=tokens_step / step / world,
        model_tflops_per_gpu=tflops,
        mfu=tflops * 1e12 / terms.gemm_rate(hw, precision, constants, bf16_share, measured=False),
        bubble=fill / slots,
        breakdown=breakdown,
    )


def gemm_precision(dtype: str | None, training: TrainingSetup) -> str:
    """The precision whose peak runs the GEMMs (:meth:`TrainingSetup.gemms_in`; fp16 runs
    at bf16's peak: :meth:`Accelerator.peak_tflops`)."""
    return training.gemms_in(dtype)


@attrs.frozen(kw_only=True)
class PlanInputs:
    """What the model reads of a compiled training plan: :func:`predict`'s arguments."""

    shape: Shape
    layout: Layout
    hardware: Accelerator
    nproc_per_node: int
    precision: str
    window: tuple[int, int] | None
    window_skip: int | tuple[int, ...] | None
    bf16_share: float

    def predict(
        self, constants: Constants = DEFAULT, *, causal: bool = True, count_recompute: bool = False
    ) -> Prediction:
        return predict(
            self.shape, self.layout, self.hardware, nproc_per_node=self.nproc_per_node,
            precision=self.precision, constants=constants, causal=causal,
            count_recompute=count_recompute, window=self.window, window_skip=self.window_skip,
            bf16_share=self.bf16_share,
        )  # fmt: skip


def plan_inputs(plan: Plan) -> PlanInputs | None:
    """The model's inputs for a compiled training plan whose accelerator model is known;
    None for serving plans, or without ``accelerator_model`` or a complete ``[model]``."""
    hw, model, batch, memory = plan.hardware, plan.model, plan.batch, plan.memory
    if hw is None or model is None or batch is None or memory is None:
        return None
    shape = resolve_shape(model)
    if shape is None:
        return None
    s, t = plan.sizes, plan.training
    # the heaviest stage sets the pace, which need not be the one memory is estimated for
    heaviest = plan.stages.heaviest_layers() if plan.stages else memory.stage_layers
    last = plan.stages.layers_of(s.pp - 1) if plan.stages else None
    return PlanInputs(
        shape=shape,
        layout=layout_of(s, batch, t, model.dtype, plan.layout.order, heaviest, last),
        hardware=hw,
        nproc_per_node=plan.nproc_per_node,
        precision=gemm_precision(model.dtype, t),
        window=model.window_size,
        window_skip=model.window_attn_skip_freq,
        bf16_share=bf16_share(shape, t, bf16_stage(s, t), heaviest),
    )


def predict_plan(plan: Plan) -> Prediction | None:
    """The prediction for a compiled training plan (the ``predicted`` block of ``mdc
    explain``); None where :func:`plan_inputs` is."""
    inputs = plan_inputs(plan)
    return None if inputs is None else inputs.predict()


def layout_of(
    sizes: Sizes,
    batch: BatchPlan,
    training: TrainingSetup,
    dtype: str | None,
    order: str,
    stage_layers: int,
    last_stage_layers: int | None,
) -> Layout:
    """What the model needs of a layout: its sizes, the micro batches as the pipeline
    schedule runs them, and how the launcher trains it."""
    s, t = sizes, training
    micro, microbatches = scheduled_micro_batches(batch, t, s.pp)
    runs = batch.grad_accum_steps if t.schedule_per_accumulation and s.pp > 1 else 1
    # layers of each model chunk recomputed whole: block's first n, or every n-th
    # (TorchTitan's selective_ac_option = n); None: all of them
    recomputed = None
    if t.recompute == "full" and t.recompute_method == "block":
        recomputed = t.recompute_num_layers
    elif t.recompute == "full" and t.recompute_every:
        recomputed = math.ceil(stage_layers / (s.vpp or 1)) // t.recompute_every
    return Layout(
        tp=s.tp, pp=s.pp, cp=s.cp, ep=s.ep, etp=s.etp, dp=s.dp, vpp=s.vpp or 1,
        micro_batch_size=micro, microbatches=microbatches, schedules=runs,
        sequence_parallel=t.sequence_parallel and s.tp > 1, recompute=t.recompute,
        recompute_layers=recomputed,
        recompute_per_op=t.recompute == "selective" and t.recompute_per_op,
        recompute_per_op_forced=tuple(t.recompute_per_op_forced),
        recompute_modules=None if t.recompute_modules is None else tuple(t.recompute_modules),
        zero_stage=t.zero_stage, grad_bytes=t.reduce_bytes or t.gradient_bytes(dtype) or 4,
        optimizer_offload=t.optimizer_offload, param_offload=t.param_offload,
        moe_capacity=t.moe_capacity_factor or 1.0,
        overlap_grad_reduce=t.overlap_grad_reduce, overlap_param_gather=t.overlap_param_gather,
        overlap_p2p=t.overlap_p2p,
        tp_comm_overlap=(t.tp_comm_overlap or t.async_tp) and t.sequence_parallel and s.tp > 1,
        ep_comm_overlap=t.ep_comm_overlap and s.ep > 1,
        dispatcher=t.moe_dispatcher, router_groups=t.moe_router_groups,
        stage_layers=stage_layers, order=order, last_stage_layers=last_stage_layers,
        eager=t.eager_kernels, float8_casts=t.float8_casts and dtype == "fp8",
        gather_bytes=(t.fp8_gather_bytes if dtype == "fp8" else None) or 2.0,
    )  # fmt: skip


def bf16_share(shape: Shape, training: TrainingSetup, stage: str, stage_layers: int) -> float:
    """The share of a stage's layers kept in bf16 under fp8 / fp4 training: the model's first
    layers sit on the first stage, its last ones on the last (only, with pp = 1: both)."""
    first, last = training.bf16_layers
    if not (first or last) or not stage_layers or not quantized(shape, training):
        return 0.0
    if stage == "only":
        return min(first + last, stage_layers) / stage_layers
    held = {"first": first, "last": last}.get(stage, 0)
    return min(held, stage_layers) / stage_layers


def bf16_stage(sizes: Sizes, training: TrainingSetup) -> str:
    """The stage whose bf16 layers (Megatron's --first-last-layers-bf16) slow it most: the
    only one, or the end of the model that keeps more of them in bf16."""
    first, last = training.bf16_layers
    if sizes.pp == 1:
        return "only"
    return "first" if first >= last else "last"
