"""The basic launcher really runs: ``local/run.sh`` -> ``launch/worker.sh`` -> ``launch/spawn.sh``.

``examples/basic_check.py`` parses ``--world_size``/``--rank`` (and ``--init_method``),
calls ``init_process_group("gloo")`` itself, all-reduces, and writes one
``rank-<rank>.json`` per process; the reports are checked against the plan.
A failing rank must end the job with its status and leave nothing running, and
so must a TERM to ``run.sh``. The helpers come from test_local_run.py; like those
tests, these use fixed or name-derived ports and must not run in parallel.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.integration.test_local_run import (
    TOKEN_VARIABLE,
    VENV_BIN,
    excerpt,
    leftovers,
    run_job,
    token,
)
from tests.tools import REPO

# Real processes on loopback ports: one xdist worker runs every such test, in turn.
pytestmark = pytest.mark.xdist_group("loopback")

__all__ = ["token"]  # the fixture, used by name below

#: the compile_spec fixture (tests/integration/conftest.py)
Compile = Callable[..., dict[str, Any]]


def check_reports(plan: dict[str, Any], reports: Path, *, init_method: str = "env://") -> None:
    """Every rank reported once, with what the plan says it gets."""
    nnodes, nproc, world = plan["nnodes"], plan["nproc_per_node"], plan["world_size"]
    assert world == nnodes * nproc
    files = sorted(p.name for p in reports.iterdir())
    assert files == sorted(f"rank-{r}.json" for r in range(world)), files
    seen = set()
    ports = set()
    for rank in range(world):
        report = json.loads((reports / f"rank-{rank}.json").read_text(encoding="utf-8"))
        # the arguments, the environment and the process group agree with the plan
        assert report["arg_rank"] == report["RANK"] == report["dist_rank"] == rank, report
        assert report["arg_world_size"] == report["WORLD_SIZE"] == world, report
        assert report["dist_world_size"] == world, report
        assert report["LOCAL_WORLD_SIZE"] == nproc, report
        assert 0 <= report["NODE_RANK"] < nnodes and 0 <= report["LOCAL_RANK"] < nproc, report
        assert rank == report["NODE_RANK"] * nproc + report["LOCAL_RANK"], report
        if plan["rendezvous"]["port_origin"] == "spec":
            assert report["MASTER_PORT"] == plan["rendezvous"]["master_port"], report
        else:  # chosen by the backend's script at run time, one for the whole launch
            assert 20000 <= report["MASTER_PORT"] < 30000, report
        ports.add(report["MASTER_PORT"])
        assert report["init_method"] == init_method, report
        assert report["allreduce"] == world * (world - 1) / 2, report
        seen.add((report["NODE_RANK"], report["LOCAL_RANK"]))
    assert seen == {(node, local) for node in range(nnodes) for local in range(nproc)}
    assert len(ports) == 1, ports


EXAMPLES = [
    pytest.param("basic-1x2.toml", 1, 2, id="basic-1x2"),
    pytest.param("basic-2x2.yaml", 2, 2, id="basic-2x2"),
]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize(("example", "nnodes", "nproc"), EXAMPLES)
def test_example_runs_every_rank_once(
    compile_spec: Compile, example: str, nnodes: int, nproc: int, tmp_path: Path, token: str
) -> None:
    out, reports = tmp_path / "out", tmp_path / "reports"
    reports.mkdir()
    plan = compile_spec(f"examples/{example}", out)
    assert (plan["launcher"], plan["nnodes"], plan["nproc_per_node"]) == ("basic", nnodes, nproc)
    code, output, seconds = run_job(out, reports, token)
    assert code == 0, f"run.sh exited {code} after {seconds:.1f} s:\n{excerpt(output)}"
    assert not leftovers(token), "processes left behind after a successful run"
    check_reports(plan, reports)


@pytest.mark.slow
@pytest.mark.torch
def test_a_shared_rendezvous_file_is_passed_as_init_method(
    compile_spec: Compile, tmp_path: Path, token: str
) -> None:
    rendezvous = tmp_path / "shared fs" / "rdzv $file"  # a fresh file each run, as torch needs
    rendezvous.parent.mkdir()
    spec = tmp_path / "rdzv.json"
    spec.write_text(
        json.dumps(
            {
                "job": {
                    "name": "basic-file-rendezvous",
                    "command": ["python", "examples/basic_check.py"],
                    "env": {"GLOO_SOCKET_IFNAME": "lo"},
                },
                "distributed": {
                    "launcher": "basic",
                    "backend": "local",
                    "nnodes": 2,
                    "nproc_per_node": 2,
                    "accelerator": "cpu",
                    "master_port": 29747,
                },
                "basic": {"rendezvous_file": str(rendezvous)},
            }
        ),
        encoding="utf-8",
    )
    out, reports = tmp_path / "out", tmp_path / "reports"
    reports.mkdir()
    plan = compile_spec(spec, out)
    code, output, seconds = run_job(out, reports, token)
    assert code == 0, f"run.sh exited {code} after {seconds:.1f} s:\n{excerpt(output)}"
    assert not leftovers(token)
    check_reports(plan, reports, init_method=f"file://{rendezvous}")


FAILING_PROGRAM = """\
import os, sys, time
if os.environ["RANK"] == os.environ["FAIL_RANK"]:
    print(f"mdc-test: rank {os.environ['RANK']} fails on purpose", flush=True)
    sys.exit(3)
