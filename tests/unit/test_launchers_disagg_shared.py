"""What sglang_disagg and vllm_disagg share (mdc_builtin.launchers._disagg): where the
servers of a split run, the first server that would cross a node's edge, and the node
script's dispatch on its role. Expected places are written out by hand from the layout
the launchers document (prefill first, from node 0 / GPU 0, then decode)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import attrs
import pytest

from mdc.api import Plan
from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins
from mdc_builtin.launchers._disagg import crossing, over_nodes, role_case, side_by_side

OTHERS = ("deepspeed", "megatron", "torchtitan", "primus", "slurm", "ssh")
COMPILER = Compiler(load_plugins(autoload=False, blocked=OTHERS))


@attrs.frozen
class Shape:
    role: str
    gpus: int
    nodes: int = 1


def plan_of(
    tmp_path: Path, nnodes: int, distributed: dict[str, Any], roles: dict[str, int]
) -> Plan:
    """A compiled vllm_disagg job of nnodes x 8 GPUs, each role's servers of ``roles[role]``
    tensor-parallel GPUs."""
    data = {
        "job": {"name": "shared", "command": ["vllm", "serve"]},
        "distributed": {
            "launcher": "vllm_disagg",
            "backend": "local",
            "nnodes": nnodes,
            "nproc_per_node": 8,
            "accelerator": "cpu",
            **distributed,
        },
        "vllm_disagg": {
            "model": "org/model",
            **{role: {"tensor_parallel_size": tp} for role, tp in roles.items()},
        },
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return COMPILER.compile(path, tree=False).plan


def test_servers_over_whole_nodes(tmp_path: Path) -> None:
    """5 nodes, 2 prefill (one server of 2 nodes) and 3 decode (a server each)."""
    plan = plan_of(tmp_path, 5, {"prefill_nodes": 2, "decode_nodes": 3}, {"decode": 8})
    shapes = {"prefill": Shape("prefill", 16, 2), "decode": Shape("decode", 8, 1)}
    placed = [(s.role, start, nodes) for s, start, nodes in over_nodes(plan, shapes.__getitem__)]
    assert placed == [
        ("prefill", 0, (0, 1)),
        ("decode", 2, (2,)),
        ("decode", 3, (3,)),
        ("decode", 4, (4,)),
    ]


def test_servers_side_by_side_and_the_first_that_crosses(tmp_path: Path) -> None:
    """2 nodes of 8 GPUs split 8 + 8: prefill servers of 4 fill node 0, decode servers of 2
    node 1; a decode server of 3 would start at GPUs 8, 11, 14 and the one at 14 crosses."""
    plan = plan_of(tmp_path, 2, {"prefill_gpus": 8, "decode_gpus": 8}, {"prefill": 4, "decode": 2})
    shapes = {"prefill": Shape("prefill", 4), "decode": Shape("decode", 2)}
    placed = [(s.role, node, gpu) for s, node, gpu in side_by_side(plan, shapes.__getitem__)]
    assert placed == [("prefill", 0, 0), ("prefill", 0, 4)] + [
        ("decode", 1, gpu) for gpu in (0, 2, 4, 6)
    ]
    assert crossing(plan, shapes["prefill"]) is None
    assert crossing(plan, shapes["decode"]) is None
    assert crossing(plan, Shape("decode", 3)) == 14
    assert crossing(plan, Shape("prefill", 3)) == 6  # 0, 3, then 6..8


@pytest.mark.parametrize(
    ("role", "code", "out", "err"),
    [
        ("prefill", 0, "p extra\n", ""),
        ("decode", 0, "line one\n  line two\n", ""),
        ("other", 2, "", "demo: unknown role other\n"),
    ],
)
def test_role_case_runs_its_role(role: str, code: int, out: str, err: str) -> None:
    """bash runs the arm of its first argument with the rest; a line break inside a quoted
    argument stays as written (only the lines' starts are indented)."""
    script = role_case(
        "demo",
        prefill=['echo "p $1"'],
        decode=['printf "%s\\n" "line one\n  line two"'],
    )
    done = subprocess.run(
        ["bash", "-c", script, "script", role, "extra"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (code, out, err)
