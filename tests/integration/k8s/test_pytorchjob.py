"""The pytorchjob backend: every document against its schema (ConfigMap: kubernetes-validate's
strict schemas, 1.30 and newest; PyTorchJob: the CRD), and ``k8s/node.sh`` run by bash with
the environment the training operator gives each pod (see tests/unit/test_backend_pytorchjob.py
for where those facts come from)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
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


def compile_docs(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> list[dict[str, Any]]:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    tree = {a.path: a.data for a in compiler.compile(path).tree}
    return [d for d in yaml.safe_load_all(tree["pytorchjob/job.yaml"].decode()) if d]


SPECS = {
    "fixed": spec(),
    "single": spec(distributed={"nnodes": 1}),
    "elastic": spec(distributed={"min_nnodes": 2, "nnodes": 4}, torchrun={"max_restarts": 1}),
    "everything": spec(
        job={"env": {"NCCL_DEBUG": "INFO"}},
        distributed={"accelerator": "amd"},
        pytorchjob={
            "namespace": "ml",
            "image_pull_policy": "IfNotPresent",
            "image_pull_secrets": ["regcred"],
            "node_selector": {"pool": "gpu"},
            "tolerations": [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "service_account": "trainer",
            "priority_class": "high",
            "cpu": 32,
            "memory": "256Gi",
            "shm_size": "64Gi",
            "labels": {"team": "llm"},
            "volumes": [
                {"name": "ckpt", "mount_path": "/ckpt", "claim": "ckpt"},
                {"name": "data", "mount_path": "/data", "host_path": "/mnt/d", "read_only": True},
            ],
            "restart_policy": "ExitCode",
            "backoff_limit": 3,
            "ttl_seconds_after_finished": 600,
            "active_deadline_seconds": 86400,
        },
    ),
}


@pytest.mark.parametrize("case", sorted(SPECS))
def test_every_document_validates(compiler: Compiler, tmp_path: Path, case: str) -> None:
    docs = compile_docs(compiler, tmp_path, SPECS[case])
    assert [d["kind"] for d in docs] == ["ConfigMap", "PyTorchJob"]
    assert [
        e for d in docs if is_builtin(d) for e in validate_document(d, (OLDEST, newest()))
    ] == []
    assert CRDS.is_dir(), f"the CRDs are missing from {CRDS}"
    assert validate_custom(docs[1]) == []


def lay_out(docs: list[dict[str, Any]], out: Path, rtype: str) -> dict[str, str]:
    """The ConfigMap's files as the pod sees them; returns the container's literal env."""
    pod = docs[1]["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "mdc")
    for item in volume["configMap"]["items"]:
        path = out / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(docs[0]["data"][item["key"]], encoding="utf-8")
        path.chmod(item["mode"])
    return kubelet_env(pod["containers"][0].get("env", []))


def fake_torchrun(tmp_path: Path) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(
        '#!/usr/bin/env bash\necho "$NODE_HOSTS"\necho "$@"\n', encoding="utf-8"
    )
    (bin_dir / "torchrun").chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


@pytest.mark.slow
def test_pods_run_their_node_with_the_operators_env(compiler: Compiler, tmp_path: Path) -> None:
    docs = compile_docs(compiler, tmp_path, spec(torchrun={"rdzv_backend": "static"}))
    out = tmp_path / "mdc"
    path = fake_torchrun(tmp_path)
    for rtype, index, rank in (("Master", 0, 0), ("Worker", 0, 1), ("Worker", 1, 2)):
        env = lay_out(docs, out, rtype)
        operator = {
            "MASTER_ADDR": "pj-master-0",
            "MASTER_PORT": "23456",
            "WORLD_SIZE": "12",
            "RANK": str(rank),
            "PET_NODE_RANK": str(rank),
            "PET_NNODES": "3",
            "PET_NPROC_PER_NODE": "4",
            "PYTHONUNBUFFERED": "0",
            "HOSTNAME": f"pj-{rtype.lower()}-{index}",
        }
        result = subprocess.run(
            ["bash", str(out / "k8s/node.sh")],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env={**env, **operator, "PATH": path},
        )
        assert result.returncode == 0, result.stderr
        hosts, args = result.stdout.splitlines()
        assert hosts == "pj-master-0 pj-worker-0 pj-worker-1"
        words = args.split()
        assert words[words.index("--node-rank") + 1] == str(rank)
        assert words[words.index("--master-addr") + 1] == "pj-master-0"
        assert words[words.index("--master-port") + 1] == "23456"
        assert words[words.index("--nnodes") + 1] == "3"
        assert words[words.index("--nproc-per-node") + 1] == "4"


@pytest.mark.slow
def test_elastic_pods_meet_at_worker_0(compiler: Compiler, tmp_path: Path) -> None:
    docs = compile_docs(compiler, tmp_path, spec(distributed={"min_nnodes": 2, "nnodes": 4}))
    out = tmp_path / "mdc"
    env = lay_out(docs, out, "Worker")
    (out / "launch" / "worker.sh").write_text(
        '#!/usr/bin/env bash\necho "$NODE_RANK $MASTER_ADDR:$MASTER_PORT"\n', encoding="utf-8"
    )
    for index in range(4):
        # elastic.go: PET_RDZV_ENDPOINT = rdzvHost:rdzvPort; no MASTER_*/RANK without a Master
        operator = {
            "PET_RDZV_ENDPOINT": "pj-worker-0:23456",
            "PET_RDZV_BACKEND": "c10d",
            "PET_NNODES": "2:4",
            "HOSTNAME": f"pj-worker-{index}",
        }
        result = subprocess.run(
            ["bash", str(out / "k8s/node.sh")],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env={**env, **operator, "PATH": os.environ["PATH"]},
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == [str(index), operator["PET_RDZV_ENDPOINT"]]


def test_node_script_lints(compiler: Compiler, tmp_path: Path) -> None:
    for data in (spec(), spec(distributed={"min_nnodes": 2})):
        for key, text in compile_docs(compiler, tmp_path, data)[0]["data"].items():
            path = tmp_path / key
            path.write_text(text, encoding="utf-8")
            subprocess.run(["bash", "-n", str(path)], check=True)
            subprocess.run([str(Path(sys.executable).parent / "shellcheck"), str(path)], check=True)


@pytest.mark.parametrize("example", ["pytorchjob-elastic", "pytorchjob-torchrun-2x8"])
def test_example_goldens_validate(example: str) -> None:
    text = (REPO / "golden" / "examples" / example / "pytorchjob" / "job.yaml").read_text(
        encoding="utf-8"
    )
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert [e for d in docs for e in validate_document(d, (OLDEST, newest()))] == []


LAUNCHER_EXAMPLES = [
    "basic-2x2.yaml",
    "deepspeed-2x2-cpu.json",
    "megatron-cpu-2x2.toml",
    "primus-megatron-2x8.yaml",
    "torchtitan-cpu-2x2.yaml",
]


def retarget(example: str, backend: str) -> dict[str, Any]:
    """Another launcher's example spec, moved onto ``backend`` (with an image)."""
    path = REPO / "examples" / example
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".toml":
        data: dict[str, Any] = tomllib.loads(text)
    else:
        data = yaml.safe_load(text)
    for table in ("local", "slurm", "ssh"):
        data.pop(table, None)
    data["distributed"]["backend"] = backend
    data["job"]["image"] = "img:1"
    return data


@pytest.mark.parametrize("example", LAUNCHER_EXAMPLES)
def test_each_supported_launcher(compiler: Compiler, tmp_path: Path, example: str) -> None:
    docs = compile_docs(compiler, tmp_path, retarget(example, "pytorchjob"))
    assert [e for d in docs for e in validate_document(d, (OLDEST, newest()))] == []
