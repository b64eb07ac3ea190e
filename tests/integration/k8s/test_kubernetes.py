"""The kubernetes backend against the real consumers available offline.

Every Kubernetes document of every example on a Kubernetes backend (kubernetes,
leaderworkerset) validates strictly against kubernetes-validate's schemas for
1.30 and the newest it ships (custom resources against their CRD, see
``validate.py``); the ConfigMap carries the tree's launch files byte for byte;
every script in it passes ``bash -n`` and shellcheck; hostile strings read back
exactly; and ``k8s/node.sh`` run by bash as an Indexed Job pod would run it
gives each node its rank and role.
"""

from __future__ import annotations

import copy
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
    kubelet_env,
    newest,
    validate_builtin,
    validate_custom,
    validate_document,
)
from tests.tools import REPO, shellcheck

from mdc.pipeline import Compiled, Compiler

EXAMPLES = REPO / "examples"
K8S_FILES = ("kubernetes/job.yaml", "leaderworkerset/lws.yaml")


def k8s_examples() -> list[Path]:
    found = []
    for path in sorted(EXAMPLES.iterdir()):
        if path.suffix in (".toml", ".yaml", ".json") and path.stem.startswith(("k8s-", "lws-")):
            found.append(path)
    return found


def compile_at_repo(compiler: Compiler, spec: Path, monkeypatch: pytest.MonkeyPatch) -> Compiled:
    monkeypatch.chdir(REPO)
    return compiler.compile(spec)


def k8s_documents(compiled: Compiled) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for artifact in compiled.tree:
        if (
            artifact.path.endswith((".yaml", ".yml"))
            and "/" in artifact.path
            and not artifact.path.startswith("launch/")
        ):
            docs += [d for d in yaml.safe_load_all(artifact.data.decode()) if d is not None]
    return docs


def configmap_files(docs: list[dict[str, Any]]) -> dict[str, tuple[str, int]]:
    """Tree path -> (text, mode) as the pods see them (ConfigMap data through volume items)."""
    maps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    found: dict[str, tuple[str, int]] = {}
    for doc in docs:
        for spec in pod_specs(doc):
            for volume in spec.get("volumes", []):
                source = volume.get("configMap")
                if source is None or volume["name"] != "mdc":
                    continue
                for item in source["items"]:
                    found[item["path"]] = (maps[source["name"]][item["key"]], item["mode"])
    return found


def pod_specs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    if doc["kind"] == "Job":
        return [doc["spec"]["template"]["spec"]]
    if doc["kind"] == "LeaderWorkerSet":
        lwt = doc["spec"]["leaderWorkerTemplate"]
        return [t["spec"] for t in (lwt.get("leaderTemplate"), lwt["workerTemplate"]) if t]
    return []


