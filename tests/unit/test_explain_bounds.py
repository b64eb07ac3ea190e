"""``mdc explain`` of a spec at the schema's maximum sizes is as bounded as ``validate``.

nnodes 1,048,576 x nproc_per_node 1,024 is a world of 2^30 ranks, and its data-parallel
group holds every one of them. explain (text, JSON, ``--svg``) must say what a reader needs
in a few kilobytes, computing only the ranks it shows: no group is enumerated whole (the
tests make doing so an error), and a server map lists a few servers and nodes with their
counts. Timings are in bench/run.py, not here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from mdc.describe import MAX_SHOWN, explain_text, plan_json
from mdc.pipeline import Compiled, Compiler
from mdc.plan.ranks import GroupSet
from mdc.rankmap import MAX_LEGEND, rank_map_svg

MAX_NODES = 1_048_576  # the schema's maxima
MAX_NPROC = 1_024
WORLD = MAX_NODES * MAX_NPROC
#: explain's output for any world stays below this (it is a few kilobytes)
BOUND = 64 * 1024


@pytest.fixture
def no_whole_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole group (every rank of it) may not be built: at 2^30 ranks it is the world."""

    def refused(self: GroupSet, *args: Any) -> Any:
        raise AssertionError(f"a whole {self.kind} group of {self.group_size} ranks was built")

    monkeypatch.setattr(GroupSet, "__getitem__", refused)
    monkeypatch.setattr(GroupSet, "__iter__", refused)


def compile_spec(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> Compiled:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return compiler.compile(path, tree=False)


def max_spec(launcher: str, **tables: Any) -> dict[str, Any]:
    return {
        "job": {"name": "biggest", "command": ["python", "train.py"]},
        "distributed": {
            "launcher": launcher,
            "nnodes": MAX_NODES,
            "nproc_per_node": MAX_NPROC,
            **tables.pop("distributed", {}),
        },
        **tables,
    }


@pytest.mark.parametrize(
    "parallelism",
    [{}, {"tp": 8, "pp": 16}, {"tp": 1024, "cp": 2}, {"tp": WORLD, "pp": 1}],
    ids=["dp-everything", "tp8-pp16", "tp1024-cp2", "tp-everything"],
)
def test_explain_at_the_schemas_maximum_shows_few_ranks(
    compiler: Compiler, tmp_path: Path, no_whole_groups: None, parallelism: dict[str, int]
) -> None:
    data = max_spec("torchrun", **({"parallelism": parallelism} if parallelism else {}))
    compiled = compile_spec(compiler, tmp_path, data)  # validate's work: no whole group either
    plan, launch = compiled.plan, compiled.launch
    assert plan.world_size == WORLD
    if parallelism.get("tp", 1) > MAX_NPROC:  # MDC250 names the first nodes the group spans
        (span,) = [d for d in compiled.diagnostics if d.code == "MDC250"]
        assert "spans nodes 0, 1, 2, 3, ...:" in span.message and len(span.message) < 300

    text = explain_text(plan, launch)
    assert len(text) < BOUND
    assert f"= {WORLD} ranks" in text
    # every group kind's line: at most MAX_SHOWN groups of at most 16 ranks, then the count
    lines = [line for line in text.splitlines() if " size " in line and line.startswith("  ")]
    assert lines
    for line in lines:
        groups = re.findall(r"\[([^\]]*)\]", line)
        assert 1 <= len(groups) <= MAX_SHOWN
        assert all(len(group.split()) <= 17 for group in groups)  # 16 ranks and "..."
    dp = next(line for line in lines if line.lstrip().startswith("dp "))
    size = WORLD // (parallelism.get("tp", 1) * parallelism.get("pp", 1) * parallelism.get("cp", 1))
    assert f"size {size}: [0 " in dp and " ...]" in dp if size > 16 else f"size {size}: [0" in dp

    document = json.dumps(plan_json(plan, launch))
    assert len(document) < BOUND
    groups = json.loads(document)["groups"]
    assert groups["dp"] == {"size": size, "count": WORLD // size}  # counts, no rank lists

    svg = rank_map_svg(plan, launch.servers)
    assert len(svg) < 8 * BOUND
    assert svg.count('class="cell"') <= 5 * 8 * 16  # panels x drawn nodes x drawn GPUs
    assert f"{MAX_NODES - 8} in between are left out" in svg


@pytest.mark.slow
def test_a_server_as_wide_as_the_world_is_listed_by_its_counts(
    compiler: Compiler, tmp_path: Path, no_whole_groups: None
) -> None:
    """vLLM over Ray on every node: one server whose node list is 2^20 long."""
    data = max_spec("vllm", vllm={"model": "m", "mode": "ray"}, parallelism={"tp": WORLD, "pp": 1})
    compiled = compile_spec(compiler, tmp_path, data)
    (server,) = compiled.launch.servers
    assert len(server.nodes) == MAX_NODES

    document = json.dumps(plan_json(compiled.plan, compiled.launch))
    assert len(document) < BOUND
    listed = json.loads(document)
    assert listed["server_count"] == 1
    (entry,) = listed["servers"]
    assert entry["nodes"] == list(range(MAX_SHOWN)) and entry["node_count"] == MAX_NODES
    assert entry["gpus"] == WORLD
    assert len(explain_text(compiled.plan, compiled.launch)) < BOUND
    assert len(rank_map_svg(compiled.plan, compiled.launch.servers)) < 8 * BOUND


def test_many_servers_are_summarised(compiler: Compiler, tmp_path: Path) -> None:
    """A vLLM replica on each of 65,536 nodes. explain lists the first servers and the
    count; the server map draws the drawn nodes' servers and a bounded legend."""
    data = max_spec(
        "vllm",
        vllm={"model": "m", "mode": "replicas"},
        parallelism={"tp": 1, "pp": 1},
        distributed={"nnodes": 65536, "nproc_per_node": 8},
    )
    compiled = compile_spec(compiler, tmp_path, data)
    servers = compiled.launch.servers
    assert len(servers) == 65536

    listed = plan_json(compiled.plan, compiled.launch)
    assert listed["server_count"] == len(servers)
    assert len(listed["servers"]) == MAX_SHOWN  # type: ignore[arg-type]
    svg = rank_map_svg(compiled.plan, servers)
    assert len(svg) < 8 * BOUND
    assert svg.count('class="swatch"') <= MAX_LEGEND
    # the last drawn node's servers are numbered by their place among all servers
    last = f"replica {len(servers) - 1}"
    assert last in svg
