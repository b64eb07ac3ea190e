"""The cluster keys (GPU networks, Kueue, Volcano gangs, GPU sharing) and the jobset backend:
every document of the examples that use them, and of every Kubernetes backend with all of
them set, passes strict validation (kubernetes-validate's schemas at 1.30 and the newest,
the CRDs in the shared folder), and carries the field each key is documented to set."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration.k8s.validate import validate_document
from tests.tools import REPO

from mdc.pipeline import Compiler

EXAMPLES = (
    "k8s-infiniband-8x8.toml",
    "k8s-efa-p5-4x8.toml",
    "pytorchjob-kueue-2x8.toml",
    "k8s-volcano-gang-4x8.toml",
    "jobset-roce-4x8.toml",
    "k8s-shared-gpu-hami.toml",
    "kuberay-vllm-ray-2x8.yaml",
)
#: Volcano's scheduling.volcano.sh/v1beta1 PodGroupSpec fields (no PodGroup CRD is in the
#: shared folder, so its documents are checked against the field list instead)
PODGROUP_SPEC = {"minMember", "minTaskMember", "queue", "priorityClassName", "minResources"}
NETWORK = {
    "annotations": {"example.com/team": "llm"},
    "networks": ["ib-0", "kube-system/ib-1"],
    "extended_resources": {"rdma/ib": 1},
    "capabilities": ["IPC_LOCK"],
    "queue": "team-a",
}


def documents(compiler: Compiler, path: Path) -> list[dict[str, Any]]:
    tree = compiler.compile(path).tree
    return [
        doc
        for artifact in tree
        if artifact.path.endswith(".yaml")
        for doc in yaml.safe_load_all(artifact.data.decode())
        if doc
    ]


def checked(docs: list[dict[str, Any]]) -> list[str]:
    errors: list[str] = []
    for doc in docs:
        if doc["kind"] == "PodGroup":
            assert doc["apiVersion"] == "scheduling.volcano.sh/v1beta1"
            assert set(doc["spec"]) <= PODGROUP_SPEC
            assert isinstance(doc["spec"]["minMember"], int)
        else:
            errors += validate_document(doc)
    return errors


def pods(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod template in ``doc`` (found by the key ``template`` holding a pod ``spec``)."""
    found: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            spec = node.get("spec")
            if isinstance(spec, dict) and "containers" in spec:
                found.append(node)
                return
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc.get("spec"))
    return found


@pytest.mark.parametrize("example", EXAMPLES)
def test_examples_pass_strict_validation(
    compiler: Compiler, example: str, shared_crds: Path
) -> None:
    docs = documents(compiler, REPO / "examples" / example)
    assert checked(docs) == []


def spec_for(tmp_path: Path, backend: str, launcher: str, table: dict[str, Any]) -> Path:
    data: dict[str, Any] = {
        "job": {"name": "net", "image": "img:1", "command": ["python", "train.py"]},
        "distributed": {
            "launcher": launcher,
            "backend": backend,
            "nnodes": 2,
            "nproc_per_node": 8,
            "accelerator": "nvidia",
        },
        backend: table,
    }
    if launcher == "vllm":  # one server over both pods through Ray
        data["job"] = {"name": "net", "image": "img:1", "command": ["vllm", "serve"]}
        data["parallelism"] = {"tp": 8, "pp": 2}
        data["vllm"] = {"model": "/models/m", "port": 8080}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


#: each backend and where its kind holds Kueue's suspend (None: the kind has none)
SUSPEND = {
    "kubernetes": ("Job", ("spec", "suspend")),
    "jobset": ("JobSet", ("spec", "suspend")),
    "pytorchjob": ("PyTorchJob", ("spec", "runPolicy", "suspend")),
    "trainjob": ("TrainJob", ("spec", "suspend")),
    "leaderworkerset": ("LeaderWorkerSet", None),
    "kuberay": ("RayCluster", ("spec", "suspend")),
}
#: the backends that run a vLLM server over Ray rather than a torchrun job
SERVING = ("leaderworkerset", "kuberay")


