"""What a cluster admin would reject in the Kubernetes backends' output, that no schema
catches: Service names, fractional GPUs, names two jobs share, the cluster domain, jobs that
never end, and CPU/memory limits nobody asked for."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from mdc.errors import Diagnostic, SpecError
from mdc.pipeline import Compiler

#: the apiserver's Service name rule (RFC 1035 label, k8s.io/apimachinery IsDNS1035Label):
#: https://kubernetes.io/docs/concepts/overview/working-with-objects/names/#rfc-1035-label-names
RFC_1035 = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
#: the file each backend writes
FILES = {
    "kubernetes": "kubernetes/job.yaml",
    "leaderworkerset": "leaderworkerset/lws.yaml",
    "pytorchjob": "pytorchjob/job.yaml",
    "trainjob": "trainjob/job.yaml",
}


def spec(backend: str, name: str = "train", **table: Any) -> dict[str, Any]:
    serving = backend == "leaderworkerset"
    data: dict[str, Any] = {
        "job": {
            "name": name,
            "image": "img:1",
            "command": ["vllm", "serve"] if serving else ["python", "train.py"],
        },
        "distributed": {
            "launcher": "vllm" if serving else "torchrun",
            "backend": backend,
            "nnodes": 2,
            "nproc_per_node": 8,
            "accelerator": "nvidia",
        },
        backend: table,
    }
    if serving:
        data["vllm"] = {"model": "org/model", "port": 8000}
    return data


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def documents(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> list[dict[str, Any]]:
    backend = data["distributed"]["backend"]
    compiled = compiler.compile(write(tmp_path, data))
    text = next(a.data.decode() for a in compiled.tree if a.path == FILES[backend])
    return [d for d in yaml.safe_load_all(text) if d]


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind)


def errors(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> list[Diagnostic]:
    with pytest.raises(SpecError) as raised:
        compiler.compile(write(tmp_path, data))
    return [d for d in raised.value.diagnostics if d.is_error]


# ---------------------------------------------------------------- names


@pytest.mark.parametrize("backend", ["kubernetes", "leaderworkerset"])
@pytest.mark.parametrize("name", ["0day-run", "9b-chat"])
def test_a_service_name_must_start_with_a_letter(
    compiler: Compiler, tmp_path: Path, backend: str, name: str
) -> None:
    assert not RFC_1035.fullmatch(name)  # what the apiserver refuses as a Service name
    found = errors(compiler, tmp_path, spec(backend, name))
    assert [d.code for d in found] == ["MDC468"], found
    assert found[0].location is not None and found[0].location.pointer == "/job/name"


@pytest.mark.parametrize("backend", sorted(FILES))
def test_every_service_mdc_writes_has_an_rfc_1035_name(
    compiler: Compiler, tmp_path: Path, backend: str
) -> None:
    docs = documents(compiler, tmp_path, spec(backend, "a1-run"))
    services = [d["metadata"]["name"] for d in docs if d["kind"] == "Service"]
    assert all(RFC_1035.fullmatch(n) for n in services), services


@pytest.mark.parametrize(
    ("backend", "name", "other"),
    [
        ("kubernetes", "lws-vllm-1-leader", "leaderworkerset"),  # Service lws-vllm-1-leader
        ("leaderworkerset", "chat-leader", "leaderworkerset"),
        ("kubernetes", "big-master-0", "pytorchjob"),  # the operator's Service big-master-0
        ("trainjob", "big-worker-3", "pytorchjob"),
        ("kubernetes", "llama-node-0", "trainjob"),  # the JobSet's Job llama-node-0
    ],
)
def test_a_name_another_job_derives_is_refused_with_the_clash(
    compiler: Compiler, tmp_path: Path, backend: str, name: str, other: str
) -> None:
    found = errors(compiler, tmp_path, spec(backend, name))
    assert [d.code for d in found] == ["MDC469"], found
    whose = {"leaderworkerset": "leaderworkerset backend", "pytorchjob": "PyTorchJob"}
    assert whose.get(other, "TrainJob") in found[0].message


def test_the_clash_in_the_issue_is_real_without_the_check(
    compiler: Compiler, tmp_path: Path
) -> None:
    """The LWS job's leader Service is exactly the name the kubernetes job would use."""
    lws = documents(compiler, tmp_path, spec("leaderworkerset", "lws-vllm-1"))
    names = {d["metadata"]["name"] for d in lws if d["kind"] == "Service"}
    assert "lws-vllm-1-leader" in names


@pytest.mark.parametrize("name", ["leader", "master-0", "run-leaders", "nodes-1x"])
def test_names_that_only_look_alike_compile(compiler: Compiler, tmp_path: Path, name: str) -> None:
    documents(compiler, tmp_path, spec("kubernetes", name))


# ---------------------------------------------------------------- GPUs


@pytest.mark.parametrize("backend", sorted(FILES))
@pytest.mark.parametrize("gpus", ["500m", "1.5", "0.5"])
def test_a_fractional_gpu_is_refused(
    compiler: Compiler, tmp_path: Path, backend: str, gpus: str
) -> None:
    found = errors(compiler, tmp_path, spec(backend, gpus_per_node=gpus))
    assert [d.code for d in found] == ["MDC472"], found


@pytest.mark.parametrize("gpus", [8, "8", "2000m", "1e1"])
def test_whole_gpu_quantities_in_any_spelling_pass(
    compiler: Compiler, tmp_path: Path, gpus: Any
) -> None:
    job = of_kind(documents(compiler, tmp_path, spec("kubernetes", gpus_per_node=gpus)), "Job")
    resources = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"]


