"""The kuberay backend: one vLLM server over several nodes through Ray, as a KubeRay
RayCluster (``ray.io/v1``).

``kuberay/raycluster.yaml`` holds the ConfigMap ``<job>-mdc`` (the launch files, mounted
at /mdc) and the RayCluster ``<job>``: a head group (node 0) and one worker group
``worker`` of nnodes-1 pods (replicas = minReplicas = maxReplicas: no autoscaling, the
server needs every GPU). The RayCluster carries ``ray.io/overwrite-container-cmd: "true"``,
so KubeRay leaves the containers' command alone and the launch scripts start Ray as on
every other backend: the head pod starts the Ray head at MASTER_PORT and, once Ray has
every GPU, the server; the workers join the head. KubeRay makes the Service
``<job>-head-svc`` in front of the head pod, with the head container's ports: the Ray
GCS at MASTER_PORT (``rayStartParams.port``, so that KubeRay's own wait for the GCS in
the workers' init container looks at that port) and the server's port, where clients
reach vLLM.

In each pod ``k8s/node.sh`` sets ``NODE_RANK``, ``MASTER_ADDR`` and ``NODE_HOSTS`` from
the pod's type (env ``MDC_RAY_NODE``) and IP (downward API ``status.podIP``): the head is
node 0 at its own IP; a worker group's pods have no index, so each worker is node 1 to
the launch script, next to the head's Service name (in Ray mode the launch script tells
only node 0 from the others, and finds its own IP at ``NODE_HOSTS[NODE_RANK]``).

A Kueue queue labels the RayCluster and creates it suspended (spec.suspend); a Volcano
gang sets KubeRay's batch-scheduler labels (``ray.io/scheduler-name: volcano``,
``volcano.sh/queue-name``), and KubeRay makes the PodGroup.

Backend codes MDC750-759:

- MDC750 the job is not one vLLM server over Ray on two nodes or more
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

import mdc
from mdc.api import Artifact, BackendSpec, Finding, Launch, Plan

from ._k8s import common as k8s

API = "ray.io/v1"
WORKER_GROUP = "worker"
OVERWRITE_COMMAND = "ray.io/overwrite-container-cmd"
#: KubeRay's batch-scheduler labels (its Volcano integration makes the PodGroup)
SCHEDULER_LABEL = "ray.io/scheduler-name"
VOLCANO_QUEUE_LABEL = "volcano.sh/queue-name"
RANK_LINES = (
    'if [[ "${MDC_RAY_NODE:-}" == head ]]; then  # the head pod is node 0',
    '  export NODE_RANK=0 MASTER_ADDR="$MDC_POD_IP" NODE_HOSTS="$MDC_POD_IP"',
    "else  # a worker group's pods have no index: each one is node 1",
    '  export NODE_RANK=1 NODE_HOSTS="$MASTER_ADDR $MDC_POD_IP"',
    "fi",
)


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class KubeRayOptions(k8s.PodOptions):
    """The ``[kuberay]`` table: the shared pod keys plus the cluster's DNS domain."""

    ray_version: str | None = None
    cluster_domain: str = k8s.DEFAULT_CLUSTER_DOMAIN


def _opts(options: KubeRayOptions | None) -> KubeRayOptions:
    return options if options is not None else KubeRayOptions()


def head_service(plan: Plan, opts: KubeRayOptions) -> str:
    """The DNS name of the Service KubeRay makes in front of the head pod."""
    service = f"{plan.job.name}-head-svc"
    if opts.namespace is None:
        return service
    return f"{service}.{opts.namespace}.svc.{opts.cluster_domain}"


def files_of(plan: Plan, launch: Launch) -> list[Artifact]:
    return [*launch.files, k8s.node_script(plan, list(RANK_LINES), "a RayCluster pod")]


def group_template(
    plan: Plan, launch: Launch, opts: KubeRayOptions, *, head: bool
) -> dict[str, Any]:
    """The pod template of the head (node 0) or of the worker group."""
    port = plan.rendezvous.master_port
    env: dict[str, Any] = {
        "MDC_RAY_NODE": "head" if head else "worker",
        "MDC_POD_IP": k8s.field_ref("status.podIP"),
        "MASTER_PORT": str(port),
    }
    if not head:
        env["MASTER_ADDR"] = head_service(plan, opts)
    name = "ray-head" if head else "ray-worker"
    container = k8s.container(plan, opts, name=name, env=env)
    endpoint = launch.endpoint
    if head:
        # KubeRay's head Service takes the head container's ports
        ports = [{"name": "gcs-server", "containerPort": port, "protocol": "TCP"}]
        if endpoint is not None:
            if endpoint.port != port:  # one port listed twice is a duplicate hostPort on
                # the node's network, which the apiserver refuses
                ports.append({"name": "vllm", "containerPort": endpoint.port, "protocol": "TCP"})
            container["readinessProbe"] = {
                "httpGet": {"path": endpoint.health_path, "port": endpoint.port},
                "periodSeconds": 10,
                "failureThreshold": 3,
            }
        container["ports"] = ports
    files = files_of(plan, launch)
    pod = k8s.pod_spec(plan, opts, containers=[container], files=files, restart_policy=None)
    labels = {**k8s.job_labels(plan, opts), "mdc/role": "head" if head else "worker"}
    # a Volcano gang: KubeRay makes the PodGroup and annotates the pods
    return k8s.pod_template(plan, opts, labels, pod, own_group=False)


