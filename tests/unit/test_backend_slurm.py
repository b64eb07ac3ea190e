"""The slurm backend: #SBATCH directives, checks, containers, and the scripts run without SLURM.

Specs go through the whole compiler (schema, plan, launcher, backend). The
scripts are also run here against stand-ins for ``srun``, ``scontrol`` and
``module`` on PATH, so role dispatch, node ranks, the tree lookup and quoting
are checked without a cluster; ``tests/integration/slurm/`` runs them on a
real one.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.tools import hashed_port

import mdc
from mdc import emit
from mdc.api import Launch, LauncherSpec, Plan, Role
from mdc.errors import Diagnostic, PluginOrigin, SpecError
from mdc.pipeline import Compiled, Compiler
from mdc.plugin_manager import load_plugins
from mdc_builtin.backends.slurm import apptainer_image, pyxis_image


def roles_launch(plan: Plan, options: object) -> Launch:
    """Each role prints its name, node rank, rendezvous address and launch id."""
    return Launch(
        roles=tuple(
            Role(
                name=r.name,
                argv=(
                    "bash",
                    "-c",
                    (
                        f'echo "{r.name} $NODE_RANK $MASTER_ADDR:$MASTER_PORT $MDC_LAUNCH_ID"'
                        ' >> "$ROLE_LOG"'
                    ),
                ),
            )
            for r in plan.roles
        )
    )


class RolesPlugin:
    """A disaggregated launcher (proxy, prefill and decode nodes), as serving launchers have."""

    @mdc.hookimpl
    def mdc_register_launchers(self) -> list[LauncherSpec]:
        return [
            LauncherSpec(
                name="roles",
                description="prints each node's role",
                parallelism="data",
                disaggregated=True,
                emit=roles_launch,
            )
        ]


@pytest.fixture(scope="module")
def compiler() -> Compiler:
    origin = PluginOrigin(entry_point="roles = tests", distribution="tests", version="0")
    return Compiler(load_plugins(autoload=False, extra=[("roles", RolesPlugin(), origin)]))


def spec(**tables: Any) -> dict[str, Any]:
    """A 2 x 8 nvidia torchrun job on slurm; ``tables`` replace or add whole tables."""
    data: dict[str, Any] = {
        "job": {"name": "unit", "command": ["python", "train.py"]},
        "distributed": {
            "launcher": "torchrun",
            "backend": "slurm",
            "nnodes": 2,
            "nproc_per_node": 8,
            "accelerator": "nvidia",
            "master_port": 29400,
        },
    }
    data.update(tables)
    return data


def compile_data(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> Compiled:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return compiler.compile(path)


def files(compiled: Compiled) -> dict[str, str]:
    return {a.path: a.data.decode() for a in compiled.tree}


def errors(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> list[Diagnostic]:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(SpecError) as raised:
        compiler.compile(path)
    return list(raised.value.diagnostics)


def sbatch_lines(script: str) -> list[str]:
    return [
        line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")
    ]


# ---------------------------------------------------------------- directives


def test_directives_come_from_the_plan_and_the_table(compiler: Compiler, tmp_path: Path) -> None:
    table = {
        "partition": "batch",
        "account": "llm",
        "qos": "high",
        "time": "2-00:00:00",
        "constraint": "h100&ib",
        "exclusive": True,
        "nodelist": "gpu[01-02]",
        "exclude": "gpu07",
        "mem": "0",
        "cpus_per_task": 96,
        "output": "logs/%x-%j.out",
        "error": "logs/%x-%j.err",
        "sbatch_args": ["--reservation=big", "--requeue"],
    }
    out = files(compile_data(compiler, tmp_path, spec(slurm=table)))
    assert out["slurm/job.sbatch"].startswith("#!/bin/bash\n#SBATCH ")
    assert sbatch_lines(out["slurm/job.sbatch"]) == [
        "--job-name=unit",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--gpus-per-node=8",
        "--cpus-per-task=96",
        "--mem=0",
        "--time=2-00:00:00",
        "--partition=batch",
        "--account=llm",
        "--qos=high",
        "--constraint=h100&ib",
        "--nodelist=gpu[01-02]",
        "--exclude=gpu07",
        "--output=logs/%x-%j.out",
        "--error=logs/%x-%j.err",
        "--exclusive",
        "--reservation=big",
        "--requeue",
    ]
    # srun does not inherit --cpus-per-task from the job: it is repeated there
    assert "--cpus-per-task=96 \\\n" in out["slurm/job.sbatch"]


def test_a_bare_spec_asks_only_for_what_the_plan_needs(compiler: Compiler, tmp_path: Path) -> None:
    compiled = compile_data(compiler, tmp_path, spec())
    out = files(compiled)
    assert sbatch_lines(out["slurm/job.sbatch"]) == [
        "--job-name=unit",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--gpus-per-node=8",
        "--exclusive",  # the node's one task gets every CPU (no cpus_per_task)
    ]
    assert compiled.diagnostics == ()
    assert compiled.plan.hosts is None  # SLURM names the hosts only when the job runs
    assert sorted(p for p in out if p.startswith("slurm/")) == ["slurm/job.sbatch", "slurm/node.sh"]
    modes = {a.path: a.executable for a in compiled.tree}
    assert modes["slurm/job.sbatch"] and modes["slurm/node.sh"]
    assert "export MASTER_PORT=29400\n" in out["slurm/job.sbatch"]


@pytest.mark.parametrize(
    ("accelerator", "gpus", "directive", "warned"),
    [
        ("nvidia", None, "--gpus-per-node=8", False),
        ("amd", None, "--gpus-per-node=8", False),
        ("cpu", None, None, False),
        ("cpu", 2, "--gpus-per-node=2", False),
        ("nvidia", "h100:8", "--gpus-per-node=h100:8", False),
        ("nvidia", 4, "--gpus-per-node=4", True),
        ("nvidia", 0, None, True),
    ],
)
def test_gpus_per_node(
    compiler: Compiler,
    tmp_path: Path,
    accelerator: str,
    gpus: Any,
    directive: str | None,
    warned: bool,
) -> None:
    data = spec(slurm={} if gpus is None else {"gpus_per_node": gpus})
    data["distributed"]["accelerator"] = accelerator
    compiled = compile_data(compiler, tmp_path, data)
    lines = [
        d
        for d in sbatch_lines(files(compiled)["slurm/job.sbatch"])
        if d.startswith("--gpus-per-node")
    ]
    assert lines == ([directive] if directive else [])
    assert [d.code for d in compiled.diagnostics] == (["MDC419"] if warned else [])


def test_an_elastic_job_asks_for_a_node_range(compiler: Compiler, tmp_path: Path) -> None:
    data = spec()
    data["distributed"].update(nnodes=4, min_nnodes=2)
    out = files(compile_data(compiler, tmp_path, data))["slurm/job.sbatch"]
    assert "--nodes=2-4" in sbatch_lines(out)
    assert "if ((nodes < 2 || nodes > 4)); then" in out
    assert '"--nodes=${nodes}" \\\n  "--ntasks=${nodes}"' in out


@pytest.mark.parametrize(
    ("min_nnodes", "nodes", "said"),
    [
        (2, 2, ""),
        (2, 4, ""),
        (2, 1, "mdc: the job has 1 node(s); the plan runs on 2 to 4\n"),
        (2, 5, "mdc: the job has 5 node(s); the plan runs on 2 to 4\n"),
        (None, 4, ""),
        (
            None,
            3,
            "mdc: the job has 3 node(s); the plan needs exactly 4 (was --nodes given to sbatch?)\n",
        ),
    ],
)
def test_the_node_count_check_runs_in_bash(
    compiler: Compiler, tmp_path: Path, min_nnodes: int | None, nodes: int, said: str
) -> None:
    """The batch script's node count lines, run by bash: an allocation inside the plan's
    range (exactly nnodes when not elastic) passes, another stops with exit 2."""
    from mdc_builtin.backends.slurm import _node_count_check

    data = spec()
    data["distributed"].update(nnodes=4, **({"min_nnodes": min_nnodes} if min_nnodes else {}))
    lines = _node_count_check(compile_data(compiler, tmp_path, data).plan)
    done = subprocess.run(
        ["bash", "-c", "\n".join([f"nodes={nodes}", *lines])],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stderr) == (2 if said else 0, said)


# ---------------------------------------------------------------- checks


@pytest.mark.parametrize(
    ("key", "value", "code"),
    [
        ("partition", "gpu a", "MDC412"),
        ("account", "llm#1", "MDC412"),
        ("qos", "it's", "MDC412"),
        ("output", "/logs/a\nb", "MDC412"),
        ("constraint", 'a"b', "MDC412"),
        ("nodelist", "gpu\\01", "MDC412"),
        ("time", "tomorrow", "MDC415"),
        ("time", "1:2:3:4", "MDC415"),
        ("time", "1.5", "MDC415"),
        ("mem", "64 GB", "MDC412"),
        ("mem", "lots", "MDC416"),
        ("mem", "1.5G", "MDC416"),
        ("gpus_per_node", "eight", "MDC417"),
    ],
)
def test_values_an_sbatch_line_cannot_carry_are_refused(
    compiler: Compiler, tmp_path: Path, key: str, value: str, code: str
) -> None:
    found = errors(compiler, tmp_path, spec(slurm={key: value}))
    assert [(d.code, d.location.pointer) for d in found] == [(code, f"/slurm/{key}")]
    assert repr(value) in found[0].message and found[0].hint


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("time", 90),
        ("time", "30:00"),
        ("time", "12:00:00"),
        ("time", "2-00"),
        ("time", "2-00:00:00"),
        ("time", "UNLIMITED"),
        ("time", "infinite"),
        ("mem", 64000),
        ("mem", "0"),
        ("mem", "480G"),
        ("mem", "1GB"),
        ("mem", "512m"),
    ],
)
def test_values_sbatch_accepts_pass(
    compiler: Compiler, tmp_path: Path, key: str, value: Any
) -> None:
    out = files(compile_data(compiler, tmp_path, spec(slurm={key: value})))
    assert f"--{key}={value}" in sbatch_lines(out["slurm/job.sbatch"])


@pytest.mark.parametrize(
    ("arg", "says"),
    [
        ("-p gpu", "is not a long sbatch option"),
        ("reservation=big", "is not a long sbatch option"),
        ("--partition=gpu", "repeats --partition, which mdc writes itself"),
        ("--exclusive", "repeats --exclusive"),
        ("--nodes=4", "repeats --nodes"),
        ("--ntasks=16", "contradicts --nodes and --ntasks-per-node"),
        ("--gres=gpu:8", "contradicts --gpus-per-node"),
        ("--mem-per-cpu=4G", "contradicts --mem"),
        ("--wrap=hostname", "contradicts the batch script, which mdc writes"),
        ("--part=gpu", "abbreviates --partition"),
        ("--excl", "abbreviates --exclude"),
        ("--reservation=a b", "holds a space"),
        ("--comment=#1", "holds '#'"),
    ],
)
def test_sbatch_args_must_be_new_long_options(
    compiler: Compiler, tmp_path: Path, arg: str, says: str
) -> None:
    found = errors(compiler, tmp_path, spec(slurm={"sbatch_args": ["--requeue", arg]}))
    assert [(d.code, d.location.pointer) for d in found] == [("MDC413", "/slurm/sbatch_args/1")]
    assert says in found[0].message, found[0].message


@pytest.mark.parametrize(
    ("arg", "says"),
    [
        ("--nodes=3", "repeats --nodes"),
        ("--ntasks-per-node=8", "repeats --ntasks-per-node"),
        ("--container-image=x", "repeats --container-image"),
        ("--kill", "abbreviates --kill-on-bad-exit"),
        ("-l", "is not a long srun option"),
    ],
)
def test_srun_args_cannot_change_the_task_layout(
    compiler: Compiler, tmp_path: Path, arg: str, says: str
) -> None:
    found = errors(compiler, tmp_path, spec(slurm={"srun_args": [arg]}))
    assert [(d.code, d.location.pointer) for d in found] == [("MDC414", "/slurm/srun_args/0")]
    assert says in found[0].message, found[0].message


def test_srun_args_are_quoted_on_the_srun_line(compiler: Compiler, tmp_path: Path) -> None:
    data = spec(slurm={"srun_args": ["--mpi=pmix", "--comment=it's $HOME"]})
    out = files(compile_data(compiler, tmp_path, data))["slurm/job.sbatch"]
    assert (
        "  --mpi=pmix \\\n  '--comment=it'\"'\"'s $HOME' \\\n  bash \"${out}/slurm/node.sh\"" in out
    )


# ---------------------------------------------------------------- containers


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("nvcr.io/nvidia/pytorch:25.01-py3", "nvcr.io#nvidia/pytorch:25.01-py3"),
        ("docker://nvcr.io/nvidia/pytorch:25.01-py3", "nvcr.io#nvidia/pytorch:25.01-py3"),
        ("registry.local:5000/team/img:1", "registry.local:5000#team/img:1"),
        ("localhost/img", "localhost#img"),
        ("nvcr.io#nvidia/pytorch:25.01-py3", "nvcr.io#nvidia/pytorch:25.01-py3"),
        (
            "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
            "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
        ),
        ("ubuntu:24.04", "ubuntu:24.04"),
        ("/shared/images/pytorch.sqsh", "/shared/images/pytorch.sqsh"),
    ],
)
def test_pyxis_image_names_the_registry_with_a_hash(image: str, expected: str) -> None:
    assert pyxis_image(image) == expected


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("nvcr.io/nvidia/pytorch:25.01-py3", "docker://nvcr.io/nvidia/pytorch:25.01-py3"),
        ("rocm/pytorch:latest", "docker://rocm/pytorch:latest"),
        ("docker://rocm/pytorch:latest", "docker://rocm/pytorch:latest"),
        ("oras://ghcr.io/team/img:1", "oras://ghcr.io/team/img:1"),
        ("/shared/images/pytorch.sif", "/shared/images/pytorch.sif"),
        ("./pytorch.sif", "./pytorch.sif"),
        ("pytorch.sif", "pytorch.sif"),
    ],
)
def test_apptainer_image_gets_a_scheme_for_registries(image: str, expected: str) -> None:
    assert apptainer_image(image) == expected


def test_pyxis_runs_the_srun_tasks_in_the_image(compiler: Compiler, tmp_path: Path) -> None:
    data = spec(slurm={"container": {"runtime": "pyxis", "mounts": ["/data:/data:ro", "/scratch"]}})
    data["job"]["image"] = "nvcr.io/nvidia/pytorch:25.01-py3"
    compiled = compile_data(compiler, tmp_path, data)
    out = files(compiled)
    assert compiled.diagnostics == ()
    assert (
        "  '--container-image=nvcr.io#nvidia/pytorch:25.01-py3' \\\n"
        '  "--container-mounts=${out}:${out},/data:/data:ro,/scratch" \\\n'
    ) in out["slurm/job.sbatch"]
    assert "apptainer" not in out["slurm/node.sh"]


@pytest.mark.parametrize(
    ("accelerator", "flag"), [("nvidia", "--nv "), ("amd", "--rocm "), ("cpu", "")]
)
def test_apptainer_runs_the_role_script_in_the_image(
    compiler: Compiler, tmp_path: Path, accelerator: str, flag: str
) -> None:
    data = spec(slurm={"container": {"runtime": "apptainer", "mounts": ["/data"]}})
    data["job"]["image"] = "rocm/pytorch:latest"
    data["distributed"]["accelerator"] = accelerator
    out = files(compile_data(compiler, tmp_path, data))
    assert (
        f'exec apptainer exec {flag}--bind "${{out}},/data" docker://rocm/pytorch:latest '
        'bash "${out}/${script}"'
    ) in out["slurm/node.sh"]
    assert "--container-image" not in out["slurm/job.sbatch"]


def test_a_container_needs_an_image(compiler: Compiler, tmp_path: Path) -> None:
    found = errors(compiler, tmp_path, spec(slurm={"container": {"runtime": "pyxis"}}))
    assert [(d.code, d.location.pointer) for d in found] == [("MDC410", "/slurm/container")]


def test_an_image_without_a_container_is_a_warning(compiler: Compiler, tmp_path: Path) -> None:
    data = spec()
    data["job"]["image"] = "nvcr.io/nvidia/pytorch:25.01-py3"
    compiled = compile_data(compiler, tmp_path, data)
    assert [(d.code, d.location.pointer) for d in compiled.diagnostics] == [
        ("MDC411", "/job/image")
    ]


@pytest.mark.parametrize("mount", ["data:/data", "/a,/b:/b", "/a b:/a", "/a:/b:ro:x"])
def test_container_mounts_are_checked(compiler: Compiler, tmp_path: Path, mount: str) -> None:
    data = spec(slurm={"container": {"runtime": "apptainer", "mounts": [mount]}})
    data["job"]["image"] = "img.sif"
    found = errors(compiler, tmp_path, data)
    assert [(d.code, d.location.pointer) for d in found] == [
        ("MDC418", "/slurm/container/mounts/0")
    ]


def test_schema_refuses_an_unknown_runtime(compiler: Compiler, tmp_path: Path) -> None:
    data = spec(slurm={"container": {"runtime": "docker"}})
    data["job"]["image"] = "img"
    found = errors(compiler, tmp_path, data)
    assert [(d.code, d.location.pointer) for d in found] == [("MDC104", "/slurm/container/runtime")]


# ---------------------------------------------------------------- the scripts, without SLURM

FAKE_SRUN = """#!/usr/bin/env bash
# Stand-in for srun: runs the command once per node with SLURM_NODEID set, records its options.
printf '%s\\n' "$@" > "$FAKE_LOG/srun.args"
nodes=""
while [[ "$1" == --* ]]; do
  case "$1" in --nodes=*) nodes="${1#--nodes=}" ;; esac
  shift
