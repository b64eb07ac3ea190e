"""The memory finding of a compile (MDC2xx): the estimate against the accelerator's capacity,
with the levers that would make it fit in its hint."""

from __future__ import annotations

from collections.abc import Iterator

import attrs

from mdc.errors import Finding, Severity
from mdc.plan.memory.estimate import estimate
from mdc.plan.memory.records import (
    GIB,
    HEADROOM,
    MAX_LEVERS,
    REQUIRED_KEYS,
    MemoryEstimate,
    Shape,
    gib,
    missing_keys,
    resolve_shape,
)
from mdc.plan.memory.spans import stage_split
from mdc.plan.model import BatchPlan, Sizes, TrainingSetup
from mdc.plan.ranks import divisors
from mdc.plan.stages import StageLayers
from mdc.spec import ModelTable


def number_text(value: float) -> str:
    return f"{value:g}"


# only read, never compared or printed: no generated ==, hash or repr (start-up time)
@attrs.frozen(kw_only=True, eq=False, repr=False)
class Context:
    """What the hint's alternatives must respect besides the shape."""

    world: int
    nproc_per_node: int
    #: the written global batch size (None: the default micro * dp, one step)
    global_batch_size: int | None
    #: etp was not written, so it follows tp
    etp_follows_tp: bool
    #: the rank order (pp not last needs expert dp = dp)
    order: str


def _resized(
    sizes: Sizes,
    context: Context,
    shape: Shape,
    training: TrainingSetup,
    *,
    tp: int | None = None,
    pp: int | None = None,
    cp: int | None = None,
) -> Sizes | None:
    """The sizes with tp, pp or cp changed, or None if the plan would reject them."""
    tp, pp, cp = tp or sizes.tp, pp or sizes.pp, cp or sizes.cp
    world = context.world
    etp = tp if context.etp_follows_tp else sizes.etp
    if world % (tp * pp * cp) or world % (etp * sizes.ep * pp):
        return None
    dp, edp = world // (tp * pp * cp), world // (etp * sizes.ep * pp)
    if pp > 1 and not context.order.endswith("pp") and dp != edp:
        return None
    g = shape.groups
    if shape.heads % tp or (g % tp and tp % g):
        return None
    if cp > 1 and shape.seq % (2 * cp):
        return None
    resized = attrs.evolve(sizes, tp=tp, pp=pp, cp=cp, etp=etp, dp=dp, edp=edp)
    if pp != sizes.pp and stage_split(shape, resized, training) is None:
        return None
    return resized


def _rebatched(
    batch: BatchPlan | None, dp: int, context: Context, micro: int | None = None
) -> tuple[bool, BatchPlan | None]:
    """(whether the global batch divides, the batch) for another dp or micro batch."""
    if batch is None:
        return True, None
    micro = micro or batch.micro_batch_size
    total = context.global_batch_size or micro * dp
    if total % (micro * dp):
        return False, None
    return True, BatchPlan(
        global_batch_size=total, micro_batch_size=micro, grad_accum_steps=total // (micro * dp)
    )


Variant = tuple[str, Sizes, BatchPlan | None, TrainingSetup]


def _levers(
    shape: Shape, sizes: Sizes, batch: BatchPlan | None, training: TrainingSetup, context: Context
) -> Iterator[list[Variant]]:
    """Each lever's candidate settings, least disruptive first."""
    for axis in ("tp", "pp", "cp"):
        current = getattr(sizes, axis)
        options: list[Variant] = []
        for value in divisors(context.world):
            if value <= current:
                continue
            resized = _resized(sizes, context, shape, training, **{axis: value})
            if resized is None:
                continue
            divides, rebatched = _rebatched(batch, resized.dp, context)
            if not divides:
                continue
            spans = " (spans nodes)" if axis == "tp" and value > context.nproc_per_node else ""
            options.append((f"{axis} {value}{spans}", resized, rebatched, training))
        yield options
    keys = dict(training.levers)
    if max(sizes.dp * sizes.cp, sizes.edp) > 1:
        yield [
            (keys[f"zero {stage}"], sizes, batch, attrs.evolve(training, zero_stage=stage))
            for stage in range(training.zero_stage + 1, 4)
            if f"zero {stage}" in keys
        ]
    if "optimizer offload" in keys and training.optimizer_offload < 1:
        yield [
            (keys["optimizer offload"], sizes, batch, attrs.evolve(training, optimizer_offload=1.0))
        ]
    if sizes.tp > 1 and not training.sequence_parallel and "sequence parallel" in keys:
        yield [
            (
                keys["sequence parallel"],
                sizes,
                batch,
                attrs.evolve(training, sequence_parallel=True),
            )
        ]
    modes = ("none", "selective", "full")
    after = modes.index(training.recompute) + 1 if training.recompute in modes else 1
    partial = training.recompute_every is not None or training.recompute_method == "block"
    if training.recompute == "full" and partial:  # every layer is a change too
        after -= 1
    yield [
        (
            keys[f"recompute {mode}"],
            sizes,
            batch,
            attrs.evolve(
                training,
                recompute=mode,
                recompute_method=None,
                recompute_num_layers=None,
                recompute_every=None,
                recompute_modules=None,
            ),
        )
        for mode in modes[after:]
        if f"recompute {mode}" in keys
    ]
    if batch is not None and batch.micro_batch_size > 1:
        options = []
        for micro in reversed(divisors(batch.micro_batch_size)[:-1]):
            divides, rebatched = _rebatched(batch, sizes.dp, context, micro)
            if divides:
                options.append((f"micro_batch_size {micro}", sizes, rebatched, training))
        yield options


