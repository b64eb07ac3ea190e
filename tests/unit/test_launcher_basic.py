"""The basic launcher: the spawner it emits, the worker's contract, and its findings.

Specs are compiled in-process through mdc's own pipeline (only mdc's own plugins,
the other launchers and backends blocked so their work in progress cannot change
these results). Real runs of the spawner live in tests/integration/test_basic_run.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.tools import shellcheck

from mdc.api import Concat, Ref
from mdc.api.shell import shell_word
from mdc.errors import Diagnostic, SpecError
from mdc.pipeline import Compiled, Compiler
from mdc.plugin_manager import load_plugins

OTHERS = ("deepspeed", "megatron", "torchtitan", "slurm", "ssh")
COMPILER = Compiler(load_plugins(autoload=False, blocked=OTHERS))


def spec(
    basic: dict[str, Any] | None = None,
    *,
    nnodes: int = 2,
    nproc: int = 3,
    command: Any = ("python", "train.py", "--epochs", "2"),
    **extra: Any,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "job": {"name": "basic-unit", "command": list(command)},
        "distributed": {
            "launcher": "basic",
            "backend": "local",
            "nnodes": nnodes,
            "nproc_per_node": nproc,
            "accelerator": "cpu",
            "master_port": 29650,
        },
    }
    if basic is not None:
        data["basic"] = basic
    for table, value in extra.items():
        data.setdefault(table, {}).update(value)
    return data


def compile_(tmp_path: Path, data: dict[str, Any]) -> Compiled:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return COMPILER.compile(path)


def errors(tmp_path: Path, data: dict[str, Any]) -> list[Diagnostic]:
    with pytest.raises(SpecError) as caught:
        compile_(tmp_path, data)
    return [d for d in caught.value.diagnostics if d.is_error]


def file_of(compiled: Compiled, path: str) -> tuple[str, bool]:
    artifact = next(a for a in compiled.tree if a.path == path)
    return artifact.data.decode("utf-8"), artifact.executable


def test_the_role_runs_the_spawner_with_the_command_as_its_arguments(tmp_path: Path) -> None:
    compiled = compile_(tmp_path, spec())
    (role,) = compiled.launch.roles
    assert role.argv == (
        "bash",
        Concat((Ref("MDC_OUT"), "/launch/spawn.sh")),
        "python",
        "train.py",
        "--epochs",
        "2",
    )
    env = dict(role.env)
    assert env == {
        "NODE_RANK": Ref("NODE_RANK"),
        "MASTER_ADDR": Ref("MASTER_ADDR"),
        "MASTER_PORT": Ref("MASTER_PORT"),
        "WORLD_SIZE": "6",
        "LOCAL_WORLD_SIZE": "3",
    }
    text, executable = file_of(compiled, "launch/spawn.sh")
    assert executable and text.startswith("#!/usr/bin/env bash\n")
    worker, _ = file_of(compiled, "launch/worker.sh")
    assert worker.rstrip().endswith(
        'exec bash "${MDC_OUT}/launch/spawn.sh" python train.py --epochs 2'
    )


def test_the_worker_env_contract_is_documented(tmp_path: Path) -> None:
    documented = compile_(tmp_path, spec(nnodes=4, nproc=2)).launch.worker_env
    # what init_process_group(init_method="env://") and the usual helpers read
    assert set(documented) == {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    }
    assert documented["RANK"].startswith("NODE_RANK * 2 + LOCAL_RANK")
    assert documented["WORLD_SIZE"].startswith("8 ")
    assert documented["LOCAL_RANK"] == "0..1"
    assert documented["LOCAL_WORLD_SIZE"] == "2"
    assert documented["MASTER_PORT"] == "29650"


def test_job_env_cannot_override_the_contract(tmp_path: Path) -> None:
    found = errors(tmp_path, spec(job={"env": {"WORLD_SIZE": "2", "RANK": "0"}}))
    assert sorted(d.location.pointer for d in found) == ["/job/env/RANK", "/job/env/WORLD_SIZE"]
    assert {d.code for d in found} == {"MDC240"}


def test_rendezvous_file_becomes_an_init_method_argument(tmp_path: Path) -> None:
    path = "/shared/rdzv/it's $HOME"
    text, _ = file_of(compile_(tmp_path, spec({"rendezvous_file": path})), "launch/spawn.sh")
    launch_line = next(line for line in text.splitlines() if '"$@"' in line)
    assert launch_line.endswith(f" --init_method {shell_word('file://' + path)} &")
    without, _ = file_of(compile_(tmp_path, spec()), "launch/spawn.sh")
    assert "--init_method" not in without


def test_the_spawner_is_the_same_bytes_for_the_same_spec(tmp_path: Path) -> None:
    first = file_of(compile_(tmp_path, spec()), "launch/spawn.sh")
    assert file_of(compile_(tmp_path, spec()), "launch/spawn.sh") == first


@pytest.mark.slow
@pytest.mark.parametrize("basic", [None, {"rendezvous_file": "/shared/x y/$(touch z)`w`;'\""}])
def test_the_spawner_passes_bash_n_and_shellcheck(
    tmp_path: Path, basic: dict[str, Any] | None
) -> None:
    text, _ = file_of(compile_(tmp_path, spec(basic)), "launch/spawn.sh")
    script = tmp_path / "spawn.sh"
    script.write_text(text, encoding="utf-8")
    parsed = subprocess.run(
        ["bash", "-n", str(script)], capture_output=True, text=True, check=False
    )
    assert parsed.returncode == 0, parsed.stderr
    # the project's bar is -S warning; the spawner's own text also passes -S style (the
    # hostile path's literal $(...) is an info-level SC2016, which the quoting intends)
    level = "style" if basic is None else "warning"
    linted = subprocess.run(
        [shellcheck(), "--norc", "-S", level, str(script)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr


# ------------------------------------------------------------ findings


def test_an_elastic_job_is_refused(tmp_path: Path) -> None:
    (found,) = errors(tmp_path, spec(nnodes=4, distributed={"min_nnodes": 2}))
    assert found.code == "MDC350" and "min_nnodes 2 < nnodes 4" in found.message
    assert "--world_size 12" in found.message


@pytest.mark.parametrize(
    ("path", "codes"),
    [
        ("shared/rdzv", ["MDC351"]),
        ("./rdzv", ["MDC351"]),
        ("/shared/rdzv?rank=0", ["MDC352"]),
        ("/shared/rdzv#1", ["MDC352"]),
        ("/shared/rdzv/", ["MDC352"]),
        ("/shared/rd\nzv", ["MDC352"]),
        ("rdzv?x", ["MDC351", "MDC352"]),
    ],
)
def test_a_rendezvous_file_must_be_a_plain_absolute_path(
    tmp_path: Path, path: str, codes: list[str]
) -> None:
    found = errors(tmp_path, spec({"rendezvous_file": path}))
    assert sorted(d.code for d in found) == codes
    assert {d.location.pointer for d in found} == {"/basic/rendezvous_file"}


def test_a_plain_absolute_rendezvous_file_is_fine(tmp_path: Path) -> None:
    compiled = compile_(tmp_path, spec({"rendezvous_file": "/nfs/jobs/run 7/rdzv"}))
    assert compiled.diagnostics == ()


@pytest.mark.parametrize(
    ("command", "basic", "named"),
    [
        (["python", "t.py", "--rank", "0"], None, "--rank"),
        (["python", "t.py", "--world_size=8"], None, "--world_size"),
        (
            ["python", "t.py", "--init_method", "env://"],
            {"rendezvous_file": "/s/f"},
            "--init_method",
        ),
    ],
)
def test_flags_the_launcher_appends_are_flagged_in_the_command(
    tmp_path: Path, command: list[str], basic: dict[str, Any] | None, named: str
) -> None:
    (found,) = compile_(tmp_path, spec(basic, command=command)).diagnostics
    assert found.code == "MDC353" and found.location.pointer == "/job/command"
    assert named in found.message


def test_init_method_in_the_command_is_fine_without_a_rendezvous_file(tmp_path: Path) -> None:
    data = spec(command=["python", "t.py", "--init_method", "env://"])
    assert compile_(tmp_path, data).diagnostics == ()
