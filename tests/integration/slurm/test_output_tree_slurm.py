"""A job's log in the compiled tree survives recompiles, on the real SLURM.

``cd OUT && sbatch slurm/job.sbatch`` (what mdc's job.sbatch says to do) makes SLURM write
the job's output to ``OUT/slurm-<jobid>.out``. mdc did not write that file: recompiling the
spec, while the job runs and after it ended, replaces mdc's files and leaves the log where
SLURM writes it, so the lines the job prints after the recompile are in it too.
"""

from __future__ import annotations

import io
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from mdc.cli import main

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("loopback"),
    pytest.mark.usefixtures("no_ambient_plugins"),
]

#: each node says it started, waits for GO (at most a minute), then says it ended
NODE_PROGRAM = (
    'echo "node $NODE_RANK started"; '
    'for _ in $(seq 600); do [[ -e "$GO" ]] && break; sleep 0.1; done; '
    'echo "node $NODE_RANK ended"'
)


def spec(tmp_path: Path, name: str) -> Path:
    data: dict[str, Any] = {
        "job": {"name": name, "command": ["bash", "-c", NODE_PROGRAM]},
        "distributed": {
            "launcher": "basic",
            "backend": "slurm",
            "nnodes": 2,
            "nproc_per_node": 1,
            "accelerator": "cpu",
        },
    }
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def compile_(spec_path: Path, out: Path, *more: str) -> int:
    stderr = io.StringIO()
    code = main(["compile", str(spec_path), "-o", str(out), "-q", *more], stderr=stderr)
    assert code in (0, 1), stderr.getvalue()
    return code


def submit(out: Path, env: dict[str, str]) -> str:
    """``cd OUT && sbatch slurm/job.sbatch``, as job.sbatch tells: no --output of ours."""
    done = subprocess.run(
        ["sbatch", "--parsable", "slurm/job.sbatch"],
        cwd=out,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"sbatch failed ({done.returncode}):\n{done.stderr}"
    job_id = done.stdout.strip().split(";")[0]
    assert job_id.isdigit(), done.stdout
    return job_id


def wait_for_line(log: Path, text: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    shown = log.read_text(errors="replace") if log.exists() else "(no file)"
    pytest.fail(f"{log} did not get {text!r} within {timeout} s:\n{shown}")


def test_the_jobs_log_in_the_tree_survives_recompiles(
    jobs: Any, token: Any, tmp_path: Path
) -> None:
    out, go = tmp_path / "out", tmp_path / "go"
    first, second = spec(tmp_path, "log-first"), spec(tmp_path, "log-second")
    compile_(first, out)
    job_id = submit(out, token.env(GO=str(go)))
    jobs.ids.append(job_id)  # cancelled if the test fails
    log = out / f"slurm-{job_id}.out"
    wait_for_line(log, "node 1 started")
    wait_for_line(log, "node 0 started")

    compile_(first, out)  # while the job runs
    compile_(second, out)
    assert log.is_file(), sorted(p.name for p in out.iterdir())
    go.touch()
    finished = jobs.wait(job_id, timeout=120)
    text = log.read_text(errors="replace")
    assert (finished.state, finished.exit_code) == ("COMPLETED", "0:0"), text
    assert {"node 0 ended", "node 1 ended"} <= set(text.splitlines()), text

    compile_(first, out)  # after it ended
    assert log.read_text(errors="replace") == text
    assert compile_(first, out, "--check") == 0
    assert json.loads((out / "manifest.json").read_text())["files"].keys().isdisjoint({log.name})
    left = token.leftovers()
    assert not left, "processes left behind after the job:\n" + "\n".join(left)