def _hint(
    shape: Shape,
    sizes: Sizes,
    batch: BatchPlan | None,
    training: TrainingSetup,
    context: Context,
    capacity: int,
    fits: str = "fits",
) -> str:
    """The levers that help most, each evaluated alone (the first setting that fits)."""
    chosen: list[tuple[int, str]] = []
    now = estimate(shape, sizes, batch, training).total
    for options in _levers(shape, sizes, batch, training, context):
        totals = [
            (total, label)
            for total, label in (
                (estimate(shape, s, b, t).total, label) for label, s, b, t in options
            )
            if total < now
        ]
        if not totals:
            continue
        fitting = [item for item in totals if item[0] <= capacity]
        chosen.append(fitting[0] if fitting else min(totals))
    chosen.sort()
    if not chosen:
        return "use accelerators with more memory, or a smaller model"
    shown = ", ".join(
        f"{label} gives {gib(total)}{f' ({fits})' if total <= capacity else ''}"
        for total, label in chosen[:MAX_LEVERS]
    )
    text = f"estimated per-GPU total with one change each: {shown}"
    if chosen[0][0] > capacity:
        text += "; none is enough alone, combine several"
    return text


def plan_memory(
    model: ModelTable | None,
    sizes: Sizes,
    batch: BatchPlan | None,
    training: TrainingSetup,
    capacity_gib: float | None,
    context: Context,
    stages: StageLayers | None = None,
) -> tuple[MemoryEstimate | None, list[Finding]]:
    """The estimate (None without a complete [model]) and the fit findings (MDC260-262)."""
    capacity = int(capacity_gib * GIB) if capacity_gib is not None else None
    shape = resolve_shape(model) if model is not None else None
    if shape is None:
        if capacity_gib is None:
            return None, []
        return None, [_no_check(model, capacity_gib)]
    found = estimate(shape, sizes, batch, training, capacity, stages)
    if capacity is None or capacity_gib is None:
        return found, []
    fit = _Fit(shape, sizes, batch, training, context, capacity, capacity_gib)
    return found, _fit_findings(found, fit)


def _no_check(model: ModelTable | None, capacity_gib: float) -> Finding:
    """MDC261: a memory limit given without the complete [model] the check needs."""
    if model is None:
        return Finding(
            code="MDC261",
            severity=Severity.WARNING,
            pointer="/distributed/accelerator_memory_gib",
            message=f"accelerator_memory_gib = {number_text(capacity_gib or 0)} is set but there "
            "is no [model] table, so no memory check is made",
            hint=f"add a [model] table with {', '.join(REQUIRED_KEYS)}",
        )
    missing = missing_keys(model)
    return Finding(
        code="MDC261",
        severity=Severity.WARNING,
        pointer="/model",
        message=f"accelerator_memory_gib = {number_text(capacity_gib or 0)} is set but [model] "
        f"lacks {', '.join(missing)}, so no memory estimate or check is made",
        hint=f"add {', '.join(missing)} to [model]",
    )


@attrs.frozen
class _Fit:
    """What a fit finding's hint evaluates its levers against."""

    shape: Shape
    sizes: Sizes
    batch: BatchPlan | None
    training: TrainingSetup
    context: Context
    capacity: int
    capacity_gib: float

    def hint(self, capacity: int, fits: str = "fits") -> str:
        return _hint(
            self.shape, self.sizes, self.batch, self.training, self.context, capacity, fits
        )


def _fit_findings(found: MemoryEstimate, fit: _Fit) -> list[Finding]:
    """MDC260 where the model state alone exceeds the limit; MDC262 where the estimate
    passes the headroom."""
    pointer = "/distributed/accelerator_memory_gib"
    capacity = fit.capacity
    peak = (
        f"activations {gib(found.activations)}"
        if found.activations >= found.step_gradients
        else f"the optimizer step's fp32 gradients {gib(found.step_gradients)} (more than "
        f"the activations, {gib(found.activations)})"
    )
    parts = (
        f"weights {gib(found.weights)} + gradients {gib(found.gradients)} + optimizer "
        f"{gib(found.optimizer)} + {peak}"
    )
    where = (
        "per GPU"
        if found.stage == "only"
        else f"per GPU on pipeline stage {found.stage_rank} ({found.stage}, "
        f"{found.stage_layers} layers)"
    )
    limit = f"accelerator_memory_gib = {number_text(fit.capacity_gib or 0)}"
    # Only the model state (weights, gradients, optimizer) refuses: the sharding that sizes it
    # is the spec's. Activations depend on kernels and fusions no spec states, so a total
    # over the limit is a warning: an estimate must not block a layout that really runs.
    state = found.weights + found.gradients + found.optimizer
    if state > capacity:
        return [
            Finding(
                code="MDC260",
                pointer=pointer,
                message=f"the model state alone needs {gib(state)} {where} (weights "
                f"{gib(found.weights)} + gradients {gib(found.gradients)} + optimizer "
                f"{gib(found.optimizer)}), more than {limit} (with activations, an "
                f"estimated {gib(found.total)})",
                hint=fit.hint(capacity),
            )
        ]
    if found.total > capacity * HEADROOM:
        share = found.total * 100 // capacity
        return [
            Finding(
                code="MDC262",
                severity=Severity.WARNING,
                pointer=pointer,
                message=f"the estimated {gib(found.total)} {where} ({parts}) is {share}% of "
                f"{limit}; "
                + (
                    "the activations are an estimate (kernels and fusions vary), so this is "
                    "not refused, but it may not fit"
                    if found.total > capacity
                    else "the CUDA/ROCm context, communication buffers and fragmentation are "
                    "not counted and may not fit"
                ),
                hint=fit.hint(int(capacity * HEADROOM), f"under {HEADROOM * 100}%"),
            )
        ]
    return []
