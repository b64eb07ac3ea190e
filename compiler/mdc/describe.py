"""The plan as data (``plan.json``) and in words (``mdc explain``).

Per-node and per-group listings are bounded so a million-rank plan stays
small; beyond the bounds, the formulas describe the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs

from mdc.api import Launch, Server
from mdc.errors import Diagnostic
from mdc.plan.model import GROUP_KINDS, Plan, Sizes
from mdc.plan.ranks import GroupSet

if TYPE_CHECKING:
    from mdc.plan.memory import MemoryEstimate

# The memory modules are imported only for a plan that holds an estimate.

#: plan.json lists every group only up to this world size.
MAX_LISTED_RANKS = 4096
#: explain shows at most this many nodes and groups per kind.
MAX_SHOWN = 8


def _plain(value: object) -> object:
    if attrs.has(type(value)):
        fields = attrs.asdict(value, recurse=False)  # type: ignore[arg-type]
        return {k: _plain(v) for k, v in fields.items()}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _env(value: object) -> object:
    """A [job] env value as written: a string, or the table's given keys."""
    if attrs.has(type(value)):
        return {k: v for k, v in attrs.asdict(value).items() if v is not None}  # type: ignore[arg-type]
    return value


def _finding(d: Diagnostic) -> dict[str, object]:
    return {
        "severity": d.severity.value,
        "code": d.code,
        "message": d.message,
        "pointer": d.location.pointer,
        "hint": d.hint,
    }


def plan_json(plan: Plan, launch: Launch) -> dict[str, object]:
    sizes = plan.sizes
    groups: dict[str, object] = {}
    for kind in GROUP_KINDS:
        group_set = plan.layout.groups(kind)
        entry: dict[str, object] = {"size": group_set.group_size, "count": group_set.count}
        if plan.world_size <= MAX_LISTED_RANKS:
            entry["ranks"] = [list(g) for g in group_set]
        groups[kind] = entry
    return {
        "job": {
            "name": plan.job.name,
            "image": plan.job.image,
            "command": plan.job.argv,
            "workdir": plan.job.workdir,
            "env": {k: _env(v) for k, v in plan.job.env.items()},
        },
        "launcher": plan.launcher,
        "backend": plan.backend,
        "accelerator": plan.accelerator,
        "nnodes": plan.nnodes,
        "min_nnodes": plan.min_nnodes,
        "nproc_per_node": plan.nproc_per_node,
        "world_size": plan.world_size,
        "parallelism": {**_plain(sizes), "order": plan.layout.order},  # type: ignore[dict-item]
        "batch": _plain(plan.batch),
        "rendezvous": {
            "master_addr": "node 0",
            "master_port": plan.rendezvous.master_port,
            "port_origin": plan.rendezvous.port_origin,
        },
        "roles": [
            {"name": r.name, "first_node": r.first_node, "count": r.count} for r in plan.roles
        ],
        "ranks_of_node": "node_rank * nproc_per_node + local_rank",
        # a disaggregated job's servers are listed under "servers", not as rank groups
        "groups": groups if plan.disagg is None else {},
        "disagg": _plain(plan.disagg),
        "model": _plain(plan.model),
        "pipeline_stages": plan.stages.as_json() if plan.stages else None,
        "memory": memory_json(plan.memory),
        **_predicted_json(plan, launch),
        "options": _plain(dict(plan.options)),
        "worker_env": dict(launch.worker_env),
        "warnings": [_finding(d) for d in plan.warnings],
        # a serving job's servers, and their weights and KV cache per GPU when estimated
        **(_servers_json(plan, launch) if launch.servers else {}),
        **_serving_json(plan),
    }


