"""The leaderworkerset backend: multi-node serving as a LeaderWorkerSet (``leaderworkerset.x-k8s.io/v1``).

``leaderworkerset/lws.yaml`` holds the ConfigMap ``<job>-mdc`` with the launch
files (mounted at /mdc), the LeaderWorkerSet ``<job>`` (group size = nnodes,
``replicas`` serving copies) and, when the serving port is known, a Service
``<job>-leader`` in front of every group's leader. The leader is node 0 (the
head or router role); the other pods of a group are nodes 1..nnodes-1.

In each pod ``k8s/node.sh`` takes ``NODE_RANK`` from the pod's
``leaderworkerset.sigs.k8s.io/worker-index`` label (downward API, env
``MDC_WORKER_INDEX``), ``MASTER_ADDR`` from ``LWS_LEADER_ADDRESS`` (set by LWS:
``<job>-<group>.<job>.<ns>``), and ``NODE_HOSTS`` from it: worker ``i`` of the
group is ``<job>-<group>-<i>`` under the same headless Service, which LWS
creates (subdomainPolicy Shared).

Only serving launchers run here (vllm, vllm_disagg, sglang, sglang_disagg): LWS pods are
StatefulSet pods (restartPolicy Always), so a training job that finishes would
be started again; run training on the kubernetes backend. Every check is shared
(MDC450-469). Pod names
(``<job>-<replica>-<index>``, at most 40 + 1 + 10 + 1 + digits) and ``<job>-leader``
fit a DNS label because the core limits job names to 40 characters.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

import mdc
from mdc.api import Artifact, BackendSpec, Finding, Launch, Plan

from ._k8s import common as k8s

API = "leaderworkerset.x-k8s.io/v1"
NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
SERVING = ("sglang", "sglang_disagg", "trtllm", "vllm", "vllm_disagg")


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class LeaderWorkerSetOptions(k8s.PodOptions):
    """The ``[leaderworkerset]`` table."""

    replicas: int | None = None
    port: int | None = None


def _opts(options: LeaderWorkerSetOptions | None) -> LeaderWorkerSetOptions:
    return options if options is not None else LeaderWorkerSetOptions()


def serving_port(plan: Plan, opts: LeaderWorkerSetOptions) -> int | None:
    """The table's port, else the launcher table's ``port`` when it sets one."""
    if opts.port is not None:
        return opts.port
    port = getattr(plan.options.get(plan.launcher), "port", None)
    return port if isinstance(port, int) else None


def rank_lines(plan: Plan) -> list[str]:
    """NODE_RANK, MASTER_ADDR and NODE_HOSTS from what LWS gives the pod."""
    return [
        'if [[ -z "${LWS_LEADER_ADDRESS:-}" || -z "${MDC_WORKER_INDEX:-}" ]]; then',
        (
            '  echo "mdc: LWS_LEADER_ADDRESS or MDC_WORKER_INDEX is not set: run this in the '
            'LeaderWorkerSet of leaderworkerset/lws.yaml" >&2'
        ),
        "  exit 2",
        "fi",
        'export NODE_RANK="$MDC_WORKER_INDEX"',
        'export MASTER_ADDR="$LWS_LEADER_ADDRESS"',
        "# The leader is <lws>-<group>.<service>...; worker i of the group is <lws>-<group>-<i>.",
        'leader="${LWS_LEADER_ADDRESS%%.*}"',
        'domain="${LWS_LEADER_ADDRESS#*.}"',
        'hosts=("$LWS_LEADER_ADDRESS")',
        (
            f"for ((node = 1; node < {plan.nnodes}; node++)); do "
            'hosts+=("$leader-$node.$domain"); done'
        ),
        'export NODE_HOSTS="${hosts[*]}"',
    ]


def documents(plan: Plan, launch: Launch, opts: LeaderWorkerSetOptions) -> list[dict[str, Any]]:
    name = plan.job.name
    labels = k8s.job_labels(plan, opts)
    node = k8s.node_script(plan, rank_lines(plan), "a LeaderWorkerSet pod")
    files = [*launch.files, node]
    master_port = plan.rendezvous.master_port
    endpoint = launch.endpoint
    port = (
        opts.port
        if opts.port is not None or endpoint is None
        else endpoint.port  # the router's port on disaggregated jobs
    )
    if port is None:
        port = serving_port(plan, opts)
    env: dict[str, Any] = {
        "MASTER_PORT": str(master_port),
        "MDC_WORKER_INDEX": k8s.field_ref(f"metadata.labels['{INDEX_LABEL}']"),
    }
    ports = [master_port] + ([port] if port is not None else [])
    container = k8s.container(plan, opts, name="node", env=env, ports=ports)
    router_only = _router_only_leader(plan, launch, opts)
    # a router needs no GPU: the leader's pod asks only for what its servers use
    leader = (
        k8s.container(plan, attrs.evolve(opts, gpus_per_node=0), name="node", env=env, ports=ports)
        if router_only
        else container
    )

    def template(probe: bool, container: dict[str, Any] = container) -> dict[str, Any]:
        pod = dict(container)
        if probe and endpoint is not None and port is not None:
            # a Service routes to the pod only once the model is loaded
            pod["readinessProbe"] = {
                "httpGet": {"path": endpoint.health_path, "port": port},
                "periodSeconds": 10,
                "failureThreshold": 3,
            }
        spec = k8s.pod_spec(plan, opts, containers=[pod], files=files, restart_policy=None)
        # a Volcano gang: the LWS controller, with Volcano as its gang scheduler, makes a
        # PodGroup of each group and annotates its pods
        return k8s.pod_template(plan, opts, labels, spec, own_group=False)

    every_node = endpoint is not None and endpoint.every_node
    probed = endpoint is not None and port is not None
    group: dict[str, Any] = {
        "size": plan.nnodes,
        "restartPolicy": "RecreateGroupOnPodRestart",
    }
    if (probed and not every_node and plan.nnodes > 1) or router_only:
        # only the leader serves HTTP; the other pods (headless engines, Ray workers,
        # servers' later nodes) have no endpoint to probe
        group["leaderTemplate"] = template(probed and not every_node, leader)
    group["workerTemplate"] = template(probed and (every_node or plan.nnodes == 1))
    lws = {
        "apiVersion": API,
        "kind": "LeaderWorkerSet",
        # Kueue: the label alone; it gates the pods of an LWS, which has no suspend
        "metadata": k8s.metadata(name, opts.namespace, k8s.object_labels(labels, opts)),
        "spec": {
            "replicas": opts.replicas if opts.replicas is not None else 1,
            # the leader is ready only once its server is, which needs the workers started
            "startupPolicy": "LeaderCreated" if probed else "LeaderReady",
            "leaderWorkerTemplate": group,
        },
    }
    docs = [k8s.configmap(plan, files, namespace=opts.namespace, labels=labels), lws]
    if port is not None:
        # replicas: every pod serves its own copy, so the Service routes to all of them
        selector = {NAME_LABEL: name} if every_node else {NAME_LABEL: name, INDEX_LABEL: "0"}
        service = k8s.headless_service(f"{name}-leader", opts.namespace, labels, selector, [port])
        service["spec"] = {
            key: value
            for key, value in service["spec"].items()
            if key not in ("clusterIP", "publishNotReadyAddresses")
        }
        docs.append(service)
    return docs


def _router_only_leader(plan: Plan, launch: Launch, opts: LeaderWorkerSetOptions) -> bool:
    """Whether node 0, the leader, runs no server that uses a GPU (a disaggregated job's
    router) while the table leaves gpus_per_node to mdc."""
    return (
        plan.nnodes > 1
        and opts.gpus_per_node is None
        and any(s.gpus == 0 for s in launch.servers)
        and not any(s.gpus and 0 in s.nodes for s in launch.servers)
    )


def emit(plan: Plan, launch: Launch, options: LeaderWorkerSetOptions | None) -> list[Artifact]:
    return [k8s.yaml_file("leaderworkerset/lws.yaml", documents(plan, launch, _opts(options)))]


def check(plan: Plan, options: LeaderWorkerSetOptions | None) -> Iterator[Finding]:
    opts = _opts(options)
    yield from k8s.pod_findings(plan, opts, "leaderworkerset")
    # LWS makes the headless Service <job> for its pods; mdc adds <job>-leader
    yield from k8s.service_name_findings(
        plan.job.name, "/job/name", "the LeaderWorkerSet's headless Service"
    )
    yield from k8s.name_clash_findings(plan.job.name, ("Service",), "leaderworkerset")


@mdc.hookimpl
def mdc_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            name="leaderworkerset",
            description="Kubernetes LeaderWorkerSet for multi-node serving: leaderworkerset/lws.yaml "
            "(group = nnodes pods, leader = node 0, replicas copies)",
            emit=emit,
            check=check,
            schema=k8s.backend_schema("leaderworkerset"),
            options_type=LeaderWorkerSetOptions,
            launchers=SERVING,
            run_command="kubectl apply -f {out}/leaderworkerset/lws.yaml",
            fixed_port=True,  # the manifests carry the master port
        )
    ]
