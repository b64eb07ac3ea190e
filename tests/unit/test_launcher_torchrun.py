"""madengine's env contract in the launchers that run on torchrun (torchrun, megatron, torchtitan).

madengine (madengine.md §4.1, §5, §6) hands a model script ``MAD_MULTI_NODE_RUNNER``, the
torchrun command up to the script, which the script runs as ``$MAD_MULTI_NODE_RUNNER
train.py args`` (unquoted: bash splits it at spaces), plus ``NNODES`` and
``NPROC_PER_NODE``, and for torchrun ``MAD_RUNTIME_NGPUS``. Here the generated
``launch/worker.sh`` runs for real under bash with a stub ``torchrun`` that records what
it is given and what ``$MAD_MULTI_NODE_RUNNER`` splits into; torch's own torchrun parser
then reads the runner's words.
"""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from mdc.cli import main

NODE_RANK, MASTER_ADDR, MASTER_PORT = "1", "10.0.0.9", "29660"
COMMANDS = {
    "torchrun": ["python", "train.py", "--steps", "3"],
    "megatron": ["python", "pretrain_gpt.py", "--mock-data"],
    "torchtitan": ["python", "-m", "torchtitan.train"],
}


def compile_spec(
    tmp_path: Path, launcher: str, nnodes: int, nproc: int, **tables: Any
) -> tuple[Path, str]:
    """Compile a spec; (the out/ directory, what mdc printed on stderr)."""
    data: dict[str, Any] = {
        "job": {"name": "unit", "command": COMMANDS[launcher]},
        "distributed": {
            "launcher": launcher,
            "nnodes": nnodes,
            "nproc_per_node": nproc,
            "accelerator": "nvidia",
            "master_port": int(MASTER_PORT),
        },
        **tables,
    }
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    err = io.StringIO()
    out = tmp_path / "out"
    code = main(["compile", str(spec), "-o", str(out)], stdout=io.StringIO(), stderr=err)
    assert code == 0, err.getvalue()
    return out, err.getvalue()


def exports(out: Path) -> dict[str, str]:
    """The exports of launch/worker.sh, as bash reads their values (runtime words kept)."""
    script = (out / "launch" / "worker.sh").read_text(encoding="utf-8")
    return dict(
        shlex.split(line[len("export ") :])[0].split("=", 1)
        for line in script.splitlines()
        if line.startswith("export ")
    )


def run_worker(tmp_path: Path, out: Path) -> dict[str, Any]:
    """Run worker.sh on node 1 with a stub torchrun; what it got and what the runner gives."""
    stub = tmp_path / "bin"
    stub.mkdir()
    record = (
        f'{sys.executable} -c \'import json, os, sys; print(json.dumps({{"argv": '
        'sys.argv[1:], "env": {k: os.environ.get(k) for k in ("NNODES", '
        '"NPROC_PER_NODE", "MAD_RUNTIME_NGPUS")}}))\''
    )
    (stub / "torchrun").write_text(
        "#!/usr/bin/env bash\n"
        f'{record} "$@" > "$RECORD_DIR/launch.json"\n'
        "# a madengine model script's line: the runner unquoted, then its script\n"
        "# shellcheck disable=SC2086\n"
        f'{record} $MAD_MULTI_NODE_RUNNER script.py --x 1 > "$RECORD_DIR/runner.json"\n',
        encoding="utf-8",
    )
    (stub / "torchrun").chmod(0o755)
    done = subprocess.run(
        ["bash", str(out / "launch" / "worker.sh")],
        cwd=tmp_path,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": f"{stub}:/usr/bin:/bin",
            "NODE_RANK": NODE_RANK,
            "MASTER_ADDR": MASTER_ADDR,
            "MASTER_PORT": MASTER_PORT,
            "NODE_HOSTS": "a b",
            "RECORD_DIR": str(tmp_path),
        },
    )
    assert done.returncode == 0, done.stderr
    return {
        "launch": json.loads((tmp_path / "launch.json").read_text(encoding="utf-8")),
        "runner": json.loads((tmp_path / "runner.json").read_text(encoding="utf-8")),
    }


def torchrun_parser() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.distributed.run import get_args_parser
    return get_args_parser()


