"""Compiled jobs really run: ``local/run.sh`` starts torchrun agents on loopback.

Each example is compiled with ``mdc.cli.main`` and its ``local/run.sh`` is run
from the repository root (the examples name ``examples/ddp_check.py`` relative
to it). ``ddp_check.py`` writes one ``rank-<RANK>.json`` per worker: what
torchrun gave it, and the result of a gloo all-reduce. Some tests use fixed ports,
so these tests must not run in parallel with each other.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.tools import REPO

from mdc.rehearse.process import processes_with

pytest.importorskip(
    "torch",
    reason="real runs need torch==2.13.0: run scripts/test, or "
    "pip install torch==2.13.0 into the venv",
)

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.xdist_group("loopback")]

#: the compile_spec fixture (tests/integration/conftest.py)
Compile = Callable[..., dict[str, Any]]
#: the venv's bin: torchrun lives next to the interpreter running the tests
VENV_BIN = Path(sys.executable).parent
RUN_TIMEOUT = 240
#: marks every process a run starts, to find any left behind
TOKEN_VARIABLE = "MDC_TEST_RUN_TOKEN"


def _processes_with(token: str) -> list[int]:
    return processes_with(TOKEN_VARIABLE, token)


def _kill_all(token: str) -> None:
    for pid in _processes_with(token):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def leftovers(token: str, grace: float = 5.0) -> list[str]:
    """Command lines of the processes still alive ``grace`` seconds from now."""
    deadline = time.monotonic() + grace
    while (pids := _processes_with(token)) and time.monotonic() < deadline:
        time.sleep(0.2)
    lines = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            lines.append(f"{pid}: {cmdline.decode(errors='replace').strip()}")
        except OSError:
            continue
    return lines


def excerpt(output: str, head: int = 3000, tail: int = 6000) -> str:
    """A failed run's output for the assertion message: its start (where the first failure
    of a node or rank is) and its end (how the others were stopped)."""
    if len(output) <= head + tail:
        return output
    return f"{output[:head]}\n[... {len(output) - head - tail} characters ...]\n{output[-tail:]}"


def run_job(
    out: Path, reports: Path, token: str, timeout: float = RUN_TIMEOUT
) -> tuple[int, str, float]:
    """``bash OUT/local/run.sh`` from the repository root: status, output, seconds."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PET_", "TORCHELASTIC_"))
        and k not in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    scratch = reports.parent / "tmp"  # torchrun's log dirs land here, not in /tmp
    scratch.mkdir(exist_ok=True)
    env.update(
        DDP_CHECK_DIR=str(reports),
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
        TMPDIR=str(scratch),
        **{TOKEN_VARIABLE: token},
    )
    started = time.monotonic()
    with subprocess.Popen(
        ["bash", str(out / "local" / "run.sh")],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    ) as proc:
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _kill_all(token)
            output, _ = proc.communicate()
            pytest.fail(
                f"run.sh did not finish within {timeout} s; output:\n"
                f"{output.decode(errors='replace')[-6000:]}"
            )
    return proc.returncode, output.decode(errors="replace"), time.monotonic() - started


@pytest.fixture
def token() -> Any:
    value = uuid.uuid4().hex
    yield value
    _kill_all(value)  # whatever a failed test left running


EXAMPLES = [
    # (example, nnodes, nproc_per_node, how torchrun meets: standalone | c10d | static)
    pytest.param("quickstart.toml", 1, 2, "standalone", id="quickstart"),
    pytest.param("torchrun-2x2-c10d.yaml", 2, 2, "c10d", id="torchrun-2x2-c10d"),
    pytest.param("torchrun-2x2-static.json", 2, 2, "static", id="torchrun-2x2-static"),
]


