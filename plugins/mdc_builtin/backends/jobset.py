"""The jobset backend: a JobSet (``jobset.x-k8s.io/v1alpha2``), the Kubernetes multi-node
API that Kubeflow Trainer v2 runs its jobs on.

``jobset/jobset.yaml`` holds the ConfigMap ``<job>-mdc`` (the launch files, mounted at
/mdc) and the JobSet ``<job>``: one replicated job ``node`` (replicas 1), an Indexed Job
of nnodes pods (completions = parallelism = nnodes). The JobSet controller makes the
headless Service ``<job>`` (network.enableDNSHostnames, publishNotReadyAddresses) and
names pod ``i`` ``<job>-node-0-<i>``, so it resolves as ``<job>-node-0-<i>.<job>`` (fully
qualified when the namespace is given). ``NODE_RANK`` is ``JOB_COMPLETION_INDEX``;
``MASTER_ADDR`` is pod 0's name. A failing pod fails the JobSet (failurePolicy
maxRestarts 0 unless ``max_restarts`` says otherwise; each restart recreates every pod).

Backend codes MDC740-749:

- MDC740 an elastic job (min_nnodes < nnodes): a replicated job has a fixed size
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

import mdc
from mdc.api import Artifact, BackendSpec, Finding, Launch, Plan

from ._k8s import common as k8s

API = "jobset.x-k8s.io/v1alpha2"
#: the replicated job of the nodes; pods are <job>-<this>-0-<index>
REPLICATED_JOB = "node"


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class JobSetOptions(k8s.PodOptions):
    """The ``[jobset]`` table: the shared pod keys plus the JobSet's policies."""

    max_restarts: int = 0
    ttl_seconds_after_finished: int | None = None
    active_deadline_seconds: int | None = None
    cluster_domain: str = k8s.DEFAULT_CLUSTER_DOMAIN


def _opts(options: JobSetOptions | None) -> JobSetOptions:
    return options if options is not None else JobSetOptions()


def node_names(plan: Plan, opts: JobSetOptions) -> k8s.NodeNames:
    """Each node's DNS name: pod ``<job>-node-0-<index>`` under the Service ``<job>``."""
    name = plan.job.name
    return k8s.NodeNames(
        count=plan.nnodes,
        prefix=f"{name}-{REPLICATED_JOB}-0-",
        suffix=k8s.pod_dns("", name, opts.namespace, opts.cluster_domain),
    )


def job_template(plan: Plan, launch: Launch, opts: JobSetOptions) -> dict[str, Any]:
    """The replicated job's Job spec: Indexed, nnodes pods, each running k8s/node.sh."""
    hosts = node_names(plan, opts)
    port = plan.rendezvous.master_port
    env: dict[str, Any] = {"MASTER_ADDR": hosts.name(0), "MASTER_PORT": str(port)}
    endpoint = launch.endpoint
    ports = [port] if endpoint is None else [port, endpoint.port]
    container = k8s.container(plan, opts, name="node", env=env, ports=ports)
    pod = k8s.pod_spec(plan, opts, containers=[container], files=files_of(plan, launch, opts))
    labels = {**k8s.job_labels(plan, opts), "mdc/role": "node"}
    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": plan.nnodes,
        "parallelism": plan.nnodes,
        "backoffLimit": 0,  # the JobSet's failurePolicy restarts, all pods together
        "template": k8s.pod_template(plan, opts, labels, pod),
    }
    if opts.active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = opts.active_deadline_seconds
    return spec


def files_of(plan: Plan, launch: Launch, opts: JobSetOptions) -> list[Artifact]:
    lines = [
        'if [[ -z "${JOB_COMPLETION_INDEX:-}" ]]; then',
        '  echo "mdc: JOB_COMPLETION_INDEX is not set: run this in the JobSet of '
        'jobset/jobset.yaml" >&2',
        "  exit 2",
        "fi",
        'export NODE_RANK="$JOB_COMPLETION_INDEX"',
        *node_names(plan, opts).shell_lines(),
    ]
    return [*launch.files, k8s.node_script(plan, lines, "a JobSet pod")]


def documents(plan: Plan, launch: Launch, opts: JobSetOptions) -> list[dict[str, Any]]:
    name = plan.job.name
    labels = k8s.job_labels(plan, opts)
    spec: dict[str, Any] = {
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
        "failurePolicy": {"maxRestarts": opts.max_restarts},
        "replicatedJobs": [
            {
                "name": REPLICATED_JOB,
                "replicas": 1,
                "template": {"spec": job_template(plan, launch, opts)},
            }
        ],
    }
    ttl = k8s.ttl(opts.ttl_seconds_after_finished)
    if ttl is not None:
        spec["ttlSecondsAfterFinished"] = ttl
    if opts.queue is not None:
        spec["suspend"] = True  # Kueue starts it once the queue admits it
    docs = [
        k8s.configmap(plan, files_of(plan, launch, opts), namespace=opts.namespace, labels=labels),
        {
            "apiVersion": API,
            "kind": "JobSet",
            "metadata": k8s.metadata(name, opts.namespace, k8s.object_labels(labels, opts)),
            "spec": spec,
        },
    ]
    group = k8s.pod_group(plan, opts, labels, plan.nnodes)
    return docs if group is None else [*docs, group]


def emit(plan: Plan, launch: Launch, options: JobSetOptions | None) -> list[Artifact]:
    return [k8s.yaml_file("jobset/jobset.yaml", documents(plan, launch, _opts(options)))]


def check(plan: Plan, options: JobSetOptions | None) -> Iterator[Finding]:
    opts = _opts(options)
    yield from k8s.pod_findings(plan, opts, "jobset")
    # the controller names its headless Service after the JobSet
    yield from k8s.service_name_findings(plan.job.name, "/job/name", "the JobSet's Service")
    yield from k8s.name_clash_findings(plan.job.name, ("Service",), "jobset")
    if not k8s.DNS_SUBDOMAIN.fullmatch(opts.cluster_domain) or len(opts.cluster_domain) > 253:
        yield Finding(
            code="MDC473",
            pointer="/jobset/cluster_domain",
            message=f"[jobset] cluster_domain {opts.cluster_domain!r} is not a DNS domain "
            "(lowercase letters, digits, '-' and '.')",
            hint="the cluster's DNS domain, the kubelet's --cluster-domain (\"cluster.local\")",
        )
    if plan.elastic:
        yield Finding(
            code="MDC740",
            pointer="/distributed/min_nnodes",
            message=f"a JobSet's replicated job runs exactly {plan.nnodes} pods; "
            f"min_nnodes = {plan.min_nnodes} asks for an elastic job",
            hint=f"remove min_nnodes (or set it to {plan.nnodes}), or use the pytorchjob "
            "backend (elasticPolicy)",
        )


@mdc.hookimpl
def mdc_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            name="jobset",
            description="Kubernetes JobSet: jobset/jobset.yaml, one Indexed replicated job of "
            "nnodes pods with DNS host names + ConfigMap (kubectl apply -f)",
            emit=emit,
            check=check,
            schema=k8s.backend_schema("jobset"),
            options_type=JobSetOptions,
            launchers=None,  # any launcher: its pods run launch/<role>.sh like every node
            run_command="kubectl apply -f {out}/jobset/jobset.yaml",
            fixed_port=True,  # the manifests carry the master port
        )
    ]