def _predicted_json(plan: Plan, launch: Launch) -> dict[str, object]:
    """plan.json's "predicted" block (only for a plan whose accelerator model is known)."""
    if plan.hardware is None:
        return {}
    if launch.servers:  # a serving job: TTFT, TPOT and throughput under its [workload]
        from mdc.tune.serving_perf import predict_plan as predict_serving

        served = predict_serving(plan, launch)
        if served is None:
            return {}
        return {"predicted": {"accelerator_model": plan.hardware.id, **served.to_json()}}
    from mdc.tune.perf import predict_plan

    prediction = predict_plan(plan)
    if prediction is None:
        return {}
    return {"predicted": {"accelerator_model": plan.hardware.id, **prediction.to_json()}}


def predicted_lines(plan: Plan, launch: Launch) -> list[str]:
    """The throughput mdc tune predicts for this layout, for ``mdc explain``."""
    if plan.hardware is None:
        return []
    if launch.servers:
        return _serving_predicted_lines(plan, launch)
    from mdc.tune.perf import predict_plan

    p = predict_plan(plan)
    if p is None:
        return []
    return [
        f"predicted on {plan.hardware.name} (mdc tune's model, docs/tune.md):",
        f"  step time        {p.step_time_s:.3f} s",
        f"  tokens/s per GPU {p.tokens_per_s_per_gpu:,.0f}",
        f"  model TFLOP/s    {p.model_tflops_per_gpu:,.0f} per GPU (MFU {p.mfu * 100:.0f}%)",
        f"  pipeline bubble  {p.bubble * 100:.1f}%; dominant communication: "
        f"{p.dominant_communication}",
    ]


def _serving_predicted_lines(plan: Plan, launch: Launch) -> list[str]:
    """``mdc explain``'s lines for a serving plan with [workload] (none without)."""
    from mdc.tune.serving_perf import deployment_of, predict_plan
    from mdc.tune.serving_server import eager_decode

    p = predict_plan(plan, launch)
    dep = deployment_of(plan, launch.servers)
    if p is None or dep is None or plan.hardware is None or plan.workload is None:
        return []
    w = plan.workload
    load = (
        f"{w.concurrency} requests in flight"
        if w.concurrency is not None
        else f"{w.request_rate:g} requests/s"
    )
    batch = ", ".join(f"{role} {size}" for role, size in p.batch.items())
    lines = [
        f"predicted on {plan.hardware.name} for {w.input_tokens} in / {w.output_tokens} out "
        f"tokens, {load} (mdc tune's serving model, docs/tune-serving.md):",
        f"  TTFT {p.ttft_ms:,.0f} ms, TPOT {p.tpot_ms:.1f} ms "
        f"({p.output_tokens_per_s_per_user:,.1f} tokens/s per user)",
        f"  output {p.output_tokens_per_s_per_gpu:,.0f} tokens/s per GPU, "
        f"{p.requests_per_s:,.2f} requests/s; running batch per server: {batch}",
        f"  bound by {p.binding}"
        + ("; overloaded: requests queue without end" if p.overloaded else ""),
    ]
    eager = eager_decode(dep, plan.hardware, p.batch)
    if eager is not None:
        lines.append(
            f"  decode steps run eager ({eager}): each layer's kernels launched one by one"
        )
    return lines


# -- mdc tune's serving output -----------------------------------------------------------

HEADER = (
    f"{'#':>2}  {'deployment':<34} {'GPUs':>5} {'TTFT ms':>8} {'TPOT ms':>8} "
    f"{'tok/s/user':>10} {'tok/s/GPU':>10} {'GiB/GPU':>8}  binding"
)


def server_lines(launch: Launch) -> list[str]:
    """A serving job as servers: role, nodes, GPUs, sizes and where each serves."""
    if not launch.servers:
        return []
    lines = ["servers:"]
    with_gpus = [s.nodes for s in launch.servers if s.gpus]
    # several servers on one node: their lines say which of its GPUs
    shared = len(set(with_gpus)) < len(with_gpus)
    for server in launch.servers[:MAX_SHOWN]:
        first, nodes = server.nodes[0], nodes_phrase(server)
        if server.gpus == 0:
            lines.append(f"  {server.role}: {nodes}, serves clients on port {server.port}")
            continue
        sizes = sizes_phrase(server)
        gpus = f"{server.gpus} GPUs"
        if shared:
            last = server.first_gpu + server.gpus - 1
            gpus = f"GPU {last}" if server.gpus == 1 else f"GPUs {server.first_gpu}-{last}"
        lines.append(
            f"  {server.role}: {nodes}, {gpus} ({sizes}), HTTP on node {first} port {server.port}"
        )
    if len(launch.servers) > MAX_SHOWN:
        lines.append(f"  ... {len(launch.servers) - MAX_SHOWN} more server(s)")
    return lines