@pytest.mark.parametrize("spec", k8s_examples(), ids=lambda p: p.name)
def test_every_builtin_document_validates_strictly(
    compiler: Compiler, spec: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = k8s_documents(compile_at_repo(compiler, spec, monkeypatch))
    builtin = [d for d in docs if is_builtin(d)]
    assert builtin, "no built-in Kubernetes document"
    errors = [e for d in builtin for e in validate_document(d, (OLDEST, newest()))]
    assert errors == []


@pytest.mark.parametrize(
    "spec", [p for p in k8s_examples() if p.stem.startswith("lws-")], ids=lambda p: p.name
)
def test_every_custom_resource_validates_against_its_crd(
    compiler: Compiler, spec: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not CRDS.is_dir():
        pytest.skip(f"the CRDs are not here: {CRDS} is absent")
    docs = k8s_documents(compile_at_repo(compiler, spec, monkeypatch))
    custom = [d for d in docs if not is_builtin(d)]
    assert [d["kind"] for d in custom] == ["LeaderWorkerSet"]
    assert [e for d in custom for e in validate_custom(d)] == []


def test_the_validator_finds_every_error(
    compiler: Compiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = k8s_documents(compile_at_repo(compiler, EXAMPLES / "k8s-torchrun-2x8.toml", monkeypatch))
    job = copy.deepcopy(next(d for d in docs if d["kind"] == "Job"))
    job["spec"]["backofLimit"] = 1
    job["spec"]["completions"] = "2"
    job["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "29500"
    errors = validate_builtin(job, OLDEST)
    assert len(errors) == 3, errors
    assert any("'backofLimit' was unexpected" in e for e in errors)
    assert any(e.startswith("spec.completions:") for e in errors)


def test_the_crd_validator_closes_objects_and_checks_list_maps(
    compiler: Compiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not CRDS.is_dir():
        pytest.skip(f"the CRDs are not here: {CRDS} is absent")
    docs = k8s_documents(compile_at_repo(compiler, EXAMPLES / "lws-vllm-ray-2x8.yaml", monkeypatch))
    lws = copy.deepcopy(next(d for d in docs if d["kind"] == "LeaderWorkerSet"))
    lws["spec"]["leaderWorkerTemplate"]["sise"] = 2
    container = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    container["ports"].append(dict(container["ports"][0]))
    errors = validate_custom(lws)
    assert any("'sise' was unexpected" in e for e in errors), errors
    assert any("duplicate list-map key" in e for e in errors), errors
    # size has a default in the CRD: leaving it out is not an error
    del lws["spec"]["leaderWorkerTemplate"]["sise"]
    del lws["spec"]["leaderWorkerTemplate"]["size"]
    container["ports"].pop()
    assert validate_custom(lws) == []


@pytest.mark.parametrize("spec", k8s_examples(), ids=lambda p: p.name)
def test_the_configmap_carries_the_tree(
    compiler: Compiler, spec: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled = compile_at_repo(compiler, spec, monkeypatch)
    shipped = configmap_files(k8s_documents(compiled))
    tree = {a.path: a for a in compiled.tree}
    launch = sorted(p for p in tree if p.startswith("launch/"))
    assert launch and set(launch) <= set(shipped)
    for path in launch:
        assert shipped[path][0].encode() == tree[path].data
        assert shipped[path][1] == (0o755 if tree[path].executable else 0o644)
    assert shipped["k8s/node.sh"][1] == 0o755


@pytest.mark.parametrize("spec", k8s_examples(), ids=lambda p: p.name)
def test_every_script_in_the_configmap_passes_bash_and_shellcheck(
    compiler: Compiler, spec: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    shipped = configmap_files(k8s_documents(compile_at_repo(compiler, spec, monkeypatch)))
    scripts = [p for p in shipped if p.endswith(".sh")]
    assert "k8s/node.sh" in scripts
    for path in scripts:
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(shipped[path][0], encoding="utf-8")
        subprocess.run(["bash", "-n", str(target)], check=True)
        result = subprocess.run(
            [shellcheck(), "-x", str(target)], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, f"{path}:\n{result.stdout}"


HOSTILE = [
    "yes",
    "no",
    "on",
    "null",
    "~",
    "0x1F",
    "1e3",
    "012",
    "2026-11-22",
    "12:30",
    "a: b",
    "- item",
    "#hash",
    "x # y",
    "'single'",
    '"double"',
    "{a: 1}",
    "[1]",
    "trailing ",
    " leading",
    "multi\nline",
    "tab\there",
    "ünïcödé",
    "*alias",
    "&anchor",
    "!tag",
    "%percent",
    "@at",
    "`tick`",
    "$(rm -rf /)",
    "back\\slash",
    "",
]


def test_hostile_strings_read_back_exactly(
    compiler: Compiler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {f"V{i}": value for i, value in enumerate(HOSTILE)}
    data: dict[str, Any] = {
        "job": {
            "name": "hostile",
            "image": "registry.local:5000/team/img:1.0@sha256:" + "a" * 64,
            "command": ["python", "train.py", *HOSTILE[:-1]],
            "env": env,
        },
        "distributed": {
            "launcher": "torchrun",
            "backend": "kubernetes",
            "nnodes": 2,
            "nproc_per_node": 2,
            "accelerator": "cpu",
        },
        "kubernetes": {
            "node_selector": {"pool": "true", "zone": "0123"},
            "labels": {"team": "null"},
        },
    }
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    compiled = compiler.compile(spec)
    docs = k8s_documents(compiled)
    assert validate_document(docs[0]) == validate_document(docs[2]) == []
    tree = {a.path: a.data.decode() for a in compiled.tree}
    assert configmap_files(docs)["launch/worker.sh"][0] == tree["launch/worker.sh"]
    job = next(d for d in docs if d["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == data["job"]["image"]
    assert pod["nodeSelector"] == {"pool": "true", "zone": "0123"}
    assert job["metadata"]["labels"]["team"] == "null"
    # the launch script, run by bash, hands the program every hostile word and value
    out = tmp_path / "out"
    out.mkdir()
    for path, (text, _mode) in configmap_files(docs).items():
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).write_text(text, encoding="utf-8")
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "torchrun").write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'env': {k: v for k, v in os.environ.items() "
        "if k.startswith('V')}}))\n",
        encoding="utf-8",
    )
    (stub / "torchrun").chmod(0o755)
    run_env = {
        "PATH": f"{stub}:{os.environ['PATH']}",
        "JOB_COMPLETION_INDEX": "1",
        "MASTER_ADDR": "hostile-0.hostile",
        "MASTER_PORT": "29500",
        "NODE_HOSTS": "hostile-0.hostile hostile-1.hostile",
    }
    result = subprocess.run(
        ["bash", str(out / "k8s/node.sh")],
        env=run_env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    seen = json.loads(result.stdout)
    assert seen["env"] == env
    assert seen["argv"][-len(HOSTILE) + 1 :] == HOSTILE[:-1]


@pytest.mark.slow
def test_node_script_runs_each_index_as_its_role(compiler: Compiler, tmp_path: Path) -> None:
    """An Indexed Job pod: JOB_COMPLETION_INDEX becomes NODE_RANK, the pod runs its role."""
    data = {
        "job": {"name": "rank", "image": "busybox", "command": ["python", "train.py"]},
        "distributed": {
            "launcher": "torchrun",
            "backend": "kubernetes",
            "nnodes": 3,
            "nproc_per_node": 1,
            "accelerator": "cpu",
        },
        "torchrun": {"rdzv_backend": "static"},
        "kubernetes": {"namespace": "ml"},
    }
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(data), encoding="utf-8")
    compiled = compiler.compile(spec)
    docs = k8s_documents(compiled)
    job = next(d for d in docs if d["kind"] == "Job")
    env = {
        e["name"]: e.get("value", e.get("valueFrom"))
        for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    hosts = [f"rank-{i}.rank.ml.svc.cluster.local" for i in range(3)]
    # NODE_HOSTS is built by node.sh (below), so the Job does not grow with nnodes
    assert env == {
        "MASTER_ADDR": hosts[0],
        "MASTER_PORT": str(compiled.plan.rendezvous.master_port),
        "MDC_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        "MDC_LAUNCH_ID": "$(MDC_NAMESPACE)/rank",
    }
    env = kubelet_env(job["spec"]["template"]["spec"]["containers"][0]["env"], "ml")
    assert env["MDC_LAUNCH_ID"] == "ml/rank"  # <namespace>/<Job name>
    assert job["spec"]["template"]["spec"]["subdomain"] == "rank"
    service = next(d for d in docs if d["kind"] == "Service")
    assert service["spec"]["clusterIP"] == "None"
    assert (
        service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    )
    out = tmp_path / "mdc"
    for path, (text, _mode) in configmap_files(docs).items():
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).write_text(text, encoding="utf-8")
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "torchrun").write_text(
        '#!/bin/sh\necho "$NODE_RANK $MASTER_ADDR $NODE_HOSTS $*"\n', encoding="utf-8"
    )
    (stub / "torchrun").chmod(0o755)
    for index in range(3):
        result = subprocess.run(
            ["bash", str(out / "k8s/node.sh")],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env={**env, "PATH": f"{stub}:{os.environ['PATH']}", "JOB_COMPLETION_INDEX": str(index)},
        )
        assert result.returncode == 0, result.stderr
        rank, master, *seen_hosts = result.stdout.split(" ", 2 + len(hosts))
        args = seen_hosts.pop()
        assert (rank, master, seen_hosts) == (str(index), hosts[0], hosts)
        assert f"--node-rank {index}" in args
    missing = subprocess.run(
        ["bash", str(out / "k8s/node.sh")],
        capture_output=True,
        check=False,
        text=True,
        env={**env, "PATH": os.environ["PATH"]},
        timeout=30,
    )
    assert missing.returncode == 2 and "JOB_COMPLETION_INDEX" in missing.stderr
