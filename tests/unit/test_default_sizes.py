"""Sizes mdc derived rather than read from the spec are shown as defaults, with what they
came from, in ``mdc explain`` and plan.json (``pp 4 (default: nnodes)``)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from mdc.cli import main


def write(tmp_path: Path, **parallelism: int) -> Path:
    data: dict[str, Any] = {
        "job": {"name": "sizes", "command": ["python", "pretrain_gpt.py"]},
        "distributed": {
            "launcher": "megatron",
            "backend": "slurm",
            "nnodes": 4,
            "nproc_per_node": 8,
        },
        "batch": {"global_batch_size": 64, "micro_batch_size": 1},
    }
    if parallelism:
        data["parallelism"] = parallelism
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    return spec


def explain(spec: Path) -> str:
    out = io.StringIO()
    assert main(["explain", str(spec)], stdout=out, stderr=io.StringIO()) == 0
    return out.getvalue()


def plan_of(spec: Path, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "out"
    assert main(["compile", "-q", str(spec), "-o", str(out)], stderr=io.StringIO()) == 0
    plan: dict[str, Any] = json.loads((out / "plan.json").read_text(encoding="utf-8"))
    return plan


def test_defaulted_sizes_say_where_they_came_from(tmp_path: Path) -> None:
    spec = write(tmp_path)
    text = explain(spec)
    assert "tp 8 (default: nproc_per_node)" in text
    assert "pp 4 (default: nnodes)" in text
    parallelism = plan_of(spec, tmp_path)["parallelism"]
    assert (parallelism["tp"], parallelism["pp"]) == (8, 4)
    assert parallelism["defaults"] == {"tp": "nproc_per_node", "pp": "nnodes", "etp": "tp"}


@pytest.mark.parametrize(("written", "default"), [({"tp": 4}, "pp"), ({"pp": 2}, "tp")])
def test_written_sizes_are_not_called_defaults(
    tmp_path: Path, written: dict[str, int], default: str
) -> None:
    spec = write(tmp_path, **written)
    (axis,) = written
    line = next(x for x in explain(spec).splitlines() if x.startswith("parallelism"))
    assert f" {axis} {written[axis]} x" in line and f" {default} " in line
    assert f"{axis} {written[axis]} (default" not in line
    assert set(plan_of(spec, tmp_path)["parallelism"]["defaults"]) == {default, "etp"}