def _servers_json(plan: Plan, launch: Launch) -> dict[str, object]:
    """Every server up to MAX_LISTED_RANKS GPUs in the world; beyond, the first MAX_SHOWN
    servers, each with its first MAX_SHOWN nodes, and the counts (a server, or the list of
    them, can be as long as the world)."""
    servers = launch.servers
    if plan.world_size <= MAX_LISTED_RANKS:
        return {"servers": [_plain(server) for server in servers]}
    listed = [
        {
            **{
                k: list(v[:MAX_SHOWN]) if k == "nodes" else _plain(v)
                for k, v in attrs.asdict(server, recurse=False).items()
            },
            "node_count": len(server.nodes),
        }
        for server in servers[:MAX_SHOWN]
    ]
    return {"servers": listed, "server_count": len(servers)}


def _serving_json(plan: Plan) -> dict[str, object]:
    if plan.serving_memory is None:
        return {}
    from mdc.plan import serving_memory

    return {"serving_memory": serving_memory.to_json(plan.serving_memory)}


def memory_json(memory: MemoryEstimate | None) -> dict[str, object] | None:
    """plan.json's "memory": the estimate in bytes, and what it assumed."""
    if memory is None:
        return None
    m = memory
    return {
        "params": {"total": m.params_total, "per_gpu": m.params_per_gpu},
        "stage": {"name": m.stage, "rank": m.stage_rank, "layers": m.stage_layers},
        "dtype": m.dtype,
        "bytes_per_param": {
            "weights": m.weight_bytes,
            "gradients": m.grad_bytes,
            "optimizer": m.optimizer_bytes,
        },
        "sharding": {"zero_stage": m.zero_stage, "dp_cp": m.shard, "expert_dp": m.expert_shard},
        "activations": {
            "micro_batch_size": m.micro_batch_size,
            "in_flight": m.in_flight,
            "sequence_parallel": m.sequence_parallel,
            "recompute": m.recompute,
        },
        "bytes": {
            "weights": m.weights,
            "gradients": m.gradients,
            "optimizer": m.optimizer,
            "activations": m.activations,
            **({"optimizer_step_gradients": m.step_gradients} if m.step_gradients else {}),
            "total": m.total,
        },
        "capacity_bytes": m.capacity,
        "fits": None if m.capacity is None else m.total <= m.capacity,
    }


def _gib(n: int) -> str:
    from mdc.plan.memory import GIB

    return f"{n / GIB:8.2f} GiB"


