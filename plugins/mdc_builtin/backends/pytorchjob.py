"""The pytorchjob backend: a Kubeflow training-operator v1 PyTorchJob (``kubeflow.org/v1``).

A fixed-size job has a ``Master`` replica (1 pod, node 0) and nnodes-1
``Worker`` replicas. Because a Master exists, the operator
(pkg/controller.v1/pytorch/envvar.go and master.go, v1.7+) sets in every
container: ``MASTER_ADDR`` = ``<job>-master-0`` (the per-pod Service it
creates), ``MASTER_PORT`` = the port named ``pytorchjob-port`` of the Master's
container named ``pytorch``, ``RANK`` = the replica index (+1 for Workers),
``WORLD_SIZE`` = pods x int(nprocPerNode), ``PET_NPROC_PER_NODE`` =
nprocPerNode, ``PET_NODE_RANK`` = RANK and ``PET_NNODES`` = pods. mdc sets
nprocPerNode = nproc_per_node (a string in the CRD), pods = nnodes and that
port = the plan's master port, and takes ``NODE_RANK`` from ``RANK``.

An elastic job (min_nnodes < nnodes) has nnodes ``Worker`` replicas and no
Master: with an elasticPolicy the operator creates an HPA that scales
``Worker.replicas`` (the CRD's scale subresource) between minReplicas and
maxReplicas, and sets ``PET_NNODES`` = ``min:max`` and ``PET_RDZV_ENDPOINT`` =
rdzvHost:rdzvPort (elastic.go, hpa.go); both count every node only when every
node is a Worker. mdc sets min/maxReplicas = min_nnodes/nnodes, rdzvHost =
``<job>-worker-0``, rdzvPort = the plan's master port, and the pods'
``MASTER_ADDR``/``MASTER_PORT`` to the same endpoint (the operator sets none
without a Master); ``NODE_RANK`` is the pod's index, from its name.

torchrun reads ``PET_*`` only for flags it is not given; mdc gives the flags,
with the values above, so both agree.

``pytorchjob/job.yaml`` holds the ConfigMap ``<job>-mdc`` (the launch files,
mounted at ``/mdc``) and the PyTorchJob; ``kubectl apply -f`` it. Every pod runs
``/mdc/k8s/node.sh``, which sets ``NODE_RANK`` and runs the node's role.

A failing rank ends the job in Failed: runPolicy.backoffLimit defaults to 0 (the
operator fails the job at the first container restart; without a limit it restarts
OnFailure containers forever), cleanPodPolicy to Running (the pods still running when
the job ends are deleted, freeing their GPUs) and ttlSecondsAfterFinished to a week.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import attrs

import mdc
from mdc.api import Artifact, BackendSpec, Finding, Launch, Plan

from ._k8s import common as k8s

#: the container and port names the operator looks for (kubeflowv1.PytorchJobDefault*)
CONTAINER = "pytorch"
PORT_NAME = "pytorchjob-port"
#: launchers whose nodes run one program that meets at MASTER_ADDR:MASTER_PORT
LAUNCHERS = ("basic", "deepspeed", "megatron", "primus", "torchrun", "torchtitan")
#: the operator's Service names are DNS-1035 labels (they start with a letter)
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
RANK_LINES = ('export NODE_RANK="${RANK:-}"  # the operator: 0 on the Master, 1.. on Workers',)
#: elastic jobs have Workers only; a pod's name (its hostname) is <job>-worker-<index>
ELASTIC_RANK_LINES = ('export NODE_RANK="${HOSTNAME##*-}"  # the pod <job>-worker-<index>',)


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class PyTorchJobOptions(k8s.PodOptions):
    """The ``[pytorchjob]`` table: the shared pod keys plus the job's run policy."""

    restart_policy: str = "OnFailure"
    backoff_limit: int | None = None
    ttl_seconds_after_finished: int | None = None
    active_deadline_seconds: int | None = None
    #: pods deleted when the job ends: Running ones (the operator's default, None, leaves a
    #: restarting container holding its GPUs after the job failed)
    clean_pod_policy: str = "Running"


def _opts(options: PyTorchJobOptions | None) -> PyTorchJobOptions:
    return options if options is not None else PyTorchJobOptions()


def node_names(plan: Plan) -> k8s.NodeNames:
    """The per-pod Service names the operator creates, in node-rank order: the Master and
    the Workers, or (elastic) the Workers only."""
    name = plan.job.name
    master = () if plan.elastic else (f"{name}-master-0",)
    return k8s.NodeNames(count=plan.nnodes, prefix=f"{name}-worker-", fixed=master)


def files_of(plan: Plan, launch: Launch) -> list[Artifact]:
    lines = ELASTIC_RANK_LINES if plan.elastic else RANK_LINES
    return [
        *launch.files,
        k8s.node_script(plan, [*lines, *node_names(plan).shell_lines()], "PyTorchJob"),
    ]


def replica(
    plan: Plan, opts: PyTorchJobOptions, files: list[Artifact], count: int
) -> dict[str, Any]:
    env = {}
    if plan.elastic:  # no Master: the operator sets no MASTER_ADDR/PORT; node 0 hosts c10d
        env = {
            "MASTER_ADDR": node_names(plan).name(0),
            "MASTER_PORT": str(plan.rendezvous.master_port),
        }
    container = k8s.container(plan, opts, name=CONTAINER, env=env)
    container["ports"] = [
        {"name": PORT_NAME, "containerPort": plan.rendezvous.master_port, "protocol": "TCP"}
    ]
    pod = k8s.pod_spec(plan, opts, containers=[container], files=files, restart_policy=None)
    # a Volcano gang: the operator makes the PodGroup from runPolicy.schedulingPolicy
    template = k8s.pod_template(plan, opts, k8s.job_labels(plan, opts), pod, own_group=False)
    return {"replicas": count, "restartPolicy": opts.restart_policy, "template": template}