def raycluster(plan: Plan, launch: Launch, opts: KubeRayOptions) -> dict[str, Any]:
    labels = k8s.object_labels(k8s.job_labels(plan, opts), opts)
    if opts.gang == k8s.VOLCANO:
        labels[SCHEDULER_LABEL] = k8s.VOLCANO
        if opts.gang_queue is not None:
            labels[VOLCANO_QUEUE_LABEL] = opts.gang_queue
        labels = dict(sorted(labels.items()))
    meta = k8s.metadata(plan.job.name, opts.namespace, labels)
    meta["annotations"] = {OVERWRITE_COMMAND: "true"}
    workers = plan.nnodes - 1
    spec: dict[str, Any] = {}
    if opts.ray_version is not None:
        spec["rayVersion"] = opts.ray_version
    if opts.queue is not None:
        spec["suspend"] = True  # Kueue starts it once the queue admits it
    spec["headGroupSpec"] = {
        "rayStartParams": {"port": str(plan.rendezvous.master_port)},
        "template": group_template(plan, launch, opts, head=True),
    }
    spec["workerGroupSpecs"] = [
        {
            "groupName": WORKER_GROUP,
            "replicas": workers,
            "minReplicas": workers,
            "maxReplicas": workers,
            "rayStartParams": {},
            "template": group_template(plan, launch, opts, head=False),
        }
    ]
    return {"apiVersion": API, "kind": "RayCluster", "metadata": meta, "spec": spec}


def documents(plan: Plan, launch: Launch, opts: KubeRayOptions) -> list[dict[str, Any]]:
    labels = k8s.job_labels(plan, opts)
    return [
        k8s.configmap(plan, files_of(plan, launch), namespace=opts.namespace, labels=labels),
        raycluster(plan, launch, opts),
    ]


def emit(plan: Plan, launch: Launch, options: KubeRayOptions | None) -> list[Artifact]:
    return [k8s.yaml_file("kuberay/raycluster.yaml", documents(plan, launch, _opts(options)))]


def ray_mode(plan: Plan) -> bool:
    """Whether the vllm launcher runs one server over every node through Ray."""
    mode = getattr(plan.options.get("vllm"), "mode", None)
    return plan.nnodes >= 2 and (mode or ("dp" if plan.sizes.dp > 1 else "ray")) == "ray"


def check(plan: Plan, options: KubeRayOptions | None) -> Iterator[Finding]:
    opts = _opts(options)
    yield from k8s.pod_findings(plan, opts, "kuberay")
    yield from k8s.service_name_findings(
        f"{plan.job.name}-head-svc", "/job/name", "KubeRay's head Service"
    )
    if not k8s.DNS_SUBDOMAIN.fullmatch(opts.cluster_domain) or len(opts.cluster_domain) > 253:
        yield Finding(
            code="MDC473",
            pointer="/kuberay/cluster_domain",
            message=f"[kuberay] cluster_domain {opts.cluster_domain!r} is not a DNS domain "
            "(lowercase letters, digits, '-' and '.')",
            hint="the cluster's DNS domain, the kubelet's --cluster-domain (\"cluster.local\")",
        )
    if not ray_mode(plan):
        yield Finding(
            code="MDC750",
            pointer="/distributed/nnodes" if plan.nnodes < 2 else "/vllm/mode",
            message="a RayCluster runs one vLLM server over its head and workers through "
            f"Ray; this job is {plan.nnodes} node(s) in vLLM mode "
            f"{getattr(plan.options.get('vllm'), 'mode', None) or 'dp/single'!r}",
            hint='run vLLM over Ray on two nodes or more (mode = "ray", pp across nodes), '
            "or use the kubernetes or leaderworkerset backend",
        )


@mdc.hookimpl
def mdc_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            reads=("vllm",),  # [vllm] mode: one server over Ray
            name="kuberay",
            description="KubeRay RayCluster for vLLM over Ray: kuberay/raycluster.yaml, a head "
            "(node 0) and a worker group of nnodes-1 pods; the launch scripts start Ray",
            emit=emit,
            check=check,
            schema=k8s.backend_schema("kuberay"),
            options_type=KubeRayOptions,
            launchers=("vllm",),
            run_command="kubectl apply -f {out}/kuberay/raycluster.yaml",
            fixed_port=True,  # the manifests carry the master port
        )
    ]
