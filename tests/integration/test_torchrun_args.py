"""torch's own parser reads the torchrun command lines mdc emits as mdc means them.

For every example and a few specs written here, the ``exec torchrun ...`` line
of ``launch/<role>.sh`` is split with shlex (after putting in NODE_RANK=1,
MASTER_ADDR=10.0.0.1 and the plan's port, as a backend would) and parsed by
``torch.distributed.run.get_args_parser()``; ``config_from_args`` then resolves
it the way ``torchrun`` does, and the result must match plan.json and the spec.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from tests.tools import REPO, spec_data

from mdc.cli import main
from mdc.loaders import load_file

torchrun = pytest.importorskip(
    "torch.distributed.run",
    reason="parsing with torchrun's own parser needs "
    "torch==2.13.0: run scripts/test, or pip install torch==2.13.0 into the venv",
)

pytestmark = pytest.mark.torch

#: the compile_spec fixture (tests/integration/conftest.py)
Compile = Callable[..., dict[str, Any]]
#: the examples whose launcher is torchrun (the other launchers' conformance tests cover theirs)
EXAMPLES = sorted(
    p
    for p in (REPO / "examples").iterdir()
    if p.suffix in (".toml", ".yaml", ".yml", ".json")
    and spec_data(load_file(p))["distributed"]["launcher"] == "torchrun"
)
NODE_RANK, MASTER_ADDR = 1, "10.0.0.1"
#: a spec without a [torchrun] table means these
DEFAULT_OPTIONS: dict[str, Any] = {
    "rdzv_backend": None,
    "rdzv_id": None,
    "rdzv_conf": {},
    "max_restarts": 0,
    "monitor_interval": None,
    "start_method": None,
    "role": None,
    "log_dir": None,
    "tee": None,
}
#: what LaunchConfig adds to rdzv_configs when the spec does not set it
RDZV_TIMEOUT_DEFAULT = {"timeout": 900}


def exec_argv(script: str, port: int) -> list[str]:
    """The argv the script execs, with the backend's runtime variables put in."""
    head, sep, command = script.partition("\nexec ")
    assert sep, f"no exec line in:\n{script}"
    guarded = set(re.findall(r'^: "\$\{(\w+):\?', head, flags=re.MULTILINE))
    values = {"NODE_RANK": str(NODE_RANK), "MASTER_ADDR": MASTER_ADDR, "MASTER_PORT": str(port)}

    def put(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in guarded, f"${{{name}}} is used without a ': ${{{name}:?...}}' guard"
        return values[name]

    return shlex.split(re.sub(r"\$\{(\w+)\}", put, command))


def python_worker(words: Sequence[str]) -> list[str] | None:
    """What a worker runs for the job's command, with torchrun's python as PY.

    None: the command does not start with python, so it runs as it is.
    """
    if not re.fullmatch(r"python(\d+(\.\d+)?)?", os.path.basename(words[0])):
        return ["PY", "-u", *words] if words[0].endswith(".py") else None
    rest = list(words[1:])
    while rest and rest[0] == "-u":
        rest = rest[1:]
    if rest and (rest[0] == "-m" and len(rest) >= 2 or not rest[0].startswith("-")):
        return ["PY", "-u", *rest]
    return None


def check_launch(
    out: Path, plan: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, Any, str, list[str]]:
    """Parse and resolve launch/worker.sh with torch; check it against plan.json."""
    assert plan["launcher"] == "torchrun"
    assert [r["name"] for r in plan["roles"]] == ["worker"]
    opts = {**DEFAULT_OPTIONS, **(plan["options"].get("torchrun") or {})}
    port = plan["rendezvous"]["master_port"]
    argv = exec_argv((out / "launch" / "worker.sh").read_text(encoding="utf-8"), port)
    assert argv[0] == "torchrun", argv

    for name in [k for k in os.environ if k.startswith("PET_")]:
        monkeypatch.delenv(name)  # torchrun's parser takes its defaults from PET_*
    args = torchrun.get_args_parser().parse_args(argv[1:])

    nnodes, nproc = plan["nnodes"], plan["nproc_per_node"]
    elastic = plan["min_nnodes"] < nnodes
    standalone = nnodes == 1 and not elastic
    static = not standalone and opts["rdzv_backend"] == "static"
    assert args.nproc_per_node == str(nproc)
    assert args.max_restarts == opts["max_restarts"]
    assert args.standalone is standalone
    assert args.nnodes == (f"{plan['min_nnodes']}:{nnodes}" if elastic else str(nnodes))
    if standalone:
        assert (args.rdzv_backend, args.rdzv_endpoint) == ("static", "")  # run() replaces them
    elif static:
        assert args.rdzv_backend == "static"
        assert (args.node_rank, args.master_addr, args.master_port) == (
            NODE_RANK,
            MASTER_ADDR,
            port,
        )
        assert args.rdzv_endpoint == ""
    else:
        assert args.rdzv_backend == "c10d"
        assert args.rdzv_endpoint == f"{MASTER_ADDR}:{port}"
        assert args.rdzv_id == (opts["rdzv_id"] or plan["job"]["name"])
        assert (args.node_rank, args.master_port) == (0, None)  # c10d ignores them
    conf = {
        k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in opts["rdzv_conf"].items()
    }
    assert args.rdzv_conf == ",".join(f"{k}={v}" for k, v in sorted(conf.items()))
    for flag in ("monitor_interval", "start_method", "role", "log_dir", "tee"):
        if opts[flag] is not None:
            assert str(getattr(args, flag)) == str(opts[flag]), flag

    # config_from_args: what torchrun resolves. Keep its side effects off this process:
    # OMP_NUM_THREADS, temporary log dirs, and creating --log-dir.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    log_dir = args.log_dir
    if log_dir is not None:
        args.log_dir = str(tmp_path / "torchrun-logs")
    config, cmd, cmd_args = torchrun.config_from_args(args)
    args.log_dir = log_dir
    assert (config.min_nodes, config.max_nodes) == (plan["min_nnodes"], nnodes)
    assert config.nproc_per_node == nproc
    assert config.max_restarts == opts["max_restarts"]
    if not standalone:  # with --standalone, run() replaces the rendezvous before this
        expected_conf = {**RDZV_TIMEOUT_DEFAULT, **conf, **({"rank": NODE_RANK} if static else {})}
        assert config.rdzv_configs == expected_conf
        assert config.rdzv_endpoint == f"{MASTER_ADDR}:{port}"
        assert config.rdzv_backend == ("static" if static else "c10d")
    if static:
        shown = plan["worker_env"]["MASTER_PORT"]
        if plan["rendezvous"]["port_origin"] == "derived":
            # chosen when the launch starts where mdc's scripts start the nodes; fixed in the
            # manifests on the Kubernetes backends
            if plan["backend"] in ("local", "slurm", "ssh"):
                assert "MDC_LAUNCH_ID" in shown and str(port) not in shown, shown
            else:
                assert shown == f"{port}, hashed from the job name, fixed in the manifests"
        else:
            assert shown == str(port)

    # The workers run the job's command: torchrun's python stands in for "python".
    command = plan["job"]["command"]
    worker = [cmd, *cmd_args]
    expected = python_worker(command)
    if expected is None:
        assert args.no_python and not args.module
        assert worker == command
    else:
        assert not args.no_python
        assert args.module is (expected[2] == "-m")
        assert worker == [sys.executable, *expected[1:]]
    return args, config, cmd, cmd_args


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_command_line_parses_as_planned(
    compile_spec: Compile, example: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    plan = compile_spec(example, out)
    check_launch(out, plan, tmp_path, monkeypatch)


def _spec(
    name: str,
    command: str | list[str],
    *,
    nnodes: int = 2,
    nproc: int = 2,
    torchrun_table: dict[str, Any] | None = None,
    **distributed: Any,
) -> dict[str, Any]:
    return {
        "job": {"name": name, "command": command},
        "distributed": {
            "launcher": "torchrun",
            "nnodes": nnodes,
            "nproc_per_node": nproc,
            "accelerator": "cpu",
            **distributed,
        },
        "torchrun": torchrun_table or {},
    }


# (spec, what torch must see: attributes of args, then the worker's command after PY)
SPECS = {
    "elastic-min-max": (
        _spec(
            "elastic-job",
            ["python", "-u", "train.py", "--epochs", "2"],
            nnodes=4,
            min_nnodes=2,
            torchrun_table={"rdzv_id": "my.run-1", "max_restarts": 3},
        ),
        {
            "nnodes": "2:4",
            "rdzv_backend": "c10d",
            "rdzv_id": "my.run-1",
            "max_restarts": 3,
            "training_script": "train.py",
            "training_script_args": ["--epochs", "2"],
        },
        ["PY", "-u", "train.py", "--epochs", "2"],
    ),
    "static": (
        _spec(
            "static-job",
            "python3 train.py --lr=3e-4 'two words'",
            nnodes=3,
            nproc=4,
            master_port=29555,
            torchrun_table={"rdzv_backend": "static", "max_restarts": 2},
        ),
        {
            "nnodes": "3",
            "rdzv_backend": "static",
            "node_rank": 1,
            "master_addr": MASTER_ADDR,
            "master_port": 29555,
            "nproc_per_node": "4",
            "max_restarts": 2,
            "training_script": "train.py",
            "training_script_args": ["--lr=3e-4", "two words"],
        },
        ["PY", "-u", "train.py", "--lr=3e-4", "two words"],
    ),
    "rdzv-conf-and-options": (
        _spec(
            "conf-job",
            ["python", "train.py"],
            torchrun_table={
                "rdzv_conf": {
                    "join_timeout": 60,
                    "last_call_timeout": 2.5,
                    "is_host": False,
                    "read_timeout": "30",
                },
                "monitor_interval": 0.5,
                "start_method": "fork",
                "role": "trainer",
                "tee": 3,
                "log_dir": "/var/log/job",
            },
        ),
        {
            "rdzv_conf": "is_host=false,join_timeout=60,last_call_timeout=2.5,read_timeout=30",
            "monitor_interval": 0.5,
            "start_method": "fork",
            "role": "trainer",
            "tee": "3",
            "log_dir": "/var/log/job",
        },
        ["PY", "-u", "train.py"],
    ),
    "module-single-node": (
        _spec("module-job", ["python", "-m", "pkg.train", "--config", "c.yaml"], nnodes=1),
        {
            "standalone": True,
            "nnodes": "1",
            "module": True,
            "no_python": False,
            "training_script": "pkg.train",
            "training_script_args": ["--config", "c.yaml"],
        },
        ["PY", "-u", "-m", "pkg.train", "--config", "c.yaml"],
    ),
    "module-multi-node": (
        _spec("module-job-2", "python -u -m pkg.train", nnodes=2),
        {
            "module": True,
            "no_python": False,
            "training_script": "pkg.train",
            "training_script_args": [],
        },
        ["PY", "-u", "-m", "pkg.train"],
    ),
    "bare-script": (
        _spec("script-job", ["train.py", "--x", "1"]),
        {
            "module": False,
            "no_python": False,
            "training_script": "train.py",
            "training_script_args": ["--x", "1"],
        },
        ["PY", "-u", "train.py", "--x", "1"],
    ),
    "non-python": (
        _spec("shell-job", ["bash", "-c", "echo $RANK"]),
        {
            "no_python": True,
            "module": False,
            "training_script": "bash",
            "training_script_args": ["-c", "echo $RANK"],
        },
        ["bash", "-c", "echo $RANK"],
    ),
    "python-dash-c": (
        _spec("inline-job", ["python", "-c", "print(1)"], nnodes=1),
        {
            "no_python": True,
            "training_script": "python",
            "training_script_args": ["-c", "print(1)"],
        },
        ["python", "-c", "print(1)"],
    ),
}


@pytest.mark.parametrize("case", sorted(SPECS))
def test_written_spec_command_line_parses_as_meant(
    compile_spec: Compile, case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, expected_args, expected_worker = SPECS[case]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    out = tmp_path / "out"
    plan = compile_spec(path, out)
    args, config, cmd, cmd_args = check_launch(out, plan, tmp_path, monkeypatch)
    for name, value in expected_args.items():
        assert getattr(args, name) == value, name
    worker = [cmd, *cmd_args]
    if expected_worker[0] == "PY":
        expected_worker = [sys.executable, *expected_worker[1:]]
    assert worker == expected_worker
    if case == "elastic-min-max":
        assert (config.min_nodes, config.max_nodes) == (2, 4)
        assert config.run_id == "my.run-1"
    if case == "rdzv-conf-and-options":
        assert config.rdzv_configs == {
            "is_host": "false",
            "join_timeout": "60",
            "last_call_timeout": "2.5",
            "read_timeout": "30",
            "timeout": 900,
        }
        assert (config.role, config.monitor_interval, config.start_method) == (
            "trainer",
            0.5,
            "fork",
        )


def test_static_rendezvous_cannot_be_elastic(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text(
        json.dumps(
            _spec(
                "static-elastic",
                ["python", "train.py"],
                nnodes=4,
                min_nnodes=2,
                torchrun_table={"rdzv_backend": "static"},
            )
        ),
        encoding="utf-8",
    )
    stderr = io.StringIO()
    code = main(
        ["compile", str(path), "-o", str(tmp_path / "out"), "--no-plugin-autoload"],
        stdout=io.StringIO(),
        stderr=stderr,
    )
    assert code != 0 and "MDC301" in stderr.getvalue(), stderr.getvalue()


@pytest.mark.parametrize("value", ["a,b", "", " padded "], ids=["comma", "empty", "padded"])
def test_rdzv_conf_values_torchrun_cannot_carry_are_rejected(value: str, tmp_path: Path) -> None:
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config

    try:  # what torchrun would make of it: an error at start-up, or another value
        carried = _parse_rendezvous_config(f"key={value}")
    except ValueError:
        carried = None
    assert carried != {"key": value}
    path = tmp_path / "spec.json"
    path.write_text(
        json.dumps(
            _spec("bad-conf", ["python", "train.py"], torchrun_table={"rdzv_conf": {"key": value}})
        ),
        encoding="utf-8",
    )
    stderr = io.StringIO()
    code = main(
        ["compile", str(path), "-o", str(tmp_path / "out"), "--no-plugin-autoload"],
        stdout=io.StringIO(),
        stderr=stderr,
    )
    assert code != 0, "mdc wrote a --rdzv-conf torchrun cannot parse as meant"
    assert "MDC302" in stderr.getvalue() and "/torchrun/rdzv_conf/key" in stderr.getvalue()