def scheduling_policy(plan: Plan, opts: PyTorchJobOptions) -> dict[str, Any]:
    """runPolicy.schedulingPolicy: the operator, run with Volcano as its gang scheduler,
    makes a PodGroup of the job with minMember = minAvailable (every pod; min_nnodes of an
    elastic job), in the Volcano queue and priority class given."""
    policy: dict[str, Any] = {"minAvailable": plan.min_nnodes if plan.elastic else plan.nnodes}
    if opts.gang_queue is not None:
        policy["queue"] = opts.gang_queue
    if opts.priority_class is not None:
        policy["priorityClass"] = opts.priority_class
    return policy


def pytorchjob(plan: Plan, opts: PyTorchJobOptions, files: list[Artifact]) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if plan.elastic:
        # the operator's HPA scales Worker.replicas (the CRD's scale subresource) between
        # minReplicas and maxReplicas, and PET_NNODES = "min:max": both count all nodes only
        # when every node is a Worker
        specs = {"Worker": replica(plan, opts, files, plan.nnodes)}
        torchrun = plan.options.get("torchrun")
        spec["elasticPolicy"] = {
            "minReplicas": plan.min_nnodes,
            "maxReplicas": plan.nnodes,
            "rdzvBackend": "c10d",
            "rdzvHost": node_names(plan).name(0),
            "rdzvPort": plan.rendezvous.master_port,
            "maxRestarts": int(getattr(torchrun, "max_restarts", 0) or 0),
        }
    else:
        specs = {"Master": replica(plan, opts, files, 1)}
        if plan.nnodes > 1:
            specs["Worker"] = replica(plan, opts, files, plan.nnodes - 1)
    spec["nprocPerNode"] = str(plan.nproc_per_node)
    spec["pytorchReplicaSpecs"] = specs
    run_policy: dict[str, Any] = {}
    for key, value in (
        ("activeDeadlineSeconds", opts.active_deadline_seconds),
        # without a backoffLimit the operator restarts a failing container forever (OnFailure)
        ("backoffLimit", opts.backoff_limit if opts.backoff_limit is not None else 0),
        ("cleanPodPolicy", opts.clean_pod_policy),
        ("ttlSecondsAfterFinished", k8s.ttl(opts.ttl_seconds_after_finished)),
    ):
        if value is not None:
            run_policy[key] = value
    if opts.gang == k8s.VOLCANO:
        run_policy["schedulingPolicy"] = scheduling_policy(plan, opts)
    if opts.queue is not None:
        run_policy["suspend"] = True  # Kueue starts it once the queue admits it
    if run_policy:
        spec["runPolicy"] = run_policy
    labels = k8s.object_labels(k8s.job_labels(plan, opts), opts)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": k8s.metadata(plan.job.name, opts.namespace, labels),
        "spec": spec,
    }


def documents(
    plan: Plan, launch: Launch, options: PyTorchJobOptions | None
) -> list[dict[str, Any]]:
    opts = _opts(options)
    files = files_of(plan, launch)
    return [
        k8s.configmap(plan, files, namespace=opts.namespace, labels=k8s.job_labels(plan, opts)),
        pytorchjob(plan, opts, files),
    ]


def emit(plan: Plan, launch: Launch, options: PyTorchJobOptions | None) -> list[Artifact]:
    return [k8s.yaml_file("pytorchjob/job.yaml", documents(plan, launch, options))]


def check(plan: Plan, options: PyTorchJobOptions | None) -> Iterator[Finding]:
    opts = _opts(options)
    yield from k8s.pod_findings(plan, opts, "pytorchjob")
    longest = node_names(plan).name(plan.nnodes - 1)
    if not DNS_1035.fullmatch(plan.job.name) or len(longest) > 63:
        yield Finding(
            code="MDC470",
            pointer="/job/name",
            message=f"the operator names the pods and their Services <job>-master-0 "
            f"and <job>-worker-<i>, which must be DNS-1035 labels; {longest!r} "
            f"({len(longest)} characters) is not: lowercase letters, digits "
            "and '-', starting with a letter, at most 63 characters",
            hint="start the job name with a letter and keep it to at most "
            f"{63 - (len(longest) - len(plan.job.name))} characters",
        )
    if len(plan.roles) != 1:
        yield Finding(
            code="MDC471",
            pointer="/distributed/launcher",
            message=f"a PyTorchJob runs one program on the Master and the Workers; "
            f"launcher {plan.launcher} has {len(plan.roles)} roles "
            f"({', '.join(r.name for r in plan.roles)})",
            hint="use the kubernetes or leaderworkerset backend",
        )


@mdc.hookimpl
def mdc_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            reads=("torchrun",),  # [torchrun] tunes the torchrun it runs on
            name="pytorchjob",
            emit=emit,
            check=check,
            launchers=LAUNCHERS,
            run_command="kubectl apply -f {out}/pytorchjob/job.yaml",
            fixed_port=True,  # the manifests carry the master port
            schema=k8s.backend_schema("pytorchjob"),
            options_type=PyTorchJobOptions,
            description="Kubeflow training-operator v1 PyTorchJob: Master (node 0) + Worker "
            "replicas; elastic min:max nodes as Workers under an elasticPolicy",
        )
    ]
