"""The pytorchjob backend: the operator's env contract, the findings, YAML round trips.

Operator facts (kubeflow/training-operator v1.7+, pkg/controller.v1/pytorch/envvar.go,
master.go, elastic.go, hpa.go; the CRD's scale subresource):
- the Master's container named ``pytorch`` needs a port named ``pytorchjob-port``; the
  operator sets MASTER_PORT from it and MASTER_ADDR = ``<job>-master-0``;
- RANK = PET_NODE_RANK = replica index, +1 for Workers; WORLD_SIZE = pods * int(nprocPerNode);
  PET_NNODES = pods;
- with an elasticPolicy: PET_NNODES = "minReplicas:maxReplicas", PET_RDZV_ENDPOINT =
  rdzvHost:rdzvPort, and an HPA that scales ``.spec.pytorchReplicaSpecs.Worker.replicas``
  between minReplicas and maxReplicas.
(Schema validation of every document: tests/integration/k8s/test_pytorchjob.py.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from mdc.errors import SpecError
from mdc.pipeline import Compiled, Compiler


def spec(**extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "job": {"name": "pj", "command": ["python", "train.py"], "image": "img:1"},
        "distributed": {
            "launcher": "torchrun",
            "backend": "pytorchjob",
            "nnodes": 3,
            "nproc_per_node": 4,
            "accelerator": "nvidia",
            "master_port": 23456,
        },
    }
    for key, value in extra.items():
        data.setdefault(key, {}).update(value)
    return data


def compile_(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> Compiled:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return compiler.compile(path)


def docs_of(compiled: Compiled) -> list[dict[str, Any]]:
    tree = {a.path: a.data.decode() for a in compiled.tree}
    return [d for d in yaml.safe_load_all(tree["pytorchjob/job.yaml"]) if d]


def job_of(compiled: Compiled) -> dict[str, Any]:
    docs = docs_of(compiled)
    assert [d["kind"] for d in docs] == ["ConfigMap", "PyTorchJob"]
    return docs[1]


def containers(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for rtype, replica in job["spec"]["pytorchReplicaSpecs"].items():
        (container,) = replica["template"]["spec"]["containers"]
        out[rtype] = container
    return out


def test_master_and_workers_match_the_operator(
    compiler: Compiler, tmp_path: Path, pod_node_hosts: Callable[[str], list[str]]
) -> None:
    compiled = compile_(compiler, tmp_path, spec())
    job = job_of(compiled)
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert job["apiVersion"] == "kubeflow.org/v1"
    assert job["spec"]["nprocPerNode"] == "4"  # a string in the CRD
    assert {k: v["replicas"] for k, v in specs.items()} == {"Master": 1, "Worker": 2}
    assert "elasticPolicy" not in job["spec"]
    for container in containers(job).values():
        assert container["name"] == "pytorch"
        assert container["ports"] == [
            {"name": "pytorchjob-port", "containerPort": 23456, "protocol": "TCP"}
        ]
        assert container["command"] == ["bash", "/mdc/k8s/node.sh"]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        # MASTER_* come from the operator, NODE_HOSTS from node.sh; the launch id is
        # <namespace>/<PyTorchJob name>
        assert env == {"MDC_NAMESPACE": None, "MDC_LAUNCH_ID": "$(MDC_NAMESPACE)/pj"}
        assert container["resources"]["limits"] == {"nvidia.com/gpu": 4}
    # WORLD_SIZE as the operator computes it (pods * nprocPerNode) is the plan's world size
    pods = sum(r["replicas"] for r in specs.values())
    assert pods * int(job["spec"]["nprocPerNode"]) == compiled.plan.world_size == 12
    node_sh = docs_of(compiled)[0]["data"]["k8s--node.sh"]
    assert 'export NODE_RANK="${RANK:-}"' in node_sh
    # the operator's per-pod Services, in node-rank order
    assert pod_node_hosts(node_sh) == ["pj-master-0", "pj-worker-0", "pj-worker-1"]


def test_torchrun_flags_agree_with_the_pet_env(compiler: Compiler, tmp_path: Path) -> None:
    """torchrun reads PET_NNODES / PET_NPROC_PER_NODE only without flags; the flags agree."""
    compiled = compile_(compiler, tmp_path, spec())
    script = docs_of(compiled)[0]["data"]["launch--worker.sh"]
    assert "--nnodes 3 " in script and "--nproc-per-node 4 " in script


def test_elastic_is_workers_only(
    compiler: Compiler, tmp_path: Path, pod_node_hosts: Callable[[str], list[str]]
) -> None:
    compiled = compile_(
        compiler,
        tmp_path,
        spec(distributed={"min_nnodes": 2, "nnodes": 4}, torchrun={"max_restarts": 2}),
    )
    job = job_of(compiled)
    # the HPA scales Worker.replicas within [min, max]: every node must be a Worker
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Worker"]
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 4
    policy = job["spec"]["elasticPolicy"]
    assert policy == {
        "minReplicas": 2,
        "maxReplicas": 4,
        "rdzvBackend": "c10d",
        "rdzvHost": "pj-worker-0",
        "rdzvPort": 23456,
        "maxRestarts": 2,
    }
    env = {e["name"]: e.get("value") for e in containers(job)["Worker"]["env"]}
    # PET_RDZV_ENDPOINT = rdzvHost:rdzvPort = the MASTER_ADDR:MASTER_PORT torchrun gets
    assert (
        f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}" == f"{policy['rdzvHost']}:{policy['rdzvPort']}"
    )
    data = docs_of(compiled)[0]["data"]
    assert pod_node_hosts(data["k8s--node.sh"]) == [f"pj-worker-{i}" for i in range(4)]
    # PET_NNODES = "min:max", PET_MAX_RESTARTS = maxRestarts
    assert "--nnodes 2:4 " in data["launch--worker.sh"]
    assert "--max-restarts 2 " in data["launch--worker.sh"]
    assert 'NODE_RANK="${HOSTNAME##*-}"' in data["k8s--node.sh"]


def test_single_node_is_a_master_only(compiler: Compiler, tmp_path: Path) -> None:
    job = job_of(compile_(compiler, tmp_path, spec(distributed={"nnodes": 1})))
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Master"]


def test_run_policy(compiler: Compiler, tmp_path: Path) -> None:
    job = job_of(
        compile_(
            compiler,
            tmp_path,
            spec(
                pytorchjob={
                    "backoff_limit": 2,
                    "ttl_seconds_after_finished": 60,
                    "active_deadline_seconds": 9,
                    "restart_policy": "ExitCode",
                }
            ),
        )
    )
    assert job["spec"]["runPolicy"] == {
        "activeDeadlineSeconds": 9,
        "backoffLimit": 2,
        "cleanPodPolicy": "Running",
        "ttlSecondsAfterFinished": 60,
    }
    assert {r["restartPolicy"] for r in job["spec"]["pytorchReplicaSpecs"].values()} == {"ExitCode"}


@pytest.mark.parametrize(
    "value",
    [
        "yes",
        "on",
        "no",
        "1:20",
        "0x1F",
        "1e3",
        "~",
        "null",
        "-",
        "a: 'b' \"c\" # $(rm -rf /)\n- d",
        " x ",
        "",
    ],
)
def test_strings_read_back_as_strings(compiler: Compiler, tmp_path: Path, value: str) -> None:
    """YAML 1.1 readers (kubectl's sigs.k8s.io/yaml, PyYAML) read the text back unchanged."""
    image = f"img{value}".rstrip()  # the apiserver refuses an image that ends with a space
    data = spec(
        job={"image": image, "env": {"HOSTILE": value}},
        pytorchjob={"labels": {"team": "on"}, "namespace": "yes"},
    )
    compiled = compile_(compiler, tmp_path, data)
    job = job_of(compiled)
    assert job["metadata"]["namespace"] == "yes"
    assert job["metadata"]["labels"]["team"] == "on"
    assert containers(job)["Master"]["image"] == image
    assert docs_of(compiled)[0]["data"]["launch--worker.sh"] == next(
        a.data.decode() for a in compiled.tree if a.path == "launch/worker.sh"
    )


def codes(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> set[str]:
    with pytest.raises(SpecError) as raised:
        compile_(compiler, tmp_path, data)
    return {d.code for d in raised.value.diagnostics}


def test_findings(compiler: Compiler, tmp_path: Path) -> None:
    no_image = spec()
    del no_image["job"]["image"]
    assert "MDC460" in codes(compiler, tmp_path, no_image)
    # a Service name (DNS-1035) must start with a letter
    assert "MDC470" in codes(compiler, tmp_path, spec(job={"name": "9lives"}))
    # a serving launcher is not among the pytorchjob backend's launchers (core's MDC231)
    served = spec(distributed={"launcher": "vllm"}, vllm={"model": "m"})
    assert "MDC231" in codes(compiler, tmp_path, served)