time.sleep(600)  # the others would wait ten minutes unless the spawner stops them
"""


def failing_spec(tmp_path: Path, nnodes: int, port: int) -> Path:
    program = tmp_path / "fail_on_one_rank.py"
    program.write_text(FAILING_PROGRAM, encoding="utf-8")
    spec = tmp_path / "fail.json"
    spec.write_text(
        json.dumps(
            {
                "job": {
                    "name": f"basic-fail-{nnodes}",
                    "command": ["python", str(program)],
                    "env": {"FAIL_RANK": str(nnodes * 2 - 1)},
                },
                "distributed": {
                    "launcher": "basic",
                    "backend": "local",
                    "nnodes": nnodes,
                    "nproc_per_node": 2,
                    "accelerator": "cpu",
                    "master_port": port,
                },
            }
        ),
        encoding="utf-8",
    )
    return spec


@pytest.mark.slow
@pytest.mark.parametrize(("nnodes", "port"), [(1, 29748), (2, 29749)])
def test_a_failing_rank_ends_the_job_with_its_status(
    compile_spec: Compile, nnodes: int, port: int, tmp_path: Path, token: str
) -> None:
    out, reports = tmp_path / "out", tmp_path / "reports"
    reports.mkdir()
    compile_spec(failing_spec(tmp_path, nnodes, port), out)
    code, output, seconds = run_job(out, reports, token, timeout=150)
    assert code == 3, f"run.sh exited {code}, not the failing rank's 3:\n{output[-6000:]}"
    assert "fails on purpose" in output, output[-6000:]
    assert "exited with status 3; stopping the others" in output, output[-6000:]
    assert seconds < 60, f"run.sh took {seconds:.1f} s to give up after a rank failed"
    left = leftovers(token)
    assert not left, "processes left behind after run.sh exited:\n" + "\n".join(left)


WAITING_PROGRAM = """\
import os, sys, time
from pathlib import Path
Path(os.environ["READY_DIR"], os.environ["RANK"]).write_text(str(sys.argv[1:]))
time.sleep(600)
"""


@pytest.mark.slow
def test_term_stops_every_process(compile_spec: Compile, tmp_path: Path, token: str) -> None:
    program = tmp_path / "wait.py"
    program.write_text(WAITING_PROGRAM, encoding="utf-8")
    ready = tmp_path / "ready"
    ready.mkdir()
    spec = tmp_path / "wait.json"
    spec.write_text(
        json.dumps(
            {
                "job": {
                    "name": "basic-term",
                    "command": ["python", str(program)],
                    "env": {"READY_DIR": str(ready)},
                },
                "distributed": {
                    "launcher": "basic",
                    "backend": "local",
                    "nnodes": 2,
                    "nproc_per_node": 2,
                    "accelerator": "cpu",
                    "master_port": 29750,
                },
            }
        ),
        encoding="utf-8",
    )
    out = tmp_path / "out"
    compile_spec(spec, out)
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_RANK", "RANK", "WORLD_SIZE")}
    env.update(PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", **{TOKEN_VARIABLE: token})
    with subprocess.Popen(
        ["bash", str(out / "local" / "run.sh")],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    ) as proc:
        deadline = time.monotonic() + 60
        while len(list(ready.iterdir())) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sorted(p.name for p in ready.iterdir()) == ["0", "1", "2", "3"]
        assert (ready / "3").read_text() == str(["--world_size", "4", "--rank", "3"])
        proc.send_signal(signal.SIGTERM)  # run.sh only, as a scheduler would
        try:
            output, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("run.sh did not stop within 30 s of TERM")
    assert proc.returncode == 143, output.decode(errors="replace")[-3000:]
    left = leftovers(token)
    assert not left, "processes left behind after TERM:\n" + "\n".join(left)


RECORDER = """\
import json, os, sys
names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
         "MASTER_PORT")