@pytest.mark.parametrize("backend", sorted(SUSPEND))
def test_every_backend_takes_the_network_and_queue_keys(
    compiler: Compiler, tmp_path: Path, backend: str, shared_crds: Path
) -> None:
    launcher = "vllm" if backend in SERVING else "torchrun"
    docs = documents(compiler, spec_for(tmp_path, backend, launcher, NETWORK))
    assert checked(docs) == []
    kind, suspend = SUSPEND[backend]
    top = next(d for d in docs if d["kind"] == kind)
    assert top["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    if suspend is not None:
        node: Any = top
        for key in suspend:
            node = node[key]
        assert node is True
    templates = pods(top)
    assert templates
    for template in templates:
        annotations = template["metadata"]["annotations"]
        assert annotations["k8s.v1.cni.cncf.io/networks"] == "ib-0,kube-system/ib-1"
        assert annotations["example.com/team"] == "llm"
    if backend == "trainjob":  # resources go in the trainer, the rest in the runtime patch
        resources = top["spec"]["trainer"]["resourcesPerNode"]
        container = templates[0]["spec"]["containers"][0]
    else:
        container = templates[0]["spec"]["containers"][0]
        resources = container["resources"]
    assert resources["limits"]["rdma/ib"] == resources["requests"]["rdma/ib"] == 1
    assert container["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}


@pytest.mark.parametrize(
    "backend", ["kubernetes", "jobset", "pytorchjob", "leaderworkerset", "kuberay"]
)
def test_host_network_and_volcano_gang(
    compiler: Compiler, tmp_path: Path, backend: str, shared_crds: Path
) -> None:
    launcher = "vllm" if backend in SERVING else "torchrun"
    table = {"host_network": True, "gang": "volcano", "gang_queue": "q1"}
    docs = documents(compiler, spec_for(tmp_path, backend, launcher, table))
    assert checked(docs) == []
    kind = SUSPEND[backend][0]
    top = next(d for d in docs if d["kind"] == kind)
    for template in pods(top):
        spec = template["spec"]
        assert spec["hostNetwork"] is True
        assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert spec["schedulerName"] == "volcano"
    groups = [d for d in docs if d["kind"] == "PodGroup"]
    if backend in ("kubernetes", "jobset"):  # mdc writes the PodGroup of its own Job
        assert [g["spec"] for g in groups] == [{"minMember": 2, "queue": "q1"}]
        for template in pods(top):
            assert template["metadata"]["annotations"] == {"scheduling.k8s.io/group-name": "net"}
    else:  # the operator or the LWS controller makes it
        assert groups == []
    if backend == "pytorchjob":
        policy = top["spec"]["runPolicy"]["schedulingPolicy"]
        assert policy == {"minAvailable": 2, "queue": "q1"}
    if backend == "kuberay":  # KubeRay's batch-scheduler labels
        labels = top["metadata"]["labels"]
        assert labels["ray.io/scheduler-name"] == "volcano"
        assert labels["volcano.sh/queue-name"] == "q1"


@pytest.mark.parametrize(
    ("sharing", "expected"),
    [
        (
            "hami",
            {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 10240, "nvidia.com/gpucores": 30},
        ),
        (
            "volcano-vgpu",
            {
                "volcano.sh/vgpu-number": 2,
                "volcano.sh/vgpu-memory": 10240,
                "volcano.sh/vgpu-cores": 30,
            },
        ),
        # qGPU: the pod's totals over its 2 cards, memory in GiB
        (
            "qgpu",
            {"tke.cloud.tencent.com/qgpu-memory": 20, "tke.cloud.tencent.com/qgpu-core": 60},
        ),
    ],
)
def test_gpu_sharing_resource_names(
    compiler: Compiler, tmp_path: Path, sharing: str, expected: dict[str, int], shared_crds: Path
) -> None:
    table = {
        "gpu_sharing": sharing,
        "gpus_per_node": 2,
        "gpu_memory": "10Gi",
        "gpu_cores": 30,
        "memory": "64Gi",
    }
    docs = documents(compiler, spec_for(tmp_path, "kubernetes", "torchrun", table))
    assert checked(docs) == []
    job = next(d for d in docs if d["kind"] == "Job")
    resources = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"] == expected
    assert resources["requests"] == {**expected, "memory": "64Gi"}
    # Volcano's scheduler hands out the devices of its vGPU plugin
    scheduler = job["spec"]["template"]["spec"].get("schedulerName")
    assert scheduler == ("volcano" if sharing == "volcano-vgpu" else None)


def test_kuberay_head_and_workers(compiler: Compiler, tmp_path: Path, shared_crds: Path) -> None:
    data = spec_for(tmp_path, "kuberay", "vllm", {"namespace": "serving"})
    spec = json.loads(data.read_text(encoding="utf-8"))
    spec["distributed"]["nnodes"] = 4
    spec["parallelism"] = {"tp": 8, "pp": 4}
    data.write_text(json.dumps(spec), encoding="utf-8")
    docs = documents(compiler, data)
    assert checked(docs) == []
    cluster = next(d for d in docs if d["kind"] == "RayCluster")
    assert cluster["metadata"]["annotations"] == {"ray.io/overwrite-container-cmd": "true"}
    port = cluster["spec"]["headGroupSpec"]["rayStartParams"]["port"]
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"name": "gcs-server", "containerPort": int(port), "protocol": "TCP"} in head["ports"]
    assert {"name": "vllm", "containerPort": 8080, "protocol": "TCP"} in head["ports"]
    (group,) = cluster["spec"]["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 3
    env = {e["name"]: e.get("value") for e in group["template"]["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == "net-head-svc.serving.svc.cluster.local"
    assert env["MASTER_PORT"] == port


def test_kuberay_lists_each_head_port_once_on_the_node_network(
    compiler: Compiler, tmp_path: Path, shared_crds: Path
) -> None:
    # on the node's network every containerPort is a hostPort, and the apiserver refuses a
    # pod that lists one twice (the Ray GCS and the server given the same port)
    data = spec_for(tmp_path, "kuberay", "vllm", {"host_network": True})
    spec = json.loads(data.read_text(encoding="utf-8"))
    spec["distributed"]["master_port"] = 8080
    data.write_text(json.dumps(spec), encoding="utf-8")
    docs = documents(compiler, data)
    assert checked(docs) == []
    cluster = next(d for d in docs if d["kind"] == "RayCluster")
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    numbers = [p["containerPort"] for p in head["ports"]]
    assert numbers == [8080]


def pod_env(entries: list[dict[str, Any]], pod_ip: str) -> dict[str, str]:
    """A container's env as the kubelet gives it: the downward API's status.podIP and
    metadata.namespace resolved, ``$(NAME)`` replaced by an earlier entry's value."""
    fields = {"status.podIP": pod_ip, "metadata.namespace": "serving"}
    out: dict[str, str] = {}
    for entry in entries:
        if "valueFrom" in entry:
            out[entry["name"]] = fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            out[entry["name"]] = re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: out.get(m.group(1), m.group(0)),
                entry["value"],
            )
    return out


def fake_bin(tmp_path: Path, log: Path) -> str:
    """ray, vllm and python3 that log their arguments (python3 answers Ray's GPU count)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    scripts = {
        "ray": f'echo "ray $*" >> {log}',
        "vllm": f'echo "vllm $*" >> {log}',
        "python3": "echo 16",
    }
    for name, body in scripts.items():
        (folder / name).write_text(f"#!/usr/bin/env bash\n{body}\n", encoding="utf-8")
        (folder / name).chmod(0o755)
    return f"{folder}:{os.environ['PATH']}"


@pytest.mark.slow
def test_kuberay_pods_start_ray_and_the_server(compiler: Compiler, tmp_path: Path) -> None:
    docs = documents(compiler, REPO / "examples" / "kuberay-vllm-ray-2x8.yaml")
    configmap = next(d for d in docs if d["kind"] == "ConfigMap")
    cluster = next(d for d in docs if d["kind"] == "RayCluster")
    groups = {
        "head": (cluster["spec"]["headGroupSpec"]["template"], "10.0.0.5"),
        "worker": (cluster["spec"]["workerGroupSpecs"][0]["template"], "10.0.1.7"),
    }
    for role, (template, ip) in groups.items():
        out = tmp_path / role / "mdc"
        volume = next(v for v in template["spec"]["volumes"] if v["name"] == "mdc")
        for item in volume["configMap"]["items"]:
            path = out / item["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(configmap["data"][item["key"]], encoding="utf-8")
            path.chmod(item["mode"])
        log = tmp_path / role / "log"
        env = pod_env(template["spec"]["containers"][0]["env"], ip)
        result = subprocess.run(
            ["bash", str(out / "k8s/node.sh")],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**env, "PATH": fake_bin(tmp_path / role, log)},
        )
        assert result.returncode == 0, result.stderr
        lines = log.read_text(encoding="utf-8").splitlines()
        if role == "head":  # the Ray head at MASTER_PORT on the pod's IP, then the server
            assert (
                lines[0] == "ray start --head --node-ip-address=10.0.0.5 --port=6379 --num-gpus=8"
            )
            assert lines[1].startswith("vllm serve meta-llama/Llama-3.1-70B-Instruct")
            assert "--distributed-executor-backend ray" in lines[1]
        else:  # a worker joins the head through KubeRay's head Service
            assert lines == [
                "ray start --address=vllm-llama70b-head-svc.serving.svc.cluster.local:6379 "
                "--node-ip-address=10.0.1.7 --num-gpus=8 --block"
            ]


@pytest.mark.parametrize("example", ["jobset-roce-4x8.toml", "kuberay-vllm-ray-2x8.yaml"])
def test_node_scripts_lint(compiler: Compiler, tmp_path: Path, example: str) -> None:
    docs = documents(compiler, REPO / "examples" / example)
    configmap = next(d for d in docs if d["kind"] == "ConfigMap")
    path = tmp_path / "node.sh"
    path.write_text(configmap["data"]["k8s--node.sh"], encoding="utf-8")
    subprocess.run(["bash", "-n", str(path)], check=True)
    subprocess.run([str(Path(sys.executable).parent / "shellcheck"), str(path)], check=True)


@pytest.mark.slow
def test_jobset_pods_take_their_rank_and_peers(compiler: Compiler, tmp_path: Path) -> None:
    docs = documents(compiler, REPO / "examples" / "jobset-roce-4x8.toml")
    configmap = next(d for d in docs if d["kind"] == "ConfigMap")
    jobset = next(d for d in docs if d["kind"] == "JobSet")
    template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    out = tmp_path / "mdc"
    volume = next(v for v in template["spec"]["volumes"] if v["name"] == "mdc")
    for item in volume["configMap"]["items"]:
        path = out / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(configmap["data"][item["key"]], encoding="utf-8")
        path.chmod(item["mode"])
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "torchrun").write_text(
        '#!/usr/bin/env bash\necho "$NODE_HOSTS"\necho "$@"\n', encoding="utf-8"
    )
    (folder / "torchrun").chmod(0o755)
    env = pod_env(template["spec"]["containers"][0]["env"], "10.0.0.9")
    # the Job controller sets JOB_COMPLETION_INDEX in an Indexed Job's pods
    result = subprocess.run(
        ["bash", str(out / "k8s/node.sh")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**env, "JOB_COMPLETION_INDEX": "2", "PATH": f"{folder}:{os.environ['PATH']}"},
    )
    assert result.returncode == 0, result.stderr
    hosts, args = result.stdout.splitlines()
    domain = "rdma-js.training.svc.cluster.local"
    assert hosts.split() == [f"rdma-js-node-0-{i}.{domain}" for i in range(4)]
    words = args.split()
    assert words[words.index("--node-rank") + 1] == "2"
    assert words[words.index("--master-addr") + 1] == f"rdma-js-node-0-0.{domain}"
