"""Two jobs of one compiled spec at once on the real SLURM: each job's launch id is its
SLURM_JOB_ID, and its torchrun agents meet at a port derived from it on node 0.

The spec has no master_port, so job.sbatch chooses the port when the job starts. The
emulated nodes share one host, so two jobs that met at one port would collide there
(EADDRINUSE, or one job's agents joining the other's store). Each rank records what it
was given, then waits until the other job is running too, so both rendezvous are held at
once.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from tests.tools import hashed_port

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.xdist_group("loopback")]

PROGRAM = """\
import json, os, time
from pathlib import Path
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([1.0])
dist.all_reduce(total)
sync = Path(os.environ["SYNC_DIR"])
job = os.environ["SLURM_JOB_ID"]
report = {name: os.environ[name] for name in ("SLURM_JOB_ID", "MDC_LAUNCH_ID", "MASTER_PORT")}
report.update(rank=dist.get_rank(), world=dist.get_world_size(), sum=total.item())
(sync / f"{job}-{report['rank']}.json").write_text(json.dumps(report))
deadline = time.monotonic() + 120
while len(list(sync.glob("*.json"))) < 4 and time.monotonic() < deadline:
    time.sleep(0.2)
both = len(list(sync.glob("*.json"))) == 4  # the other job's ranks are up too
(sync / f"{job}-{report['rank']}.both").write_text(json.dumps(both))
dist.barrier()
dist.destroy_process_group()
"""


def test_two_jobs_of_one_spec_meet_at_their_own_ports(
    compile_spec: Any, jobs: Any, token: Any, tmp_path: Path
) -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("the job's workers import torch: pip install torch==2.13.0 into the venv")
    program = tmp_path / "launch_report.py"
    program.write_text(PROGRAM, encoding="utf-8")
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "job": {
                    "name": "slurm-two-launches",
                    "command": ["python", str(program)],
                    "env": {"GLOO_SOCKET_IFNAME": "lo"},
                },
                "distributed": {
                    "launcher": "torchrun",
                    "backend": "slurm",
                    "nnodes": 2,
                    "nproc_per_node": 1,
                    "accelerator": "cpu",
                },
                "torchrun": {"rdzv_backend": "static"},
            }
        ),
        encoding="utf-8",
    )
    out = tmp_path / "out"
    plan = compile_spec(spec, out)
    assert plan["rendezvous"]["port_origin"] == "derived"
    sync = tmp_path / "sync"
    sync.mkdir()
    env = token.env(SYNC_DIR=str(sync))
    submitted = [jobs.submit(out, env) for _ in range(2)]
    for job_id in submitted:
        finished = jobs.wait(job_id, timeout=180)
        assert (finished.state, finished.exit_code) == ("COMPLETED", "0:0"), (
            f"job {job_id}: {finished.state} {finished.exit_code}:\n{finished.log[-6000:]}"
        )
    assert not token.leftovers()
    by_job: dict[str, list[dict[str, Any]]] = {}
    for path in sync.glob("*.json"):
        report = json.loads(path.read_text(encoding="utf-8"))
        by_job.setdefault(report["SLURM_JOB_ID"], []).append(report)
    assert sorted(by_job) == sorted(submitted)
    ports = {}
    for job_id, reports in by_job.items():
        assert sorted(r["rank"] for r in reports) == [0, 1]
        assert all(r["world"] == 2 and r["sum"] == 2.0 for r in reports), reports
        assert {r["MDC_LAUNCH_ID"] for r in reports} == {job_id}  # the job id, on every node
        (port,) = {int(r["MASTER_PORT"]) for r in reports}  # one port for the whole job
        start = hashed_port(job_id)
        assert start <= port < start + 100, (job_id, port, start)
        ports[job_id] = port
    assert len(set(ports.values())) == 2, ports
    overlapped = [json.loads(p.read_text(encoding="utf-8")) for p in sync.glob("*.both")]
    assert overlapped == [True] * 4  # both jobs held their rendezvous at the same time
