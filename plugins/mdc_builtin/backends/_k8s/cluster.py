"""What a production cluster asks of a Kubernetes backend's pods, from the shared table keys:
the GPU network (extended resources for RDMA, InfiniBand or EFA devices, Multus networks,
host networking, capabilities), pod annotations, the scheduler, Kueue's queue, Volcano's
gang and GPU sharing (``gpu_memory`` and ``gpu_cores`` in a sharing device plugin's names).

A backend builds each pod template with :func:`pod_template`, labels its top object with
:func:`object_labels` (Kueue's queue; the backend suspends the object where its kind has a
field for it, see :data:`QUEUE_LABEL`) and adds :func:`pod_group` to its documents.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import attrs

from mdc.api import Plan

from .options import GPU_RESOURCES, PodOptions, gpu_count
from .quantity import parse_quantity

#: Multus reads a pod's secondary networks from this annotation (NetworkAttachmentDefinition
#: names, "<namespace>/<name>" for another namespace's), comma-separated
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
#: Kueue admits a workload of the LocalQueue this label names; the object is created
#: suspended (batch Job and JobSet spec.suspend, PyTorchJob runPolicy.suspend, TrainJob
#: spec.suspend) and Kueue unsuspends it once admitted; a LeaderWorkerSet has no such field
#: and Kueue gates its pods instead
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: Volcano's scheduler places the pods carrying this annotation as the gang of that PodGroup
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO = "volcano"
VOLCANO_VGPU = "volcano-vgpu"
PODGROUP_API = "scheduling.volcano.sh/v1beta1"
#: a pod on the node's network uses the node's resolver unless told to use the cluster DNS,
#: and then cannot resolve its peers' names (MASTER_ADDR)
HOST_NETWORK_DNS = "ClusterFirstWithHostNet"
MIB = 1 << 20
GIB = 1 << 30


@attrs.frozen(kw_only=True)
class Sharing:
    """The resource names a GPU-sharing device plugin documents."""

    #: the count of (virtual) GPUs; None: the plugin counts whole cards in ``cores``
    count: str | None
    memory: str
    #: bytes in one unit of ``memory``
    memory_unit: int
    #: percent of one GPU
    cores: str
    #: the plugin's memory and cores are the pod's totals (qGPU), not per GPU
    totals: bool = False


SHARING = {
    # HAMi: nvidia.com/gpu vGPUs, each with gpumem MiB and gpucores percent of its card
    "hami": Sharing(
        count="nvidia.com/gpu",
        memory="nvidia.com/gpumem",
        memory_unit=MIB,
        cores="nvidia.com/gpucores",
    ),
    # Volcano's vGPU device plugin: vgpu-number vGPUs, each vgpu-memory MiB and vgpu-cores %
    VOLCANO_VGPU: Sharing(
        count="volcano.sh/vgpu-number",
        memory="volcano.sh/vgpu-memory",
        memory_unit=MIB,
        cores="volcano.sh/vgpu-cores",
    ),
    # Tencent TKE qGPU: qgpu-core in percent of a card (N * 100 for N whole cards) and
    # qgpu-memory in GiB, both the pod's totals, split evenly over its cards
    "qgpu": Sharing(
        count=None,
        memory="tke.cloud.tencent.com/qgpu-memory",
        memory_unit=GIB,
        cores="tke.cloud.tencent.com/qgpu-core",
        totals=True,
    ),
}


def memory_units(text: str, unit: int) -> int | None:
    """``text`` (a quantity) in whole ``unit`` bytes, or None when it is not a whole number
    of them (the plugins' resources are extended resources: whole numbers only)."""
    value = parse_quantity(text)
    if value is None or value <= 0:
        return None
    units = value / Decimal(unit)
    return int(units) if units == units.to_integral_value() else None


def sharing_resources(plan: Plan, opts: PodOptions) -> dict[str, int]:
    """The sharing plugin's resources for the pod (empty without ``gpu_sharing``)."""
    sharing = SHARING.get(opts.gpu_sharing or "")
    count = gpu_count(plan, opts)
    if sharing is None or count is None:
        return {}
    cards = int(parse_quantity(str(count)) or 0)  # a quantity the checks took ("-" is 0)
    out: dict[str, int] = {}
    if sharing.count is not None:
        out[sharing.count] = cards
    scale = cards if sharing.totals else 1
    if opts.gpu_memory is not None:
        units = memory_units(opts.gpu_memory, sharing.memory_unit)
        if units is not None:
            out[sharing.memory] = units * scale
    cores = opts.gpu_cores
    if cores is None and sharing.count is None:
        cores = 100  # whole cards: the plugin counts them in cores alone
    if cores is not None:
        out[sharing.cores] = cores * scale
    return out


def _add_resources(plan: Plan, opts: PodOptions, container: dict[str, Any]) -> None:
    extra: dict[str, int | str] = dict(opts.extended_resources)
    parts = {k: dict(v) for k, v in container.get("resources", {}).items()}
    if opts.gpu_sharing in SHARING:
        # the plugin's names replace the whole-GPU resource
        gpu = opts.gpu_resource or GPU_RESOURCES.get(plan.accelerator)
        for part in parts.values():
            part.pop(gpu, None)
        extra.update(sharing_resources(plan, opts))
    elif not extra:
        return
    # an extended resource is asked in limits, and requests equal to them
    for key in ("limits", "requests"):
        parts[key] = dict(sorted({**parts.get(key, {}), **extra}.items()))
    resources = {k: parts[k] for k in ("limits", "requests") if parts[k]}
    if resources:
        container["resources"] = resources
    else:
        container.pop("resources", None)


def cluster_container(plan: Plan, opts: PodOptions, container: dict[str, Any]) -> dict[str, Any]:
    """``container`` with the extra resources (network devices, GPU sharing) and capabilities."""
    out = dict(container)
    _add_resources(plan, opts, out)
    if opts.capabilities:
        out["securityContext"] = {"capabilities": {"add": list(opts.capabilities)}}
    return out


def scheduler(opts: PodOptions) -> str | None:
    """The pods' scheduler: the table's, else Volcano's for a Volcano gang or Volcano's vGPUs
    (its scheduler hands out the devices the vGPU plugin advertises)."""
    if opts.scheduler_name is not None:
        return opts.scheduler_name
    return VOLCANO if opts.gang == VOLCANO or opts.gpu_sharing == VOLCANO_VGPU else None


def pod_annotations(plan: Plan, opts: PodOptions, *, own_group: bool) -> dict[str, str]:
    """The pod annotations: the table's, Multus networks, and the PodGroup of a Volcano gang
    when mdc writes it (``own_group``; an operator that makes its own annotates the pods)."""
    out = dict(opts.annotations)
    if opts.networks:
        out[NETWORKS_ANNOTATION] = ",".join(opts.networks)
    if opts.gang == VOLCANO and own_group:
        out[GROUP_ANNOTATION] = plan.job.name
    return dict(sorted(out.items()))


def apply_pod(plan: Plan, opts: PodOptions, spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` (a pod spec) with the cluster options: scheduler, host network, and each
    container's extra resources and capabilities."""
    out: dict[str, Any] = {}
    for key, value in spec.items():
        if key == "containers":
            if (name := scheduler(opts)) is not None:
                out["schedulerName"] = name
            if opts.host_network:
                out["hostNetwork"] = True
                out["dnsPolicy"] = HOST_NETWORK_DNS
            value = [cluster_container(plan, opts, c) for c in value]
        out[key] = value
    return out


def pod_template(
    plan: Plan,
    opts: PodOptions,
    labels: Mapping[str, str],
    spec: dict[str, Any],
    *,
    own_group: bool = True,
) -> dict[str, Any]:
    """A pod template: ``labels``, the annotations of :func:`pod_annotations`, and ``spec``
    with :func:`apply_pod`."""
    meta: dict[str, Any] = {}
    if labels:
        meta["labels"] = dict(sorted(labels.items()))
    annotations = pod_annotations(plan, opts, own_group=own_group)
    if annotations:
        meta["annotations"] = annotations
    template: dict[str, Any] = {"metadata": meta} if meta else {}
    template["spec"] = apply_pod(plan, opts, spec)
    return template


def object_labels(labels: Mapping[str, str], opts: PodOptions) -> dict[str, str]:
    """The top object's labels: ``labels`` and Kueue's queue."""
    out = dict(labels)
    if opts.queue is not None:
        out[QUEUE_LABEL] = opts.queue
    return dict(sorted(out.items()))


def pod_group(
    plan: Plan, opts: PodOptions, labels: Mapping[str, str], pods: int
) -> dict[str, Any] | None:
    """Volcano's PodGroup ``<job>``: its scheduler starts none of the ``pods`` until it can
    place all of them (minMember), or None without a Volcano gang."""
    if opts.gang != VOLCANO:
        return None
    meta: dict[str, Any] = {"name": plan.job.name}
    if opts.namespace is not None:
        meta["namespace"] = opts.namespace
    meta["labels"] = dict(sorted(labels.items()))
    spec: dict[str, Any] = {"minMember": pods}
    if opts.gang_queue is not None:
        spec["queue"] = opts.gang_queue
    if opts.priority_class is not None:
        spec["priorityClassName"] = opts.priority_class
    return {"apiVersion": PODGROUP_API, "kind": "PodGroup", "metadata": meta, "spec": spec}
