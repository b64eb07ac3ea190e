"""The kubernetes backend and the shared k8s lint: names, labels, enums, quantities, volumes,
the YAML writer, and what the Job, Service and ConfigMap hold."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from mdc.api import Artifact
from mdc.errors import Diagnostic, SpecError
from mdc.pipeline import Compiled, Compiler
from mdc_builtin.backends._k8s import common as k8s


def spec(
    name: str = "train", nnodes: int = 2, accelerator: str = "nvidia", **table: Any
) -> dict[str, Any]:
    return {
        "job": {"name": name, "image": "img:1", "command": ["python", "train.py"]},
        "distributed": {
            "launcher": "torchrun",
            "backend": "kubernetes",
            "nnodes": nnodes,
            "nproc_per_node": 8,
            "accelerator": accelerator,
            "master_port": 29400,
        },
        "kubernetes": table,
    }


def compiled_of(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> Compiled:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return compiler.compile(path)


def docs_of(compiled: Compiled) -> dict[str, dict[str, Any]]:
    text = next(a.data.decode() for a in compiled.tree if a.path == "kubernetes/job.yaml")
    return {d["kind"]: d for d in yaml.safe_load_all(text)}


def errors(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> list[Diagnostic]:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(SpecError) as raised:
        compiler.compile(path)
    return list(raised.value.diagnostics)


def codes(found: list[Diagnostic] | tuple[Diagnostic, ...]) -> list[tuple[str, str]]:
    return [(d.code, d.location.pointer) for d in found]


def test_an_indexed_job_of_nnodes_pods_with_a_headless_service(
    compiler: Compiler, tmp_path: Path, pod_node_hosts: Callable[[str], list[str]]
) -> None:
    docs = docs_of(
        compiled_of(
            compiler, tmp_path, spec(nnodes=3, backoff_limit=2, ttl_seconds_after_finished=60)
        )
    )
    assert list(docs) == ["ConfigMap", "Service", "Job"]
    job = docs["Job"]["spec"]
    assert (job["completionMode"], job["completions"], job["parallelism"]) == ("Indexed", 3, 3)
    assert (job["backoffLimit"], job["ttlSecondsAfterFinished"]) == (2, 60)
    pod = job["template"]["spec"]
    assert pod["subdomain"] == docs["Service"]["metadata"]["name"] == "train"
    assert docs["Service"]["spec"]["clusterIP"] == "None"
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == "train-0.train"
    # the launch id: <namespace>/<Job name>, the namespace from the downward API, which the
    # kubelet expands in a later variable's value as $(MDC_NAMESPACE)
    names = [e["name"] for e in pod["containers"][0]["env"]]
    assert names.index("MDC_NAMESPACE") < names.index("MDC_LAUNCH_ID")
    namespace = pod["containers"][0]["env"][names.index("MDC_NAMESPACE")]
    assert namespace["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["MDC_LAUNCH_ID"] == "$(MDC_NAMESPACE)/" + docs["Job"]["metadata"]["name"]
    assert "NODE_HOSTS" not in env  # node.sh builds it: the Job does not grow with nnodes
    node_sh = docs["ConfigMap"]["data"]["k8s--node.sh"]
    assert pod_node_hosts(node_sh) == ["train-0.train", "train-1.train", "train-2.train"]
    assert env["MASTER_PORT"] == "29400"
    assert pod["containers"][0]["command"] == ["bash", "/mdc/k8s/node.sh"]
    assert pod["restartPolicy"] == "Never"


@pytest.mark.parametrize(
    ("accelerator", "table", "requests", "limits"),
    [
        ("nvidia", {}, {"nvidia.com/gpu": 8}, {"nvidia.com/gpu": 8}),
        # burstable (the default): cpu and memory are requests, the GPU is both
        (
            "amd",
            {"cpu": "500m", "memory": "64Gi"},
            {"amd.com/gpu": 8, "cpu": "500m", "memory": "64Gi"},
            {"amd.com/gpu": 8},
        ),
        (
            "amd",
            {"cpu": "500m", "memory": "64Gi", "qos": "guaranteed"},
            {"amd.com/gpu": 8, "cpu": "500m", "memory": "64Gi"},
            {"amd.com/gpu": 8, "cpu": "500m", "memory": "64Gi"},
        ),
        ("cpu", {"cpu": 4}, {"cpu": 4}, None),
        ("cpu", {}, None, None),
        (
            "nvidia",
            {"gpu_resource": "nvidia.com/gpumem", "gpus_per_node": 20000},
            {"nvidia.com/gpumem": 20000},
            {"nvidia.com/gpumem": 20000},
        ),
        ("nvidia", {"gpus_per_node": 0}, None, None),
    ],
)
def test_the_gpu_resource_follows_the_accelerator(
    compiler: Compiler,
    tmp_path: Path,
    accelerator: str,
    table: dict[str, Any],
    requests: dict[str, Any] | None,
    limits: dict[str, Any] | None,
) -> None:
    docs = docs_of(compiled_of(compiler, tmp_path, spec(accelerator=accelerator, **table)))
    container = docs["Job"]["spec"]["template"]["spec"]["containers"][0]
    expected = {k: v for k, v in (("limits", limits), ("requests", requests)) if v is not None}
    assert container.get("resources") == (expected or None)


def test_shm_volumes_and_pod_placement(compiler: Compiler, tmp_path: Path) -> None:
    docs = docs_of(
        compiled_of(
            compiler,
            tmp_path,
            spec(
                namespace="ml",
                shm_size="32Gi",
                image_pull_policy="Never",
                service_account="sa",
                priority_class="high",
                node_selector={"pool": "gpu"},
                image_pull_secrets=["reg"],
                tolerations=[
                    {
                        "key": "gpu",
                        "operator": "Equal",
                        "value": "yes",
                        "effect": "NoExecute",
                        "toleration_seconds": 30,
                    }
                ],
                volumes=[
                    {"name": "ckpt", "mount_path": "/ckpt", "claim": "ckpt-pvc"},
                    {
                        "name": "data",
                        "mount_path": "/data",
                        "host_path": "/mnt/d",
                        "read_only": True,
                    },
                ],
            ),
        )
    )
    pod = docs["Job"]["spec"]["template"]["spec"]
    assert docs["Job"]["metadata"]["namespace"] == "ml"
    assert pod["containers"][0]["imagePullPolicy"] == "Never"
    assert (pod["serviceAccountName"], pod["priorityClassName"]) == ("sa", "high")
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["imagePullSecrets"] == [{"name": "reg"}]
    assert pod["tolerations"] == [
        {
            "key": "gpu",
            "operator": "Equal",
            "value": "yes",
            "effect": "NoExecute",
            "tolerationSeconds": 30,
        }
    ]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"] == {
        "name": "dshm",
        "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"},
    }
    assert volumes["ckpt"]["persistentVolumeClaim"] == {"claimName": "ckpt-pvc"}
    assert volumes["data"]["hostPath"] == {"path": "/mnt/d", "type": "Directory"}
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["data"] == {"name": "data", "mountPath": "/data", "readOnly": True}
    assert mounts["dshm"]["mountPath"] == "/dev/shm"
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == "train-0.train.ml.svc.cluster.local"


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ({"namespace": "Team_A"}, [("MDC461", "/kubernetes/namespace")]),
        ({"node_selector": {"pool": "gpu pool"}}, [("MDC462", "/kubernetes/node_selector/pool")]),
        ({"node_selector": {"-bad": "x"}}, [("MDC462", "/kubernetes/node_selector/-bad")]),
        ({"labels": {"team": "a" * 64}}, [("MDC462", "/kubernetes/labels/team")]),
        (
            {"tolerations": [{"key": "gpu", "operator": "Exists", "value": "x"}]},
            [("MDC463", "/kubernetes/tolerations/0/value")],
        ),
        ({"tolerations": [{"effect": "NoSchedule"}]}, [("MDC463", "/kubernetes/tolerations/0")]),
        (
            {"tolerations": [{"key": "gpu", "effect": "NoSchedule", "toleration_seconds": 5}]},
            [("MDC463", "/kubernetes/tolerations/0/toleration_seconds")],
        ),
        ({"memory": "64GB"}, [("MDC464", "/kubernetes/memory")]),
        ({"gpu_resource": "gpu"}, [("MDC464", "/kubernetes/gpu_resource")]),
        ({"volumes": [{"name": "v", "mount_path": "/v"}]}, [("MDC465", "/kubernetes/volumes/0")]),
        (
            {"volumes": [{"name": "v", "mount_path": "/mdc", "claim": "c"}]},
            [("MDC465", "/kubernetes/volumes/0/mount_path")],
        ),
        (
            {"volumes": [{"name": "dshm", "mount_path": "/x", "claim": "c"}]},
            [("MDC465", "/kubernetes/volumes/0/name")],
        ),
        (
            {"volumes": [{"name": "Data", "mount_path": "/x", "host_path": "rel"}]},
            [
                ("MDC461", "/kubernetes/volumes/0/name"),
                ("MDC465", "/kubernetes/volumes/0/host_path"),
            ],
        ),
        ({"service_account": "Trainer"}, [("MDC461", "/kubernetes/service_account")]),
    ],
)
def test_mdcs_own_lint_catches_what_no_schema_checks(
    compiler: Compiler, tmp_path: Path, table: dict[str, Any], expected: list[tuple[str, str]]
) -> None:
    assert codes(errors(compiler, tmp_path, spec(**table))) == expected


def test_the_schema_checks_enums(compiler: Compiler, tmp_path: Path) -> None:
    found = errors(compiler, tmp_path, spec(image_pull_policy="Sometimes"))
    assert [d.location.pointer for d in found] == ["/kubernetes/image_pull_policy"]


def test_an_image_is_required(compiler: Compiler, tmp_path: Path) -> None:
    data = spec()
    del data["job"]["image"]
    assert codes(errors(compiler, tmp_path, data)) == [("MDC460", "/job/image")]


def test_names_are_never_renamed(compiler: Compiler, tmp_path: Path) -> None:
    found = errors(compiler, tmp_path, spec(namespace="Team_A.Dev"))
    assert codes(found) == [("MDC461", "/kubernetes/namespace")]
    assert "'team-a-dev'" in (found[0].hint or "")


def test_an_elastic_job_cannot_be_an_indexed_job(compiler: Compiler, tmp_path: Path) -> None:
    data = spec(nnodes=4)
    data["distributed"]["min_nnodes"] = 2
    assert codes(errors(compiler, tmp_path, data)) == [("MDC441", "/distributed/min_nnodes")]


def test_gpu_count_below_the_process_count_is_a_warning(compiler: Compiler, tmp_path: Path) -> None:
    compiled = compiled_of(compiler, tmp_path, spec(gpus_per_node=4))
    assert codes(compiled.diagnostics) == [("MDC466", "/kubernetes/gpus_per_node")]


@pytest.mark.parametrize("name", ["a", "a-b", "a1", "0a"])
def test_dns_labels_accepted(name: str) -> None:
    assert k8s.dns_label_findings(name, "/x", "name") == []


@pytest.mark.parametrize("name", ["A", "a.b", "-a", "a-", "a_b", "", "a" * 64])
def test_dns_labels_refused(name: str) -> None:
    assert [f.code for f in k8s.dns_label_findings(name, "/x", "name")] == ["MDC461"]


@pytest.mark.parametrize(
    "value",
    [
        "yes",
        "No",
        "ON",
        "off",
        "null",
        "~",
        "Null",
        "true",
        "False",
        "0x1F",
        "0o17",
        "012",
        "1e3",
        ".5",
        "-1",
        "+1",
        ".inf",
        "-.Inf",
        ".NaN",
        "1_000",
        "2026-11-22",
        "12:30:00",
        "0b101",
        "a: b",
        "- x",
        "#c",
        "x #c",
        "'q'",
        '"q"',
        "{a}",
        "[a]",
        "*a",
        "&a",
        "!t",
        "%p",
        "@a",
        "`b`",
        "?",
        ":",
        ">",
        "|",
        "trailing ",
        " leading",
        "multi\nline",
        "multi\nline\n",
        "tab\there",
        "cr\rlf",
        "\u2028",
        "ünï",
        "",
        " ",
        "\n",
        "a\n\nb",
        "back\\slash",
        "x\x07bell",
    ],
)
def test_every_string_reads_back_as_itself(value: str) -> None:
    doc = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x"},
        "data": {"k": value, "list": [value], value or "empty": value},
    }
    text = k8s.dump_yaml([doc])
    assert k8s.load_yaml(text) == [doc]
    assert list(yaml.safe_load_all(text)) == [doc]  # PyYAML (YAML 1.1, like kubectl's parser)


def test_yaml_is_deterministic_and_keeps_the_key_order() -> None:
    doc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"b": 1}}
    text = k8s.dump_yaml([doc, doc])
    assert text == k8s.dump_yaml([doc, doc])
    assert text.startswith("---\napiVersion: v1\nkind: Service\nmetadata:\n")
    assert text.count("---\n") == 2


def test_configmap_keys_and_a_payload_over_the_limit() -> None:
    assert k8s.config_key("launch/ds_config.json") == "launch--ds_config.json"
    with pytest.raises(ValueError, match="cannot be a ConfigMap key"):
        k8s.config_key("launch/a b.sh")
    big = [Artifact.text("launch/big.json", "x" * (k8s.CONFIGMAP_LIMIT + 1))]
    assert [f.code for f in k8s.configmap_findings(big, "kubernetes")] == ["MDC467"]


def serving_spec(launcher: str, nnodes: int, table: dict[str, Any]) -> dict[str, Any]:
    data = spec(nnodes=nnodes)
    data["distributed"]["launcher"] = launcher
    data["job"]["command"] = {
        "vllm": ["vllm", "serve"],
        "sglang": ["python3", "-m", "sglang.launch_server"],
        "sglang_disagg": "python3",
    }[launcher]
    data[launcher] = table
    return data


@pytest.mark.parametrize(
    ("launcher", "nnodes", "table", "port"),
    [
        # vLLM's OpenAI-compatible server answers GET /health once its engine is up
        # (docs.vllm.ai, "OpenAI-Compatible Server"); default port 8000 (FrontendArgs.port)
        ("vllm", 1, {"model": "m"}, 8000),
        ("vllm", 2, {"model": "m", "port": 8080}, 8080),
        # SGLang's HTTP server: GET /health (python/sglang/srt/entrypoints/http_server.py),
        # default port 30000 (ServerArgs.port)
        ("sglang", 2, {"model": "m"}, 30000),
        # the router of a disaggregated job answers /health on its port (node 0)
        ("sglang_disagg", 3, {"model_path": "m", "router_port": 8001}, 8001),
    ],
)
def test_serving_pods_are_ready_once_the_server_answers(
    compiler: Compiler, tmp_path: Path, launcher: str, nnodes: int, table: dict[str, Any], port: int
) -> None:
    compiled = compiled_of(compiler, tmp_path, serving_spec(launcher, nnodes, table))
    job = docs_of(compiled)["Job"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": port}
    assert {"containerPort": port, "protocol": "TCP"} in container["ports"]


def test_training_pods_have_no_readiness_probe(compiler: Compiler, tmp_path: Path) -> None:
    job = docs_of(compiled_of(compiler, tmp_path, spec()))["Job"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert "readinessProbe" not in container
