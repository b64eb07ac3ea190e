"""The checks of the Kubernetes cluster keys (MDC450-MDC454, MDC483 and MDC740 for what a
TrainJob or JobSet cannot take), and that gpu_memory is a GPU share, not the pod's RAM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mdc.errors import Diagnostic, SpecError
from mdc.pipeline import Compiler


def spec(backend: str = "kubernetes", **table: Any) -> dict[str, Any]:
    return {
        "job": {"name": "train", "image": "img:1", "command": ["python", "train.py"]},
        "distributed": {
            "launcher": "torchrun",
            "backend": backend,
            "nnodes": 2,
            "nproc_per_node": 8,
            "accelerator": "nvidia",
        },
        backend: table,
    }


def findings(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> list[Diagnostic]:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    try:
        return list(compiler.compile(path, tree=False).diagnostics)
    except SpecError as exc:
        return list(exc.diagnostics)


def codes(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> list[tuple[str, str]]:
    return [(d.code, d.location.pointer) for d in findings(compiler, tmp_path, data)]


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        # the apiserver: annotation keys are qualified names, 256 KiB in all
        ({"annotations": {"bad key": "x"}}, ("MDC450", "/kubernetes/annotations/bad key")),
        (
            {"annotations": {"a": "x" * (256 * 1024)}},
            ("MDC450", "/kubernetes/annotations"),
        ),
        (
            {"networks": ["ib0"], "annotations": {"k8s.v1.cni.cncf.io/networks": "x"}},
            ("MDC450", "/kubernetes/annotations/k8s.v1.cni.cncf.io~1networks"),
        ),
        # extended resources: DOMAIN/NAME outside kubernetes.io, whole, not the GPU itself
        ({"extended_resources": {"efa": 1}}, ("MDC451", "/kubernetes/extended_resources/efa")),
        (
            {"extended_resources": {"rdma/ib": "0.5"}},
            ("MDC451", "/kubernetes/extended_resources/rdma~1ib"),
        ),
        (
            {"extended_resources": {"nvidia.com/gpu": 8}},
            ("MDC451", "/kubernetes/extended_resources/nvidia.com~1gpu"),
        ),
        ({"networks": ["a,b"]}, ("MDC452", "/kubernetes/networks/0")),
        ({"gang": "volcano", "scheduler_name": "kai"}, ("MDC453", "/kubernetes/scheduler_name")),
        ({"gang_queue": "q"}, ("MDC453", "/kubernetes/gang_queue")),
        ({"scheduler_name": "Bad_Name"}, ("MDC461", "/kubernetes/scheduler_name")),
        ({"queue": "-bad-"}, ("MDC462", "/kubernetes/queue/kueue.x-k8s.io~1queue-name")),
        ({"gpu_memory": "20Gi"}, ("MDC454", "/kubernetes/gpu_memory")),
        ({"gpu_cores": 50}, ("MDC454", "/kubernetes/gpu_cores")),
        (
            {"gpu_sharing": "hami", "gpu_memory": "1.5Ki"},
            ("MDC454", "/kubernetes/gpu_memory"),
        ),
        (
            {"gpu_sharing": "qgpu", "gpu_memory": "1536Mi"},  # qGPU counts whole GiB
            ("MDC454", "/kubernetes/gpu_memory"),
        ),
        (
            {"gpu_sharing": "hami", "gpu_resource": "nvidia.com/gpu"},
            ("MDC454", "/kubernetes/gpu_resource"),
        ),
        ({"gpu_sharing": "hami", "gpus_per_node": 0}, ("MDC454", "/kubernetes/gpu_sharing")),
    ],
)
def test_refused(
    compiler: Compiler, tmp_path: Path, table: dict[str, Any], expected: tuple[str, str]
) -> None:
    assert expected in codes(compiler, tmp_path, spec(**table))


def test_host_network_with_networks_is_a_warning(compiler: Compiler, tmp_path: Path) -> None:
    found = findings(compiler, tmp_path, spec(host_network=True, networks=["ib0"]))
    assert [(d.code, d.severity.value) for d in found if d.code == "MDC452"] == [
        ("MDC452", "warning")
    ]


def test_gpu_memory_is_a_key_not_a_typo_of_memory(compiler: Compiler, tmp_path: Path) -> None:
    found = findings(compiler, tmp_path, spec(gpu_memory="20Gi"))
    assert not any("memory'?" in d.message or "did you mean" in d.message for d in found)
    assert [d.code for d in found] == ["MDC454"]


def test_the_examples_settings_are_taken(compiler: Compiler, tmp_path: Path) -> None:
    table: dict[str, Any] = {
        "extended_resources": {"vpc.amazonaws.com/efa": 32, "rdma/rdma_shared_device_a": 1},
        "networks": ["training/ipoib-network"],
        "capabilities": ["IPC_LOCK"],
        "queue": "team-a",
        "gang": "volcano",
        "gang_queue": "research",
        "annotations": {"example.com/owner": "llm"},
    }
    assert codes(compiler, tmp_path, spec(**table)) == []


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("host_network", True),
        ("scheduler_name", "volcano"),
        ("gang", "volcano"),
        ("gpu_sharing", "volcano-vgpu"),
    ],
)
def test_what_a_trainjob_patch_cannot_set(
    compiler: Compiler, tmp_path: Path, key: str, value: Any
) -> None:
    assert ("MDC483", f"/trainjob/{key}") in codes(
        compiler, tmp_path, spec("trainjob", **{key: value})
    )


def test_jobset_is_not_elastic(compiler: Compiler, tmp_path: Path) -> None:
    data = spec("jobset")
    data["distributed"]["min_nnodes"] = 1
    assert ("MDC740", "/distributed/min_nnodes") in codes(compiler, tmp_path, data)


def test_kuberay_runs_vllm_over_ray_on_two_nodes_or_more(
    compiler: Compiler, tmp_path: Path
) -> None:
    data: dict[str, Any] = {
        "job": {"name": "srv", "image": "img:1", "command": ["vllm", "serve"]},
        "distributed": {
            "launcher": "vllm",
            "backend": "kuberay",
            "nnodes": 1,
            "nproc_per_node": 8,
            "accelerator": "nvidia",
        },
        "parallelism": {"tp": 8},
        "vllm": {"model": "/models/m"},
    }
    assert ("MDC750", "/distributed/nnodes") in codes(compiler, tmp_path, data)
    data["distributed"]["nnodes"] = 2
    data["parallelism"] = {"tp": 8, "pp": 2}
    assert [c for c, _ in codes(compiler, tmp_path, data) if c == "MDC750"] == []


@pytest.mark.parametrize("backend", ["jobset", "kuberay"])
def test_new_backends_check_service_names_and_the_domain(
    compiler: Compiler, tmp_path: Path, backend: str
) -> None:
    data = spec(backend, cluster_domain="Not_A_Domain")
    data["job"]["name"] = "9b-run"  # a Service name must start with a letter (DNS-1035)
    if backend == "kuberay":
        data["distributed"]["launcher"] = "vllm"
        data["job"]["command"] = ["vllm", "serve"]
        data["parallelism"] = {"tp": 8, "pp": 2}
        data["vllm"] = {"model": "/models/m"}
    found = codes(compiler, tmp_path, data)
    assert ("MDC468", "/job/name") in found
    assert ("MDC473", f"/{backend}/cluster_domain") in found
