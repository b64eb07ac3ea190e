"""What the apiserver refuses in a pod, refused by mdc first, and only that.

Each expected value comes from the apiserver's own rules: the quantity grammar of
k8s.io/apimachinery ``resource.ParseQuantity`` (ASCII digits; a sign, a fraction, one suffix),
``ValidateNonnegativeQuantity`` for requests and an emptyDir's sizeLimit, hostPath's "must
not contain '..'", a container image's "must not have leading or trailing whitespace" (Go's
``strings.TrimSpace``), the extended resource name standard, the int64 ``tolerationSeconds``
and an Indexed Job's parallelism of at most 100000 (pkg/apis/batch/validation).
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from mdc.errors import SpecError
from mdc.pipeline import Compiler
from mdc_builtin.backends._k8s import common as k8s


def spec(backend: str = "kubernetes", nnodes: int = 2, **table: Any) -> dict[str, Any]:
    """A torchrun job on ``backend`` (vLLM on leaderworkerset, which runs only servers)."""
    serving = backend == "leaderworkerset"
    data: dict[str, Any] = {
        "job": {"name": "train", "image": "img:1", "command": ["python", "train.py"]},
        "distributed": {
            "launcher": "vllm" if serving else "torchrun",
            "backend": backend,
            "nnodes": nnodes,
            "nproc_per_node": 8,
            "accelerator": "nvidia",
        },
        backend: table,
    }
    if serving:
        data["job"]["command"] = ["vllm", "serve"]
        data["vllm"] = {"model": "m"}
    return data


def findings(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> list[tuple[str, str]]:
    """(code, pointer) of every error compiling ``data`` finds; [] when it compiles."""
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    try:
        compiler.compile(path)
    except SpecError as exc:
        return [(d.code, d.location.pointer) for d in exc.diagnostics if d.is_error]
    return []


def job_yaml(compiler: Compiler, tmp_path: Path, data: dict[str, Any]) -> dict[str, Any]:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    compiled = compiler.compile(path)
    text = next(a.data.decode() for a in compiled.tree if a.path == "kubernetes/job.yaml")
    return {d["kind"]: d for d in yaml.safe_load_all(text)}


# ---------------------------------------------------------------- the quantity grammar

#: (text, the value ParseQuantity gives it): the grammar's forms, a bare sign or '.' (zero),
#: and a value under a nano rounded up to one
ACCEPTED = [
    ("8", Decimal(8)),
    ("+8", Decimal(8)),
    ("500m", Decimal("0.5")),
    ("1.5", Decimal("1.5")),
    ("1.", Decimal(1)),
    (".5", Decimal("0.5")),
    ("0", Decimal(0)),
    (".", Decimal(0)),
    ("-", Decimal(0)),
    ("64Gi", Decimal(64 * 2**30)),
    ("1Ki", Decimal(1024)),
    ("2k", Decimal(2000)),
    ("1E", Decimal(10**18)),
    ("1e3", Decimal(1000)),
    ("1E+3", Decimal(1000)),
    ("5e-3", Decimal("0.005")),
    ("1n", Decimal("1e-9")),
    ("0.1n", Decimal("1e-9")),
    ("1e99999", Decimal(2**63 - 1)),
]
#: Unicode digits, a unit that is not a suffix, a capital K, bytes, spaces, Go-less forms
REFUSED = [
    "８",
    "٨Gi",
    "1٨",
    "٨",
    "64GB",
    "1K",
    "1KiB",
    "64 Gi",
    " 8",
    "1e",
    "1ee3",
    "1Mi3",
    "0x10",
]


@pytest.mark.parametrize(("text", "value"), ACCEPTED)
def test_the_quantities_the_apiserver_reads(text: str, value: Decimal) -> None:
    assert k8s.parse_quantity(text) == value


@pytest.mark.parametrize("text", REFUSED)
def test_what_is_not_a_quantity(text: str) -> None:
    assert k8s.parse_quantity(text) is None


@pytest.mark.parametrize("key", ["cpu", "memory", "shm_size", "gpus_per_node"])
@pytest.mark.parametrize("text", ["８", "٨Gi", "-1", "-500m", "-.5"])
def test_unicode_digits_and_negative_quantities_are_refused(
    compiler: Compiler, tmp_path: Path, key: str, text: str
) -> None:
    table: dict[str, Any] = {key: text}
    assert findings(compiler, tmp_path, spec(**table)) == [("MDC464", f"/kubernetes/{key}")]


@pytest.mark.parametrize("key", ["cpu", "memory", "shm_size"])
@pytest.mark.parametrize("text", ["0", "500m", ".5", "1e3", "64Gi", "-0"])
def test_what_the_apiserver_takes_is_taken(
    compiler: Compiler, tmp_path: Path, key: str, text: str
) -> None:
    table: dict[str, Any] = {key: text}
    assert findings(compiler, tmp_path, spec(**table)) == []


def test_no_cpu_at_all_is_a_request_the_apiserver_takes(compiler: Compiler, tmp_path: Path) -> None:
    assert findings(compiler, tmp_path, spec(cpu=0)) == []


def test_a_gpu_count_rounded_to_a_whole_number_by_the_apiserver_is_whole() -> None:
    # 1.9999999999 is rounded up to the nano, 2.000000000: a whole number of GPUs
    assert k8s.whole_quantity("1.9999999999")
    assert not k8s.whole_quantity("1.5")
    assert not k8s.whole_quantity("٨")


# ---------------------------------------------------------------- volumes and mounts


@pytest.mark.parametrize(
    "path", ["/mdc", "//mdc", "/data/../mdc", "/mdc/.", "/dev/./shm", "/mdc//x"]
)
def test_reserved_mounts_are_found_however_written(
    compiler: Compiler, tmp_path: Path, path: str
) -> None:
    volumes = [{"name": "data", "mount_path": path, "claim": "data"}]
    assert findings(compiler, tmp_path, spec(volumes=volumes)) == [
        ("MDC465", "/kubernetes/volumes/0/mount_path")
    ]


def test_one_mount_path_written_two_ways_is_used_twice(compiler: Compiler, tmp_path: Path) -> None:
    volumes = [
        {"name": "a", "mount_path": "/data", "claim": "a"},
        {"name": "b", "mount_path": "//data/./", "claim": "b"},
    ]
    assert findings(compiler, tmp_path, spec(volumes=volumes)) == [
        ("MDC465", "/kubernetes/volumes/1/mount_path")
    ]


@pytest.mark.parametrize("path", ["/mnt/../etc", "/mnt/data/..", "/../mnt"])
def test_a_host_path_with_a_parent_element_is_refused(
    compiler: Compiler, tmp_path: Path, path: str
) -> None:
    volumes = [{"name": "data", "mount_path": "/data", "host_path": path}]
    assert findings(compiler, tmp_path, spec(volumes=volumes)) == [
        ("MDC465", "/kubernetes/volumes/0/host_path")
    ]


@pytest.mark.parametrize("path", ["/mnt/..data", "/mnt/data..", "/mnt/./data", "//mnt"])
def test_a_host_path_without_a_parent_element_is_taken(
    compiler: Compiler, tmp_path: Path, path: str
) -> None:
    volumes = [{"name": "data", "mount_path": "/data", "host_path": path}]
    assert findings(compiler, tmp_path, spec(volumes=volumes)) == []


# ---------------------------------------------------------------- image, resource names


@pytest.mark.parametrize("backend", ["kubernetes", "pytorchjob", "leaderworkerset", "trainjob"])
@pytest.mark.parametrize("image", [" img:1", "img:1 ", "img:1\n", "\timg:1", "img:1\u00a0"])
def test_an_image_with_outer_whitespace_is_refused(
    compiler: Compiler, tmp_path: Path, backend: str, image: str
) -> None:
    data = spec(backend)
    data["job"]["image"] = image
    assert ("MDC442", "/job/image") in findings(compiler, tmp_path, data)


@pytest.mark.parametrize(
    "name",
    [
        "example.com/dongle",  # an extended resource that is not a GPU: the scheduler takes it
        "nvidia.com/mig-1g.10gb",
        "kubernetes.io/batteries",  # a native resource name: the apiserver takes it too
    ],
)
def test_any_extended_resource_may_stand_for_the_gpu(
    compiler: Compiler, tmp_path: Path, name: str
) -> None:
    assert findings(compiler, tmp_path, spec(gpu_resource=name)) == []


@pytest.mark.parametrize(
    "name", ["requests.nvidia.com/gpu", "nvidia.com/" + "g" * 64, "a" * 245 + ".com/gpu", "gpu"]
)
def test_a_resource_name_the_apiserver_refuses_is_refused(
    compiler: Compiler, tmp_path: Path, name: str
) -> None:
    assert findings(compiler, tmp_path, spec(gpu_resource=name)) == [
        ("MDC464", "/kubernetes/gpu_resource")
    ]


# ---------------------------------------------------------------- API ranges


def test_toleration_seconds_is_an_int64(compiler: Compiler, tmp_path: Path) -> None:
    def table(seconds: int) -> dict[str, Any]:
        return {
            "tolerations": [
                {
                    "key": "k",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "toleration_seconds": seconds,
                }
            ]
        }

    assert findings(compiler, tmp_path, spec(**table(2**63))) == [
        ("MDC105", "/kubernetes/tolerations/0/toleration_seconds")
    ]
    assert findings(compiler, tmp_path, spec(**table(-(2**63) - 1))) == [
        ("MDC105", "/kubernetes/tolerations/0/toleration_seconds")
    ]
    # "Zero and negative values will be treated as 0 (evict immediately)" (the API's doc)
    assert findings(compiler, tmp_path, spec(**table(-1))) == []
    assert findings(compiler, tmp_path, spec("leaderworkerset", **table(2**63))) == [
        ("MDC105", "/leaderworkerset/tolerations/0/toleration_seconds")
    ]
    docs = job_yaml(compiler, tmp_path, spec(**table(2**63 - 1)))
    pod = docs["Job"]["spec"]["template"]["spec"]
    assert pod["tolerations"][0]["tolerationSeconds"] == 2**63 - 1


def test_an_indexed_job_runs_at_most_100000_pods(compiler: Compiler, tmp_path: Path) -> None:
    assert findings(compiler, tmp_path, spec(nnodes=100_001)) == [("MDC443", "/distributed/nnodes")]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec(nnodes=100_000)), encoding="utf-8")
    assert compiler.compile(path, tree=False).plan.nnodes == 100_000


# ---------------------------------------------------------------- the ConfigMap's size


def big_job(characters: int) -> dict[str, Any]:
    """A job whose command carries ``characters`` bytes into launch/worker.sh."""
    data = spec()
    data["job"]["command"] = ["python", "train.py", "x" * characters]
    return data


def test_kubectl_applys_annotation_is_the_object_as_go_writes_it() -> None:
    doc = {"kind": "ConfigMap", "data": {"run.sh": "a < b && c\n"}}
    # encoding/json: keys sorted, no spaces, '<' and '&' as \u003c and \u0026; a newline
    written = '{"data":{"run.sh":"a \\u003c b \\u0026\\u0026 c\\n"},"kind":"ConfigMap"}\n'
    key = "kubectl.kubernetes.io/last-applied-configuration"
    assert k8s.last_applied_size(doc) == len(key) + len(written)


@pytest.mark.parametrize("backend", ["kubernetes", "pytorchjob", "trainjob"])
def test_a_configmap_kubectl_apply_cannot_annotate_is_a_warning(
    compiler: Compiler, tmp_path: Path, backend: str
) -> None:
    data = big_job(300_000)
    del data["kubernetes"]
    data["distributed"]["backend"] = backend
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    for tree in (True, False):  # compile and validate alike
        compiled = compiler.compile(path, tree=tree)
        found = [(d.code, d.location.pointer) for d in compiled.diagnostics]
        assert found == [("MDC444", "/distributed/backend")]
    plan = next(a for a in compiler.compile(path).tree if a.path == "plan.json")
    assert "MDC444" in plan.data.decode()


def test_a_configmap_under_256_kib_is_applied_without_a_word(
    compiler: Compiler, tmp_path: Path
) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(big_job(250_000)), encoding="utf-8")
    assert compiler.compile(path).diagnostics == ()


def test_a_configmap_over_1_mib_is_refused(compiler: Compiler, tmp_path: Path) -> None:
    assert findings(compiler, tmp_path, big_job(1_050_000)) == [("MDC467", "/distributed/backend")]


def test_report_outside_a_command() -> None:
    from mdc.api import Finding, Severity, report

    with pytest.raises(ValueError, match="MDC467"):
        report(Finding(code="MDC467", pointer="", message="too big", hint="h"))
    report(Finding(code="MDC444", pointer="", message="m", hint="h", severity=Severity.WARNING))
    with pytest.raises(TypeError):
        report("MDC467")  # type: ignore[arg-type]
