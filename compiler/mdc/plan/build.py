"""The plan pass: from the spec to a checked, fully resolved :class:`Plan`.

Pure: no I/O. Every violated rule becomes a diagnostic naming the numbers and
suggesting values that would work; all are collected before returning.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from mdc.errors import Diagnostic, Severity, SourceLocation
from mdc.plan.model import (
    ONE_NODE_ROLE,
    BatchPlan,
    DisaggSplit,
    NodeRole,
    Plan,
    RankLayout,
    Rendezvous,
    Sizes,
    TrainingSetup,
)
from mdc.plan.ranks import RankGrid, complete_order, divisors
from mdc.plan.stages import Model, StageLayers, layout_vpp, split_layers
from mdc.runtime import PORT_RANGE
from mdc.spec import JobSpec, ModelTable

if TYPE_CHECKING:
    from mdc.plan.memory import MemoryEstimate

Locate = Callable[[str], SourceLocation]

DEFAULT_ORDER = "tp-cp-ep-dp-pp"
DEFAULT_BACKEND = "local"
DEFAULT_ACCELERATOR = "nvidia"


def derived_port(job_name: str) -> int:
    """A stable port per job name, for manifests that fix it (each pod has its own ports);
    scripts derive theirs at run time from the launch id instead (mdc.runtime.port_lines)."""
    digest = hashlib.sha256(job_name.encode()).digest()
    low, high = PORT_RANGE
    return low + int.from_bytes(digest[:8], "big") % (high - low)


def _listing(values: list[int], limit: int = 12) -> str:
    shown = ", ".join(map(str, values[:limit]))
    return shown + (", ..." if len(values) > limit else "")


class _Findings:
    def __init__(self, locate: Locate) -> None:
        self.locate = locate
        self.items: list[Diagnostic] = []

    def add(
        self,
        code: str,
        message: str,
        pointer: str,
        hint: str | None = None,
        severity: Severity = Severity.ERROR,
    ) -> None:
        self.items.append(
            Diagnostic(
                severity=severity,
                code=code,
                message=message,
                location=self.locate(pointer),
                hint=hint,
            )
        )

    @property
    def errors(self) -> bool:
        return any(d.is_error for d in self.items)


def _command(spec: JobSpec, found: _Findings) -> None:
    """A command string must split into words as a shell would (MDC213)."""
    command = spec.job.command
    if not isinstance(command, str):
        return
    try:
        words = shlex.split(command)
    except ValueError as exc:
        found.add(
            "MDC213",
            f"command {command[:80]!r} does not split into words: {exc}",
            "/job/command",
            "close the quote, or write the command as a list of words",
        )
        return
    if not words:
        found.add(
            "MDC213",
            f"command {command[:80]!r} holds no words",
            "/job/command",
            'name the program to run, e.g. command = ["python", "train.py"]',
        )


def build_plan(
    spec: JobSpec,
    *,
    parallelism: str,
    disaggregated: bool,
    locate: Locate,
    serving: bool = False,
    training: TrainingSetup | None = None,
    scale_up_domain: int | None = None,
    fixed_port: bool = False,
) -> tuple[Plan | None, tuple[Diagnostic, ...]]:
    """Resolve and check ``spec`` for a launcher with the given traits.

    :param parallelism: ``"model"`` (default tp = nproc_per_node, pp = nnodes) or
        ``"data"`` (default tp = pp = 1), from the launcher's record.
    :param disaggregated: whether the launcher splits nodes into proxy/prefill/decode.
    :param serving: whether the launcher serves (no training memory estimate).
    :param training: how the launcher trains (sharding, recompute), for the memory estimate.
    :returns: the plan (None if any error) and every finding, warnings included.
    """
    found = _Findings(locate)
    training = training or TrainingSetup()
    model = _framework_model(spec.model, training, found)
    dist = spec.distributed
    nnodes = dist.nnodes or 1
    nproc = dist.nproc_per_node or 1
    _command(spec, found)
    min_nnodes = _min_nnodes(dist.min_nnodes, nnodes, found)
    # a disaggregated job's router runs beside a server (no node of its own): the
    # servers' sizes divide every GPU of the job
    gpus = nproc * nnodes
    sizes, layout = _parallel(
        spec, gpus, nnodes, nproc, parallelism, found, disaggregated or serving
    )
    if sizes is not None and not serving:
        sizes = _layout_vpp(sizes, training, found)
    if sizes:
        batch = _batch(spec, sizes, found)
    else:
        batch = None
        _batch_without_dp(spec, found)
    roles, disagg = _roles(spec, nnodes, nproc, disaggregated, found)
    stages = None
    if sizes and model is not None:
        _model_rules(model, sizes, found, spec.distributed.launcher)
        if not serving:
            stages = _stages(model, sizes, training, found)
    if layout is not None and sizes is not None and not (disaggregated or serving):
        # a serving engine's tp spanning nodes is a deployment choice (multi-node servers)
        _span_warnings(layout, sizes, nproc, scale_up_domain, found)
    memory = None
    if not found.errors and sizes is not None:
        memory = _memory(
            spec,
            model,
            sizes,
            stages,
            batch,
            training,
            disaggregated or serving,
            nnodes * nproc,
            nproc,
            found,
        )
    if found.errors or sizes is None or layout is None:
        return None, tuple(found.items)
    plan = Plan(
        job=spec.job,
        launcher=dist.launcher,
        backend=dist.backend or DEFAULT_BACKEND,
        nnodes=nnodes,
        min_nnodes=min_nnodes,
        nproc_per_node=nproc,
        accelerator=dist.accelerator or DEFAULT_ACCELERATOR,
        sizes=sizes,
        layout=layout,
        batch=batch,
        rendezvous=_rendezvous(dist.master_port, spec.job.name, fixed_port),
        roles=roles,
        disagg=disagg,
        model=model,
        options=spec.plugin_tables,
        training=training,
        stages=stages,
        memory=memory,
        warnings=tuple(found.items),
    )
    return plan, tuple(found.items)


def _min_nnodes(given: int | None, nnodes: int, found: _Findings) -> int:
    """The fewest nodes an elastic job runs on (nnodes unless given); more than nnodes is
    refused (MDC208)."""
    min_nnodes = given or nnodes
    if min_nnodes > nnodes:
        found.add(
            "MDC208",
            f"min_nnodes ({min_nnodes}) is larger than nnodes ({nnodes})",
            "/distributed/min_nnodes",
            f"an elastic job runs on min_nnodes..nnodes nodes; set min_nnodes to at most {nnodes}",
        )
    return min_nnodes


def _rendezvous(port: int | None, job: str, fixed: bool) -> Rendezvous:
    """The spec's master port, else one derived from the job's name."""
    return Rendezvous(
        master_port=port or derived_port(job),
        port_origin="spec" if port else "derived",
        fixed=fixed,
    )


def _parallel(
    spec: JobSpec,
    world: int,
    nnodes: int,
    nproc: int,
    parallelism: str,
    found: _Findings,
    serving: bool,
) -> tuple[Sizes | None, RankLayout | None]:
    par = spec.parallelism
    model_parallel = parallelism == "model"
    tp = par.tp or (nproc if model_parallel else 1)
    # a written dp says the nodes hold replicas, not pipeline stages
    pp = par.pp or (nnodes if model_parallel and par.dp is None else 1)
    cp = par.cp or 1
    ep = par.ep or 1
    # vLLM and SGLang split experts over ep ranks and the rest of tp (SGLang's
    # moe_tp_size = tp_size / ep_size; vLLM's expert parallelism has no expert tp)
    etp = par.etp or (max(1, tp // ep) if serving and ep > 1 else tp)
    written = [a for a in ("tp", "pp", "cp") if getattr(par, a) is not None]
    model_size = tp * pp * cp
    if world % model_size:
        _not_dividing(found, world, tp, pp, cp, written, model_parallel)
        return None, None
    dp = world // model_size
    if par.dp is not None and par.dp != dp:
        found.add(
            "MDC202",
            f"dp = {par.dp} disagrees with world / (tp * pp * cp) = "
            f"{world} / ({tp} * {pp} * {cp}) = {dp}",
            "/parallelism/dp",
            f"remove dp (it is derived) or write dp = {dp}",
        )
    expert_size = etp * ep * pp
    etp_from = "tp / ep" if serving and ep > 1 else "tp"
    if serving and par.etp is None and 1 < ep < tp and tp % ep:
        _ep_inside_tp(found, tp, ep)
        return None, None
    if world % expert_size:
        options = list(divisors(world // (etp * pp))) if world % (etp * pp) == 0 else []
        hint = (
            f"with etp = {etp} and pp = {pp}, ep can be one of {_listing(options)}"
            if options
            else "choose etp * ep * pp dividing the world size"
        )
        taken = [f"etp = {etp} follows {etp_from}"] if par.etp is None else []
        if par.tp is None and model_parallel:
            taken.append(f"tp = {tp} is this launcher's default (nproc_per_node)")
        if taken:
            hint += f"; {', '.join(taken)}: set {'them' if len(taken) > 1 else 'it'} to override"
        found.add(
            "MDC203",
            f"world size ({world}) is not divisible by etp * ep * pp = "
            f"{etp} * {ep} * {pp} = {expert_size}",
            "/parallelism/ep" if par.ep else "/parallelism/etp",
            hint,
        )
        return None, None
    edp = world // expert_size
    vpp = par.vpp if par.vpp and par.vpp > 1 else None
    if vpp is not None and pp == 1:
        found.add(
            "MDC206",
            f"vpp = {vpp} (interleaved schedule) needs pp > 1, but pp = 1",
            "/parallelism/vpp",
            "remove vpp, or set pp > 1",
        )
    defaults = {}
    if par.tp is None and model_parallel:
        defaults["tp"] = "nproc_per_node"
    if par.pp is None and model_parallel and par.dp is None:
        defaults["pp"] = "nnodes"
    if par.etp is None:
        defaults["etp"] = etp_from
    sizes = Sizes(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, dp=dp, edp=edp, vpp=vpp, defaults=defaults)
    return sizes, _layout(par.order or DEFAULT_ORDER, sizes, found)


def _not_dividing(
    found: _Findings,
    world: int,
    tp: int,
    pp: int,
    cp: int,
    written: list[str],
    model_parallel: bool,
) -> None:
    blame = written[0] if written else "tp"
    others = {"tp": pp * cp, "pp": tp * cp, "cp": tp * pp}[blame]
    hint = f"tp * pp * cp must divide the world size {world}"
    if world % others == 0:
        hint += (
            f"; keeping the other two, {blame} can be one of {_listing(divisors(world // others))}"
        )
    defaults = {"tp": f"tp = {tp} (nproc_per_node)", "pp": f"pp = {pp} (nnodes)"}
    taken = [text for axis, text in defaults.items() if axis not in written]
    if model_parallel and taken:
        hint += f"; this launcher defaulted {' and '.join(taken)}; set them explicitly to override"
    found.add(
        "MDC201",
        f"world size ({world}) is not divisible by tp * pp * cp = "
        f"{tp} * {pp} * {cp} = {tp * pp * cp}",
        f"/parallelism/{blame}" if written else "/distributed/nproc_per_node",
        hint,
    )


def _layout(order: str, sizes: Sizes, found: _Findings) -> RankLayout | None:
    tokens = order.split("-")
    repeated = sorted({t for t in tokens if tokens.count(t) > 1})
    if repeated:
        found.add(
            "MDC212",
            f"order {order!r} names {repeated[0]!r} twice",
            "/parallelism/order",
            f"use each axis once, e.g. {DEFAULT_ORDER!r}",
        )
        return None
    dense = {"tp": sizes.tp, "cp": sizes.cp, "ep": 1, "dp": sizes.dp, "pp": sizes.pp}
    expert = {"tp": sizes.etp, "cp": 1, "ep": sizes.ep, "dp": sizes.edp, "pp": sizes.pp}
    grids = []
    for table in (dense, expert):
        try:
            axes = complete_order(order, table)
        except ValueError as exc:
            axis = str(exc)
            found.add(
                "MDC204",
                f"{axis} = {table[axis]} but the order {order!r} does not place {axis}",
                "/parallelism/order",
                f"add {axis!r} to the order, e.g. {DEFAULT_ORDER!r}",
            )
            return None
        grids.append(RankGrid(axes, tuple(table[a] for a in axes)))
    layout = RankLayout(order=order, dense=grids[0], expert=grids[1])
    # Megatron-Core asserts, for pp > 1, that an order not ending in pp keeps dp equal to
    # expert dp, and that both layouts give the same pipeline groups.
    if sizes.pp > 1 and not order.endswith("pp") and sizes.edp != sizes.dp:
        found.add(
            "MDC205",
            f"with order {order!r} (pp not last) and pp = {sizes.pp}, the "
            f"dense and expert layouts disagree: dp = {sizes.dp} but expert dp = "
            f"world / (etp * ep * pp) = {sizes.edp}",
            "/parallelism/order",
            "put pp last in the order, or choose etp * ep = tp * cp",
        )
        return None
    dense_stride = layout.dense.groups("pp").inner_strides[0]
    expert_stride = layout.expert.groups("pp").inner_strides[0]
    if sizes.pp > 1 and dense_stride != expert_stride:
        found.add(
            "MDC205",
            f"with order {order!r} (pp not last) and pp = {sizes.pp}, the "
            f"dense and expert layouts give different pipeline groups: the sizes "
            f"ordered before pp multiply to {dense_stride} in the dense layout (tp, cp, "
            f"dp) but to {expert_stride} in the expert layout (etp, ep, expert dp)",
            "/parallelism/order",
            "put pp last in the order",
        )
        return None
    return layout


def _batch(spec: JobSpec, sizes: Sizes, found: _Findings) -> BatchPlan | None:
    if spec.batch is None:
        return None
    micro = spec.batch.micro_batch_size or 1
    step = micro * sizes.dp
    total = spec.batch.global_batch_size or step
    if total % step:
        below, above = total // step * step, (total // step + 1) * step
        nearest = " or ".join(str(v) for v in (below, above) if v > 0)
        found.add(
            "MDC207",
            f"global_batch_size ({total}) is not divisible by "
            f"micro_batch_size * dp = {micro} * {sizes.dp} = {step}",
            "/batch/global_batch_size",
            f"the nearest valid global_batch_size is {nearest}; or change "
            f"micro_batch_size to a divisor of {total} / {sizes.dp}"
            if total % sizes.dp == 0
            else f"the nearest valid global_batch_size is {nearest}",
        )
        return None
    return BatchPlan(
        global_batch_size=total, micro_batch_size=micro, grad_accum_steps=total // step
    )


def _batch_without_dp(spec: JobSpec, found: _Findings) -> None:
    """With dp unknown (the sizes are wrong), micro must still divide global."""
    if spec.batch is None or not spec.batch.global_batch_size:
        return
    total, micro = spec.batch.global_batch_size, spec.batch.micro_batch_size or 1
    if total % micro:
        found.add(
            "MDC207",
            f"global_batch_size ({total}) is not divisible by micro_batch_size ({micro})",
            "/batch/global_batch_size",
            f"micro_batch_size can be one of {_listing(divisors(total))}",
        )


def auto_split(total: int, units: tuple[int, int] = (1, 1)) -> tuple[int, int]:
    """The automatic prefill/decode split of ``total`` nodes (or of one or two nodes'
    GPUs): about 40% prefill, each role whole servers of ``units`` (prefill, decode)
    nodes or GPUs when such a split exists."""
    target = max(1, total * 2 // 5)
    prefill_unit, decode_unit = units
    fits = [p for p in range(prefill_unit, total, prefill_unit) if (total - p) % decode_unit == 0]
    prefill = min(fits, key=lambda p: (abs(p - target), p)) if fits else target
    return prefill, total - prefill


def disagg_roles(split: DisaggSplit, nnodes: int) -> tuple[NodeRole, ...]:
    """The plan roles of a split: the prefill nodes (node 0 also runs the router, on no
    GPU of its own), then the decode nodes; or (a split of GPUs) one role for every node,
    each running its servers and node 0 also the router."""
    if split.unit == "gpus":
        return (NodeRole(name=ONE_NODE_ROLE, first_node=0, count=nnodes),)
    return (
        NodeRole(name="prefill", first_node=0, count=split.prefill),
        NodeRole(name="decode", first_node=split.prefill, count=split.decode),
    )


def _roles(
    spec: JobSpec, nnodes: int, nproc: int, disaggregated: bool, found: _Findings
) -> tuple[tuple[NodeRole, ...], DisaggSplit | None]:
    dist = spec.distributed
    keys = ("prefill_nodes", "decode_nodes", "prefill_gpus", "decode_gpus")
    given = [k for k in keys if getattr(dist, k) is not None]
    if not disaggregated:
        for key in given:
            found.add(
                "MDC211",
                f"{key} applies only to disaggregated serving launchers, not {dist.launcher!r}",
                f"/distributed/{key}",
                f"remove {key}",
            )
        return (NodeRole(name="worker", first_node=0, count=nnodes),), None
    # up to 2 nodes the servers share the nodes and the split is of GPUs; from 3 the roles
    # take whole nodes. Either way the router runs on node 0 beside the first prefill
    # server (as SGLang's and vLLM's multi-node recipes run it): no node of its own
    unit, total = ("gpus", nproc * nnodes) if nnodes <= 2 else ("nodes", nnodes)
    wrong = [k for k in given if not k.endswith(unit)]
    for key in wrong:
        right = (
            key.replace("_gpus", "_nodes") if unit == "nodes" else key.replace("_nodes", "_gpus")
        )
        found.add(
            "MDC210",
            f"{key} does not apply to {nnodes} node(s): "
            + (
                "up to 2 nodes split their GPUs" if unit == "gpus" else "the roles take whole nodes"
            ),
            f"/distributed/{key}",
            f"use {right}",
        )
    if wrong:
        return (), None
    if total < 2:
        found.add(
            "MDC209",
            f"disaggregated serving on one node needs at least 2 GPUs (1 prefill + 1 "
            f"decode), got nproc_per_node = {nproc}",
            "/distributed/nproc_per_node",
            "set nproc_per_node to 2 or more",
        )
        return (), None
    if len(given) == 1:
        found.add(
            "MDC210",
            f"{given[0]} is set but not its partner; set both prefill_{unit} "
            f"and decode_{unit}, or neither for the automatic split",
            f"/distributed/{given[0]}",
        )
        return (), None
    if given:
        prefill = getattr(dist, f"prefill_{unit}") or 0
        decode = getattr(dist, f"decode_{unit}") or 0
        if prefill + decode != total:
            _split_sum_finding(unit, prefill, decode, nnodes, nproc, found)
            return (), None
        split = DisaggSplit(prefill=prefill, decode=decode, origin="spec", unit=unit)
    else:
        prefill, decode = auto_split(total)
        split = DisaggSplit(prefill=prefill, decode=decode, origin="auto", unit=unit)
    return disagg_roles(split, nnodes), split


def _ep_inside_tp(found: _Findings, tp: int, ep: int) -> None:
    """MDC203 as the serving engines refuse it: an MoE layer's tp GPUs split into ep x
    (tp / ep) (TensorRT-LLM's Mapping: moe_tp_size x moe_ep_size == tp_size; SGLang's
    moe_tp_size = tp_size / ep_size), so an ep below tp divides it."""
    found.add(
        "MDC203",
        f"ep ({ep}) does not divide tp ({tp}): the serving engine splits each MoE layer's "
        f"{tp} tensor-parallel GPUs into ep x (tp / ep) (TensorRT-LLM: moe_tp_size x "
        "moe_ep_size must equal tp_size; SGLang: moe_tp_size = tp_size / ep_size)",
        "/parallelism/ep",
        f"ep can be one of {_listing(list(divisors(tp)))}, or a multiple of tp across "
        "data-parallel ranks where the engine allows it",
    )


def _split_sum_finding(
    unit: str, prefill: int, decode: int, nnodes: int, nproc: int, found: _Findings
) -> None:
    """MDC210: the split does not add up; a split of nnodes - 1 nodes is the layout that
    gave the router a node of its own, whose fix is the smaller nnodes."""
    total = nnodes if unit == "nodes" else nnodes * nproc
    auto = auto_split(total)
    hint = f"e.g. prefill_{unit} = {auto[0]} and decode_{unit} = {auto[1]} (the automatic split)"
    pointer = f"/distributed/prefill_{unit}"
    if unit == "gpus":
        whole = f"must equal the job's GPUs ({nnodes} x {nproc} = {total}), but got "
        whole += str(prefill + decode)
    else:
        whole = (
            f"must equal nnodes ({nnodes}), but got {prefill + decode}: the router runs on "
            "the first prefill node and takes no node of its own"
        )
        if prefill + decode == nnodes - 1:
            pointer = "/distributed/nnodes"
            hint = (
                f"set nnodes = {prefill + decode} (the servers' nodes)"
                if prefill + decode > 2
                else f"set nnodes = 2 with prefill_gpus = {prefill * nproc} and decode_gpus = "
                f"{decode * nproc} instead of prefill_nodes and decode_nodes (up to 2 nodes "
                "the split is of GPUs)"
            )
    found.add(
        "MDC210", f"prefill_{unit} ({prefill}) + decode_{unit} ({decode}) {whole}", pointer, hint
    )


def framework_model(model: ModelTable | None, training: TrainingSetup) -> ModelTable | None:
    """[model] with what the launcher's framework fixes (TorchTitan's flavor) filled in
    where it is not written."""
    if not training.model_shape and (model is None or not training.model_defaults):
        return model
    model = model or ModelTable()
    fields = attrs.fields_dict(ModelTable)
    filled: dict[str, Any] = {
        k: v
        for k, v in (*training.model_shape, *training.model_defaults)
        if k in fields and getattr(model, k) is None
    }
    return attrs.evolve(model, **filled)


def _framework_model(
    model: ModelTable | None, training: TrainingSetup, found: _Findings
) -> ModelTable | None:
    """:func:`framework_model`; a written value that differs is refused (MDC393): the
    framework builds its own."""
    for key, value in training.model_shape:
        written = getattr(model, key, None)
        if written is not None and written != value:
            found.add(
                "MDC393",
                f"[model] {key} = {written!r}, but {training.model_source} has {key} = "
                f"{value!r}, and that is the model the framework builds",
                f"/model/{key}",
                f"remove {key} (it is taken from {training.model_source}) or write {value!r}",
            )
    return framework_model(model, training)


def _layout_vpp(sizes: Sizes, training: TrainingSetup, found: _Findings) -> Sizes:
    """The virtual stages per rank the framework makes when vpp is not written: a Megatron
    layout string's, or TorchTitan's default for a looped schedule."""
    split = training.pipeline
    if split.default_vpp is not None and sizes.vpp is None and sizes.pp > 1:
        return attrs.evolve(sizes, vpp=split.default_vpp)
    if split.rule != "megatron" or split.layout is None:
        return sizes
    implied, findings = layout_vpp(split, sizes.pp)
    for f in findings:
        found.add(f.code, f.message, f.pointer, f.hint, f.severity)
    if implied is not None and sizes.vpp is None:
        if sizes.pp == 1:
            found.add(
                "MDC228",
                f"pipeline_model_parallel_layout gives {implied} virtual stages per rank, "
                "which needs pp > 1 (Megatron-LM: 'When interleaved schedule is used, "
                "pipeline-model-parallel size should be greater than 1')",
                split.pointer("layout"),
                "write one stage per pipeline rank, or set pp > 1",
            )
        return attrs.evolve(sizes, vpp=implied)
    return sizes


def _stages(
    model: ModelTable, sizes: Sizes, training: TrainingSetup, found: _Findings
) -> StageLayers | None:
    """The layers of every pipeline stage, by the launcher's framework's rule."""
    if not model.num_layers:
        return None
    mtp = getattr(model, "mtp_num_layers", None)
    stages, findings = split_layers(
        training.pipeline,
        Model(layers=model.num_layers, mtp_layers=mtp if isinstance(mtp, int) else None),
        sizes.pp,
        sizes.vpp,
    )
    for f in findings:
        found.add(f.code, f.message, f.pointer, f.hint, f.severity)
    return stages


def _model_rules(model: ModelTable, sizes: Sizes, found: _Findings, launcher: str) -> None:
    """The shape rules Megatron-Core applies, with its meaning (the layers per stage:
    :func:`_stages`, by the launcher's own rule; serving engines split layers unevenly)."""
    heads, groups = model.num_attention_heads, model.num_query_groups
    if heads and heads % sizes.tp:
        found.add(
            "MDC220",
            f"num_attention_heads ({heads}) must be a multiple of tp ({sizes.tp})",
            "/model/num_attention_heads",
            f"tp can be one of {_listing(divisors(heads))}",
        )
    if heads and groups and heads % groups:
        found.add(
            "MDC226",
            f"num_attention_heads ({heads}) must be a multiple of num_query_groups ({groups})",
            "/model/num_query_groups",
            f"num_query_groups can be one of {_listing(divisors(heads))}",
        )
    if groups and groups % sizes.tp and sizes.tp % groups:
        found.add(
            "MDC221",
            f"num_query_groups ({groups}) must be a multiple or divisor of tp ({sizes.tp})",
            "/model/num_query_groups",
        )
    experts = model.num_experts
    if sizes.ep > 1 and not experts:
        found.add(
            "MDC224",
            f"ep = {sizes.ep} needs num_experts in the model table",
            "/model",
            "set num_experts, or ep = 1 for a dense model",
        )
    elif experts and experts % sizes.ep:
        found.add(
            "MDC224",
            f"num_experts ({experts}) must be a multiple of ep ({sizes.ep})",
            "/model/num_experts",
            f"ep can be one of {_listing(divisors(experts))}",
        )
    # the model's rules and memory estimate are imported only for a spec with a [model]
    from mdc.plan.architecture import rules as architecture_rules

    for f in architecture_rules(model, sizes.tp, launcher == "megatron"):
        found.add(f.code, f.message, f.pointer, f.hint, f.severity)
    seq = model.seq_length
    if seq and sizes.cp > 1 and seq % (2 * sizes.cp):
        found.add(
            "MDC225",
            f"seq_length ({seq}) must be a multiple of 2 * cp = {2 * sizes.cp} when cp > 1",
            "/model/seq_length",
        )


def _memory(
    spec: JobSpec,
    model: ModelTable | None,
    sizes: Sizes,
    stages: StageLayers | None,
    batch: BatchPlan | None,
    training: TrainingSetup,
    serving: bool,
    world: int,
    nproc: int,
    found: _Findings,
) -> MemoryEstimate | None:
    """The training memory estimate and its fit check (serving launchers get none)."""
    capacity = spec.distributed.accelerator_memory_gib
    if serving:
        return None  # the serving estimate is the pipeline's, with the launcher's setup
    if model is None and capacity is None:
        return None  # nothing to estimate, nothing to check
    from mdc.plan.memory import Context, plan_memory

    context = Context(
        world=world,
        nproc_per_node=nproc,
        global_batch_size=spec.batch.global_batch_size if spec.batch else None,
        etp_follows_tp=spec.parallelism.etp is None,
        order=spec.parallelism.order or DEFAULT_ORDER,
    )
    memory, findings = plan_memory(model, sizes, batch, training, capacity, context, stages)
    for f in findings:
        found.add(f.code, f.message, f.pointer, f.hint, f.severity)
    return memory


#: MDC250/251 name the nodes of at most this many of a group's ranks
MAX_SPAN_RANKS = 4096


def _span_warnings(
    layout: RankLayout, sizes: Sizes, nproc: int, scale_up_domain: int | None, found: _Findings
) -> None:
    # A group is fast while it stays on one scale-up network: a node, or a whole rack of
    # nodes where the accelerator's NVLink domain spans several (NVL72: 72 GPUs, 4 a node).
    # Ranks fill nodes in order, so consecutive nodes share a domain.
    rack = scale_up_domain is not None and scale_up_domain > nproc and scale_up_domain % nproc == 0
    boundary = scale_up_domain if rack and scale_up_domain else nproc
    where = f"scale-up domains ({boundary} GPUs each)" if rack else "nodes"
    for code, kind, article, name, size in (
        ("MDC250", "tp", "a", "tensor-parallel", sizes.tp),
        ("MDC251", "ep", "an", "expert-parallel", sizes.ep),
    ):
        groups = layout.groups(kind)
        index = groups.group_crossing(boundary)
        if index is None:
            continue
        ranks = groups.head(index, 16)
        shown = ", ".join(map(str, ranks)) + (", ..." if size > 16 else "")
        # the spans of the group's first MAX_SPAN_RANKS ranks only: a group can be the world
        spans = sorted({r // boundary for r in groups.head(index, MAX_SPAN_RANKS)})
        more = ", ..." if size > MAX_SPAN_RANKS else ""
        found.add(
            code,
            f"{article} {name} group (ranks {shown}) spans {where} "
            f"{', '.join(map(str, spans))}{more}: its all-reduces cross the inter-node network",
            f"/parallelism/{kind}",
            f"keep {kind} within a node (a divisor of nproc_per_node = {nproc})"
            + (f" or a scale-up domain ({boundary} GPUs)" if rack else "")
            + "; rule of thumb: tp within a node, pp across nodes, dp in between",
            Severity.WARNING,
        )