@pytest.mark.parametrize(("example", "nnodes", "nproc", "rendezvous"), EXAMPLES)
def test_example_runs_every_rank_once(
    compile_spec: Compile,
    example: str,
    nnodes: int,
    nproc: int,
    rendezvous: str,
    tmp_path: Path,
    token: str,
) -> None:
    out, reports = tmp_path / "out", tmp_path / "reports"
    reports.mkdir()
    plan = compile_spec(f"examples/{example}", out)
    assert (plan["nnodes"], plan["nproc_per_node"]) == (nnodes, nproc)
    world = plan["world_size"]
    assert world == nnodes * nproc
    worker = (out / "launch" / "worker.sh").read_text(encoding="utf-8")
    flag = {
        "standalone": "--standalone",
        "c10d": "--rdzv-backend c10d",
        "static": "--rdzv-backend static",
    }[rendezvous]
    assert flag in worker, worker

    code, output, seconds = run_job(out, reports, token)
    assert code == 0, f"run.sh exited {code} after {seconds:.1f} s:\n{excerpt(output)}"
    assert not leftovers(token), "processes left behind after a successful run"

    files = sorted(p.name for p in reports.iterdir())
    assert files == sorted(f"rank-{r}.json" for r in range(world)), (files, output[-3000:])
    # ddp_check.py prints one flat JSON object per rank; workers share stdout, so two
    # ranks' lines may interleave: find the objects rather than split lines
    printed = [
        json.loads(found) for found in re.findall(r'\{[^{}\n]*"allreduce"[^{}\n]*\}', output)
    ]
    assert sorted(r["RANK"] for r in printed) == list(range(world)), (
        f"every rank must report exactly once:\n{output[-3000:]}"
    )

    worker_env = plan["worker_env"]
    assert worker_env["LOCAL_WORLD_SIZE"] == str(nproc)
    assert worker_env["WORLD_SIZE"] == str(world)
    seen = set()
    ports = set()
    for rank in range(world):
        report = json.loads((reports / f"rank-{rank}.json").read_text(encoding="utf-8"))
        assert report["RANK"] == report["dist_rank"] == rank, report
        assert report["WORLD_SIZE"] == report["dist_world_size"] == world, report
        assert report["LOCAL_WORLD_SIZE"] == nproc, report
        assert 0 <= report["LOCAL_RANK"] < nproc, report
        assert 0 <= report["GROUP_RANK"] < nnodes, report
        # plan.json: RANK = GROUP_RANK * nproc_per_node + LOCAL_RANK
        assert worker_env["RANK"] == f"GROUP_RANK * {nproc} + LOCAL_RANK"
        assert report["RANK"] == report["GROUP_RANK"] * nproc + report["LOCAL_RANK"], report
        assert report["allreduce"] == world * (world - 1) / 2, report
        if rendezvous == "static":  # the example's port is derived at run time
            assert plan["rendezvous"]["port_origin"] == "derived"
            assert "MDC_LAUNCH_ID" in worker_env["MASTER_PORT"], worker_env
            assert 20000 <= report["master_port"] < 30000, report
        seen.add((report["GROUP_RANK"], report["LOCAL_RANK"]))
        ports.add(report["master_port"])
    assert seen == {(node, local) for node in range(nnodes) for local in range(nproc)}
    if rendezvous == "static":
        assert len(ports) == 1, ports  # every node of one launch meets at one port


FAILING_PROGRAM = """\
import os, sys, time
if os.environ["GROUP_RANK"] == "1":
    print(f"mdc-test: node 1 rank {os.environ['RANK']} fails on purpose", flush=True)
    sys.exit(3)
time.sleep(600)  # the other node would hang for ten minutes unless run.sh stops it
"""


@pytest.mark.parametrize(("rendezvous", "port"), [("static", 29743), ("c10d", 29744)])
def test_a_failing_node_stops_the_job_promptly(
    compile_spec: Compile, rendezvous: str, port: int, tmp_path: Path, token: str
) -> None:
    program = tmp_path / "fail_on_node_1.py"
    program.write_text(FAILING_PROGRAM, encoding="utf-8")
    spec = tmp_path / "fail.json"
    spec.write_text(
        json.dumps(
            {
                "job": {
                    "name": f"fail-on-node-1-{rendezvous}",
                    "command": ["python", str(program)],
                },
                "distributed": {
                    "launcher": "torchrun",
                    "backend": "local",
                    "nnodes": 2,
                    "nproc_per_node": 2,
                    "accelerator": "cpu",
                    "master_port": port,
                },
                "torchrun": {"rdzv_backend": rendezvous},
            }
        ),
        encoding="utf-8",
    )
    out, reports = tmp_path / "out", tmp_path / "reports"
    reports.mkdir()
    compile_spec(spec, out)

    code, output, seconds = run_job(out, reports, token, timeout=150)
    assert code != 0, f"run.sh exited 0 though node 1 failed:\n{output[-6000:]}"
    assert "fails on purpose" in output, output[-6000:]
    assert "stopping the others" in output, output[-6000:]
    assert seconds < 90, f"run.sh took {seconds:.1f} s to give up after a node failed"
    left = leftovers(token)
    assert not left, "processes left behind after run.sh exited:\n" + "\n".join(left)


