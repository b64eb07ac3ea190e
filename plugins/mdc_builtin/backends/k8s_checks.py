"""The checks of a Kubernetes backend's pod options and files that the apiserver would
otherwise refuse at apply time (MDC460, MDC462-467, MDC472)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from decimal import Decimal

from mdc.api import Artifact, Finding, Plan, Severity

from .k8s_names import DNS_SUBDOMAIN, LABEL_NAME, dns_label_findings, label_findings
from .k8s_options import MOUNT, PodOptions, Toleration, Volume, gpu_count
from .k8s_pod import CONFIGMAP_LIMIT, config_key

#: a Kubernetes resource quantity: a number with an optional binary/decimal suffix or exponent
QUANTITY = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?")
_SUFFIXES = {
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{
        s: Decimal(10) ** e
        for s, e in zip("numkMGTPE", (-9, -6, -3, 3, 6, 9, 12, 15, 18), strict=True)
    },
}


def whole_quantity(text: str) -> bool:
    """Whether a quantity (already matching :data:`QUANTITY`) is a whole number, as the
    apiserver requires of extended resources such as nvidia.com/gpu (IsIntegerResourceName)."""
    match = QUANTITY.fullmatch(text)
    if match is None:
        return False
    suffix = match.group(3) or ""
    if suffix[:1] in ("e", "E"):
        value = Decimal(text)
    else:
        value = Decimal(text[: len(text) - len(suffix)]) * _SUFFIXES.get(suffix, Decimal(1))
    return value == value.to_integral_value()


def pod_findings(plan: Plan, opts: PodOptions, table: str) -> Iterator[Finding]:
    """Every shared check of the pod options in ``[table]`` (MDC460, MDC462-466)."""
    if not plan.job.image:
        yield Finding(
            code="MDC460",
            pointer="/job/image",
            message=f"the {table} backend runs the job in pods, which need an image, "
            "but [job] image is not set",
            hint='set [job] image (for example "nvcr.io/nvidia/pytorch:25.01-py3")',
        )
    if opts.namespace is not None:
        yield from dns_label_findings(opts.namespace, f"/{table}/namespace", "namespace")
    for key, value in (
        ("service_account", opts.service_account),
        ("priority_class", opts.priority_class),
    ):
        if value is not None and (len(value) > 253 or not DNS_SUBDOMAIN.fullmatch(value)):
            yield Finding(
                code="MDC461",
                pointer=f"/{table}/{key}",
                message=f"[{table}] {key} {value!r} is not a valid Kubernetes name",
                hint="use lowercase letters, digits, '-' and '.'",
            )
    for index, secret in enumerate(opts.image_pull_secrets):
        if len(secret) > 253 or not DNS_SUBDOMAIN.fullmatch(secret):
            yield Finding(
                code="MDC461",
                pointer=f"/{table}/image_pull_secrets/{index}",
                message=f"image pull secret {secret!r} is not a valid Kubernetes name",
                hint="use lowercase letters, digits, '-' and '.'",
            )
    yield from label_findings(
        opts.node_selector, f"/{table}/node_selector", f"[{table}] node_selector"
    )
    yield from label_findings(opts.labels, f"/{table}/labels", f"[{table}] labels")
    yield from _toleration_findings(opts.tolerations, table)
    for key in ("cpu", "memory", "shm_size", "gpus_per_node"):
        value = getattr(opts, key)
        if value is not None and not QUANTITY.fullmatch(str(value)):
            yield Finding(
                code="MDC464",
                pointer=f"/{table}/{key}",
                message=f"[{table}] {key} {str(value)!r} is not a Kubernetes quantity",
                hint='write a number with an optional suffix: "64Gi", "500m", 8',
            )
    gpus = opts.gpus_per_node
    if gpus is not None and QUANTITY.fullmatch(str(gpus)) and not whole_quantity(str(gpus)):
        yield Finding(
            code="MDC472",
            pointer=f"/{table}/gpus_per_node",
            message=f"[{table}] gpus_per_node {str(gpus)!r} is not a whole number; the "
            "apiserver refuses a fractional quantity of an extended resource (a GPU "
            "is handed out whole)",
            hint="write a whole number of GPUs, as 1 or 8 (GPU sharing is the device "
            "plugin's time-slicing or MIG, with their own resource names)",
        )
    if opts.gpu_resource is not None:
        prefix, _, name = opts.gpu_resource.rpartition("/")
        if not prefix or not DNS_SUBDOMAIN.fullmatch(prefix) or not LABEL_NAME.fullmatch(name):
            yield Finding(
                code="MDC464",
                pointer=f"/{table}/gpu_resource",
                message=f"[{table}] gpu_resource {opts.gpu_resource!r} is not an "
                "extended resource name (DOMAIN/NAME)",
                hint='for example "nvidia.com/gpu" or "amd.com/gpu"',
            )
    yield from _volume_findings(opts.volumes, table)
    count = gpu_count(plan, opts)
    if plan.accelerator == "cpu" and count is not None and opts.gpu_resource is None:
        yield Finding(
            code="MDC466",
            pointer=f"/{table}/gpus_per_node",
            severity=Severity.WARNING,
            message=f"[{table}] gpus_per_node = {count} on a cpu job, which has no GPU "
            "resource name",
            hint='set gpu_resource (for example "nvidia.com/gpu"), or remove gpus_per_node',
        )
    elif (
        plan.accelerator != "cpu"
        and count is not None
        and opts.gpu_resource is None
        and str(count).isdigit()
        and int(str(count)) < plan.nproc_per_node
    ):
        yield Finding(
            code="MDC466",
            pointer=f"/{table}/gpus_per_node",
            severity=Severity.WARNING,
            message=f"each pod asks for {count} GPU(s) but runs {plan.nproc_per_node} "
            "process(es): some processes share a GPU",
            hint=f"set gpus_per_node = {plan.nproc_per_node}, or lower nproc_per_node",
        )


def _toleration_findings(tolerations: Sequence[Toleration], table: str) -> Iterator[Finding]:
    for index, tol in enumerate(tolerations):
        pointer = f"/{table}/tolerations/{index}"
        if tol.operator == "Exists" and tol.value:
            yield Finding(
                code="MDC463",
                pointer=f"{pointer}/value",
                message=f"toleration {index} has operator Exists and value "
                f"{tol.value!r}; Kubernetes rejects a value with Exists",
                hint='remove value, or use operator = "Equal"',
            )
        if not tol.key and tol.operator != "Exists":
            yield Finding(
                code="MDC463",
                pointer=pointer,
                message=f"toleration {index} has no key, which needs operator Exists",
                hint='set key, or operator = "Exists" to tolerate every taint',
            )
        if tol.toleration_seconds is not None and tol.effect != "NoExecute":
            yield Finding(
                code="MDC463",
                pointer=f"{pointer}/toleration_seconds",
                message=f"toleration {index} sets toleration_seconds with effect "
                f"{tol.effect!r}; it applies only to NoExecute",
                hint='set effect = "NoExecute", or remove toleration_seconds',
            )
        if tol.key is not None:
            prefix, _, name = tol.key.rpartition("/")
            if not LABEL_NAME.fullmatch(name) or (prefix and not DNS_SUBDOMAIN.fullmatch(prefix)):
                yield Finding(
                    code="MDC463",
                    pointer=f"{pointer}/key",
                    message=f"toleration {index} key {tol.key!r} is not a taint key",
                    hint='write a label key, as "nvidia.com/gpu"',
                )


def _volume_findings(volumes: Sequence[Volume], table: str) -> Iterator[Finding]:
    seen_names: set[str] = set()
    seen_paths: set[str] = set()
    for index, vol in enumerate(volumes):
        pointer = f"/{table}/volumes/{index}"
        yield from dns_label_findings(vol.name, f"{pointer}/name", "volume name")
        if vol.name in ("mdc", "dshm") or vol.name in seen_names:
            yield Finding(
                code="MDC465",
                pointer=f"{pointer}/name",
                message=f"volume name {vol.name!r} is used twice (mdc names its own "
                'volumes "mdc" and "dshm")',
                hint="give every volume its own name",
            )
        seen_names.add(vol.name)
        path = vol.mount_path.rstrip("/") or "/"
        if (
            not path.startswith("/")
            or path in ("/", MOUNT, "/dev/shm")
            or path.startswith(MOUNT + "/")
            or path in seen_paths
        ):
            yield Finding(
                code="MDC465",
                pointer=f"{pointer}/mount_path",
                message=f"volume {vol.name!r} mount_path {vol.mount_path!r} is not an "
                f"absolute path of its own (/, {MOUNT}, /dev/shm and paths "
                "used twice are taken)",
                hint='mount it at its own absolute path, as "/checkpoints"',
            )
        seen_paths.add(path)
        if (vol.claim is None) == (vol.host_path is None):
            yield Finding(
                code="MDC465",
                pointer=pointer,
                message=f"volume {vol.name!r} needs exactly one of claim and host_path",
                hint='claim = "<pvc name>" for a PersistentVolumeClaim, or '
                'host_path = "/mnt/data" for a node directory',
            )
        elif vol.host_path is not None and not vol.host_path.startswith("/"):
            yield Finding(
                code="MDC465",
                pointer=f"{pointer}/host_path",
                message=f"volume {vol.name!r} host_path {vol.host_path!r} is not absolute",
                hint='write an absolute path, as "/mnt/data"',
            )
        elif vol.claim is not None and (
            len(vol.claim) > 253 or not DNS_SUBDOMAIN.fullmatch(vol.claim)
        ):
            yield Finding(
                code="MDC465",
                pointer=f"{pointer}/claim",
                message=f"volume {vol.name!r} claim {vol.claim!r} is not a valid "
                "PersistentVolumeClaim name",
                hint="use lowercase letters, digits, '-' and '.'",
            )


def configmap_findings(files: Iterable[Artifact], table: str) -> list[Finding]:
    """MDC467 when the files exceed what one ConfigMap can hold."""
    size = sum(len(a.data) + len(config_key(a.path)) for a in files)
    if size <= CONFIGMAP_LIMIT:
        return []
    return [
        Finding(
            code="MDC467",
            pointer=f"/{table}",
            message=f"the launch files take {size} bytes; a ConfigMap holds at most "
            f"{CONFIGMAP_LIMIT} bytes",
            hint="ship large files in the image or a volume instead",
        )
    ]
