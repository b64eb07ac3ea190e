"""The leaderworkerset backend: the LeaderWorkerSet against its CRD, and ``k8s/node.sh`` run
by bash with the environment LWS gives a pod (LWS_LEADER_ADDRESS, the worker-index label)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration.k8s.validate import (
    CRDS,
    OLDEST,
    is_builtin,
    newest,
    validate_custom,
    validate_document,
)

from mdc.pipeline import Compiler

INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"


def disagg_spec(**lws: Any) -> dict[str, Any]:
    return {
        "job": {"name": "pd", "image": "lmsysorg/sglang:latest", "command": "python3"},
        "distributed": {
            "launcher": "sglang_disagg",
            "backend": "leaderworkerset",
            "nnodes": 4,
            "nproc_per_node": 2,
            "accelerator": "nvidia",
        },
        "sglang_disagg": {"model_path": "m"},
        "leaderworkerset": {"namespace": "serve", **lws},
    }


def compile_docs(
    compiler: Compiler, tmp_path: Path, data: dict[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    compiled = compiler.compile(spec)
    tree = {a.path: a.data for a in compiled.tree}
    docs = [d for d in yaml.safe_load_all(tree["leaderworkerset/lws.yaml"].decode()) if d]
    return docs, tree


def test_group_size_replicas_and_rank_from_the_worker_index_label(
    compiler: Compiler, tmp_path: Path
) -> None:
    docs, _ = compile_docs(compiler, tmp_path, disagg_spec(replicas=3, port=30000))
    assert [d["kind"] for d in docs] == ["ConfigMap", "LeaderWorkerSet", "Service"]
    lws = docs[1]
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert lws["spec"]["replicas"] == 3
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 4
    pod = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    assert "restartPolicy" not in pod  # StatefulSet pods: Always, the default
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert (
        env["MDC_WORKER_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
        == f"metadata.labels['{INDEX_LABEL}']"
    )
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 2}
    service = docs[2]
    assert service["metadata"]["name"] == "pd-leader"
    assert service["spec"]["selector"] == {
        "leaderworkerset.sigs.k8s.io/name": "pd",
        INDEX_LABEL: "0",
    }
    assert [
        e for d in docs if is_builtin(d) for e in validate_document(d, (OLDEST, newest()))
    ] == []
    if CRDS.is_dir():  # the CRD check itself is in test_kubernetes.py, which skips without it
        assert validate_custom(lws) == []


@pytest.mark.slow
def test_each_pod_of_a_group_runs_its_role_with_the_groups_hosts(
    compiler: Compiler, tmp_path: Path
) -> None:
    docs, _ = compile_docs(compiler, tmp_path, disagg_spec())
    data = docs[0]["data"]
    pod = docs[1]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    out = tmp_path / "mdc"
    for item in pod["volumes"][0]["configMap"]["items"]:
        (out / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        (out / item["path"]).write_text(data[item["key"]], encoding="utf-8")
    # every role script is replaced by one that reports what it got
    for script in (out / "launch").glob("*.sh"):
        script.write_text(
            f'#!/usr/bin/env bash\necho "{script.stem} $NODE_RANK $MASTER_ADDR '
            '$MASTER_PORT $NODE_HOSTS"\n',
            encoding="utf-8",
        )
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"] if "value" in e}
    leader = "pd-1.pd.serve"  # group 1 of LeaderWorkerSet pd, as LWS names it
    hosts = [leader, "pd-1-1.pd.serve", "pd-1-2.pd.serve", "pd-1-3.pd.serve"]
    # 4 nodes, the automatic split: 1 prefill (the leader, which also runs the router), 3 decode
    roles = {0: "prefill", 1: "decode", 2: "decode", 3: "decode"}
    for index in range(4):
        result = subprocess.run(
            ["bash", str(out / "k8s/node.sh")],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env={
                **env,
                "PATH": os.environ["PATH"],
                "LWS_LEADER_ADDRESS": leader,
                "MDC_WORKER_INDEX": str(index),
            },
        )
        assert result.returncode == 0, result.stderr
        role, rank, master, port, *node_hosts = result.stdout.split()
        assert (role, rank, master, port) == (roles[index], str(index), leader, env["MASTER_PORT"])
        assert node_hosts == hosts
    missing = subprocess.run(
        ["bash", str(out / "k8s/node.sh")],
        capture_output=True,
        check=False,
        text=True,
        env={**env, "PATH": os.environ["PATH"]},
        timeout=30,
    )
    assert missing.returncode == 2 and "LWS_LEADER_ADDRESS" in missing.stderr
