"""Compiled jobs really run on SLURM: sbatch, srun, one task per node, the launchers.

Each test compiles a spec into a temporary directory (under /tmp, which every
emulated node sees, as a shared filesystem would be), submits
``slurm/job.sbatch`` with sbatch and waits for the job to end. The programs
write one report per rank (PROBE_DIR or DDP_CHECK_DIR); the tests compare them
with the plan. Every job is cancelled if its test fails, and processes left
behind are looked for through a token in the job's environment.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from tests.tools import REPO

import mdc
from mdc import emit
from mdc.api import Launch, LauncherSpec, Plan, Role
from mdc.errors import PluginOrigin
from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("loopback")]

HERE = Path(__file__).resolve().parent


def write_json(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def reports(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("rank-*.json"))]


def cpu_job(
    name: str,
    command: list[str],
    port: int,
    nnodes: int = 2,
    nproc: int = 2,
    launcher: str = "torchrun",
    **tables: Any,
) -> dict[str, Any]:
    return {
        "job": {"name": name, "command": command, "env": {"GLOO_SOCKET_IFNAME": "lo"}},
        "distributed": {
            "launcher": launcher,
            "backend": "slurm",
            "nnodes": nnodes,
            "nproc_per_node": nproc,
            "accelerator": "cpu",
            "master_port": port,
        },
        **tables,
    }


def needs_torch() -> None:
    """The job's workers import torch (from this venv); the test process does not."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip(
            "real runs need torch==2.13.0: run scripts/test, or pip install "
            "torch==2.13.0 into the venv"
        )


def assert_completed(finished: Any, token: Any) -> None:
    assert (finished.state, finished.exit_code) == ("COMPLETED", "0:0"), (
        f"job {finished.job_id}: {finished.state} {finished.exit_code}:\n{finished.log[-6000:]}"
    )
    left = token.leftovers()
    assert not left, "processes left behind after the job:\n" + "\n".join(left)


# ---------------------------------------------------------------- torchrun


@pytest.mark.torch
def test_torchrun_c10d_2x2_every_rank_reports(
    compile_spec: Any, jobs: Any, token: Any, tmp_path: Path
) -> None:
    """examples/ddp_check.py (gloo all-reduce and one DDP step) on 2 nodes x 2 processes."""
    needs_torch()
    spec = write_json(
        tmp_path / "spec.json",
        cpu_job(
            "slurm-ddp-c10d",
            ["python", str(REPO / "examples" / "ddp_check.py")],
            29811,
            torchrun={"rdzv_conf": {"join_timeout": 120}},
        ),
    )
    out, checks = tmp_path / "out", tmp_path / "reports"
    checks.mkdir()
    plan = compile_spec(spec, out)
    assert "--rdzv-backend c10d" in (out / "launch" / "worker.sh").read_text()

    finished = jobs.wait(jobs.submit(out, token.env(DDP_CHECK_DIR=str(checks))))
    assert_completed(finished, token)
    world, nproc = plan["world_size"], plan["nproc_per_node"]
    found = reports(checks)
    # c10d numbers the nodes in the order they join: compare as sets
    assert (
        sorted(r["RANK"] for r in found)
        == list(range(world))
        == sorted(r["dist_rank"] for r in found)
    )
    assert {r["GROUP_RANK"] for r in found} == set(range(plan["nnodes"]))
    for report in found:
        assert report["WORLD_SIZE"] == report["dist_world_size"] == world
        assert report["LOCAL_WORLD_SIZE"] == nproc
        assert report["RANK"] == report["GROUP_RANK"] * nproc + report["LOCAL_RANK"]
        assert report["allreduce"] == world * (world - 1) / 2


