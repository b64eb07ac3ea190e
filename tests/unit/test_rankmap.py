"""The rank map SVG: well-formed, bounded, and every cell's colour and label right.

Expected groups, stages and replicas come from megatron-core's own ``RankGenerator`` (the
torch-marked test) or are worked out here from the node layout, never read back from mdc.
"""

from __future__ import annotations

import io
import json
import re
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import attrs
import pytest
from tests.tools import REPO

from mdc.cli import main
from mdc.convert import structure_spec
from mdc.errors import SourceLocation
from mdc.pipeline import Compiler
from mdc.plan import Plan, build_plan
from mdc.plugin_manager import load_plugins
from mdc.rankmap import MAX_COLUMNS, MAX_NODES, PALETTE, rank_map_svg

SVG = "{http://www.w3.org/2000/svg}"
NOUNS = {"tp": "TP group", "pp": "stage", "dp": "replica", "cp": "CP group", "ep": "EP group"}


def plan_of(nnodes: int, nproc: int, **parallelism: Any) -> Plan:
    data = {
        "job": {"name": "map", "command": "train.py"},
        "distributed": {"launcher": "torchrun", "nnodes": nnodes, "nproc_per_node": nproc},
        "parallelism": parallelism,
    }
    spec = structure_spec(data, {})
    plan, diagnostics = build_plan(
        spec,
        parallelism="data",
        disaggregated=False,
        locate=lambda pointer: SourceLocation(path="job.toml", pointer=pointer),
    )
    assert plan is not None, [d.render() for d in diagnostics]
    return plan


def parse(svg: str) -> ET.Element:
    assert svg.startswith('<?xml version="1.0" encoding="UTF-8"?>\n<svg ')
    return ET.fromstring(svg.encode("utf-8"))


def panels(root: ET.Element) -> dict[str, ET.Element]:
    return {g.get("data-kind", ""): g for g in root.iter(f"{SVG}g") if g.get("class") == "panel"}


def cells(panel: ET.Element) -> list[ET.Element]:
    return [g for g in panel.iter(f"{SVG}g") if g.get("class") == "cell"]


def texts(element: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in element.iter(f"{SVG}text")]


def drawn(count: int, cap: int) -> list[int]:
    """Indices drawn: all up to ``cap``, else the first cap - 1 and the last."""
    return list(range(count)) if count <= cap else [*range(cap - 1), count - 1]


# ---------------------------------------------------------------- structure


@pytest.mark.parametrize(
    ("nnodes", "nproc", "sizes", "kinds"),
    [
        (1, 2, {}, ["dp"]),
        (1, 1, {}, ["dp"]),
        (
            4,
            8,
            {"tp": 2, "pp": 2, "ep": 2, "etp": 1, "order": "tp-cp-ep-pp-dp"},
            ["tp", "pp", "dp", "ep"],
        ),
        (16, 8, {"tp": 8, "pp": 4, "cp": 2}, ["tp", "pp", "dp", "cp"]),
        (3, 64, {"tp": 4}, ["tp", "dp"]),
        (2, 8, {"tp": 8, "pp": 2}, ["tp", "pp"]),
    ],
)
def test_panels_cells_and_frames(
    nnodes: int, nproc: int, sizes: dict[str, Any], kinds: list[str]
) -> None:
    plan = plan_of(nnodes, nproc, **sizes)
    root = parse(rank_map_svg(plan))
    found = panels(root)
    assert list(found) == kinds  # one panel per dimension > 1, in the order
    nodes, columns = drawn(nnodes, MAX_NODES), drawn(nproc, MAX_COLUMNS)
    expected_ranks = [n * nproc + c for n in nodes for c in columns]
    for kind, panel in found.items():
        got = [int(c.get("data-rank", "-1")) for c in cells(panel)]
        assert got == expected_ranks, kind
        frames = [r for r in panel.iter(f"{SVG}rect") if r.get("class") == "node-frame"]
        assert len(frames) == len(nodes)
        rows = [g for g in panel.iter(f"{SVG}g") if g.get("class") == "node"]
        assert [int(g.get("data-node", "-1")) for g in rows] == nodes
        for row in rows:  # every cell of a row lies inside the row's frame
            frame = next(r for r in row.iter(f"{SVG}rect") if r.get("class") == "node-frame")
            left = int(frame.get("x", "0"))
            right = left + int(frame.get("width", "0"))
            for cell in cells(row):
                rect = cell.find(f"{SVG}rect")
                assert rect is not None
                x, w = int(rect.get("x", "0")), int(rect.get("width", "0"))
                assert left < x and x + w < right
                assert int(cell.get("data-rank", "-1")) // nproc == int(row.get("data-node", ""))
    width = int(root.get("width", "0"))
    assert root.get("viewBox") == f"0 0 {width} {root.get('height')}"