def memory_lines(memory: MemoryEstimate | None) -> list[str]:
    """The estimate as a short table for ``mdc explain``."""
    if memory is None:
        return []
    from mdc.plan.memory import GIB

    m = memory
    stage = {
        "only": "",
        "first": f" on the first pipeline stage, {m.stage_layers} layers + input embedding",
        "middle": f" on pipeline stage {m.stage_rank}, {m.stage_layers} layers",
        "last": f" on the last pipeline stage, {m.stage_layers} layers + output layer",
    }[m.stage]
    experts = f", experts over expert-dp {m.expert_shard}" if m.expert_shard != m.shard else ""
    over = f", sharded over dp-cp {m.shard}{experts}"
    parallel = "sequence parallel" if m.sequence_parallel else "no sequence parallel"
    if m.capacity is None:
        verdict = "(no accelerator_memory_gib: not checked)"
    else:
        verdict = f"of {m.capacity / GIB:g} GiB ({m.total * 100 // m.capacity}%)" + (
            "" if m.total <= m.capacity else ": does not fit"
        )
    return [
        f"memory per GPU (estimate; {m.dtype}, zero stage {m.zero_stage}){stage}:",
        f"  parameters  {m.params_total:,} in total, {m.params_per_gpu:,} on each GPU here",
        f"  weights     {_gib(m.weights)}   {m.weight_bytes} B/param"
        + (over if m.zero_stage >= 3 else ""),
        f"  gradients   {_gib(m.gradients)}   {m.grad_bytes} B/param"
        + (over if m.zero_stage >= 2 else ""),
        f"  optimizer   {_gib(m.optimizer)}   {m.optimizer_bytes} B/param (Adam)"
        + (over if m.zero_stage >= 1 else ""),
        (
            f"  activations {_gib(m.activations)}   micro batch {m.micro_batch_size}, "
            f"{m.in_flight} in flight, recompute {m.recompute}, {parallel}"
        ),
        *(
            [
                f"  step grads  {_gib(m.step_gradients)}   fp32 copy during the optimizer "
                "step, when the activations are freed (the larger one counts)"
            ]
            if m.step_gradients
            else []
        ),
        f"  total       {_gib(m.total)}   {verdict}",
    ]


def stage_lines(plan: Plan) -> list[str]:
    """The decoder layers of each pipeline stage, for ``mdc explain``."""
    stages = plan.stages
    if stages is None or stages.pp == 1:
        return []
    pp = stages.pp
    lines = ["pipeline stages (decoder layers; per virtual stage in brackets):"]
    for run in stages.runs:
        # the first and the last rank stand alone: they also hold the embedding / output
        cuts = sorted({run.first_rank, run.first_rank + run.count} | {1, pp - 1} - {0, pp})
        bounds = [c for c in cuts if run.first_rank <= c <= run.first_rank + run.count]
        bounds = sorted({run.first_rank, *bounds, run.first_rank + run.count})
        for start, end in zip(bounds, bounds[1:], strict=False):
            ranks = f"{start}" if end - start == 1 else f"{start}..{end - 1}"
            ends = [
                n for n, on in (("input embedding", start == 0), ("output layer", end == pp)) if on
            ]
            chunks = f" [{' '.join(map(str, run.chunks))}]" if stages.vpp > 1 else ""
            more = f" + {' + '.join(ends)}" if ends else ""
            lines.append(f"  stage {ranks}: {run.layers} layers{chunks}{more}")
    return lines


def _ranks(group_set: GroupSet, index: int, limit: int = 16) -> str:
    """Group ``index``'s first ``limit`` ranks (only those are computed: a group may hold
    every rank of a billion-rank world)."""
    shown = " ".join(map(str, group_set.head(index, limit)))
    return f"[{shown}{' ...' if group_set.group_size > limit else ''}]"


def _size(sizes: Sizes, axis: str) -> str:
    """``pp 4``, or ``pp 4 (default: nnodes)`` when the spec left it to mdc."""
    origin = sizes.defaults.get(axis)
    value = getattr(sizes, axis)
    return f"{axis} {value}" + (f" (default: {origin})" if origin else "")


def plural_nodes(count: int) -> str:
    return "one node" if count == 1 else f"{count} nodes"


def _group_lines(plan: Plan) -> list[str]:
    lines = ["groups (ranks in each group):"]
    for kind in GROUP_KINDS:
        group_set = plan.layout.groups(kind)
        if group_set.group_size == 1 and kind not in ("dp", "tp"):
            continue
        listed = [_ranks(group_set, i) for i in range(min(group_set.count, MAX_SHOWN))]
        more = f" ... ({group_set.count} groups)" if group_set.count > MAX_SHOWN else ""
        lines.append(f"  {kind:<10} size {group_set.group_size}: {' '.join(listed)}{more}")
    return lines


