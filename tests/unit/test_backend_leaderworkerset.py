"""The leaderworkerset backend: which launchers it takes, its checks, replicas and the port."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mdc.errors import Diagnostic, SpecError
from mdc.pipeline import Compiler
from mdc.plugin_manager import load_plugins


@pytest.fixture(scope="module")
def compiler() -> Compiler:
    return Compiler(load_plugins(autoload=False))


def spec(
    launcher: str = "vllm", name: str = "serve", nnodes: int = 2, **table: Any
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "job": {"name": name, "image": "vllm/vllm-openai:latest", "command": ["vllm", "serve"]},
        "distributed": {
            "launcher": launcher,
            "backend": "leaderworkerset",
            "nnodes": nnodes,
            "nproc_per_node": 8,
            "accelerator": "nvidia",
        },
        "leaderworkerset": table,
    }
    if launcher == "vllm":
        data["vllm"] = {"model": "m"}
    return data


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def errors(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> list[Diagnostic]:
    with pytest.raises(SpecError) as raised:
        compiler.compile(write(tmp_path, data))
    return list(raised.value.diagnostics)


def documents(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> list[dict[str, Any]]:
    compiled = compiler.compile(write(tmp_path, data))
    text = next(a.data.decode() for a in compiled.tree if a.path == "leaderworkerset/lws.yaml")
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed", "basic"])
def test_training_launchers_are_refused(compiler: Compiler, tmp_path: Path, launcher: str) -> None:
    found = errors(compiler, tmp_path, spec(launcher=launcher))
    assert [d.location.pointer for d in found] == ["/distributed/backend"]
    assert "vllm" in found[0].hint


def test_replicas_and_the_leader_service_port(compiler: Compiler, tmp_path: Path) -> None:
    docs = documents(compiler, tmp_path, spec(replicas=4, port=9000))
    assert [d["kind"] for d in docs] == ["ConfigMap", "LeaderWorkerSet", "Service"]
    assert docs[1]["spec"]["replicas"] == 4
    assert docs[2]["spec"]["ports"][0]["port"] == 9000


def test_the_launchers_port_is_used_and_without_one_there_is_no_service(
    compiler: Compiler, tmp_path: Path
) -> None:
    data = spec()
    data["vllm"]["port"] = 8123
    assert documents(compiler, tmp_path, data)[2]["spec"]["ports"][0]["port"] == 8123
    assert [d["kind"] for d in documents(compiler, tmp_path, spec())] == [
        "ConfigMap",
        "LeaderWorkerSet",
    ]


def test_the_shared_lint_applies(compiler: Compiler, tmp_path: Path) -> None:
    found = errors(compiler, tmp_path, spec(node_selector={"pool": "a b"}))
    assert [(d.code, d.location.pointer) for d in found] == [
        ("MDC462", "/leaderworkerset/node_selector/pool")
    ]
