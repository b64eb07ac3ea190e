"""The checks of a Kubernetes backend's pod options and files that the apiserver would
otherwise refuse at apply time (MDC442, MDC460, MDC462-466, MDC472)."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Iterator, Sequence

from mdc.api import Artifact, Finding, Plan, Severity

from .apply import size_findings
from .names import DNS_SUBDOMAIN, LABEL_NAME, dns_label_findings, label_findings
from .options import MOUNT, PodOptions, Toleration, Volume, gpu_count
from .pod import config_key
from .quantity import parse_quantity

#: what Go's unicode.IsSpace calls a space: the apiserver refuses an image that begins or
#: ends with one (strings.TrimSpace); Python's str.isspace also counts U+001C-U+001F
GO_SPACES = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | frozenset(
    chr(c) for c in range(0x2000, 0x200B)
)
#: the mounts every pod has (the ConfigMap tree and the shared-memory emptyDir)
RESERVED_MOUNTS = (MOUNT, "/dev/shm")


def whole_quantity(text: str) -> bool:
    """Whether a quantity is a whole number, as the apiserver requires of extended resources
    such as nvidia.com/gpu (IsIntegerResourceName; it compares the value it parsed, rounded
    up to a nano)."""
    value = parse_quantity(text)
    return value is not None and value == value.to_integral_value()


def mount_point(path: str) -> str:
    """The directory a mount path names, as the container runtime resolves it (lexically, as
    Go's path.Clean): ``//mdc``, ``/data/../mdc`` and ``/mdc/`` are all ``/mdc``."""
    cleaned = posixpath.normpath(path)
    return "/" + cleaned.lstrip("/") if path.startswith("/") else cleaned


def extended_resource(name: str) -> bool:
    """Whether ``name`` is what the apiserver calls an extended resource name
    (helper.IsExtendedResourceName): DOMAIN/NAME, not native (``kubernetes.io/``), not
    ``requests.``-prefixed, and a qualified name even with ``requests.`` put in front."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    prefix, _, base = f"requests.{name}".rpartition("/")
    return (
        len(prefix) <= 253
        and DNS_SUBDOMAIN.fullmatch(prefix) is not None
        and len(base) <= 63
        and LABEL_NAME.fullmatch(base) is not None
    )


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
    elif plan.job.image[0] in GO_SPACES or plan.job.image[-1] in GO_SPACES:
        yield Finding(
            code="MDC442",
            pointer="/job/image",
            message=f"[job] image {plan.job.image!r} begins or ends with whitespace, which "
            "the apiserver refuses in a container's image",
            hint=f"remove the whitespace: {plan.job.image.strip(''.join(GO_SPACES))!r}",
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
    yield from _quantity_findings(opts, table)
    if opts.gpu_resource is not None:
        yield from _gpu_resource_findings(opts.gpu_resource, table)
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
        and (asked := parse_quantity(str(count))) is not None
        and asked < plan.nproc_per_node
    ):
        yield Finding(
            code="MDC466",
            pointer=f"/{table}/gpus_per_node",
            severity=Severity.WARNING,
            message=f"each pod asks for {count} GPU(s) but runs {plan.nproc_per_node} "
            "process(es): some processes share a GPU",
            hint=f"set gpus_per_node = {plan.nproc_per_node}, or lower nproc_per_node",
        )


def _quantity_findings(opts: PodOptions, table: str) -> Iterator[Finding]:
    """MDC464 for a cpu, memory, shm_size or GPU count the apiserver refuses (not a quantity,
    or negative: ValidateNonnegativeQuantity, and an emptyDir's sizeLimit below 0); MDC472 for
    a fractional GPU count."""
    for key in ("cpu", "memory", "shm_size", "gpus_per_node"):
        value = getattr(opts, key)
        if value is None:
            continue
        parsed = parse_quantity(str(value))
        if parsed is None:
            yield Finding(
                code="MDC464",
                pointer=f"/{table}/{key}",
                message=f"[{table}] {key} {str(value)!r} is not a Kubernetes quantity",
                hint='write a number in ASCII digits with an optional suffix: "64Gi", "500m", 8',
            )
        elif parsed < 0:
            yield Finding(
                code="MDC464",
                pointer=f"/{table}/{key}",
                message=f"[{table}] {key} {str(value)!r} is negative; the apiserver refuses "
                "a negative quantity",
                hint=f"write a quantity of at least 0, as {str(value).lstrip('-')!r}",
            )
    gpus = opts.gpus_per_node
    name = opts.gpu_resource
    if (
        gpus is not None
        and (parsed := parse_quantity(str(gpus))) is not None
        and parsed >= 0
        and (name is None or extended_resource(name))
        and not whole_quantity(str(gpus))
    ):
        yield Finding(
            code="MDC472",
            pointer=f"/{table}/gpus_per_node",
            message=f"[{table}] gpus_per_node {str(gpus)!r} is not a whole number; the "
            "apiserver refuses a fractional quantity of an extended resource (a GPU "
            "is handed out whole)",
            hint="write a whole number of GPUs, as 1 or 8 (GPU sharing is the device "
            "plugin's time-slicing or MIG, with their own resource names)",
        )


def _gpu_resource_findings(name: str, table: str) -> Iterator[Finding]:
    """MDC464 for a gpu_resource the apiserver refuses as a container resource name.

    Any extended resource is accepted, GPU or not: the scheduler places the pod on a node
    whose allocatable has that resource and refuses nothing, and device plugins name their
    accelerators freely (nvidia.com/gpu, nvidia.com/mig-1g.10gb, gpu.intel.com/i915,
    habana.ai/gaudi, a fractional plugin's nvidia.com/gpumem), so no name can be told not
    to be one. A name without a domain is a native resource (cpu, memory, hugepages-2Mi),
    which the table's own keys set.
    """
    prefix, _, base = name.rpartition("/")
    qualified = (
        bool(prefix)
        and len(prefix) <= 253
        and DNS_SUBDOMAIN.fullmatch(prefix) is not None
        and len(base) <= 63
        and LABEL_NAME.fullmatch(base) is not None
    )
    if not qualified:
        yield Finding(
            code="MDC464",
            pointer=f"/{table}/gpu_resource",
            message=f"[{table}] gpu_resource {name!r} is not an extended resource name "
            "(DOMAIN/NAME)",
            hint='for example "nvidia.com/gpu" or "amd.com/gpu"',
        )
    elif "kubernetes.io/" not in name and not extended_resource(name):
        yield Finding(
            code="MDC464",
            pointer=f"/{table}/gpu_resource",
            message=f"[{table}] gpu_resource {name!r} does not follow the extended resource "
            "name standard: the apiserver refuses a name that begins with 'requests.' "
            "or is too long once 'requests.' is put in front",
            hint='use the name the device plugin advertises, as "nvidia.com/gpu"',
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
        path = mount_point(vol.mount_path)
        if (
            not path.startswith("/")
            or path in ("/", *RESERVED_MOUNTS)
            or path.startswith(MOUNT + "/")
            or path in seen_paths
        ):
            yield Finding(
                code="MDC465",
                pointer=f"{pointer}/mount_path",
                message=f"volume {vol.name!r} mount_path {vol.mount_path!r}"
                + ("" if path == vol.mount_path.rstrip("/") else f" (that is {path!r})")
                + f" is not an absolute path of its own (/, {MOUNT}, /dev/shm and paths "
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
        elif vol.host_path is not None and ".." in vol.host_path.split("/"):
            yield Finding(
                code="MDC465",
                pointer=f"{pointer}/host_path",
                message=f"volume {vol.name!r} host_path {vol.host_path!r} has a '..' "
                "element, which the apiserver refuses in a hostPath",
                hint=f"write the directory itself, as {mount_point(vol.host_path)!r}",
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
    """MDC467 when the files exceed what one ConfigMap can hold, MDC444 when only kubectl
    apply's annotation of it is too large (see :mod:`.apply`)."""
    data = {config_key(a.path): a.data.decode("utf-8") for a in files}
    return size_findings({"data": data}, f"the {table} backend")
