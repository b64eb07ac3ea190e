"""The emulated SLURM cluster, shared by every test process of a run.

mdc's SLURM tier (``tests/integration/slurm``) and the example plugin's suite
(``examples/mdc-mpi/tests``) both need the cluster ``slurm_local.sh`` runs. Under
pytest-xdist each worker is its own process with its own session fixtures, so a
session fixture alone would let one worker stop the cluster while another's job
runs on it. :func:`shared` counts the users in a file under the run's temporary
root, behind a lock: the first user brings the cluster up, the last one tears it
down, and only if the run started it (a cluster that was already up stays up).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest

from mdc.testing import in_ci

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "slurm_local.sh"
NODES = 4
FAKE_GPUS = 8
#: seconds spent bringing the cluster up (by this process), and in the SLURM tier's tests
TIMES: dict[str, float] = {}


@attrs.frozen
class Cluster:
    nodes: int
    gpus_per_node: int
    partitions: tuple[str, ...]
    #: CPUs of each emulated node (slurm.conf gives each this machine's count)
    cpus: int


def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary directory every process of this pytest run shares.

    A pytest-xdist worker's base directory is ``<root>/popen-gwN``; without xdist the
    base directory is the run's own.
    """
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def shared(
    root: Path,
    name: str,
    *,
    is_up: Callable[[], bool],
    up: Callable[[], None],
    down: Callable[[], None],
) -> Iterator[None]:
    """Hold the resource ``name`` for the ``with`` block, with every other holder of this run.

    ``up`` runs for the first holder (it must be safe on a running resource), ``down``
    after the last one, and only if ``is_up`` said no before the first ``up``. A failed
    ``up`` counts no holder, so the next one tries again.
    """
    lock, state = root / f"{name}.lock", root / f"{name}.json"
    with _locked(lock):
        held = json.loads(state.read_text()) if state.exists() else {"users": 0}
        if held["users"] == 0:
            started = not is_up()
            up()
            held = {"users": 0, "started": started}
        held["users"] += 1
        state.write_text(json.dumps(held))
    try:
        yield
    finally:
        with _locked(lock):
            held = json.loads(state.read_text())
            held["users"] -= 1
            state.write_text(json.dumps(held))
            if held["users"] == 0 and held["started"]:
                down()


def installed() -> bool:
    return all(
        Path(p).is_file()
        for p in ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/sbatch", "/usr/sbin/munged")
    )


def script(action: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MDC_SLURM_NODES": str(NODES), "MDC_SLURM_FAKE_GPUS": str(FAKE_GPUS)}
    return subprocess.run(
        ["bash", str(SCRIPT), action],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _up() -> None:
    started = time.monotonic()
    done = script("up")
    TIMES["bring-up"] = time.monotonic() - started
    if done.returncode != 0:
        pytest.fail(f"slurm_local.sh up failed ({done.returncode}):\n{done.stdout}{done.stderr}")


def _down() -> None:
    done = script("down", timeout=120)
    assert done.returncode == 0, f"slurm_local.sh down failed:\n{done.stderr}"


def _cannot_run(why: str) -> None:
    """Skip, and say why; under CI, fail (CI has root and apt-get)."""
    if in_ci():
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The running cluster: 4 emulated nodes with 8 fake GPUs each, on 127.0.0.1."""
    if os.geteuid() != 0:
        _cannot_run(
            "the SLURM tests run a real cluster on this machine and need root "
            "(tests/integration/slurm/slurm_local.sh up)"
        )
    if not installed() and shutil.which("apt-get") is None:
        _cannot_run(
            "SLURM is not installed and there is no apt-get to install it "
            "(munge slurmctld slurmd slurm-client)"
        )
    with shared(
        run_root(tmp_path_factory),
        "slurm-cluster",
        is_up=lambda: installed() and script("status", timeout=60).returncode == 0,
        up=_up,
        down=_down,
    ):
        partitions = subprocess.run(
            ["sinfo", "-h", "-o", "%R"], capture_output=True, text=True, check=True
        ).stdout.split()
        cpus = int(
            subprocess.run(
                ["sinfo", "-h", "-o", "%c"], capture_output=True, text=True, check=True
            ).stdout.split()[0]
        )
        yield Cluster(nodes=NODES, gpus_per_node=FAKE_GPUS, partitions=tuple(partitions), cpus=cpus)