done
pids=()
for ((i = 0; i < nodes; i++)); do
  SLURM_NODEID=$i SLURM_PROCID=$i SLURM_LOCALID=0 "$@" &
  pids+=("$!")
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit "$status"
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
# Stand-in for scontrol show hostnames: one name per node of FAKE_NODELIST (comma-separated).
[[ "$1 $2" == "show hostnames" ]] || exit 9
tr ',' '\\n' <<< "$3"
"""
FAKE_MODULE = """#!/usr/bin/env bash
printf '%s\\n' "$@" >> "$FAKE_LOG/module.args"
"""


@pytest.fixture
def fake_slurm(tmp_path: Path) -> Iterator[dict[str, str]]:
    """PATH with stand-ins for srun, scontrol and module; FAKE_LOG collects what they saw."""
    bin_dir, log = tmp_path / "fake-bin", tmp_path / "fake-log"
    bin_dir.mkdir()
    log.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL), ("module", FAKE_MODULE)):
        (bin_dir / name).write_text(text, encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "MDC_"))
        and k not in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK")
    }
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", FAKE_LOG=str(log), ROLE_LOG=str(log / "roles")
    )
    yield env


def write(compiled: Compiled, out: Path) -> Path:
    emit.write_tree(out, compiled.tree)
    return out


def submit(
    out: Path, env: dict[str, str], cwd: Path, nodelist: str, **extra: str
) -> subprocess.CompletedProcess[str]:
    """Run job.sbatch the way SLURM would: a copy of it, with the job's variables set."""
    copy = cwd / "spooled-copy.sbatch"  # SLURM runs a copy from its spool directory
    copy.write_text((out / "slurm" / "job.sbatch").read_text(encoding="utf-8"), encoding="utf-8")
    job_env = {
        **env,
        "SLURM_JOB_ID": "4711",
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_JOB_NUM_NODES": str(len(nodelist.split(","))),
        "SLURM_SUBMIT_DIR": str(cwd),
        **extra,
    }
    return subprocess.run(
        ["bash", str(copy)],
        cwd=cwd,
        env=job_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_each_node_runs_its_role_with_its_rank(
    compiler: Compiler, tmp_path: Path, fake_slurm: dict[str, str]
) -> None:
    data = spec()
    data["distributed"].update(
        launcher="roles", nnodes=5, prefill_nodes=2, decode_nodes=3, accelerator="cpu"
    )
    out = write(compile_data(compiler, tmp_path, data), tmp_path / "out")
    done = submit(out, fake_slurm, out, "n1,n2,n3,n4,n5")
    assert done.returncode == 0, done.stderr
    roles = sorted(
        (tmp_path / "fake-log" / "roles").read_text().splitlines(),
        key=lambda line: int(line.split()[1]),
    )
    # the prefill nodes first (node 0 also runs the router), then decode; every node sees
    # node 0's address; the launch id is the job's id; the spec's port stays as written
    assert roles == [
        "prefill 0 n1:29400 4711",
        "prefill 1 n1:29400 4711",
        "decode 2 n1:29400 4711",
        "decode 3 n1:29400 4711",
        "decode 4 n1:29400 4711",
    ]
    srun = (tmp_path / "fake-log" / "srun.args").read_text().splitlines()
    assert srun == [
        "--kill-on-bad-exit=1",
        "--nodes=5",
        "--ntasks=5",
        "--ntasks-per-node=1",
        "--cpus-per-task=8",  # a CPU job: one CPU per rank, which srun does not inherit
        "bash",
        f"{out}/slurm/node.sh",
    ]


@pytest.mark.slow
def test_a_derived_port_comes_from_the_job_id_and_node_0_probes(
    compiler: Compiler, tmp_path: Path, fake_slurm: dict[str, str]
) -> None:
    """Two jobs of one compiled tree: each job's nodes share one port, derived from its
    SLURM_JOB_ID; the batch script, on node 0, steps past a port in use there."""
    data = spec()
    del data["distributed"]["master_port"]
    data["distributed"].update(launcher="roles", nnodes=3, accelerator="cpu")
    out = write(compile_data(compiler, tmp_path, data), tmp_path / "out")
    log = tmp_path / "fake-log" / "roles"

    def ports(job_id: str, node_name: str) -> set[str]:
        log.unlink(missing_ok=True)
        done = submit(
            out, fake_slurm, out, "n1,n2,n3", SLURM_JOB_ID=job_id, SLURMD_NODENAME=node_name
        )
        assert done.returncode == 0, done.stderr
        lines = [line.split() for line in log.read_text().splitlines()]
        assert len(lines) == 3 and {line[3] for line in lines} == {job_id}
        return {line[2].split(":")[1] for line in lines}

    first, second = hashed_port("4711"), hashed_port("4712")
    assert ports("4711", "n1") == {str(first)} and ports("4712", "n1") == {str(second)}
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            busy.bind(("127.0.0.1", first))
        except OSError:
            pytest.skip(f"port {first} is taken on this host")
        busy.listen()
        assert ports("4711", "n1") == {str(first + 1)}  # node 0 steps to a free port
        assert ports("4711", "n2") == {str(first)}  # not on node 0: no probe, the hash


@pytest.mark.slow
def test_the_tree_is_found_through_mdc_out_or_the_submit_dir(
    compiler: Compiler, tmp_path: Path, fake_slurm: dict[str, str]
) -> None:
    data = spec()
    data["distributed"].update(launcher="roles", nnodes=3, accelerator="cpu")
    out = write(compile_data(compiler, tmp_path, data), tmp_path / "out")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    lost = submit(out, fake_slurm, elsewhere, "a,b,c")
    assert lost.returncode == 2
    assert f"mdc: no compiled tree at '{elsewhere}'" in lost.stderr
    assert "cd OUT && sbatch slurm/job.sbatch" in lost.stderr

    found = submit(out, fake_slurm, elsewhere, "a,b,c", MDC_OUT=str(out))
    assert found.returncode == 0, found.stderr
    assert len((tmp_path / "fake-log" / "roles").read_text().splitlines()) == 3


@pytest.mark.slow
def test_a_job_of_the_wrong_size_stops_before_srun(
    compiler: Compiler, tmp_path: Path, fake_slurm: dict[str, str]
) -> None:
    out = write(compile_data(compiler, tmp_path, spec()), tmp_path / "out")
    done = submit(out, fake_slurm, out, "a,b,c")
    assert done.returncode == 2
    assert "the job has 3 node(s); the plan needs exactly 2" in done.stderr
    assert not (tmp_path / "fake-log" / "srun.args").exists()


@pytest.mark.slow
def test_node_sh_refuses_to_run_outside_srun(
    compiler: Compiler, tmp_path: Path, fake_slurm: dict[str, str]
) -> None:
    out = write(compile_data(compiler, tmp_path, spec()), tmp_path / "out")
    done = subprocess.run(
        ["bash", str(out / "slurm" / "node.sh")],
        env=fake_slurm,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "run by slurm/job.sbatch through srun" in done.stderr


@pytest.mark.slow
def test_hostile_values_reach_srun_and_module_verbatim(
    compiler: Compiler, tmp_path: Path, fake_slurm: dict[str, str]
) -> None:
    canary = tmp_path / "canary"
    canary.mkdir()
    hostile = f"$(touch {canary}/a)`touch {canary}/b`; touch {canary}/c ' \" \\ *"
    data = spec(
        slurm={"modules": [f"cuda/{hostile}", "nccl"], "srun_args": [f"--comment={hostile}"]}
    )
    data["distributed"].update(launcher="roles", nnodes=3, accelerator="cpu")
    out_dir = tmp_path / "out $(touch x) 'q'"
    out = write(compile_data(compiler, tmp_path, data), out_dir)
    done = submit(out, fake_slurm, out, "a,b,c")
    assert done.returncode == 0, done.stderr
    assert os.listdir(canary) == []
    log = tmp_path / "fake-log"
    assert (log / "module.args").read_text().splitlines() == [
        "load",
        f"cuda/{hostile}",
        "load",
        "nccl",
    ]
    srun = (log / "srun.args").read_text().splitlines()
    assert f"--comment={hostile}" in srun
    assert srun[-2:] == ["bash", f"{out_dir}/slurm/node.sh"]


# ---------------------------------------------------------------- CPUs, elastic, setup/teardown


@pytest.mark.parametrize(
    ("accelerator", "slurm", "exclusive", "cpus", "warned"),
    [
        ("nvidia", {}, True, None, False),  # whole nodes: the task gets every CPU
        ("nvidia", {"cpus_per_task": 16}, False, "16", False),
        ("nvidia", {"cpus_per_task": 4}, False, "4", True),  # 8 ranks on 4 CPUs
        ("nvidia", {"exclusive": False}, False, None, True),  # SLURM's default: 1 CPU, 8 ranks
        ("nvidia", {"cpus_per_task": 4, "exclusive": True}, True, "4", False),
        # a CPU job: one CPU per rank, not whole nodes (which would bring every GPU along)
        ("cpu", {}, False, "8", False),
        ("cpu", {"cpus_per_task": 2}, False, "2", True),
        ("cpu", {"exclusive": True}, True, None, False),  # asked for: whole nodes
        ("cpu", {"exclusive": False}, False, None, True),
    ],
)
def test_each_nodes_task_gets_a_cpu_per_rank_or_a_warning(
    compiler: Compiler,
    tmp_path: Path,
    accelerator: str,
    slurm: dict[str, Any],
    exclusive: bool,
    cpus: str | None,
    warned: bool,
) -> None:
    data = spec(slurm=slurm)
    data["distributed"]["accelerator"] = accelerator
    compiled = compile_data(compiler, tmp_path, data)
    lines = sbatch_lines(files(compiled)["slurm/job.sbatch"])
    assert ("--exclusive" in lines) == exclusive
    assert (f"--cpus-per-task={cpus}" in lines) == (cpus is not None)
    codes = [d.code for d in compiled.diagnostics]
    assert codes == (["MDC420"] if warned else []), compiled.diagnostics


def test_an_elastic_header_leaves_tasks_per_node_to_srun(
    compiler: Compiler, tmp_path: Path
) -> None:
    data = spec()
    data["distributed"]["min_nnodes"] = 1
    data["distributed"]["nnodes"] = 3
    script = files(compile_data(compiler, tmp_path, data))["slurm/job.sbatch"]
    assert sbatch_lines(script)[:2] == ["--job-name=unit", "--nodes=1-3"]
    assert not any(line.startswith("--ntasks") for line in sbatch_lines(script))
    assert "  --ntasks-per-node=1 \\\n" in script  # srun: still one task per node


def test_setup_and_teardown_are_quoted_words(compiler: Compiler, tmp_path: Path) -> None:
    hostile = "it's $(reboot) `id` ; rm -rf /"
    data = spec(
        slurm={
            "setup": [["dcgmi", "profile", "--pause"], ["echo", hostile]],
            "teardown": [["dcgmi", "profile", "--resume"]],
        }
    )
    script = files(compile_data(compiler, tmp_path, data))["slurm/job.sbatch"]
    assert f"echo {shlex.quote(hostile)}\n" in script
    before, after = script.split("dcgmi profile --pause\n")
    assert "trap mdc_teardown EXIT" in before and "srun" in after
    assert "\nsrun \\\n" in script  # not exec'd: the shell stays to run the teardown
    # bash reads the quoted words back as given
    line = f"echo {shlex.quote(hostile)}"
    done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, check=True)
    assert done.stdout == hostile + "\n"
