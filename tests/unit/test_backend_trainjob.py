"""The trainjob backend: the Trainer's env contract, the runtime patch, the findings.

Trainer facts (kubeflow/trainer v2, pkg/runtime/framework/plugins/torch and pkg/constants):
the torch plugin sets in the trainer container PET_NNODES = numNodes,
PET_NPROC_PER_NODE = numProcPerNode, PET_NODE_RANK = the Job completion index,
PET_MASTER_ADDR = ``<job>-node-0-0.<job>`` and PET_MASTER_PORT = 29500
(ContainerTrainerPort), taking precedence over the TrainJob's own env; the
torch-distributed runtime's replicated job and container are both ``node``
(the CRDs' upstream samples, ``examples/`` in tests.tools.CRD_PLACES); the v1alpha1 TrainJob has ``runtimePatches``
(no podSpecOverrides) with volumes and containers[].volumeMounts.
(Schema validation of every document: tests/integration/k8s/test_trainjob.py.)
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

RUNTIME_SAMPLE = "examples/clustertrainingruntime-torch-distributed.yaml"


def spec(**extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "job": {"name": "tj", "command": ["python", "train.py"], "image": "img:1"},
        "distributed": {
            "launcher": "torchrun",
            "backend": "trainjob",
            "nnodes": 4,
            "nproc_per_node": 8,
            "accelerator": "amd",
            "master_port": 29500,
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
    docs = [d for d in yaml.safe_load_all(tree["trainjob/job.yaml"]) if d]
    assert [d["kind"] for d in docs] == ["ConfigMap", "TrainJob"]
    return docs


def patched_pod(job: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    (patch,) = job["spec"]["runtimePatches"]
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    return rjob["name"], rjob["template"]["spec"]["template"]["spec"]


def test_trainer_contract(
    compiler: Compiler, tmp_path: Path, pod_node_hosts: Callable[[str], list[str]]
) -> None:
    compiled = compile_(compiler, tmp_path, spec())
    configmap, job = docs_of(compiled)
    trainer = job["spec"]["trainer"]
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert trainer["numNodes"] == 4 and trainer["numProcPerNode"] == 8  # integers here
    assert trainer["resourcesPerNode"]["limits"] == {"amd.com/gpu": 8}
    assert trainer["command"] == ["bash", "/mdc/k8s/node.sh"]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env == {
        "MASTER_PORT": "29500",
        "MDC_NAMESPACE": None,  # from the downward API
        "MDC_LAUNCH_ID": "$(MDC_NAMESPACE)/" + job["metadata"]["name"],
    }
    assert not any(name.startswith("PET_") for name in env)  # the Trainer's own win anyway
    node_sh = configmap["data"]["k8s--node.sh"]
    assert pod_node_hosts(node_sh) == [f"tj-node-0-{i}.tj" for i in range(4)]
    assert 'export NODE_RANK="${PET_NODE_RANK:-}"' in node_sh
    assert 'export MASTER_ADDR="${PET_MASTER_ADDR:-}"' in node_sh
    assert job["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": "torch-distributed",
    }
    worker = configmap["data"]["launch--worker.sh"]
    # torchrun's flags agree with PET_NNODES and PET_NPROC_PER_NODE
    assert "--nnodes 4 " in worker and "--nproc-per-node 8 " in worker


def test_patch_targets_the_runtime_names(
    compiler: Compiler, tmp_path: Path, shared_crds: Path
) -> None:
    _, job = docs_of(
        compile_(
            compiler,
            tmp_path,
            spec(
                trainjob={
                    "node_selector": {"pool": "mi300x"},
                    "service_account": "trainer",
                    "tolerations": [
                        {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                    ],
                    "volumes": [{"name": "ckpt", "mount_path": "/ckpt", "claim": "ckpt-pvc"}],
                }
            ),
        )
    )
    runtime = yaml.safe_load((shared_crds / RUNTIME_SAMPLE).read_text(encoding="utf-8"))
    (rjob,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    (rcontainer,) = rjob["template"]["spec"]["template"]["spec"]["containers"]
    name, pod = patched_pod(job)
    assert name == rjob["name"] == "node"
    assert [c["name"] for c in pod["containers"]] == [rcontainer["name"]]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts == {"mdc": "/mdc", "dshm": "/dev/shm", "ckpt": "/ckpt"}
    assert {v["name"] for v in pod["volumes"]} == set(mounts)
    assert pod["nodeSelector"] == {"pool": "mi300x"}
    assert pod["serviceAccountName"] == "trainer"
    assert pod["tolerations"] == [
        {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]


def test_named_runtime(
    compiler: Compiler, tmp_path: Path, pod_node_hosts: Callable[[str], list[str]]
) -> None:
    configmap, job = docs_of(
        compile_(
            compiler,
            tmp_path,
            spec(
                trainjob={
                    "runtime": "torch-rocm",
                    "runtime_kind": "TrainingRuntime",
                    "replicated_job": "trainer-node",
                    "container": "trainer",
                    "namespace": "ml",
                }
            ),
        )
    )
    assert job["spec"]["runtimeRef"]["kind"] == "TrainingRuntime"
    assert job["spec"]["runtimeRef"]["name"] == "torch-rocm"
    name, pod = patched_pod(job)
    assert name == "trainer-node" and pod["containers"][0]["name"] == "trainer"
    hosts = pod_node_hosts(configmap["data"]["k8s--node.sh"])
    assert hosts[0] == "tj-trainer-node-0-0.tj"


@pytest.mark.parametrize("value", ["yes", "off", "1:20", "0o17", "a: 'b' \"c\" # $(x)\n- d"])
def test_strings_read_back_as_strings(compiler: Compiler, tmp_path: Path, value: str) -> None:
    _, job = docs_of(
        compile_(
            compiler,
            tmp_path,
            spec(job={"image": value}, trainjob={"namespace": "no", "node_selector": {"k": "on"}}),
        )
    )
    assert job["spec"]["trainer"]["image"] == value
    assert job["metadata"]["namespace"] == "no"
    assert patched_pod(job)[1]["nodeSelector"] == {"k": "on"}


def codes(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> set[str]:
    with pytest.raises(SpecError) as raised:
        compile_(compiler, tmp_path, data)
    return {d.code for d in raised.value.diagnostics}


def test_findings(compiler: Compiler, tmp_path: Path) -> None:
    no_image = spec()
    del no_image["job"]["image"]
    assert "MDC460" in codes(compiler, tmp_path, no_image)
    assert "MDC480" in codes(compiler, tmp_path, spec(job={"name": "9lives"}))
    assert "MDC481" in codes(compiler, tmp_path, spec(distributed={"min_nnodes": 2}))
    found = codes(
        compiler, tmp_path, spec(trainjob={"image_pull_policy": "Always", "priority_class": "high"})
    )
    assert "MDC483" in found


@pytest.mark.parametrize("name", ["Node_X", "a$(touch /tmp/x)", "n" * 70])
def test_replicated_job_must_be_a_dns_label(compiler: Compiler, tmp_path: Path, name: str) -> None:
    """It names the pods (<job>-<replicatedJob>-0-<i>): reported where it is written."""
    assert codes(compiler, tmp_path, spec(trainjob={"replicated_job": name})) == {"MDC461"}
