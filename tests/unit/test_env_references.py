"""[job] env values that refer to other variables: a literal stays literal with a warning
(MDC254), and the explicit forms prepend/append/ref are expanded at run time, quoted, and
checked (MDC255 for a variable mdc does not set). Run with bash to see what a process gets."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mdc.errors import SpecError
from mdc.pipeline import Compiled, Compiler

HOSTILE = "/opt/it's $(id) `x`/lib"


def compile_env(compiler: Compiler, tmp_path: Path, env: dict[str, Any]) -> Compiled:
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "job": {"name": "envs", "command": ["python", "train.py"], "env": env},
                "distributed": {
                    "launcher": "torchrun",
                    "backend": "local",
                    "nnodes": 1,
                    "nproc_per_node": 2,
                    "accelerator": "cpu",
                },
            }
        ),
        encoding="utf-8",
    )
    return compiler.compile(spec)


def run_exports(compiled: Compiled, outer: dict[str, str], names: list[str]) -> list[str]:
    """What the launch script exports, run by bash up to its exec, with ``outer`` set."""
    script = next(a.data.decode() for a in compiled.tree if a.path == "launch/worker.sh")
    body = script[: script.rindex("\nexec ")]
    probe = body + "\n" + "\n".join(f'printf "%s\\n" "${{{n}-<unset>}}"' for n in names)
    done = subprocess.run(
        ["bash", "-c", probe],
        env={"PATH": "/usr/bin:/bin", "NODE_RANK": "3", **outer},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.splitlines()


def test_literal_values_stay_literal_with_a_warning(compiler: Compiler, tmp_path: Path) -> None:
    env = {"LD_LIBRARY_PATH": "/opt/x/lib:$LD_LIBRARY_PATH", "WHO": "${SLURM_NODEID}"}
    compiled = compile_env(compiler, tmp_path, env)
    found = {d.location.pointer: d for d in compiled.diagnostics if d.location}
    assert found["/job/env/LD_LIBRARY_PATH"].code == "MDC254"
    assert "prepend" in (found["/job/env/LD_LIBRARY_PATH"].hint or "")
    assert '{ ref = "SLURM_NODEID" }' in (found["/job/env/WHO"].hint or "")
    values = run_exports(compiled, {"LD_LIBRARY_PATH": "/usr/lib", "SLURM_NODEID": "1"}, list(env))
    assert values == list(env.values())


@pytest.mark.parametrize(
    ("outer", "expected"),
    [
        ({"LD_LIBRARY_PATH": "/usr/lib"}, [f"{HOSTILE}:/usr/lib", "/usr/lib;/src"]),
        ({}, [HOSTILE, "/src"]),  # unset: the value alone, no stray separator
    ],
)
def test_prepend_and_append_join_the_run_time_value(
    compiler: Compiler, tmp_path: Path, outer: dict[str, str], expected: list[str]
) -> None:
    env = {
        "LD_LIBRARY_PATH": {"prepend": HOSTILE},
        "PYTHONPATH": {"append": "/src", "separator": ";"},
    }
    if "LD_LIBRARY_PATH" in outer:
        outer = {**outer, "PYTHONPATH": "/usr/lib"}
    compiled = compile_env(compiler, tmp_path, env)
    assert not [d for d in compiled.diagnostics if d.code in ("MDC254", "MDC255")]
    assert run_exports(compiled, outer, list(env)) == expected


def test_ref_takes_another_variable_at_run_time(compiler: Compiler, tmp_path: Path) -> None:
    env = {"POD_INDEX": {"ref": "NODE_RANK"}, "JOBID": {"ref": "SLURM_JOB_ID"}}
    compiled = compile_env(compiler, tmp_path, env)
    codes = {d.location.pointer: d.code for d in compiled.diagnostics if d.location}
    assert codes.get("/job/env/JOBID/ref") == "MDC255"  # mdc does not set it
    assert "/job/env/POD_INDEX/ref" not in codes
    assert run_exports(compiled, {"SLURM_JOB_ID": "77"}, list(env)) == ["3", "77"]
    assert run_exports(compiled, {}, list(env)) == ["3", ""]
    plan = json.loads(next(a.data for a in compiled.tree if a.path == "plan.json"))
    assert plan["job"]["env"]["POD_INDEX"] == {"ref": "NODE_RANK", "separator": ":"}


@pytest.mark.parametrize(
    "value",
    [
        {"prepend": "/a", "ref": "X"},
        {"ref": "NOT-A-NAME"},
        {"append": "/a", "separator": "|"},
        {},
    ],
)
def test_a_bad_explicit_form_is_refused(
    compiler: Compiler, tmp_path: Path, value: dict[str, str]
) -> None:
    with pytest.raises(SpecError) as raised:
        compile_env(compiler, tmp_path, {"X": value})
    assert all(
        d.location and d.location.pointer.startswith("/job/env/X") for d in raised.value.diagnostics
    )
