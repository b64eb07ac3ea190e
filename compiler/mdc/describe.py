"""The plan as data (``plan.json``) and in words (``mdc explain``).

Per-node and per-group listings are bounded so a million-rank plan stays
small; beyond the bounds, the formulas describe the rest.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from mdc.api import Launch
from mdc.errors import Diagnostic
from mdc.plan.model import GROUP_KINDS, Plan

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


def _finding(d: Diagnostic) -> dict[str, object]:
    return {"severity": d.severity.value, "code": d.code, "message": d.message,
            "pointer": d.location.pointer, "hint": d.hint}


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
        "job": {"name": plan.job.name, "image": plan.job.image, "command": plan.job.argv,
                "workdir": plan.job.workdir, "env": dict(plan.job.env)},
        "launcher": plan.launcher,
        "backend": plan.backend,
        "accelerator": plan.accelerator,
        "nnodes": plan.nnodes,
        "min_nnodes": plan.min_nnodes,
        "nproc_per_node": plan.nproc_per_node,
        "world_size": plan.world_size,
        "parallelism": {**_plain(sizes), "order": plan.layout.order},  # type: ignore[dict-item]
        "batch": _plain(plan.batch),
        "rendezvous": {"master_addr": "node 0", "master_port": plan.rendezvous.master_port,
                       "port_origin": plan.rendezvous.port_origin},
        "roles": [{"name": r.name, "first_node": r.first_node, "count": r.count}
                  for r in plan.roles],
        "ranks_of_node": "node_rank * nproc_per_node + local_rank",
        "groups": groups,
        "disagg": _plain(plan.disagg),
        "model": _plain(plan.model),
        "options": _plain(dict(plan.options)),
        "worker_env": dict(launch.worker_env),
        "warnings": [_finding(d) for d in plan.warnings],
    }


def _ranks(ranks: tuple[int, ...], limit: int = 16) -> str:
    shown = " ".join(map(str, ranks[:limit]))
    return f"[{shown}{' ...' if len(ranks) > limit else ''}]"


def explain_text(plan: Plan, launch: Launch) -> str:
    s, nproc = plan.sizes, plan.nproc_per_node
    elastic = f" (elastic: {plan.min_nnodes}..{plan.nnodes} nodes)" if plan.elastic else ""
    lines = [
        f"job {plan.job.name}: launcher {plan.launcher} on backend {plan.backend}, "
        f"accelerator {plan.accelerator}",
        f"world: {plan.nnodes} node(s) x {nproc} process(es) = {plan.world_size} ranks{elastic}",
        f"parallelism (order {plan.layout.order}, fastest first): tp {s.tp} x cp {s.cp} x "
        f"pp {s.pp} x dp {s.dp}   [dp = {plan.world_size} / (tp {s.tp} * pp {s.pp} * cp {s.cp})]",
        f"experts: ep {s.ep} x etp {s.etp} x expert-dp {s.edp} x pp {s.pp}"
        + (f"; virtual pipeline stages per rank: {s.vpp}" if s.vpp else ""),
    ]
    if plan.batch:
        b = plan.batch
        lines.append(f"batch: global {b.global_batch_size} = micro {b.micro_batch_size} x dp "
                     f"{s.dp} x {b.grad_accum_steps} gradient accumulation step(s)")
    port = plan.rendezvous
    lines.append(f"rendezvous: node 0, port {port.master_port} ({port.port_origin})")
    if plan.disagg:
        d = plan.disagg
        lines.append(f"disaggregated serving ({d.origin} split): 1 proxy, {d.prefill} prefill, "
                     f"{d.decode} decode node(s)")
    lines.append("nodes:")
    shown = list(range(min(plan.nnodes, MAX_SHOWN)))
    if plan.nnodes > MAX_SHOWN:
        shown[-1] = plan.nnodes - 1
    for node in shown:
        if node == plan.nnodes - 1 and plan.nnodes > MAX_SHOWN:
            lines.append(f"  ... {plan.nnodes - MAX_SHOWN} more node(s)")
        first = node * nproc
        role = plan.role_of(node).name
        lines.append(f"  node {node} ({role}): ranks {first}..{first + nproc - 1}")
    lines.append("groups (ranks in each group):")
    for kind in GROUP_KINDS:
        group_set = plan.layout.groups(kind)
        if group_set.group_size == 1 and kind not in ("dp", "tp"):
            continue
        listed = [_ranks(group_set[i]) for i in range(min(group_set.count, MAX_SHOWN))]
        more = f" ... ({group_set.count} groups)" if group_set.count > MAX_SHOWN else ""
        lines.append(f"  {kind:<10} size {group_set.group_size}: {' '.join(listed)}{more}")
    if launch.worker_env:
        lines.append("every worker sees:")
        lines += [f"  {name} = {meaning}" for name, meaning in launch.worker_env.items()]
    for warning in plan.warnings:
        lines.append(f"warning[{warning.code}]: {warning.message}")
        if warning.hint:
            lines.append(f"  hint: {warning.hint}")
    return "\n".join(lines) + "\n"