@pytest.mark.torch
def test_torchrun_static_ranks_follow_slurm_node_ids(
    compile_spec: Any, jobs: Any, token: Any, tmp_path: Path
) -> None:
    """Static rendezvous: node rank = SLURM_NODEID, node 0 on MASTER_ADDR; submitted from
    outside the tree with MDC_OUT."""
    needs_torch()
    spec = write_json(
        tmp_path / "spec.json",
        cpu_job(
            "slurm-static",
            ["python", str(HERE / "rank_probe.py")],
            29812,
            torchrun={"rdzv_backend": "static"},
        ),
    )
    out, probes, elsewhere = tmp_path / "out", tmp_path / "probes", tmp_path / "elsewhere"
    probes.mkdir()
    elsewhere.mkdir()
    plan = compile_spec(spec, out)

    finished = jobs.wait(
        jobs.submit(out, token.env(PROBE_DIR=str(probes), MDC_OUT=str(out)), cwd=elsewhere)
    )
    assert_completed(finished, token)
    nproc, world = plan["nproc_per_node"], plan["world_size"]
    found = {r["dist_rank"]: r for r in reports(probes)}
    assert sorted(found) == list(range(world))
    hosts: dict[int, set[str]] = {}
    for rank, report in found.items():
        node = int(report["NODE_RANK"])
        assert report["SLURM_NODEID"] == report["SLURM_PROCID"] == report["NODE_RANK"]
        assert report["SLURM_LOCALID"] == "0"  # one srun task per node
        assert int(report["GROUP_RANK"]) == node
        assert int(report["RANK"]) == rank == node * nproc + int(report["LOCAL_RANK"])
        assert report["WORLD_SIZE"] == str(world)
        assert report["MASTER_PORT"] == str(plan["rendezvous"]["master_port"])
        assert report["allreduce"] == world * (world - 1) / 2
        hosts.setdefault(node, set()).add(report["SLURMD_NODENAME"])
    # one host per node, node 0 on the first host of the allocation (MASTER_ADDR)
    assert all(len(names) == 1 for names in hosts.values()), hosts
    assert len({next(iter(names)) for names in hosts.values()}) == plan["nnodes"]
    assert hosts[0] == {found[0]["MASTER_ADDR"]}


