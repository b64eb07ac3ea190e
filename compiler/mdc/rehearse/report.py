"""What ``mdc rehearse`` found: the outcome, the cross-rank checks, and its rendering."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class Outcome:
    """What a rehearsal found."""

    ok: bool
    serving: bool
    launcher: str
    backend: str
    nnodes: int
    world_size: int
    seconds: float
    #: the kept tree (--keep), None when it was a temporary directory
    tree: str | None
    #: rank (or a label) -> its mismatches
    problems: dict[str, list[str]]
    missing: list[int]
    #: node index -> exit status (None: still running when stopped)
    exits: dict[int, int | None]
    timed_out: bool
    #: cross-rank findings (node ranks, roles, URLs)
    findings: list[str]
    groups_built: int
    kinds: list[str]
    logs: dict[int, str]
    #: the compile's warnings, rendered
    warnings: list[str] = attrs.field(factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            **attrs.asdict(self),
            "exits": {str(k): v for k, v in self.exits.items()},
            "logs": {str(k): v for k, v in self.logs.items()},
        }


def log_tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def training_findings(plan: dict[str, Any], reports: dict[int, dict[str, Any]]) -> list[str]:
    """Cross-rank checks: ranks per node, and a join-order rendezvous' node ranks."""
    found = []
    nproc = plan["nproc_per_node"]
    by_node: dict[int, list[int]] = {}
    for rank, report in reports.items():
        by_node.setdefault(int(report.get("node", -1)), []).append(rank)
    for node, ranks in sorted(by_node.items()):
        if len(ranks) != nproc:
            found.append(
                f"node {node} ran {len(ranks)} rank(s) {sorted(ranks)}, "
                f"plan.json says {nproc} per node"
            )
    if "join order" in str(plan.get("worker_env", {}).get("GROUP_RANK", "")):
        group_of: dict[int, set[str]] = {}
        for report in reports.values():
            group = report.get("env", {}).get("GROUP_RANK")
            group_of.setdefault(int(report.get("node", -1)), set()).add(str(group))
        seen = sorted(g for groups in group_of.values() for g in groups)
        for node, groups in sorted(group_of.items()):
            if len(groups) != 1:
                found.append(f"node {node}'s ranks have GROUP_RANKs {sorted(groups)}")
        if len(reports) == plan["world_size"] and seen != [str(i) for i in range(plan["nnodes"])]:
            found.append(f"the nodes' GROUP_RANKs are {seen}, not 0..{plan['nnodes'] - 1}")
    return found


def render(outcome: Outcome, *, kept: bool) -> str:
    serving = outcome.serving
    lines = []
    for label, found in sorted(
        outcome.problems.items(),
        key=lambda kv: (not kv[0].isdigit(), int(kv[0]) if kv[0].isdigit() else 0, kv[0]),
    ):
        lines.append(f"rank {label}: " + found[0])
        lines += [f"rank {label}: {p}" for p in found[1:]]
    lines += [f"rehearse: {f}" for f in outcome.findings]
    for index, text in outcome.logs.items():
        code = outcome.exits.get(index)
        status = "was stopped" if code is None or code < 0 else f"exited {code}"
        lines.append(f"node {index} {status}; the end of its log:")
        lines += [f"  | {line}" for line in text.splitlines()]
    what = "nodes" if serving else "ranks"
    if outcome.timed_out:
        lines.append(f"rehearse: timed out after {outcome.seconds} s: every process was stopped")
    if outcome.missing:
        lines.append(
            f"rehearse: {what} that never reported: " + ", ".join(str(m) for m in outcome.missing)
        )
    where = f"; tree and logs kept in {outcome.tree}" if kept else ""
    nodes = f"{outcome.nnodes} node{'s' if outcome.nnodes != 1 else ''}"
    size = nodes if serving else f"{outcome.world_size} ranks on {nodes}"
    if outcome.ok:
        checked = (
            "roles, argv and every address handed to a node"
            if serving
            else f"ranks, env and arguments; {outcome.groups_built} groups of "
            f"{len(outcome.kinds)} kinds ({', '.join(outcome.kinds)}) built and "
            "all-reduced"
        )
        lines.append(
            f"rehearse: OK: {outcome.launcher} on {outcome.backend}, {size}: "
            f"{checked} ({outcome.seconds} s){where}"
        )
    else:
        bad = len(outcome.problems)
        lines.append(
            f"rehearse: FAILED: {outcome.launcher} on {outcome.backend}, {size}: "
            f"{bad} {what[:-1]}(s) with mismatches, {len(outcome.missing)} missing, "
            f"{sum(1 for c in outcome.exits.values() if c != 0)} node(s) failed "
            f"({outcome.seconds} s){where}"
        )
    return "\n".join(lines) + "\n"
