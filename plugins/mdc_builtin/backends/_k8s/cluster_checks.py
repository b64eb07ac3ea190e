"""The checks of the cluster keys of :mod:`.cluster` (MDC450-MDC455; names reuse MDC461
and label values MDC462): what the apiserver would refuse of the pods and objects they
build, and the combinations mdc cannot write."""

from __future__ import annotations

from collections.abc import Iterator

from mdc.api import Finding, Plan, Severity

from .checks import extended_resource, whole_quantity
from .cluster import (
    GROUP_ANNOTATION,
    NETWORKS_ANNOTATION,
    QUEUE_LABEL,
    SHARING,
    VOLCANO,
    memory_units,
)
from .names import DNS_SUBDOMAIN, LABEL_NAME, label_findings
from .options import GPU_RESOURCES, PodOptions, gpu_count
from .quantity import parse_quantity

#: the most bytes of annotations (keys and values) an object may carry
#: (apimachinery's TotalAnnotationSizeLimitB)
ANNOTATIONS_BYTES = 256 * 1024


def cluster_findings(plan: Plan, opts: PodOptions, table: str) -> Iterator[Finding]:
    """Every check of the cluster keys in ``[table]``."""
    yield from _annotation_findings(opts, table)
    yield from _resource_findings(plan, opts, table)
    yield from _network_findings(opts, table)
    yield from _scheduling_findings(opts, table)
    yield from _sharing_findings(plan, opts, table)


