"""The kubernetes backend: an Indexed Job, a headless Service and a ConfigMap.

``kubernetes/job.yaml`` holds three documents: the ConfigMap ``<job>-mdc`` with
the launch files (mounted at /mdc), a headless Service ``<job>`` and an
Indexed Job ``<job>`` (completions = parallelism = nnodes) whose pods have
``subdomain: <job>``, so pod ``<job>-<i>`` resolves as ``<job>-<i>.<job>``
(fully qualified when the namespace is given). ``NODE_RANK`` is
``JOB_COMPLETION_INDEX``; ``MASTER_ADDR`` is the DNS name of index 0; every
node sees ``NODE_HOSTS``. Pod host names ``<job>-<index>`` fit a DNS label because
the core limits job names to 40 characters. Apply with ``kubectl apply -f kubernetes/job.yaml``.
Backend codes MDC440-449:

- MDC441 an elastic job (min_nnodes < nnodes): an Indexed Job has a fixed size
- MDC443 more nodes than an Indexed Job may run at once (the apiserver's limit on
  parallelism, :data:`MAX_INDEXED_PARALLELISM`)
- MDC473 ``cluster_domain`` is not a DNS domain

A failing pod fails the Job (backoffLimit 0, restartPolicy Never), and the finished
Job and its pods are deleted after a week (ttlSecondsAfterFinished 604800) unless
the table says otherwise (-1: kept). A serving launcher's pods get a readiness probe on
its health endpoint (``GET /health`` on the serving port: vLLM's and SGLang's servers and
SGLang's router), and the container lists that port.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

import mdc
from mdc.api import Artifact, BackendSpec, Finding, Launch, Plan
from mdc.api.files import read_schema

from ._k8s import common as k8s

#: the most pods an Indexed Job may run at once: the apiserver refuses a larger parallelism
#: (pkg/apis/batch/validation, maxParallelismForIndexedJob), and mdc's Job runs nnodes
MAX_INDEXED_PARALLELISM = 100_000


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class KubernetesOptions(k8s.PodOptions):
    """The ``[kubernetes]`` table."""

    backoff_limit: int | None = None
    ttl_seconds_after_finished: int | None = None
    active_deadline_seconds: int | None = None
    cluster_domain: str = k8s.DEFAULT_CLUSTER_DOMAIN


def _opts(options: KubernetesOptions | None) -> KubernetesOptions:
    return options if options is not None else KubernetesOptions()


def node_names(plan: Plan, opts: KubernetesOptions) -> k8s.NodeNames:
    """Each node's DNS name: the Indexed Job's pod ``<job>-<index>`` under the Service."""
    return k8s.NodeNames(
        count=plan.nnodes,
        prefix=f"{plan.job.name}-",
        suffix=k8s.pod_dns("", plan.job.name, opts.namespace, opts.cluster_domain),
    )


def documents(plan: Plan, launch: Launch, opts: KubernetesOptions) -> list[dict[str, Any]]:
    name = plan.job.name
    labels = k8s.job_labels(plan, opts)
    hosts = node_names(plan, opts)
    node = k8s.node_script(
        plan,
        [
            'if [[ -z "${JOB_COMPLETION_INDEX:-}" ]]; then',
            (
                '  echo "mdc: JOB_COMPLETION_INDEX is not set: run this in the Indexed Job of '
                'kubernetes/job.yaml" >&2'
            ),
            "  exit 2",
            "fi",
            'export NODE_RANK="$JOB_COMPLETION_INDEX"',
            *hosts.shell_lines(),
        ],
        "an Indexed Job pod",
    )
    files = [*launch.files, node]
    port = plan.rendezvous.master_port
    env: dict[str, Any] = {"MASTER_ADDR": hosts.name(0), "MASTER_PORT": str(port)}
    endpoint = launch.endpoint
    ports = [port] if endpoint is None else [port, endpoint.port]
    container = k8s.container(plan, opts, name="node", env=env, ports=ports)
    if endpoint is not None:
        # a serving pod is Ready once its server answers the health endpoint (the model is
        # loaded), so a Service in front of the pods routes only to servers that serve; a
        # pod that serves no HTTP (a later node of a server, a headless engine) stays unready
        container["readinessProbe"] = {
            "httpGet": {"path": endpoint.health_path, "port": endpoint.port},
            "periodSeconds": 10,
            "failureThreshold": 3,
        }
    pod_labels = {**labels, "mdc/role": "node"}
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": plan.nnodes,
        "parallelism": plan.nnodes,
        "backoffLimit": opts.backoff_limit if opts.backoff_limit is not None else 0,
    }
    ttl = k8s.ttl(opts.ttl_seconds_after_finished)
    if ttl is not None:
        job_spec["ttlSecondsAfterFinished"] = ttl
    if opts.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = opts.active_deadline_seconds
    if opts.queue is not None:
        job_spec["suspend"] = True  # Kueue starts it once the queue admits it
    pod = k8s.pod_spec(plan, opts, containers=[container], files=files, subdomain=name)
    job_spec["template"] = k8s.pod_template(plan, opts, pod_labels, pod)
    docs = [
        k8s.configmap(plan, files, namespace=opts.namespace, labels=labels),
        k8s.headless_service(name, opts.namespace, labels, {"mdc/job": name}, [port]),
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": k8s.metadata(name, opts.namespace, k8s.object_labels(labels, opts)),
            "spec": job_spec,
        },
    ]
    group = k8s.pod_group(plan, opts, labels, plan.nnodes)
    return docs if group is None else [*docs, group]


def emit(plan: Plan, launch: Launch, options: KubernetesOptions | None) -> list[Artifact]:
    return [k8s.yaml_file("kubernetes/job.yaml", documents(plan, launch, _opts(options)))]


def check(plan: Plan, options: KubernetesOptions | None) -> Iterator[Finding]:
    opts = _opts(options)
    yield from k8s.pod_findings(plan, opts, "kubernetes")
    yield from k8s.service_name_findings(plan.job.name, "/job/name", "the headless Service")
    yield from k8s.name_clash_findings(plan.job.name, ("Service", "Job"), "kubernetes")
    if not k8s.DNS_SUBDOMAIN.fullmatch(opts.cluster_domain) or len(opts.cluster_domain) > 253:
        yield Finding(
            code="MDC473",
            pointer="/kubernetes/cluster_domain",
            message=f"[kubernetes] cluster_domain {opts.cluster_domain!r} is not a DNS "
            "domain (lowercase letters, digits, '-' and '.')",
            hint="the cluster's DNS domain, the kubelet's --cluster-domain (\"cluster.local\")",
        )
    if plan.nnodes > MAX_INDEXED_PARALLELISM:
        yield Finding(
            code="MDC443",
            pointer="/distributed/nnodes",
            message=f"an Indexed Job runs its {plan.nnodes} pods at once (parallelism = "
            f"nnodes), and the apiserver refuses a parallelism above "
            f"{MAX_INDEXED_PARALLELISM} for an Indexed Job",
            hint=f"run at most {MAX_INDEXED_PARALLELISM} nodes (more processes per node, "
            "or several jobs)",
        )
    if plan.elastic:
        yield Finding(
            code="MDC441",
            pointer="/distributed/min_nnodes",
            message=f"an Indexed Job runs exactly {plan.nnodes} pods; min_nnodes = "
            f"{plan.min_nnodes} asks for an elastic job",
            hint=f"remove min_nnodes (or set it to {plan.nnodes}), or use the "
            "pytorchjob backend (elasticPolicy)",
        )


@mdc.hookimpl
def mdc_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            name="kubernetes",
            description="Kubernetes: kubernetes/job.yaml, an Indexed Job + headless Service + "
            "ConfigMap (kubectl apply -f)",
            emit=emit,
            check=check,
            schema=read_schema("mdc_schemas", "plugins/kubernetes.v1.schema.json"),
            options_type=KubernetesOptions,
            launchers=None,  # any launcher: its pods run launch/<role>.sh like every node
            run_command="kubectl apply -f {out}/kubernetes/job.yaml",
            fixed_port=True,  # the manifests carry the master port
        )
    ]