def explain_text(plan: Plan, launch: Launch) -> str:
    s, nproc = plan.sizes, plan.nproc_per_node
    elastic = f" (elastic: {plan.min_nnodes}..{plan.nnodes} nodes)" if plan.elastic else ""
    lines = [
        (
            f"job {plan.job.name}: launcher {plan.launcher} on backend {plan.backend}, "
            f"accelerator {plan.accelerator}"
        ),
        f"world: {plan.nnodes} node(s) x {nproc} GPU(s)"
        if plan.disagg
        else f"world: {plan.nnodes} node(s) x {nproc} process(es) = {plan.world_size} ranks"
        + elastic,
    ]
    # a disaggregated job is its servers (below): one rank grid over every GPU, the
    # router's included, would describe no process that runs
    if not plan.disagg:
        lines += [
            f"parallelism (order {plan.layout.order}, fastest first): {_size(s, 'tp')} x cp "
            f"{s.cp} x {_size(s, 'pp')} x dp {s.dp}   [dp = {plan.world_size} / (tp {s.tp} * "
            f"pp {s.pp} * cp {s.cp})]",
            f"experts: ep {s.ep} x {_size(s, 'etp')} x expert-dp {s.edp} x pp {s.pp}"
            + (f"; virtual pipeline stages per rank: {s.vpp}" if s.vpp else ""),
        ]
    if plan.batch:
        b = plan.batch
        lines.append(
            f"batch: global {b.global_batch_size} = micro {b.micro_batch_size} x dp "
            f"{s.dp} x {b.grad_accum_steps} gradient accumulation step(s)"
        )
    port = plan.rendezvous
    where = port.text() if port.derived else f"{port.master_port} (spec)"
    lines.append(f"rendezvous: node 0, port {where}")
    if plan.disagg:
        d = plan.disagg
        lines.append(
            f"disaggregated serving ({d.origin} split): the router and {d.prefill} prefill, "
            f"{d.decode} decode GPUs on {plural_nodes(plan.nnodes)}"
            if d.unit == "gpus"
            else f"disaggregated serving ({d.origin} split): {d.prefill} prefill, "
            f"{d.decode} decode node(s), the router beside node 0's prefill server"
        )
    lines.append("nodes:")
    shown = list(range(min(plan.nnodes, MAX_SHOWN)))
    if plan.nnodes > MAX_SHOWN:
        shown[-1] = plan.nnodes - 1
    for node in shown:
        if node == plan.nnodes - 1 and plan.nnodes > MAX_SHOWN:
            lines.append(f"  ... {plan.nnodes - MAX_SHOWN} more node(s)")
        first = node * nproc
        role = plan.role_of(node).name
        ranks = "" if plan.disagg else f": ranks {first}..{first + nproc - 1}"
        lines.append(f"  node {node} ({role}){ranks}")
    if not plan.disagg:
        lines += _group_lines(plan)
    lines += stage_lines(plan)
    lines += memory_lines(plan.memory)
    lines += server_lines(launch)
    if plan.serving_memory is not None:
        from mdc.plan import serving_memory

        lines += serving_memory.lines(plan.serving_memory)
    lines += predicted_lines(plan, launch)
    if launch.worker_env:
        lines.append("every worker sees:")
        lines += [f"  {name} = {meaning}" for name, meaning in launch.worker_env.items()]
    # Rendered as validate prints them: file:line:col, code, pointer and hint.
    lines += [warning.render() for warning in plan.warnings]
    return "\n".join(lines) + "\n"


def nodes_phrase(server: Server) -> str:
    """``node 3`` or ``nodes 1-2``: where a server runs."""
    first, last = server.nodes[0], server.nodes[-1]
    return f"node {first}" if first == last else f"nodes {first}-{last}"


def sizes_phrase(server: Server) -> str:
    """``tp 16 dp 8``: a server's tp and each other size above 1."""
    sizes = (("tp", server.tp), ("pp", server.pp), ("dp", server.dp), ("ep", server.ep))
    return " ".join(f"{name} {value}" for name, value in sizes if value > 1 or name == "tp")
