"""The plugin's tests use mdc's own golden harness, as any plugin author can."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

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


def _mdc_slurm_cluster() -> ModuleType:
    """mdc's emulated SLURM cluster (this plugin lives in mdc's repository): the module with
    its session fixture, loaded from its file so this suite also runs from its own folder."""
    path = ROOT.parent.parent / "tests" / "integration" / "slurm" / "cluster.py"
    spec = importlib.util.spec_from_file_location("mdc_tests_slurm_cluster", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: the same fixture as mdc's SLURM tier: one cluster for every test process of the run,
#: torn down by the last user and only if the run started it
slurm_cluster = _mdc_slurm_cluster().slurm_cluster