def test_cells_are_labelled_with_rank_and_coordinates() -> None:
    """tp-cp-ep-dp-pp, tp 2 x cp 2 x dp 2 x pp 2 on 2 x 8: coordinates by hand."""
    plan = plan_of(2, 8, tp=2, pp=2, cp=2)
    root = parse(rank_map_svg(plan))
    for cell in cells(panels(root)["tp"]):
        rank = int(cell.get("data-rank", ""))
        tp, cp, dp, pp = rank % 2, rank // 2 % 2, rank // 4 % 2, rank // 8
        assert texts(cell)[:2] == [f"r{rank}", f"tp{tp} pp{pp} dp{dp} cp{cp}"]
        title = cell.find(f"{SVG}title")
        assert title is not None and title.text is not None
        assert title.text.startswith(
            f"rank {rank}: node {rank // 8}, local rank {rank % 8}; "
            f"tp {tp}, pp {pp}, dp {dp}, cp {cp}"
        )


def test_million_ranks_stay_small_and_say_so() -> None:
    plan = plan_of(131072, 8, tp=8, pp=16, cp=2, ep=4)
    svg = rank_map_svg(plan)
    assert len(svg) < 400_000
    root = parse(svg)
    found = panels(root)
    assert list(found) == ["tp", "pp", "dp", "cp", "ep"]
    for panel in found.values():
        assert len(cells(panel)) == MAX_NODES * 8
        assert (
            f"… {131072 - MAX_NODES} more node(s), ranks {(MAX_NODES - 1) * 8}.."
            f"{131071 * 8 - 1}, not drawn" in texts(panel)
        )
    assert (
        f"drawn: nodes 0..{MAX_NODES - 2} and 131071 of 131072; the {131072 - MAX_NODES} "
        "in between are left out (mdc explain and plan.json give every group)"
    ) in texts(root)
    last = [c for c in cells(found["pp"]) if c.get("data-rank") == str(131071 * 8)]
    assert texts(last[0])[2] == "stage 15"


def test_wide_nodes_are_cut_with_an_ellipsis() -> None:
    plan = plan_of(2, 64, tp=4)
    root = parse(rank_map_svg(plan))
    assert f"drawn: local ranks 0..{MAX_COLUMNS - 2} and 63 of 64 per node" in texts(root)
    tp = panels(root)["tp"]
    assert texts(tp).count("…") == 2  # one per node row
    assert [c.get("data-rank") for c in cells(tp)][-1] == "127"


def test_deterministic_and_escaped() -> None:
    plan = plan_of(2, 2, tp=2)
    assert rank_map_svg(plan) == rank_map_svg(plan_of(2, 2, tp=2))
    odd = attrs.evolve(
        plan, hosts=("gpu<1>&co", 'gpu"2"'), job=attrs.evolve(plan.job, name="a<b>&c")
    )
    svg = rank_map_svg(odd)
    root = parse(svg)
    assert "rank map: job a<b>&c (torchrun on local)" in texts(root)
    assert {"gpu<1>&co", 'gpu"2"'} <= set(texts(root))
    assert "<b>" not in svg and "&co" not in svg.replace("&amp;co", "")


def test_roles_and_hosts_label_the_rows() -> None:
    compiled = Compiler(load_plugins(autoload=False, blocked=[])).compile(
        REPO / "examples" / "sglang-disagg-7-custom.yaml"
    )
    root = parse(rank_map_svg(compiled.plan))
    labels = texts(next(iter(panels(root).values())))
    roles = [compiled.plan.role_of(n).name for n in range(compiled.plan.nnodes)]
    assert roles[0] == "prefill" and "decode" in roles  # the router beside node 0's server
    for node, role in enumerate(roles):
        index = labels.index(f"node {node}")
        assert role in labels[index + 1]


def test_explain_writes_the_svg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MDC_DISABLE_PLUGIN_AUTOLOAD", "1")
    spec = REPO / "examples" / "ssh-torchrun-2x8.toml"
    target = tmp_path / "map.svg"
    out = io.StringIO()
    assert main(["explain", str(spec), "--svg", str(target)], stdout=out, stderr=io.StringIO()) == 0
    assert out.getvalue().startswith("job ")  # the text explanation still goes to stdout
    plan = Compiler(load_plugins(autoload=False, blocked=[])).compile(spec).plan
    assert target.read_text(encoding="utf-8") == rank_map_svg(plan)
    assert plan.hosts is not None
    assert set(plan.hosts) <= set(texts(parse(rank_map_svg(plan))))