def test_the_jobs_gpus_reach_every_node_task(
    compile_spec: Any, jobs: Any, token: Any, tmp_path: Path, slurm_cluster: Any
) -> None:
    """--gpus-per-node on the job, nothing on srun: each node's task still sees the node's
    GPUs (fake devices here), as every process the launcher starts does."""
    probes = tmp_path / "probes"
    probes.mkdir()
    line = 'echo "$NODE_RANK $CUDA_VISIBLE_DEVICES $SLURM_GPUS_ON_NODE" > "$PROBE_DIR/rank-$RANK"'
    data = cpu_job("slurm-gpus", ["bash", "-c", line], 29819, launcher="basic")
    data["distributed"]["accelerator"] = "nvidia"
    out = tmp_path / "out"
    compile_spec(write_json(tmp_path / "spec.json", data), out)
    assert "#SBATCH --gpus-per-node=2\n" in (out / "slurm" / "job.sbatch").read_text()
    finished = jobs.wait(jobs.submit(out, token.env(PROBE_DIR=str(probes))), timeout=120)
    assert_completed(finished, token)
    seen = {p.name: p.read_text().split() for p in probes.iterdir()}
    assert seen == {f"rank-{rank}": [str(rank // 2), "0,1", "2"] for rank in range(4)}


def test_a_cpu_job_gets_a_cpu_per_rank_and_no_gpu(
    compile_spec: Any, jobs: Any, token: Any, tmp_path: Path, slurm_cluster: Any
) -> None:
    """A CPU job asks nproc_per_node CPUs for each node's task and no GPU: whole nodes
    (--exclusive) would hand it every GPU of the node as well."""
    probes = tmp_path / "probes"
    probes.mkdir()
    line = (
        'echo "$NODE_RANK gpus=${CUDA_VISIBLE_DEVICES:-} on_node=${SLURM_GPUS_ON_NODE:-} '
        'cpus=$SLURM_CPUS_PER_TASK" > "$PROBE_DIR/rank-$RANK"'
    )
    out = tmp_path / "out"
    data = cpu_job("slurm-cpu", ["bash", "-c", line], 29820, launcher="basic")
    compile_spec(write_json(tmp_path / "spec.json", data), out)
    assert "#SBATCH --exclusive" not in (out / "slurm" / "job.sbatch").read_text()
    finished = jobs.wait(jobs.submit(out, token.env(PROBE_DIR=str(probes))), timeout=120)
    assert_completed(finished, token)
    seen = {p.name: p.read_text().split() for p in probes.iterdir()}
    assert seen == {
        f"rank-{rank}": [str(rank // 2), "gpus=", "on_node=", "cpus=2"] for rank in range(4)
    }


# ---------------------------------------------------------------- several roles, failures


def roles_launch(plan: Plan, options: object) -> Launch:
    """proxy, prefill and decode nodes each record their role; ROLE_FAIL fails one node,
    once every node has recorded its line (so the test can tell that all of them ran)."""

    def line(role: str) -> str:
        return (
            f'echo "{role} $NODE_RANK $SLURMD_NODENAME $MASTER_ADDR $MASTER_PORT" '
            '>> "$ROLE_LOG"; if [[ "$NODE_RANK" == "${ROLE_FAIL:-none}" ]]; then '
            f'for _ in {{1..600}}; do (( $(wc -l < "$ROLE_LOG") >= {plan.nnodes} )) && '
            "break; sleep 0.1; done; exit 3; "
            'fi; if [[ -n "${ROLE_FAIL:-}" ]]; then exec sleep 600; fi'
        )

    return Launch(
        roles=tuple(Role(name=r.name, argv=("bash", "-c", line(r.name))) for r in plan.roles)
    )


class RolesPlugin:
    @mdc.hookimpl
    def mdc_register_launchers(self) -> list[LauncherSpec]:
        return [
            LauncherSpec(
                name="roles",
                description="records each node's role",
                parallelism="data",
                disaggregated=True,
                emit=roles_launch,
            )
        ]


def compile_roles(tmp_path: Path, nnodes: int, port: int) -> Path:
    origin = PluginOrigin(entry_point="roles = tests", distribution="tests", version="0")
    compiler = Compiler(load_plugins(autoload=False, extra=[("roles", RolesPlugin(), origin)]))
    spec = write_json(
        tmp_path / "spec.json",
        cpu_job("slurm-roles", ["serve"], port, nnodes=nnodes, nproc=1, launcher="roles"),
    )
    out = tmp_path / "out"
    emit.write_tree(out, compiler.compile(spec).tree)
    return out


def test_every_node_runs_its_role(jobs: Any, token: Any, tmp_path: Path) -> None:
    out = compile_roles(tmp_path, nnodes=4, port=29813)
    log = tmp_path / "roles.log"
    finished = jobs.wait(jobs.submit(out, token.env(ROLE_LOG=str(log))), timeout=120)
    assert_completed(finished, token)
    lines = sorted(log.read_text().splitlines(), key=lambda line: int(line.split()[1]))
    # 4 nodes: max(1, 4 * 2 // 5) = 1 prefill node (node 0, also the router's), then 3
    # decode nodes; emulated nodes node1..node4, node 0 on the first of them
    assert lines == [
        f"{role} {node} node{node + 1} node1 29813"
        for node, role in enumerate(["prefill", "decode", "decode", "decode"])
    ]


def test_a_failing_node_ends_the_job_with_its_status(jobs: Any, token: Any, tmp_path: Path) -> None:
    """srun --kill-on-bad-exit=1: node 2 exits 3, the others (sleeping 10 minutes) are
    terminated. srun's status is the highest of its tasks' (143 for the terminated ones);
    its log names the task that failed first and that task's status."""
    out = compile_roles(tmp_path, nnodes=3, port=29814)
    log = tmp_path / "roles.log"
    finished = jobs.wait(jobs.submit(out, token.env(ROLE_LOG=str(log), ROLE_FAIL="2")), timeout=120)
    assert finished.state == "FAILED", f"{finished.state}:\n{finished.log}"
    assert finished.exit_code != "0:0"
    assert "node3: task 2: Exited with exit code 3" in finished.log, finished.log
    assert finished.seconds < 60, f"the job took {finished.seconds:.0f} s to end"
    assert len(log.read_text().splitlines()) == 3
    left = token.leftovers()
    assert not left, "processes left behind after the job:\n" + "\n".join(left)


def test_a_job_given_another_node_count_stops_before_srun(
    jobs: Any, token: Any, tmp_path: Path
) -> None:
    out = compile_roles(tmp_path, nnodes=3, port=29815)
    log = tmp_path / "roles.log"
    finished = jobs.wait(
        jobs.submit(out, token.env(ROLE_LOG=str(log)), args=("--nodes=2",)), timeout=120
    )
    assert (finished.state, finished.exit_code) == ("FAILED", "2:0"), finished.log
    assert "the job has 2 node(s); the plan needs exactly 3" in finished.log
    assert not log.exists()


def test_submitting_from_elsewhere_without_mdc_out_says_how(
    jobs: Any, token: Any, tmp_path: Path
) -> None:
    out = compile_roles(tmp_path, nnodes=3, port=29816)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    finished = jobs.wait(
        jobs.submit(out, token.env(ROLE_LOG=str(tmp_path / "roles.log")), cwd=elsewhere),
        timeout=120,
    )
    assert (finished.state, finished.exit_code) == ("FAILED", "2:0"), finished.log
    assert f"mdc: no compiled tree at '{elsewhere}'" in finished.log
    assert "cd OUT && sbatch slurm/job.sbatch" in finished.log


# ---------------------------------------------------------------- megatron, deepspeed


@pytest.mark.torch
def test_megatron_groups_form_on_slurm(
    compile_spec: Any, jobs: Any, token: Any, tmp_path: Path
) -> None:
    """The megatron launcher's arguments and env on 2 nodes x 4: tp 2, pp 2, dp 2; every
    TP/PP/DP/CP/DP-CP group of plan.json is formed and all-reduced in."""
    needs_torch()
    data = cpu_job(
        "slurm-megatron",
        ["python", str(HERE / "megatron_probe.py"), "--mock-data"],
        29817,
        nproc=4,
        launcher="megatron",
        parallelism={"tp": 2, "pp": 2},
        batch={"global_batch_size": 16, "micro_batch_size": 2},
        megatron={"extra_args": ["--distributed-backend", "gloo"]},
        torchrun={"rdzv_backend": "static"},
        # 4 ranks on the emulated nodes' fewer CPUs: whole nodes, not a CPU job's default of
        # one CPU per rank, which sbatch refuses there
        slurm={"exclusive": True},
    )
    out, probes = tmp_path / "out", tmp_path / "probes"
    probes.mkdir()
    plan = compile_spec(write_json(tmp_path / "spec.json", data), out)
    assert plan["parallelism"]["dp"] == 2 and plan["batch"]["grad_accum_steps"] == 4

    finished = jobs.wait(
        jobs.submit(out, token.env(PROBE_DIR=str(probes), PROBE_PLAN=str(out / "plan.json"))),
        timeout=300,
    )
    assert_completed(finished, token)
    found = reports(probes)
    assert sorted(r["rank"] for r in found) == list(range(plan["world_size"]))
    for report in found:
        assert report["problems"] == [], report
        rank = report["rank"]
        for kind in ("tp", "pp", "dp"):
            groups = plan["groups"][kind]["ranks"]
            assert report["groups"][kind] in groups and rank in report["groups"][kind]
            assert report["sums"][kind] == sum(report["groups"][kind])
        assert int(report["node_rank"]) == rank // plan["nproc_per_node"]
    # tp groups stay within a node (tp = 2 of 4 per node); pp groups span both nodes
    assert plan["groups"]["tp"]["ranks"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert plan["groups"]["pp"]["ranks"] == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.torch
def test_deepspeed_env_contract_on_slurm(
    compile_spec: Any, jobs: Any, token: Any, tmp_path: Path
) -> None:
    """The deepspeed launcher under SLURM: torchrun per node (static rendezvous) with
    LOCAL_SIZE/CROSS_RANK/CROSS_SIZE and --deepspeed_config; DeepSpeed itself starts."""
    needs_torch()
    data = cpu_job(
        "slurm-deepspeed",
        ["python", str(HERE / "deepspeed_probe.py")],
        29818,
        launcher="deepspeed",
        batch={"global_batch_size": 16, "micro_batch_size": 2},
        deepspeed={"zero_stage": 1},
    )
    out, probes = tmp_path / "out", tmp_path / "probes"
    probes.mkdir()
    plan = compile_spec(write_json(tmp_path / "spec.json", data), out)
    worker = (out / "launch" / "worker.sh").read_text(encoding="utf-8")
    assert "exec torchrun " in worker and "--rdzv-backend static" in worker

    finished = jobs.wait(
        jobs.submit(out, token.env(PROBE_DIR=str(probes), PROBE_PLAN=str(out / "plan.json"))),
        timeout=300,
    )
    assert_completed(finished, token)
    found = reports(probes)
    assert sorted(r["rank"] for r in found) == list(range(plan["world_size"]))
    for report in found:
        assert report["problems"] == [], report
        env = report["env"]
        assert env["CROSS_RANK"] == env["NODE_RANK"] == str(report["rank"] // 2)
        assert (env["LOCAL_SIZE"], env["CROSS_SIZE"]) == ("2", "2")
        assert report["config"] == str(out / "launch" / "ds_config.json")
