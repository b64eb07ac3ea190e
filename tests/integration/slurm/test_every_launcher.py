"""Every training launcher compiles for the local, ssh and slurm backends, and every script
mdc writes for them (job.sbatch included) passes ``bash -n`` and shellcheck.

The specs are ``specs/<launcher>.toml``; the backend is swapped in the data
(ssh gets one host per node). No cluster is needed here.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.tools import REPO, shellcheck, spec_data

from mdc.loaders import load_file
from mdc.plugin_manager import load_plugins

# bash -n and shellcheck only: no cluster, no port, so not in the xdist_group "loopback"
pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
Compile = Callable[..., dict[str, Any]]

REGISTERED = set(load_plugins(autoload=False).launchers)
SPECS = sorted(
    p
    for p in (HERE / "specs").glob("*.toml")
    if spec_data(load_file(p))["distributed"]["launcher"] in REGISTERED
)
EXAMPLES = sorted(
    p
    for p in (REPO / "examples").iterdir()
    if p.name.startswith(("slurm-", "ssh-")) and p.suffix in (".toml", ".yaml", ".yml", ".json")
)


def lint(out: Path) -> None:
    scripts = sorted([*out.rglob("*.sh"), *out.rglob("*.sbatch")])
    assert scripts
    checker = shellcheck()
    for script in scripts:
        parsed = subprocess.run(
            ["bash", "-n", str(script)], capture_output=True, text=True, check=False
        )
        assert parsed.returncode == 0, f"bash -n {script.relative_to(out)}:\n{parsed.stderr}"
        linted = subprocess.run(
            [checker, "--norc", "-S", "style", str(script)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert linted.returncode == 0, (
            f"shellcheck {script.relative_to(out)}:\n{linted.stdout}{linted.stderr}"
        )


@pytest.mark.parametrize("backend", ["local", "ssh", "slurm"])
@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_launcher_compiles_for_backend(
    spec: Path, backend: str, compile_spec: Compile, tmp_path: Path
) -> None:
    data = spec_data(load_file(spec))
    data["distributed"]["backend"] = backend
    nnodes = data["distributed"]["nnodes"]
    if backend != "slurm":
        data.pop("slurm", None)
        data["job"].pop("image", None)  # only the slurm backend runs containers
    if backend == "ssh":
        data["ssh"] = {"hosts": [f"gpu{i + 1}" for i in range(nnodes)]}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    out = tmp_path / "out"
    plan = compile_spec(path, out)
    assert (plan["launcher"], plan["backend"]) == (data["distributed"]["launcher"], backend)
    wanted = {
        "local": ["local/run.sh"],
        "ssh": ["ssh/hostfile", "ssh/launch.sh"],
        "slurm": ["slurm/job.sbatch", "slurm/node.sh"],
    }[backend]
    assert sorted(p.relative_to(out).as_posix() for p in (out / backend).iterdir()) == wanted
    lint(out)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_scripts_pass_shellcheck(
    example: Path, compile_spec: Compile, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    compile_spec(example, out)
    lint(out)
