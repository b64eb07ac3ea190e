"""The plugin's tests use mdc's own golden harness, as any plugin author can."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from mdc.testing import in_ci

#: mdc.testing: --update-golden, and the golden, golden_root, mdc_plugins, mdc_cli fixtures
pytest_plugins = ["mdc.testing"]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def golden_root() -> Path:
    """This distribution's goldens: examples/mdc-mpi/golden/."""
    return ROOT / "golden"


@pytest.fixture
def mdc_plugins() -> tuple[str, ...]:
    """mdc's own plugins plus this one, whatever else is installed."""
    return ("mpirun",)


@pytest.fixture
def at_plugin_root(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Compile from examples/mdc-mpi, so spec paths (and the commands) are relative to it."""
    monkeypatch.chdir(ROOT)
    return ROOT


@pytest.fixture(scope="session")
def openmpi() -> str:
    """The path of Open MPI's mpirun; installed with apt (openmpi-bin) when missing.

    Without root or apt-get the test cannot run: a skip on a developer's machine, a
    failure under CI (which has both).
    """
    found = shutil.which("mpirun")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (
            ["apt-get", "update"],
            ["apt-get", "install", "-y", "--no-install-recommends", "openmpi-bin"],
        ):
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=900, check=False
            )
            if done.returncode != 0:
                pytest.fail(
                    f"{' '.join(command)} failed ({done.returncode}):\n"
                    f"{done.stdout[-3000:]}{done.stderr[-3000:]}"
                )
        found = shutil.which("mpirun")
    if found is None:
        why = (
            "Open MPI's mpirun is not installed and cannot be (needs root and apt-get: "
            "apt-get install openmpi-bin)"
        )
        if in_ci():
            pytest.fail(why)
        pytest.skip(why)
    return found


#: mdc's own emulated SLURM cluster (this plugin lives in mdc's repository)
SLURM_LOCAL = ROOT.parent.parent / "tests" / "integration" / "slurm" / "slurm_local.sh"
#: the settings mdc's SLURM tier uses, so that both share one running cluster
SLURM_SETTINGS = {"MDC_SLURM_NODES": "4", "MDC_SLURM_FAKE_GPUS": "8"}


def _slurm_local(action: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SLURM_LOCAL), action],
        env={**os.environ, **SLURM_SETTINGS},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[None]:
    """A real SLURM cluster on this machine (mdc's slurm_local.sh: apt-installs SLURM when
    missing). Torn down only if this session started it."""
    if os.geteuid() != 0 or not SLURM_LOCAL.is_file():
        why = f"the SLURM test needs root and {SLURM_LOCAL}"
        if in_ci():
            pytest.fail(why)
        pytest.skip(why)
    was_up = _slurm_local("status", 60).returncode == 0
    up = _slurm_local("up", 900)
    if up.returncode != 0:
        pytest.fail(f"slurm_local.sh up failed ({up.returncode}):\n{up.stdout}{up.stderr}")
    yield
    if not was_up:
        down = _slurm_local("down", 120)
        assert down.returncode == 0, f"slurm_local.sh down failed:\n{down.stderr}"
