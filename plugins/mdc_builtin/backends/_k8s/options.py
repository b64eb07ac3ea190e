"""The pod-level options every Kubernetes backend's table accepts (:class:`PodOptions`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from mdc.api import Plan

#: where the ConfigMap's files appear in every container
MOUNT = "/mdc"
GPU_RESOURCES = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
#: what ttl_seconds_after_finished keeps a finished job for unless the table says: a week, to
#: read its logs, and then the API objects go
DEFAULT_TTL_SECONDS = 7 * 24 * 3600
#: the cluster DNS domain pod names are qualified with (the kubelet's --cluster-domain)
DEFAULT_CLUSTER_DOMAIN = "cluster.local"


def ttl(value: int | None) -> int | None:
    """The ttlSecondsAfterFinished to write: the table's, the default, or none for -1."""
    if value is None:
        return DEFAULT_TTL_SECONDS
    return None if value < 0 else value


@attrs.frozen(kw_only=True)
class Toleration:
    """One entry of ``tolerations`` (the pod spec's own fields, snake_case)."""

    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None


@attrs.frozen(kw_only=True)
class Volume:
    """One entry of ``volumes``: a PVC (``claim``) or a node directory (``host_path``)."""

    name: str
    mount_path: str
    claim: str | None = None
    host_path: str | None = None
    read_only: bool = False


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class PodOptions:
    """Pod-level keys every Kubernetes backend's table accepts (subclass it for your table)."""

    namespace: str | None = None
    image_pull_policy: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    node_selector: Mapping[str, str] = attrs.field(factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    service_account: str | None = None
    priority_class: str | None = None
    #: extended resource that stands for the accelerator (default by accelerator)
    gpu_resource: str | None = None
    #: quantity of gpu_resource per pod (default nproc_per_node on GPU jobs)
    gpus_per_node: int | str | None = None
    cpu: int | str | None = None
    memory: str | None = None
    #: "burstable": cpu and memory are requests only (no limits); "guaranteed": limits = requests
    qos: str = "burstable"
    #: sizeLimit of the /dev/shm memory emptyDir (None: no limit)
    shm_size: str | None = None
    volumes: tuple[Volume, ...] = ()
    labels: Mapping[str, str] = attrs.field(factory=dict)
    #: the pods share the node's IPC namespace (hostIPC), for shared memory between processes
    #: of different pods on one node
    host_ipc: bool = False
    #: pod annotations (the pod template's metadata.annotations)
    annotations: Mapping[str, str] = attrs.field(factory=dict)
    #: Multus secondary networks (annotation k8s.v1.cni.cncf.io/networks, comma-separated)
    networks: tuple[str, ...] = ()
    #: extra extended resources per pod (RDMA, EFA, host devices): requests = limits
    extended_resources: Mapping[str, int | str] = attrs.field(factory=dict)
    #: the pods run in the node's network namespace (hostNetwork, dnsPolicy
    #: ClusterFirstWithHostNet so that they still resolve the cluster's names)
    host_network: bool = False
    #: Linux capabilities added to the container (securityContext.capabilities.add)
    capabilities: tuple[str, ...] = ()
    scheduler_name: str | None = None
    #: Kueue LocalQueue (label kueue.x-k8s.io/queue-name; the object is created suspended)
    queue: str | None = None
    #: "volcano": one gang of every pod of the job (a PodGroup with minMember)
    gang: str | None = None
    #: the Volcano queue of the gang (PodGroup spec.queue)
    gang_queue: str | None = None
    #: the GPU-sharing device plugin whose resources gpu_memory and gpu_cores are asked in
    gpu_sharing: str | None = None
    #: GPU memory per GPU of the pod (a quantity, "20Gi"), through gpu_sharing
    gpu_memory: str | None = None
    #: percent of each GPU's compute (1-100), through gpu_sharing
    gpu_cores: int | None = None


def pod_options_schema() -> dict[str, Any]:
    """The JSON Schema ``properties`` of :class:`PodOptions` (from kubernetes.v1.schema.json),
    for other Kubernetes backends' schemas to merge."""
    from mdc.api.files import read_schema

    full = read_schema("mdc_schemas", "plugins/kubernetes.v1.schema.json")
    names = {f.name for f in attrs.fields(PodOptions)}
    props: dict[str, Any] = {k: v for k, v in full["properties"].items() if k in names}
    return props


def backend_schema(name: str) -> dict[str, Any]:
    """A Kubernetes backend's table schema (``plugins/NAME.v1.schema.json``) with the pod
    options merged in, its own properties winning."""
    from mdc.api.files import read_schema

    own = read_schema("mdc_schemas", f"plugins/{name}.v1.schema.json")
    own["properties"] = {**pod_options_schema(), **own["properties"]}
    return own


def gpu_count(plan: Plan, opts: PodOptions) -> int | str | None:
    """The accelerator quantity per pod: the table's, else nproc_per_node on GPU jobs."""
    if opts.gpus_per_node is not None:
        return None if str(opts.gpus_per_node) == "0" else opts.gpus_per_node
    return None if plan.accelerator == "cpu" else plan.nproc_per_node