record = {"argv": sys.argv[1:], "env": {n: os.environ.get(n) for n in names}}
with open(os.path.join(os.environ["RECORD_DIR"], os.environ["RANK"] + ".json"), "w") as f:
    json.dump(record, f)
"""


@pytest.mark.slow
def test_the_spawner_passes_the_command_verbatim(compile_spec: Compile, tmp_path: Path) -> None:
    """spawn.sh on node 1 of 3 x 3: ranks 3..5, the arguments untouched, no torch needed."""
    recorder = tmp_path / "record.py"
    recorder.write_text(RECORDER, encoding="utf-8")
    hostile = ["it's", 'say "hi"', "$(touch canary)", "`touch canary`", "a b\tc", "*", "", "--"]
    rendezvous = "/shared/rdzv $HOME"
    spec = tmp_path / "record.json"
    spec.write_text(
        json.dumps(
            {
                "job": {
                    "name": "basic-record",
                    "command": [sys.executable, str(recorder), *hostile],
                },
                "distributed": {
                    "launcher": "basic",
                    "backend": "local",
                    "nnodes": 3,
                    "nproc_per_node": 3,
                    "accelerator": "cpu",
                    "master_port": 29751,
                },
                "basic": {"rendezvous_file": rendezvous},
            }
        ),
        encoding="utf-8",
    )
    out, records = tmp_path / "out", tmp_path / "records"
    records.mkdir()
    compile_spec(spec, out)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(NODE_RANK="1", MASTER_ADDR="10.1.2.3", MASTER_PORT="29751", RECORD_DIR=str(records))
    done = subprocess.run(
        ["bash", str(out / "launch" / "worker.sh")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "canary").exists(), "a command hidden in the arguments ran"
    assert sorted(p.name for p in records.iterdir()) == ["3.json", "4.json", "5.json"]
    for local in range(3):
        rank = 3 + local
        record = json.loads((records / f"{rank}.json").read_text(encoding="utf-8"))
        assert record["argv"] == [
            *hostile,
            "--world_size",
            "9",
            "--rank",
            str(rank),
            "--init_method",
            f"file://{rendezvous}",
        ]
        assert record["env"] == {
            "RANK": str(rank),
            "LOCAL_RANK": str(local),
            "WORLD_SIZE": "9",
            "LOCAL_WORLD_SIZE": "3",
            "NODE_RANK": "1",
            "MASTER_ADDR": "10.1.2.3",
            "MASTER_PORT": "29751",
        }