def test_golden_megatron_moe(golden: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MDC_DISABLE_PLUGIN_AUTOLOAD", "1")
    plan = (
        Compiler(load_plugins(autoload=False, blocked=[]))
        .compile(REPO / "examples" / "megatron-moe-4x8.json")
        .plan
    )
    golden.check_text(REPO / "golden" / "rankmap" / "megatron-moe-4x8.svg", rank_map_svg(plan))


# ---------------------------------------------------------------- against megatron-core


CASES = [
    (4, 8, {"tp": 2, "pp": 2, "ep": 2, "etp": 1, "order": "tp-cp-ep-pp-dp"}),
    (16, 8, {"tp": 8, "pp": 4, "cp": 2}),
    (4, 4, {"tp": 2, "pp": 2, "cp": 2, "ep": 2, "order": "tp-cp-ep-dp-pp"}),
    (6, 4, {"tp": 2, "pp": 3, "order": "tp-pp-dp"}),
    (8, 4, {"tp": 4, "ep": 8, "etp": 1, "pp": 2, "order": "tp-cp-ep-dp-pp"}),
    (12, 8, {"tp": 2, "cp": 4, "pp": 2, "order": "cp-tp-ep-dp-pp"}),
]


@pytest.mark.torch
@pytest.mark.parametrize(
    ("nnodes", "nproc", "sizes"), CASES, ids=lambda v: re.sub(r"[^\w-]", "", str(v))
)
def test_colours_and_labels_match_megatron(nnodes: int, nproc: int, sizes: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # megatron-core warns at import (TE/Apex missing)
        from megatron.core.parallel_state import RankGenerator
    plan = plan_of(nnodes, nproc, **sizes)
    s = plan.sizes
    order = plan.layout.order
    dense = RankGenerator(tp=s.tp, ep=1, dp=s.dp, pp=s.pp, cp=s.cp, order=order)
    expert = RankGenerator(tp=s.etp, ep=s.ep, dp=s.edp, pp=s.pp, cp=1, order=order)
    groups = {
        "tp": dense.get_ranks("tp"),
        "pp": dense.get_ranks("pp"),
        "dp": dense.get_ranks("dp"),
        "cp": dense.get_ranks("cp"),
        "ep": expert.get_ranks("ep"),
    }

    def group_index(kind: str, rank: int) -> int:
        return next(i for i, g in enumerate(groups[kind]) if rank in g)

    def position(kind: str, rank: int) -> int:
        return int(groups[kind][group_index(kind, rank)].index(rank))

    root = parse(rank_map_svg(plan))
    found = panels(root)
    assert set(found) == {
        k
        for k, n in (("tp", s.tp), ("pp", s.pp), ("dp", s.dp), ("cp", s.cp), ("ep", s.ep))
        if n > 1
    }
    for kind, panel in found.items():
        for cell in cells(panel):
            rank = int(cell.get("data-rank", ""))
            # tp, cp, ep: the group; pp: the stage, dp: the replica (position in the group)
            value = position(kind, rank) if kind in ("pp", "dp") else group_index(kind, rank)
            rect = cell.find(f"{SVG}rect")
            assert rect is not None
            assert rect.get("fill") == PALETTE[value % len(PALETTE)], (kind, rank)
            coords = " ".join(
                f"{k}{position(k, rank)}"
                for k, n in (("tp", s.tp), ("pp", s.pp), ("dp", s.dp), ("cp", s.cp), ("ep", s.ep))
                if n > 1
            )
            assert texts(cell) == [f"r{rank}", coords, f"{NOUNS[kind]} {value}"], (kind, rank)


# ---------------------------------------------------------------- serving jobs as servers


def serving_compiled(data: dict[str, Any], tmp_path: Path) -> Any:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return Compiler(load_plugins(autoload=False, blocked=[])).compile(path)


def gpu_cells(root: ET.Element) -> dict[tuple[int, int], str]:
    """(node, GPU) -> the server index the cell is coloured by ("" when none)."""
    return {
        (int(c.get("data-node", "")), int(c.get("data-gpu", ""))): c.get("data-server", "")
        for c in root.iter(f"{SVG}g")
        if c.get("class") == "cell"
    }


def test_a_disaggregated_job_is_drawn_as_its_servers(tmp_path: Path) -> None:
    """4 x 8, tp 16: each server's 16 GPUs over its 2 nodes are one colour; the router runs
    on node 0 beside the prefill server, on no GPU (no replica drawn for it)."""
    data = {
        "job": {"name": "pd", "command": "python3"},
        "distributed": {"launcher": "sglang_disagg", "nnodes": 4, "nproc_per_node": 8},
        "sglang_disagg": {"model_path": "m", "tp_size": 16},
    }
    compiled = serving_compiled(data, tmp_path)
    root = parse(rank_map_svg(compiled.plan, compiled.launch.servers))
    assert set(panels(root)) == {"servers"}
    cells_ = gpu_cells(root)
    assert {cells_[(n, g)] for n in (0, 1) for g in range(8)} == {"1"}  # prefill 0
    assert {cells_[(n, g)] for n in (2, 3) for g in range(8)} == {"2"}  # decode 0
    words = texts(root)
    assert "router: node 0, port 8000 (no GPU)" in words
    assert "prefill 0: nodes 0-1, tp 16, port 30000" in words
    assert not any("replica" in w for w in words)


def test_one_node_servers_on_their_gpus(tmp_path: Path) -> None:
    data = {
        "job": {"name": "pd1", "command": "python3"},
        "distributed": {"launcher": "sglang_disagg", "nnodes": 1, "nproc_per_node": 8},
        "sglang_disagg": {"model_path": "m", "tp_size": 2},
    }
    compiled = serving_compiled(data, tmp_path)
    cells_ = gpu_cells(parse(rank_map_svg(compiled.plan, compiled.launch.servers)))
    # servers 1.. in the plan's order: prefill on GPUs 0-1, decode on 2-3, 4-5, 6-7
    assert [cells_[(0, g)] for g in range(8)] == ["1", "1", "2", "2", "3", "3", "4", "4"]


def test_servers_over_more_nodes_than_drawn(tmp_path: Path) -> None:
    """20 nodes of 2 GPUs: nodes 0..MAX_NODES-2 and the last are drawn, a line says how many
    are not (the rank view's line, without the ranks it would name), and only the drawn
    nodes' GPUs have cells."""
    data = {
        "job": {"name": "pd20", "command": "python3"},
        "distributed": {"launcher": "sglang_disagg", "nnodes": 20, "nproc_per_node": 2},
        "sglang_disagg": {"model_path": "m", "tp_size": 2},
    }
    compiled = serving_compiled(data, tmp_path)
    root = parse(rank_map_svg(compiled.plan, compiled.launch.servers))
    assert f"… {20 - MAX_NODES} more node(s), not drawn" in texts(root)
    shown = drawn(20, MAX_NODES)
    assert sorted(gpu_cells(root)) == [(n, g) for n in shown for g in (0, 1)]
    frames = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "node-frame"]
    assert len(frames) == len(shown)


def test_explain_draws_a_serving_job_as_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MDC_DISABLE_PLUGIN_AUTOLOAD", "1")
    spec = REPO / "examples" / "vllm-dp-ep-2x8.toml"
    target = tmp_path / "map.svg"
    assert main(["explain", str(spec), "--svg", str(target)], stdout=io.StringIO()) == 0
    root = parse(target.read_text(encoding="utf-8"))
    assert set(panels(root)) == {"servers"}
    assert set(gpu_cells(root).values()) == {"0"}  # one server of 16 engines over both nodes


def _look(cell: ET.Element) -> tuple[str, str]:
    """What tells a cell apart by eye: its fill and the hatching laid over it."""
    rects = list(cell.iter(f"{SVG}rect"))
    hatch = next((r.get("fill", "") for r in rects if r.get("class") == "hatch"), "")
    return rects[0].get("fill", ""), hatch


@pytest.mark.parametrize(("kind", "sizes"), [("cp", {"cp": 2}), ("dp", {"tp": 2})])
def test_many_groups_stay_apart_by_colour_and_hatching(kind: str, sizes: dict[str, int]) -> None:
    """8 x 16 ranks in 64 CP groups (or 64 replicas): every group drawn has its own
    (colour, hatching) pair although the palette has 12 colours; the legend says so."""
    plan = plan_of(8, 16, **sizes)
    svg = rank_map_svg(plan)
    root = parse(svg)
    looks: dict[int, tuple[str, str]] = {}
    for cell in cells(panels(root)[kind]):
        looks.setdefault(int(cell.get("data-value", "-1")), _look(cell))
    assert len(looks) > len(PALETTE)
    assert len(set(looks.values())) == len(looks)
    for value, (fill, hatch) in looks.items():
        assert fill == PALETTE[value % len(PALETTE)]
        assert (hatch == "") == (value < len(PALETTE))
    defined = {f"url(#{p.get('id')})" for p in root.iter(f"{SVG}pattern")}
    assert {h for _, h in looks.values() if h} <= defined
    assert any("hatched after" in t for t in texts(panels(root)[kind]))
    assert rank_map_svg(plan_of(8, 16, **sizes)) == svg


def test_few_groups_need_no_hatching() -> None:
    svg = rank_map_svg(plan_of(2, 8, tp=2, cp=2))
    assert "<pattern" not in svg and 'class="hatch"' not in svg