# ---------------------------------------------------------------- cluster domain


def node_hosts(docs: list[dict[str, Any]]) -> str:
    node_sh: str = of_kind(docs, "ConfigMap")["data"]["k8s--node.sh"]
    return next(line for line in node_sh.splitlines() if "node_hosts+=" in line)


def test_the_cluster_domain_is_an_option(compiler: Compiler, tmp_path: Path) -> None:
    default = documents(compiler, tmp_path, spec("kubernetes", namespace="ml"))
    env = of_kind(default, "Job")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "MASTER_ADDR", "value": "train-0.train.ml.svc.cluster.local"} in env
    docs = documents(
        compiler, tmp_path, spec("kubernetes", namespace="ml", cluster_domain="corp.example")
    )
    env = of_kind(docs, "Job")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "MASTER_ADDR", "value": "train-0.train.ml.svc.corp.example"} in env
    assert ".train.ml.svc.corp.example" in node_hosts(docs)
    assert "cluster.local" not in yaml.safe_dump_all(docs)


def test_a_cluster_domain_that_is_no_domain_is_refused(compiler: Compiler, tmp_path: Path) -> None:
    found = errors(compiler, tmp_path, spec("kubernetes", cluster_domain="Cluster_Local"))
    assert [d.code for d in found] == ["MDC473"]


# ---------------------------------------------------------------- ending in Failed, TTL


def test_an_indexed_job_fails_at_the_first_pod_failure_and_is_collected(
    compiler: Compiler, tmp_path: Path
) -> None:
    job = of_kind(documents(compiler, tmp_path, spec("kubernetes")), "Job")
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert job["spec"]["ttlSecondsAfterFinished"] == 7 * 24 * 3600
    kept = of_kind(
        documents(compiler, tmp_path, spec("kubernetes", ttl_seconds_after_finished=-1)), "Job"
    )
    assert "ttlSecondsAfterFinished" not in kept["spec"]


def test_a_pytorchjob_ends_in_failed_and_frees_its_gpus(compiler: Compiler, tmp_path: Path) -> None:
    """Without backoffLimit the operator's PastBackoffLimit never fires and OnFailure pods
    restart forever; with 0 it fails the job at the first restart. cleanPodPolicy Running
    deletes the pods still running then (the operator's default, None, keeps them)."""
    job = of_kind(documents(compiler, tmp_path, spec("pytorchjob")), "PyTorchJob")
    assert job["spec"]["runPolicy"] == {
        "backoffLimit": 0,
        "cleanPodPolicy": "Running",
        "ttlSecondsAfterFinished": 7 * 24 * 3600,
    }
    assert {r["restartPolicy"] for r in job["spec"]["pytorchReplicaSpecs"].values()} == {
        "OnFailure"
    }


# ---------------------------------------------------------------- requests and limits


@pytest.mark.parametrize("backend", ["kubernetes", "pytorchjob", "leaderworkerset"])
def test_cpu_and_memory_are_requests_unless_guaranteed(
    compiler: Compiler, tmp_path: Path, backend: str
) -> None:
    def resources(**table: Any) -> dict[str, Any]:
        docs = documents(compiler, tmp_path, spec(backend, cpu=32, memory="256Gi", **table))
        found: list[dict[str, Any]] = [c["resources"] for c in _containers(docs)]
        assert found and all(r == found[0] for r in found)
        return found[0]

    burstable = resources()
    assert burstable == {
        "limits": {"nvidia.com/gpu": 8},
        "requests": {"cpu": 32, "memory": "256Gi", "nvidia.com/gpu": 8},
    }
    guaranteed = resources(qos="guaranteed")
    assert guaranteed["limits"] == guaranteed["requests"]


def test_trainjob_resources_per_node_follow_qos(compiler: Compiler, tmp_path: Path) -> None:
    docs = documents(compiler, tmp_path, spec("trainjob", cpu=32, memory="256Gi"))
    per_node = of_kind(docs, "TrainJob")["spec"]["trainer"]["resourcesPerNode"]
    assert per_node["limits"] == {"nvidia.com/gpu": 8}


def _containers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "containers" in node:
                found.extend(node["containers"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(docs)
    return found


@pytest.mark.parametrize("qos", ["burstable", "guaranteed"])
def test_both_forms_pass_strict_validation(compiler: Compiler, tmp_path: Path, qos: str) -> None:
    docs = documents(compiler, tmp_path, spec("kubernetes", cpu="500m", memory="8Gi", qos=qos))
    for doc in docs:
        kubernetes_validate.validate(doc, "1.30", strict=True)


@pytest.mark.parametrize("backend", ["kubernetes", "pytorchjob", "leaderworkerset"])
def test_host_ipc_reaches_every_pod_and_validates(
    compiler: Compiler, tmp_path: Path, backend: str
) -> None:
    docs = documents(compiler, tmp_path, spec(backend, host_ipc=True))
    pods: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "containers" in node:
                pods.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(docs)
    assert pods and all(p.get("hostIPC") is True for p in pods)
    default = documents(compiler, tmp_path, spec(backend))
    assert "hostIPC" not in yaml.safe_dump_all(default)
    for doc in docs:
        if doc["kind"] in ("ConfigMap", "Service", "Job"):
            kubernetes_validate.validate(doc, "1.30", strict=True)