#: every rank of a launch reports its launch id and port, then waits until the other launch
#: is running too (its rank 0 has written its file), so both hold their rendezvous at once
CONCURRENT_PROGRAM = """\
import json, os, sys, time
from pathlib import Path
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([1.0])
dist.all_reduce(total)
sync = Path(os.environ["MDC_TEST_SYNC"])
launch = os.environ["MDC_LAUNCH_ID"]
report = {"launch": launch, "port": int(os.environ["MASTER_PORT"]), "rank": rank,
          "world": world, "sum": total.item()}
if rank == 0:
    (sync / f"{launch}.ready").write_text(json.dumps(report))
deadline = time.monotonic() + 120
while len(list(sync.glob("*.ready"))) < 2 and time.monotonic() < deadline:
    time.sleep(0.2)
report["both_running"] = len(list(sync.glob("*.ready"))) == 2
print("mdc-test-report " + json.dumps(report), flush=True)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""


def test_two_concurrent_launches_of_one_spec_never_collide(
    compile_spec: Compile, tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One compiled tree run twice at once: each launch gets its own id and port, and its
    two nodes meet at that port (a static rendezvous, as the ports matter most there)."""
    program = tmp_path / "launch_report.py"
    program.write_text(CONCURRENT_PROGRAM, encoding="utf-8")
    spec = tmp_path / "same.json"
    spec.write_text(
        json.dumps(
            {
                "job": {"name": "train-92", "command": ["python", str(program)]},
                "distributed": {
                    "launcher": "torchrun",
                    "backend": "local",
                    "nnodes": 2,
                    "nproc_per_node": 1,
                    "accelerator": "cpu",
                },
                "torchrun": {"rdzv_backend": "static"},
            }
        ),
        encoding="utf-8",
    )
    out, again = tmp_path / "out", tmp_path / "again"
    plan = compile_spec(spec, out)
    compile_spec(spec, again)
    run_sh = (out / "local" / "run.sh").read_bytes()
    assert run_sh == (again / "local" / "run.sh").read_bytes()  # the script has no port
    assert str(plan["rendezvous"]["master_port"]).encode() not in run_sh
    sync = tmp_path / "sync"
    sync.mkdir()
    monkeypatch.setenv("MDC_TEST_SYNC", str(sync))  # run_job passes the environment on
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = [
            pool.submit(run_job, out, tmp_path / f"reports-{index}", token) for index in range(2)
        ]
        results = [run.result() for run in runs]
    launches: dict[str, list[dict[str, Any]]] = {}
    for code, output, seconds in results:
        assert code == 0, f"run.sh exited {code} after {seconds:.1f} s:\n{excerpt(output)}"
        # the two nodes' prints may land on one line: a report is one flat JSON object
        reports = [json.loads(r) for r in re.findall(r"mdc-test-report (\{[^{}]*\})", output)]
        assert len(reports) == 2, output[-3000:]
        assert len({r["launch"] for r in reports}) == 1, reports  # one id for the launch
        launches[reports[0]["launch"]] = reports
    assert len(launches) == 2, launches  # two launches, two ids
    ports = set()
    for reports in launches.values():
        assert {r["rank"] for r in reports} == {0, 1}
        assert all(r["world"] == 2 and r["sum"] == 2.0 for r in reports), reports
        assert all(r["both_running"] for r in reports), reports
        assert len({r["port"] for r in reports}) == 1, reports  # both nodes, one port
        ports.add(reports[0]["port"])
    assert len(ports) == 2, ports  # the launches never shared a port
    assert all(20000 <= port < 30000 for port in ports), ports
    assert not leftovers(token)
