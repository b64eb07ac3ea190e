"""The sglang launcher: the server's command and env on one and several nodes, and its findings.

Specs are compiled in-process through mdc's own pipeline with only the plugins these
tests need (sglang and the local backend). Flag names against SGLang's own CLI are
checked in tests/conformance/test_serving_flags.py; here the generated worker script is
also run for real, with a stub ``python`` on PATH that records its arguments.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.tools import shellcheck

from mdc.api import Concat, Ref
from mdc.emit import write_tree
from mdc.errors import Diagnostic, SpecError
from mdc.pipeline import Compiled, Compiler
from mdc.plugin_manager import load_plugins

OTHERS = (
    "torchrun",
    "basic",
    "deepspeed",
    "megatron",
    "torchtitan",
    "primus",
    "vllm",
    "sglang_disagg",
    "slurm",
    "ssh",
    "kubernetes",
    "pytorchjob",
    "trainjob",
    "leaderworkerset",
)
COMPILER = Compiler(load_plugins(autoload=False, blocked=OTHERS))
MODEL = "org/some-model"
SERVER = ("python", "-m", "sglang.launch_server")


def spec(
    sglang: dict[str, Any] | None = None,
    *,
    nnodes: int = 1,
    nproc: int = 4,
    command: Any = SERVER,
    **extra: Any,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "job": {"name": "sglang-unit", "command": list(command)},
        "distributed": {
            "launcher": "sglang",
            "backend": "local",
            "nnodes": nnodes,
            "nproc_per_node": nproc,
            "master_port": 29650,
        },
        "sglang": {"model": MODEL, **(sglang or {})},
    }
    for table, value in extra.items():
        data.setdefault(table, {}).update(value)
    return data


def compile_(tmp_path: Path, data: dict[str, Any]) -> Compiled:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return COMPILER.compile(path)


def diagnostics(tmp_path: Path, data: dict[str, Any]) -> list[Diagnostic]:
    with pytest.raises(SpecError) as caught:
        compile_(tmp_path, data)
    return list(caught.value.diagnostics)


def test_one_node_needs_no_node_flags(tmp_path: Path) -> None:
    compiled = compile_(tmp_path, spec({"args": ["--trust-remote-code"]}))
    (role,) = compiled.launch.roles
    assert role.argv == (
        *SERVER,
        "--model-path",
        MODEL,
        "--tp-size",
        "4",
        "--host",
        "0.0.0.0",
        "--port",
        "30000",
        "--trust-remote-code",
    )
    env = dict(role.env)
    assert env["SGLANG_TENSOR_PARALLEL_SIZE"] == "4"
    assert env["SGLANG_PIPELINE_PARALLEL_SIZE"] == "1"
    assert env["NNODES"] == "1" and env["NPROC_PER_NODE"] == "4"
    assert "NCCL_INIT_ADDR" not in env
    # one node: no node script, no SGLANG_HOST_IP (madengine sets it on N > 1 only, §4.1)
    assert "SGLANG_HOST_IP" not in compiled.launch.worker_env
    assert compiled.launch.files == ()


def test_several_nodes_meet_at_node_0(tmp_path: Path) -> None:
    compiled = compile_(
        tmp_path, spec({"port": 31000}, nnodes=2, nproc=8, parallelism={"tp": 8, "pp": 2})
    )
    (role,) = compiled.launch.roles
    meet = Concat((Ref("MASTER_ADDR"), ":", Ref("MASTER_PORT")))
    # launch/sglang-node.sh exports SGLANG_HOST_IP, then runs the server
    node_script = Concat((Ref("MDC_OUT"), "/launch/sglang-node.sh"))
    assert role.argv == (
        "bash",
        node_script,
        *SERVER,
        "--model-path",
        MODEL,
        "--tp-size",
        "8",
        "--pp-size",
        "2",
        "--nnodes",
        "2",
        "--node-rank",
        Ref("NODE_RANK"),
        "--dist-init-addr",
        meet,
        "--host",
        "0.0.0.0",
        "--port",
        "31000",
    )
    assert "SGLANG_HOST_IP" in compiled.launch.worker_env
    env = dict(role.env)
    assert env["SGLANG_PIPELINE_PARALLEL_SIZE"] == "2"
    assert env["NCCL_INIT_ADDR"] == meet
    assert compiled.launch.worker_env["MASTER_PORT"].startswith("29650 ")


def test_a_missing_model_is_an_error(tmp_path: Path) -> None:
    data = spec()
    del data["sglang"]
    assert [(d.code, d.location.pointer) for d in diagnostics(tmp_path, data)] == [
        ("MDC370", "/sglang")
    ]


def test_one_server_must_use_every_gpu(tmp_path: Path) -> None:
    found = [
        d
        for d in diagnostics(tmp_path, spec(nnodes=2, nproc=4, parallelism={"tp": 4, "pp": 1}))
        if d.is_error
    ]
    assert [d.code for d in found] == ["MDC371"]
    assert "= 4 GPUs" in found[0].message and "2 x 4 = 8" in found[0].message


def test_context_parallel_is_refused(tmp_path: Path) -> None:
    found = diagnostics(tmp_path, spec(nproc=4, parallelism={"tp": 2, "pp": 1, "cp": 2}))
    assert "MDC372" in {d.code for d in found if d.is_error}


@pytest.mark.parametrize(
    ("where", "words", "expected"),
    [
        (
            "command",
            [*SERVER, "--tensor-parallel-size", "2"],
            [("/job/command/3", "'--tensor-parallel-size 2'", "but [parallelism] tp = 8")],
        ),
        (
            "args",
            ["--model", "x", "--nccl-init-addr=a:1"],
            [
                ("/sglang/args/0", "'--model x'", 'but [sglang] model = "org/some-model"'),
                (
                    "/sglang/args/2",
                    "'--nccl-init-addr=a:1'",
                    "but mdc writes --dist-init-addr per node",
                ),
            ],
        ),
        (
            "args",
            ["--node-rank", "0", "--port=1"],
            [
                ("/sglang/args/0", "'--node-rank 0'", "but mdc writes --node-rank per node"),
                ("/sglang/args/2", "'--port=1'", "but [sglang] port = 30001"),
            ],
        ),
    ],
)
def test_a_flag_that_disagrees_with_mdc_is_refused(
    tmp_path: Path, where: str, words: list[str], expected: list[tuple[str, str, str]]
) -> None:
    """One finding per flag, at the word itself, naming what it disagrees with: the key,
    or (the node's rank and address over two nodes) the value mdc writes on each node."""
    args = {"args": words} if where == "args" else {}
    data = spec({**args, "port": 30001}, nnodes=2, parallelism={"tp": 8, "pp": 1})
    if where == "command":
        data["job"]["command"] = words
    found = [d for d in diagnostics(tmp_path, data) if d.is_error]
    assert [d.code for d in found] == ["MDC373"] * len(expected)
    for d, (pointer, said, what) in zip(found, expected, strict=True):
        assert d.location.pointer == pointer
        assert f"passes {said}, {what}" in d.message, d.message


def test_the_nodes_flags_on_one_node_are_the_users(tmp_path: Path) -> None:
    """On one node mdc writes no --node-rank or --dist-init-addr: SGLang reads the user's."""
    compiled = compile_(tmp_path, spec({"args": ["--node-rank", "0", "--dist-init-addr=a:1"]}))
    (role,) = compiled.launch.roles
    assert list(role.argv[-3:]) == ["--node-rank", "0", "--dist-init-addr=a:1"]


def test_a_foreign_command_is_a_warning(tmp_path: Path) -> None:
    compiled = compile_(tmp_path, spec(command=["python", "serve.py"]))
    assert [d.code for d in compiled.diagnostics] == ["MDC374"]
    assert compile_(tmp_path, spec()).diagnostics == ()


def test_an_elastic_job_is_refused(tmp_path: Path) -> None:
    found = diagnostics(tmp_path, spec(nnodes=4, nproc=2, distributed={"min_nnodes": 2}))
    assert "MDC375" in {d.code for d in found if d.is_error}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("hosts", "address"),
    [
        ("10.0.0.5 10.0.0.6", "10.0.0.6"),  # an IP as it is
        ("10.0.0.5 localhost", "127.0.0.1"),  # a name: its IPv4 address (getent ahostsv4)
        ("10.0.0.5 no-such-host.invalid", None),  # does not resolve: an error
    ],
)
def test_the_worker_script_runs_the_server_with_this_nodes_rank(
    tmp_path: Path, hosts: str, address: str | None
) -> None:
    out = tmp_path / "out"
    write_tree(out, compile_(tmp_path, spec(nnodes=2, nproc=2)).tree)
    worker = out / "launch" / "worker.sh"
    for script in (worker, out / "launch" / "sglang-node.sh"):
        linted = subprocess.run(
            [shellcheck(), "--norc", "-S", "style", str(script)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert linted.returncode == 0, linted.stdout + linted.stderr
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "python").write_text(
        '#!/usr/bin/env bash\necho "$SGLANG_HOST_IP $NCCL_INIT_ADDR $*" > "$LOG"\n',
        encoding="utf-8",
    )
    (stubs / "python").chmod(0o755)
    log = tmp_path / "log"
    env = {
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "NODE_RANK": "1",
        "LOG": str(log),
        "MASTER_ADDR": "10.1.2.3",
        "MASTER_PORT": "29650",
        "NODE_HOSTS": hosts,
        "MDC_RESOLVE_SECONDS": "0",
    }
    done = subprocess.run(
        ["bash", str(worker)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    if address is None:
        assert done.returncode == 1
        assert "'no-such-host.invalid' (in NODE_HOSTS) has no IPv4 address" in done.stderr
        return
    assert done.returncode == 0, done.stderr
    assert log.read_text(encoding="utf-8").split() == [
        address,
        "10.1.2.3:29650",
        "-m",
        "sglang.launch_server",
        "--model-path",
        MODEL,
        "--tp-size",
        "2",
        "--pp-size",
        "2",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--dist-init-addr",
        "10.1.2.3:29650",
        "--host",
        "0.0.0.0",
        "--port",
        "30000",
    ]
