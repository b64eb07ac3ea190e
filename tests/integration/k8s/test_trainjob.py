"""The trainjob backend: every document against its schema (ConfigMap: kubernetes-validate's
strict schemas, 1.30 and newest; TrainJob: the v1alpha1 CRD), and ``k8s/node.sh`` run by bash
with the PET_* environment the Trainer's torch plugin gives each node's pod (see
tests/unit/test_backend_trainjob.py for where those facts come from)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration.k8s.test_pytorchjob import retarget
from tests.integration.k8s.validate import (
    CRDS,
    OLDEST,
    is_builtin,
    kubelet_env,
    newest,
    validate_custom,
    validate_document,
)
from tests.tools import REPO

from mdc.pipeline import Compiler


def spec(**extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "job": {"name": "tj", "command": ["python", "train.py"], "image": "img:1"},
        "distributed": {
            "launcher": "torchrun",
            "backend": "trainjob",
            "nnodes": 3,
            "nproc_per_node": 2,
            "accelerator": "nvidia",
            "master_port": 29500,
        },
    }
    for key, value in extra.items():
        data.setdefault(key, {}).update(value)
    return data


def compile_docs(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> list[dict[str, Any]]:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    tree = {a.path: a.data for a in compiler.compile(path).tree}
    return [d for d in yaml.safe_load_all(tree["trainjob/job.yaml"].decode()) if d]


SPECS = {
    "plain": spec(),
    "cpu": spec(distributed={"accelerator": "cpu", "nnodes": 2}),
    "everything": spec(
        job={"env": {"NCCL_DEBUG": "INFO"}},
        trainjob={
            "namespace": "ml",
            "runtime": "torch-rocm",
            "runtime_kind": "TrainingRuntime",
            "image_pull_secrets": ["regcred"],
            "node_selector": {"pool": "gpu"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "service_account": "trainer",
            "cpu": "32",
            "memory": "256Gi",
            "shm_size": "64Gi",
            "labels": {"team": "llm"},
            "gpus_per_node": 2,
            "volumes": [{"name": "ckpt", "mount_path": "/ckpt", "claim": "ckpt"}],
            "active_deadline_seconds": 3600,
        },
    ),
}


@pytest.mark.parametrize("case", sorted(SPECS))
def test_every_document_validates(compiler: Compiler, tmp_path: Path, case: str) -> None:
    docs = compile_docs(compiler, tmp_path, SPECS[case])
    assert [d["kind"] for d in docs] == ["ConfigMap", "TrainJob"]
    assert [
        e for d in docs if is_builtin(d) for e in validate_document(d, (OLDEST, newest()))
    ] == []
    assert CRDS.is_dir(), f"the CRDs are missing from {CRDS}"
    assert validate_custom(docs[1]) == []


@pytest.mark.slow
def test_nodes_run_with_the_trainers_env(compiler: Compiler, tmp_path: Path) -> None:
    docs = compile_docs(compiler, tmp_path, spec(torchrun={"rdzv_backend": "static"}))
    configmap, job = docs
    pod = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"][
        "replicatedJobs"
    ][0]["template"]["spec"]["template"]["spec"]
    out = tmp_path / "mdc"
    volume = next(v for v in pod["volumes"] if v["name"] == "mdc")
    for item in volume["configMap"]["items"]:
        path = out / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(configmap["data"][item["key"]], encoding="utf-8")
        path.chmod(item["mode"])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(
        '#!/usr/bin/env bash\necho "$NODE_HOSTS"\necho "$@"\n', encoding="utf-8"
    )
    (bin_dir / "torchrun").chmod(0o755)
    env = kubelet_env(job["spec"]["trainer"]["env"])
    assert env["MDC_LAUNCH_ID"] == "default/" + job["metadata"]["name"]
    for index in range(3):
        trainer = {
            "PET_NNODES": "3",
            "PET_NPROC_PER_NODE": "2",
            "PET_NODE_RANK": str(index),
            "PET_MASTER_ADDR": "tj-node-0-0.tj",
            "PET_MASTER_PORT": "29500",
            "JOB_COMPLETION_INDEX": str(index),
        }
        result = subprocess.run(
            ["bash", str(out / "k8s/node.sh")],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env={**env, **trainer, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        )
        assert result.returncode == 0, result.stderr
        hosts, args = result.stdout.splitlines()
        assert hosts.split() == [f"tj-node-0-{i}.tj" for i in range(3)]
        words = args.split()
        assert words[words.index("--node-rank") + 1] == str(index)
        assert words[words.index("--master-addr") + 1] == "tj-node-0-0.tj"
        assert words[words.index("--master-port") + 1] == "29500"
        assert words[words.index("--nnodes") + 1] == "3"
        assert words[words.index("--nproc-per-node") + 1] == "2"
    missing = subprocess.run(
        ["bash", str(out / "k8s/node.sh")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**env, "PATH": os.environ["PATH"]},
    )
    assert missing.returncode == 2


def test_node_script_lints(compiler: Compiler, tmp_path: Path) -> None:
    for key, text in compile_docs(compiler, tmp_path, spec())[0]["data"].items():
        path = tmp_path / key
        path.write_text(text, encoding="utf-8")
        subprocess.run(["bash", "-n", str(path)], check=True)
        subprocess.run([str(Path(sys.executable).parent / "shellcheck"), str(path)], check=True)


def test_example_golden_validates() -> None:
    text = (
        REPO / "golden" / "examples" / "trainjob-torchrun-4x8" / "trainjob" / "job.yaml"
    ).read_text(encoding="utf-8")
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert [e for d in docs for e in validate_document(d, (OLDEST, newest()))] == []


@pytest.mark.parametrize(
    "example",
    [
        "basic-2x2.yaml",
        "deepspeed-2x2-cpu.json",
        "megatron-cpu-2x2.toml",
        "primus-megatron-2x8.yaml",
        "torchtitan-cpu-2x2.yaml",
    ],
)
def test_each_supported_launcher(compiler: Compiler, tmp_path: Path, example: str) -> None:
    docs = compile_docs(compiler, tmp_path, retarget(example, "trainjob"))
    assert [e for d in docs for e in validate_document(d, (OLDEST, newest()))] == []
