"""What a cluster admin checks of the slurm backend, proven on the test SLURM: an elastic
job gets up to its maximum of nodes, each node's task gets the node's CPUs, and setup and
teardown commands run around srun, the teardown also when a node fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import mdc
from mdc import emit
from mdc.api import Launch, LauncherSpec, Plan, Role
from mdc.errors import PluginOrigin
from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("loopback")]


def probe_launch(plan: Plan, options: object) -> Launch:
    """Each node records its rank, the job's node count and the CPUs its task got
    (SLURM_CPUS_ON_NODE in a step is the step's CPUs on that node); PROBE_FAIL fails a node,
    once every node has recorded (up to 10 s): srun then stops the others, which must not
    happen before they wrote their record, however loaded the machine."""
    line = (
        'echo "$NODE_RANK $SLURM_JOB_NUM_NODES $SLURM_CPUS_ON_NODE" > "$PROBE_DIR/node-$NODE_RANK"'
        '; if [[ "$NODE_RANK" == "${PROBE_FAIL:-none}" ]]; then'
        " for _ in {1..100}; do"
        ' (( $(ls "$PROBE_DIR" | wc -l) >= SLURM_JOB_NUM_NODES )) && break; sleep 0.1; done;'
        " exit 3; fi"
    )
    return Launch(roles=tuple(Role(name=r.name, argv=("bash", "-c", line)) for r in plan.roles))


class ProbePlugin:
    @mdc.hookimpl
    def mdc_register_launchers(self) -> list[LauncherSpec]:
        return [
            LauncherSpec(
                name="probe",
                description="records what SLURM gave each node",
                parallelism="data",
                emit=probe_launch,
            )
        ]


def compile_probe(tmp_path: Path, nnodes: int, min_nnodes: int | None = None, **slurm: Any) -> Path:
    origin = PluginOrigin(entry_point="probe = tests", distribution="tests", version="0")
    compiler = Compiler(load_plugins(autoload=False, extra=[("probe", ProbePlugin(), origin)]))
    distributed: dict[str, Any] = {
        "launcher": "probe",
        "backend": "slurm",
        "nnodes": nnodes,
        "nproc_per_node": 2,
        "accelerator": "cpu",
    }
    if min_nnodes is not None:
        distributed["min_nnodes"] = min_nnodes
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "job": {"name": "slurm-admin", "command": ["probe"]},
                "distributed": distributed,
                "slurm": slurm,
            }
        ),
        encoding="utf-8",
    )
    out = tmp_path / "out"
    emit.write_tree(out, compiler.compile(spec).tree)
    return out


def probes(folder: Path) -> dict[int, list[int]]:
    found = {}
    for path in folder.glob("node-*"):
        rank, nodes, cpus = (int(w) for w in path.read_text().split())
        found[rank] = [nodes, cpus]
    return found


def test_an_elastic_job_gets_its_maximum_of_idle_nodes(
    jobs: Any, token: Any, tmp_path: Path, slurm_cluster: Any
) -> None:
    """--nodes=1-3 with --ntasks-per-node=1 in the header got 1 node of 4 idle ones;
    what mdc writes gets 3."""
    out = compile_probe(tmp_path, nnodes=3, min_nnodes=1)
    header = (out / "slurm" / "job.sbatch").read_text()
    assert "#SBATCH --nodes=1-3\n" in header and "#SBATCH --ntasks-per-node" not in header
    folder = tmp_path / "probes"
    folder.mkdir()
    finished = jobs.wait(jobs.submit(out, token.env(PROBE_DIR=str(folder))), timeout=120)
    assert finished.state == "COMPLETED", finished.log
    assert sorted(probes(folder)) == [0, 1, 2], finished.log
    assert {nodes for nodes, _ in probes(folder).values()} == {3}


def test_the_old_header_gets_the_minimum(jobs: Any, token: Any, tmp_path: Path) -> None:
    """The same job with the directive the backend wrote before: SLURM sizes it from the
    minimum (1 task), and the batch script runs on 1 node."""
    out = compile_probe(tmp_path, nnodes=3, min_nnodes=1)
    folder = tmp_path / "probes"
    folder.mkdir()
    finished = jobs.wait(
        jobs.submit(out, token.env(PROBE_DIR=str(folder)), args=("--ntasks-per-node=1",)),
        timeout=120,
    )
    assert finished.state == "COMPLETED", finished.log
    assert {nodes for nodes, _ in probes(folder).values()} == {1}


def test_each_nodes_task_gets_every_cpu_of_its_node(
    jobs: Any, token: Any, tmp_path: Path, slurm_cluster: Any
) -> None:
    """exclusive = true (a CPU job's default is one CPU per rank, which leaves a GPU node's
    GPUs to others): the one task of each node gets all of its CPUs."""
    out = compile_probe(tmp_path, nnodes=2, exclusive=True)
    assert "#SBATCH --exclusive\n" in (out / "slurm" / "job.sbatch").read_text()
    folder = tmp_path / "probes"
    folder.mkdir()
    finished = jobs.wait(jobs.submit(out, token.env(PROBE_DIR=str(folder))), timeout=120)
    assert finished.state == "COMPLETED", finished.log
    assert probes(folder) == {0: [2, slurm_cluster.cpus], 1: [2, slurm_cluster.cpus]}


def test_without_exclusive_the_task_gets_one_cpu(
    jobs: Any, token: Any, tmp_path: Path, slurm_cluster: Any
) -> None:
    """What the warning MDC420 says: exclusive = false and no cpus_per_task leave each node's
    task (running every rank of the node) SLURM's default, 1 CPU."""
    if slurm_cluster.cpus < 2:
        pytest.skip("the emulated nodes have 1 CPU: 1 CPU is also the whole node")
    out = compile_probe(tmp_path, nnodes=2, exclusive=False)
    folder = tmp_path / "probes"
    folder.mkdir()
    finished = jobs.wait(jobs.submit(out, token.env(PROBE_DIR=str(folder))), timeout=120)
    assert finished.state == "COMPLETED", finished.log
    assert probes(folder) == {0: [2, 1], 1: [2, 1]}


@pytest.mark.parametrize("fail", [None, "1"], ids=["ok", "a-node-fails"])
def test_setup_and_teardown_run_around_srun(
    jobs: Any, token: Any, tmp_path: Path, fail: str | None
) -> None:
    log = tmp_path / "steps.log"
    folder = tmp_path / "probes"
    folder.mkdir()
    out = compile_probe(
        tmp_path,
        nnodes=2,
        setup=[["bash", "-c", f"echo setup >> {log}; ls {folder} >> {log}"], ["true"]],
        teardown=[
            ["false"],  # reported; the next still runs and the job keeps srun's status
            ["bash", "-c", f"echo teardown $(ls {folder} | wc -l) >> {log}"],
        ],
    )
    env = token.env(PROBE_DIR=str(folder), **({"PROBE_FAIL": fail} if fail else {}))
    finished = jobs.wait(jobs.submit(out, env), timeout=120)
    # setup ran before any node (the folder was empty), teardown after both
    assert log.read_text().splitlines() == ["setup", "teardown 2"], finished.log
    assert "mdc: [slurm] teardown command 1 exited with status 1" in finished.log
    if fail:
        assert finished.state == "FAILED" and finished.exit_code.startswith("3:"), finished.log
    else:
        assert (finished.state, finished.exit_code) == ("COMPLETED", "0:0"), finished.log
