"""A real SLURM cluster on this machine for the slurm backend's tests.

``slurm_local.sh`` (beside this file) installs SLURM with apt when it is
missing and runs 4 emulated nodes, each with 8 fake GPUs, on 127.0.0.1. The
session fixture ``slurm_cluster`` (in ``cluster.py``, shared with the example
plugin's suite) brings it up once for every test process of the run and tears
down only what it started: a cluster that was already up stays up. Without
root, or without SLURM and apt-get, the tests that need it skip and say why
(under CI they fail: CI has both).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from tests.integration.slurm import cluster
from tests.integration.slurm.cluster import FAKE_GPUS, NODES, TIMES, Cluster

from mdc.rehearse.process import processes_with

#: the session fixture, shared with examples/mdc-mpi/tests (one cluster for every process)
slurm_cluster = cluster.slurm_cluster

HERE = Path(__file__).resolve().parent
#: the venv's bin: torchrun lives next to the interpreter running the tests
VENV_BIN = Path(sys.executable).parent
#: marks every process a job starts (sbatch passes the environment on), to find leftovers
TOKEN_VARIABLE = "MDC_TEST_RUN_TOKEN"
FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.nodeid.startswith("tests/integration/slurm/"):
        TIMES["tests"] = TIMES.get("tests", 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if "bring-up" in TIMES:
        terminalreporter.write_line(
            f"SLURM tier: cluster bring-up {TIMES['bring-up']:.1f} s, tests under "
            f"tests/integration/slurm {TIMES.get('tests', 0.0):.1f} s ({NODES} emulated nodes, "
            f"{FAKE_GPUS} fake GPUs each)"
        )


# ---------------------------------------------------------------- compiling and submitting


@attrs.frozen
class Finished:
    job_id: str
    state: str
    exit_code: str
    log: str
    seconds: float


class Jobs:
    """Submits batch jobs and waits for them; cancels whatever is still queued at the end."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.ids: list[str] = []

    def submit(
        self, out: Path, env: dict[str, str], *, cwd: Path | None = None, args: tuple[str, ...] = ()
    ) -> str:
        """``sbatch slurm/job.sbatch`` from inside OUT (or ``cwd``); returns the job id."""
        self.logs.mkdir(parents=True, exist_ok=True)
        script = out / "slurm" / "job.sbatch"
        done = subprocess.run(
            [
                "sbatch",
                "--parsable",
                f"--output={self.logs}/job-%j.out",
                *args,
                str(script) if cwd is not None else "slurm/job.sbatch",
            ],
            cwd=cwd or out,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"sbatch failed ({done.returncode}):\n{done.stderr}"
        job_id = done.stdout.strip().split(";")[0]
        assert job_id.isdigit(), done.stdout
        self.ids.append(job_id)
        return job_id

    def wait(self, job_id: str, timeout: float = 240) -> Finished:
        started = time.monotonic()
        state, exit_code = "", ""
        while time.monotonic() - started < timeout:
            shown = subprocess.run(
                ["scontrol", "show", "job", "-o", job_id],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            found = re.search(r"\bJobState=(\S+)", shown.stdout)
            code = re.search(r"\bExitCode=(\S+)", shown.stdout)
            state, exit_code = (found.group(1) if found else ""), (code.group(1) if code else "")
            if state in FINAL_STATES:
                break
            time.sleep(0.5)
        else:
            self.cancel(job_id)
            pytest.fail(
                f"job {job_id} did not finish within {timeout} s (state {state}); "
                f"log:\n{self.log(job_id)[-6000:]}"
            )
        return Finished(
            job_id=job_id,
            state=state,
            exit_code=exit_code,
            log=self.log(job_id),
            seconds=time.monotonic() - started,
        )

    def log(self, job_id: str) -> str:
        path = self.logs / f"job-{job_id}.out"
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""

    @staticmethod
    def cancel(job_id: str) -> None:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30, check=False)

    def cancel_all(self) -> None:
        for job_id in self.ids:
            self.cancel(job_id)


@pytest.fixture
def jobs(slurm_cluster: Cluster, tmp_path: Path) -> Iterator[Jobs]:
    submitted = Jobs(tmp_path / "logs")
    yield submitted
    submitted.cancel_all()  # a failed test's jobs do not stay queued or running


class RunToken:
    """Marks a test's jobs: every process they start carries ``TOKEN_VARIABLE=value``."""

    def __init__(self) -> None:
        self.value = uuid.uuid4().hex

    def env(self, **extra: str) -> dict[str, str]:
        """What sbatch passes on to the job: this environment without launcher and SLURM
        variables, the venv first on PATH, and the token."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PET_", "TORCHELASTIC_", "SLURM_", "SBATCH_", "SRUN_"))
            and k
            not in (
                "MASTER_ADDR",
                "MASTER_PORT",
                "NODE_RANK",
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "MDC_OUT",
            )
        }
        env.update(
            PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
            PYTHONUNBUFFERED="1",
            **{TOKEN_VARIABLE: self.value},
            **extra,
        )
        return env

    def processes(self) -> list[int]:
        """Live processes whose environment holds the token."""
        return processes_with(TOKEN_VARIABLE, self.value)

    def leftovers(self, grace: float = 10.0) -> list[str]:
        """Command lines of the token's processes still alive ``grace`` seconds from now."""
        deadline = time.monotonic() + grace
        while (pids := self.processes()) and time.monotonic() < deadline:
            time.sleep(0.2)
        lines = []
        for pid in pids:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                lines.append(f"{pid}: {cmdline.decode(errors='replace').strip()}")
            except OSError:
                continue
        return lines

    def kill_all(self) -> None:
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def token() -> Iterator[RunToken]:
    marked = RunToken()
    yield marked
    marked.kill_all()  # whatever a failed test left running
