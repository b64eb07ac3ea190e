"""Every compiled job.sbatch is accepted by a real sbatch (``--test-only``).

``sbatch --test-only`` parses the script's #SBATCH lines as a submission would
(an unknown option or a malformed value is refused) and asks the controller
whether the request fits the cluster (nodes, GPUs per node, memory, time,
partition), without running anything. Covered: every example whose backend is
slurm, and one spec per launcher in ``specs/`` (the disaggregated one has
slurm examples of its own). The local cluster has
4 nodes with 8 fake GPUs each, this machine's CPUs and 4000 MB, and one
partition, ``debug``. What a site's example asks beyond that (its partition
name, more nodes, CPUs or memory than the emulation has) is scaled down on the
command line, which takes precedence over #SBATCH lines: sbatch still parses
and checks every directive as written, and the rest is submitted as written.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.tools import REPO

from mdc.loaders import load_file
from mdc.plugin_manager import load_plugins

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("loopback")]

HERE = Path(__file__).resolve().parent
SPECS = HERE / "specs"
Compile = Callable[..., dict[str, Any]]


def backend_of(path: Path) -> str | None:
    data = load_file(path).data
    backend = data.get("distributed", {}).get("backend") if isinstance(data, dict) else None
    return backend if isinstance(backend, str) else None


def launcher_of(path: Path) -> str:
    data = load_file(path).data
    assert isinstance(data, dict)
    launcher: str = data["distributed"]["launcher"]
    return launcher


REGISTERED = set(load_plugins(autoload=False).launchers)
SLURM_EXAMPLES = sorted(
    p
    for p in (REPO / "examples").iterdir()
    if p.suffix in (".toml", ".yaml", ".yml", ".json") and backend_of(p) == "slurm"
)
LAUNCHER_SPECS = sorted(p for p in SPECS.glob("*.toml") if launcher_of(p) in REGISTERED)
CASES = [
    *[pytest.param(p, id=f"examples/{p.name}") for p in SLURM_EXAMPLES],
    *[pytest.param(p, id=f"specs/{p.name}") for p in LAUNCHER_SPECS],
]


def test_examples_and_specs_are_found() -> None:
    assert [p.name for p in SLURM_EXAMPLES], "no example uses the slurm backend"
    assert all(backend_of(p) == "slurm" for p in LAUNCHER_SPECS)


def test_every_launcher_has_a_slurm_spec() -> None:
    plugins = load_plugins(autoload=False)
    wanted = {name for name in plugins.launchers if not plugins.launcher(name).disaggregated}
    have = {launcher_of(p) for p in SPECS.glob("*.toml")}
    assert wanted <= have, f"no spec in {SPECS.relative_to(REPO)} for: {sorted(wanted - have)}"


def directive(script: str, name: str) -> str | None:
    found = re.search(rf"^#SBATCH --{name}=(\S+)$", script, re.MULTILINE)
    return found.group(1) if found else None


def sbatch_test_only(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sbatch", "--test-only", *args, "slurm/job.sbatch"],
        cwd=out,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("spec", CASES)
def test_sbatch_accepts_the_batch_script(
    spec: Path, slurm_cluster: Any, compile_spec: Compile, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    plan = compile_spec(spec, out)
    script = (out / "slurm" / "job.sbatch").read_text(encoding="utf-8")
    args = []
    partition = directive(script, "partition")
    if partition is not None and partition not in slurm_cluster.partitions:
        args.append(f"--partition={slurm_cluster.partitions[0]}")
    nodes = plan["min_nnodes"]
    if nodes > slurm_cluster.nodes:
        nodes = slurm_cluster.nodes
        args.append(f"--nodes={nodes}")
    else:  # an elastic job (--nodes=MIN-MAX) gets up to MAX idle nodes
        nodes = min(plan["nnodes"], slurm_cluster.nodes)
    cpus = directive(script, "cpus-per-task")
    if cpus is not None and int(cpus) > slurm_cluster.cpus:
        args.append(f"--cpus-per-task={slurm_cluster.cpus}")
    if directive(script, "mem") is not None:
        args.append("--mem=0")  # all of a node's memory, whatever the example asks
    done = sbatch_test_only(out, *args)
    assert done.returncode == 0, f"sbatch --test-only {' '.join(args)} refused:\n{done.stderr}"
    # "sbatch: Job N to start at ... on nodes node[1-2] in partition debug"
    started = re.search(r"Job \d+ to start at \S+ using \d+ processors on nodes (\S+)", done.stderr)
    assert started, done.stderr
    expected = "node1" if nodes == 1 else f"node[1-{nodes}]"  # sbatch's hostlist form
    assert started.group(1) == expected, done.stderr


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({"gpus_per_node": 9}, "Requested node configuration is not available"),
        ({"mem": "64G"}, "Requested node configuration is not available"),
        ({"partition": "nosuch"}, "invalid partition specified: nosuch"),
        ({"sbatch_args": ["--no-such-option"]}, "unrecognized option '--no-such-option'"),
    ],
)
def test_sbatch_refuses_what_the_cluster_cannot_give(
    change: dict[str, Any], refusal: str, slurm_cluster: Any, compile_spec: Compile, tmp_path: Path
) -> None:
    """The check is real: the same script with one impossible request is refused."""
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "job": {"name": "too-big", "command": ["python", "train.py"]},
                "distributed": {
                    "launcher": "torchrun",
                    "backend": "slurm",
                    "nnodes": 2,
                    "nproc_per_node": 8,
                    "accelerator": "nvidia",
                },
                "slurm": change,
            }
        ),
        encoding="utf-8",
    )
    out = tmp_path / "out"
    compile_spec(spec, out)
    done = sbatch_test_only(out)
    assert done.returncode != 0, done.stderr
    assert refusal in done.stderr, done.stderr
    # the same script with the request put right on the command line is accepted (an unknown
    # option in the script cannot be put right that way)
    fixed = sbatch_test_only(out, "--gpus-per-node=8", "--mem=0", "--partition=debug")
    assert (fixed.returncode == 0) == ("sbatch_args" not in change), fixed.stderr