@pytest.mark.parametrize(("nnodes", "nproc"), [(1, 4), (2, 8)])
def test_torchrun_exports_madengines_names(tmp_path: Path, nnodes: int, nproc: int) -> None:
    out, _ = compile_spec(tmp_path, "torchrun", nnodes, nproc)
    env = exports(out)
    assert (env["NNODES"], env["NPROC_PER_NODE"], env["MAD_RUNTIME_NGPUS"]) == (
        str(nnodes),
        str(nproc),
        str(nproc),
    )
    runner = env["MAD_MULTI_NODE_RUNNER"].split(" ")
    # the exec line: torchrun's flags, then the program (torchrun drops "python")
    script = (out / "launch" / "worker.sh").read_text(encoding="utf-8")
    words = shlex.split(script.rpartition("\nexec ")[2])
    assert runner == words[: words.index("train.py")]
    plan = json.loads((out / "plan.json").read_text(encoding="utf-8"))
    documented = plan["worker_env"]
    assert {"MAD_MULTI_NODE_RUNNER", "NNODES", "NPROC_PER_NODE", "MAD_RUNTIME_NGPUS"} <= set(
        documented
    )


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("launcher", ["torchrun", "megatron", "torchtitan"])
def test_the_runner_word_splits_into_the_launch_command(tmp_path: Path, launcher: str) -> None:
    """``$MAD_MULTI_NODE_RUNNER script.py`` runs torchrun with mdc's own flags."""
    nnodes, nproc = 2, 4
    out, _ = compile_spec(tmp_path, launcher, nnodes, nproc)
    got = run_worker(tmp_path, out)
    launch, runner = got["launch"], got["runner"]
    assert launch["env"]["NNODES"] == str(nnodes)
    assert launch["env"]["NPROC_PER_NODE"] == str(nproc)
    assert launch["env"]["MAD_RUNTIME_NGPUS"] == (str(nproc) if launcher == "torchrun" else None)
    # the runner's words are torchrun's flags, exactly as mdc's own command has them
    assert runner["argv"][0] == "torchrun"
    flags = runner["argv"][1:-3]
    assert runner["argv"][-3:] == ["script.py", "--x", "1"]
    assert launch["argv"][: len(flags)] == flags
    assert launch["argv"][len(flags)] in ("train.py", "pretrain_gpt.py", "--module")
    parsed = torchrun_parser().parse_args([*flags, "script.py", "--x", "1"])
    assert parsed.nnodes == str(nnodes)
    assert parsed.nproc_per_node == str(nproc)
    assert parsed.rdzv_endpoint == f"{MASTER_ADDR}:{MASTER_PORT}"
    assert (parsed.training_script, parsed.training_script_args) == ("script.py", ["--x", "1"])


@pytest.mark.slow
@pytest.mark.torch
def test_one_node_runner_is_standalone(tmp_path: Path) -> None:
    """madengine's one-node runner is ``torchrun --standalone --nproc_per_node=G``."""
    out, _ = compile_spec(tmp_path, "torchrun", 1, 2)
    runner = run_worker(tmp_path, out)["runner"]["argv"]
    parsed = torchrun_parser().parse_args(runner[1:])
    assert parsed.standalone and parsed.nproc_per_node == "2" and parsed.nnodes == "1"


def test_a_word_the_runner_cannot_carry_is_a_warning(tmp_path: Path) -> None:
    """Unquoted expansion splits at spaces and removes no quotes: 'my logs' cannot pass."""
    out, err = compile_spec(
        tmp_path,
        "torchrun",
        2,
        2,
        torchrun={"log_dir": "/tmp/my logs", "rdzv_conf": {"timeout": 60}},
    )
    assert "MDC303" in err and "/tmp/my logs" in err
    assert err.count("MDC303") == 1  # timeout=60 passes as it is
    assert "'/tmp/my logs'" in exports(out)["MAD_MULTI_NODE_RUNNER"]


def test_plain_words_give_no_warning(tmp_path: Path) -> None:
    _, err = compile_spec(
        tmp_path, "torchrun", 2, 2, torchrun={"log_dir": "/tmp/logs", "rdzv_conf": {"timeout": 60}}
    )
    assert "MDC303" not in err
