"""The leaderworkerset backend: which launchers it takes, its checks, replicas and the port."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mdc.errors import Diagnostic, SpecError
from mdc.pipeline import Compiler


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
    assert "vllm" in (found[0].hint or "")


def test_replicas_and_the_leader_service_port(compiler: Compiler, tmp_path: Path) -> None:
    docs = documents(compiler, tmp_path, spec(replicas=4, port=9000))
    assert [d["kind"] for d in docs] == ["ConfigMap", "LeaderWorkerSet", "Service"]
    assert docs[1]["spec"]["replicas"] == 4
    assert docs[2]["spec"]["ports"][0]["port"] == 9000


def test_the_launchers_port_is_used_and_by_default_vllms_own(
    compiler: Compiler, tmp_path: Path
) -> None:
    data = spec()
    data["vllm"]["port"] = 8123
    assert documents(compiler, tmp_path, data)[2]["spec"]["ports"][0]["port"] == 8123
    # vLLM's default port (FrontendArgs.port, 8000) when [vllm] port is not written
    assert documents(compiler, tmp_path, spec())[2]["spec"]["ports"][0]["port"] == 8000


def test_the_leader_service_of_a_disaggregated_job_targets_the_router(
    compiler: Compiler, tmp_path: Path
) -> None:
    data = spec("sglang_disagg", nnodes=3)
    data["job"]["command"] = "python3"
    data["sglang_disagg"] = {"model_path": "m", "router_port": 8080}
    config, lws, service = documents(compiler, tmp_path, data)
    assert service["spec"]["ports"] == [
        {"name": "p8080", "port": 8080, "protocol": "TCP", "targetPort": 8080}
    ]
    assert service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    group = lws["spec"]["leaderWorkerTemplate"]
    (leader,) = group["leaderTemplate"]["spec"]["containers"]
    (worker,) = group["workerTemplate"]["spec"]["containers"]
    assert leader["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8080}
    assert "readinessProbe" not in worker  # prefill/decode pods are reached by the router
    # the leader is ready only after its servers start, so the workers must not wait for it
    assert lws["spec"]["startupPolicy"] == "LeaderCreated"


def gpus_asked(container: dict[str, Any]) -> int:
    resources = container.get("resources", {})
    limit = resources.get("limits", {}).get("nvidia.com/gpu", 0)
    assert resources.get("requests", {}).get("nvidia.com/gpu", 0) == limit
    return int(limit)


@pytest.mark.parametrize("gpus_per_node", [None, 8])
def test_every_pod_asks_for_its_servers_gpus(
    compiler: Compiler, tmp_path: Path, gpus_per_node: int | None
) -> None:
    """The scheduler is asked for every GPU the servers use and no more: the router runs on
    the leader beside the first prefill server and uses none, so every pod is a server's
    and asks for that server's GPUs (the table's gpus_per_node, where it sets one)."""
    data = spec("sglang_disagg", nnodes=3)
    if gpus_per_node is not None:
        data["leaderworkerset"]["gpus_per_node"] = gpus_per_node
    data["job"]["command"] = "python3"
    data["sglang_disagg"] = {"model_path": "m"}
    compiled = compiler.compile(write(tmp_path, data))
    on_node = [
        sum(s.gpus // len(s.nodes) for s in compiled.launch.servers if node in s.nodes)
        for node in range(3)
    ]
    assert on_node == [8, 8, 8]
    (router,) = [s for s in compiled.launch.servers if s.role == "router"]
    assert (router.nodes, router.gpus) == ((0,), 0)
    group = documents(compiler, tmp_path, data)[1]["spec"]["leaderWorkerTemplate"]
    (leader,) = group["leaderTemplate"]["spec"]["containers"]
    (worker,) = group["workerTemplate"]["spec"]["containers"]
    assert gpus_asked(leader) == (on_node[0] if gpus_per_node is None else 8)
    assert gpus_asked(worker) == on_node[1] == on_node[2]


def test_vllm_replicas_on_lws_route_to_every_server(compiler: Compiler, tmp_path: Path) -> None:
    data = spec()
    data["vllm"]["mode"] = "replicas"
    data["parallelism"] = {"tp": 8, "pp": 1}
    config, lws, service = documents(compiler, tmp_path, data)
    assert "leaderworkerset.sigs.k8s.io/worker-index" not in service["spec"]["selector"]
    group = lws["spec"]["leaderWorkerTemplate"]
    assert "leaderTemplate" not in group
    (pod,) = group["workerTemplate"]["spec"]["containers"]
    assert pod["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}


def test_the_shared_lint_applies(compiler: Compiler, tmp_path: Path) -> None:
    found = errors(compiler, tmp_path, spec(node_selector={"pool": "a b"}))
    assert [(d.code, d.location.pointer) for d in found] == [
        ("MDC462", "/leaderworkerset/node_selector/pool")
    ]