def _qualified(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    return (
        LABEL_NAME.fullmatch(name) is not None
        and len(name) <= 63
        and (not prefix or (len(prefix) <= 253 and DNS_SUBDOMAIN.fullmatch(prefix) is not None))
    )


def _annotation_findings(opts: PodOptions, table: str) -> Iterator[Finding]:
    for key in sorted(opts.annotations):
        pointer = f"/{table}/annotations/{key.replace('~', '~0').replace('/', '~1')}"
        if not _qualified(key):
            yield Finding(
                code="MDC450",
                pointer=pointer,
                message=f"[{table}] annotations key {key!r} is not a qualified name, which "
                "the apiserver requires of an annotation key",
                hint='write NAME or PREFIX/NAME, as a label key ("example.com/team")',
            )
        taken = {NETWORKS_ANNOTATION: "networks", GROUP_ANNOTATION: "gang"}
        if key in taken and (opts.networks if key == NETWORKS_ANNOTATION else opts.gang):
            yield Finding(
                code="MDC450",
                pointer=pointer,
                message=f"[{table}] annotations sets {key!r}, which [{table}] "
                f"{taken[key]} sets too",
                hint=f"remove it from annotations, or drop {taken[key]}",
            )
    size = sum(len(k.encode()) + len(v.encode()) for k, v in opts.annotations.items())
    if size > ANNOTATIONS_BYTES:
        yield Finding(
            code="MDC450",
            pointer=f"/{table}/annotations",
            message=f"[{table}] annotations hold {size} bytes; the apiserver refuses more "
            f"than {ANNOTATIONS_BYTES} on one object",
            hint="keep large data in a ConfigMap or a volume",
        )


def _resource_findings(plan: Plan, opts: PodOptions, table: str) -> Iterator[Finding]:
    gpu = opts.gpu_resource or GPU_RESOURCES.get(plan.accelerator)
    for name, value in sorted(opts.extended_resources.items()):
        pointer = f"/{table}/extended_resources/{name.replace('~', '~0').replace('/', '~1')}"
        if not extended_resource(name):
            yield Finding(
                code="MDC451",
                pointer=pointer,
                message=f"[{table}] extended_resources {name!r} is not an extended resource "
                "name (DOMAIN/NAME, outside kubernetes.io), which is all a device plugin "
                "advertises",
                hint='the name the device plugin advertises, as "rdma/ib" or '
                '"vpc.amazonaws.com/efa"',
            )
        elif name == gpu and gpu_count(plan, opts) is not None:
            yield Finding(
                code="MDC451",
                pointer=pointer,
                message=f"[{table}] extended_resources names {name!r}, the GPU resource "
                "that gpus_per_node asks for",
                hint="set the GPU count with gpus_per_node",
            )
        parsed = parse_quantity(str(value))
        if parsed is None or parsed < 0 or not whole_quantity(str(value)):
            yield Finding(
                code="MDC451",
                pointer=pointer,
                message=f"[{table}] extended_resources {name!r} = {str(value)!r} is not a "
                "whole number of at least 0; the apiserver refuses any other quantity of an "
                "extended resource",
                hint="ask for whole devices, as 1 or 8",
            )


def _network_findings(opts: PodOptions, table: str) -> Iterator[Finding]:
    for index, network in enumerate(opts.networks):
        if "," in network or not network.strip():
            yield Finding(
                code="MDC452",
                pointer=f"/{table}/networks/{index}",
                message=f"[{table}] networks entry {network!r} is not one network: Multus "
                f"splits {NETWORKS_ANNOTATION} at commas",
                hint='one NetworkAttachmentDefinition per entry, as "sriov-ib0" or '
                '"kube-system/efa"',
            )
    if opts.host_network and opts.networks:
        yield Finding(
            code="MDC452",
            pointer=f"/{table}/networks",
            severity=Severity.WARNING,
            message=f"[{table}] host_network puts the pods on the node's network, where "
            "Multus attaches no secondary network: networks has no effect",
            hint="use either the node's network (host_network) or Multus networks",
        )


def _scheduling_findings(opts: PodOptions, table: str) -> Iterator[Finding]:
    for key in ("scheduler_name", "gang_queue"):
        value = getattr(opts, key)
        if value is not None and (len(value) > 253 or not DNS_SUBDOMAIN.fullmatch(value)):
            yield Finding(
                code="MDC461",
                pointer=f"/{table}/{key}",
                message=f"[{table}] {key} {value!r} is not a valid Kubernetes name",
                hint="use lowercase letters, digits, '-' and '.'",
            )
    if opts.queue is not None:
        yield from label_findings({QUEUE_LABEL: opts.queue}, f"/{table}/queue", f"[{table}] queue")
    if opts.gang == VOLCANO and opts.scheduler_name not in (None, VOLCANO):
        yield Finding(
            code="MDC453",
            pointer=f"/{table}/scheduler_name",
            message=f'[{table}] gang = "volcano" asks Volcano\'s scheduler to start the pods '
            f"together, but scheduler_name {opts.scheduler_name!r} sends them to another "
            "scheduler, which ignores the PodGroup",
            hint='remove scheduler_name (the gang sets "volcano"), or remove gang',
        )
    if opts.gang_queue is not None and opts.gang != VOLCANO:
        yield Finding(
            code="MDC453",
            pointer=f"/{table}/gang_queue",
            message=f"[{table}] gang_queue names a Volcano queue, but there is no gang",
            hint='set gang = "volcano", or use queue for a Kueue LocalQueue',
        )


def _sharing_findings(plan: Plan, opts: PodOptions, table: str) -> Iterator[Finding]:
    sharing = SHARING.get(opts.gpu_sharing or "")
    if sharing is None:
        for key in ("gpu_memory", "gpu_cores"):
            if getattr(opts, key) is not None:
                yield Finding(
                    code="MDC454",
                    pointer=f"/{table}/{key}",
                    message=f"[{table}] {key} is a share of a GPU, which only a GPU-sharing "
                    "device plugin hands out, and gpu_sharing names none",
                    hint=f"set gpu_sharing ({', '.join(map(repr, SHARING))}); the pod's "
                    "RAM is memory",
                )
        return
    if opts.gpu_resource is not None:
        yield Finding(
            code="MDC454",
            pointer=f"/{table}/gpu_resource",
            message=f"[{table}] gpu_sharing = {opts.gpu_sharing!r} asks for the plugin's own "
            f"resources, but gpu_resource {opts.gpu_resource!r} names another",
            hint="remove gpu_resource",
        )
    if gpu_count(plan, opts) is None:
        yield Finding(
            code="MDC454",
            pointer=f"/{table}/gpu_sharing",
            message=f"[{table}] gpu_sharing shares GPUs, but the pods ask for none "
            f"(accelerator {plan.accelerator!r}, gpus_per_node {opts.gpus_per_node!r})",
            hint="set gpus_per_node (the GPUs each pod shares), or remove gpu_sharing",
        )
    elif not whole_quantity(str(gpu_count(plan, opts))):
        return  # MDC472 says so
    if opts.gpu_memory is not None and memory_units(opts.gpu_memory, sharing.memory_unit) is None:
        unit = "MiB" if sharing.memory_unit == 1 << 20 else "GiB"
        yield Finding(
            code="MDC454",
            pointer=f"/{table}/gpu_memory",
            message=f"[{table}] gpu_memory {opts.gpu_memory!r} is not a whole number of {unit} "
            f"above 0, the unit {opts.gpu_sharing} counts GPU memory in",
            hint=f'write whole {unit}, as "{"20480Mi" if unit == "MiB" else "20Gi"}"',
        )
    if opts.gpu_cores is not None and not 1 <= opts.gpu_cores <= 100:
        yield Finding(
            code="MDC454",
            pointer=f"/{table}/gpu_cores",
            message=f"[{table}] gpu_cores {opts.gpu_cores} is not a percent of one GPU (1-100)",
            hint="write the share of each GPU's compute, as 50",
        )
