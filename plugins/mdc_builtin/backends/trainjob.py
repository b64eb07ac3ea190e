"""The trainjob backend: a Kubeflow Trainer v2 TrainJob (``trainer.kubeflow.org/v1alpha1``).

The TrainJob names a (Cluster)TrainingRuntime (``[trainjob] runtime``, default the
ClusterTrainingRuntime ``torch-distributed``) and sets ``trainer.numNodes`` =
nnodes, ``trainer.numProcPerNode`` = nproc_per_node (an integer in v1alpha1),
``resourcesPerNode``, ``image``, ``command`` and ``env``. The runtime's JobSet
runs one pod per node: replicated job ``node``, container ``node`` (the
torch-distributed runtime's names; ``[trainjob] replicated_job`` and
``container`` for runtimes that name them otherwise).

The Trainer's torch plugin puts into that container ``PET_NNODES``,
``PET_NPROC_PER_NODE``, ``PET_NODE_RANK`` (the Job completion index),
``PET_MASTER_ADDR`` = ``<job>-node-0-0.<job>`` and ``PET_MASTER_PORT`` = 29500
(its ContainerTrainerPort); those take precedence over the TrainJob's own env.
``/mdc/k8s/node.sh`` maps ``NODE_RANK`` and ``MASTER_ADDR`` from them;
``MASTER_PORT`` is the plan's port, set in the trainer env (the rendezvous
store listens on it inside the pod network, so any free port works), so
plan.json stays true. torchrun gets explicit flags that agree with the
``PET_*`` values (nnodes, nproc_per_node). ``NODE_HOSTS`` lists the JobSet pods'
DNS names ``<job>-node-0-<i>.<job>``.

``trainjob/job.yaml`` holds the ConfigMap ``<job>-mdc`` (the launch files) and
the TrainJob. The v1alpha1 TrainJob has no podSpecOverrides; its
``runtimePatches`` (manager ``mdc.dev/launch-files``) add the ConfigMap and
``/dev/shm`` volumes and their mounts, node selector, tolerations, pull
secrets, service account and volumes to the runtime's pod template. What a
runtime patch cannot set (imagePullPolicy, priorityClassName) is a diagnostic.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import attrs

import mdc
from mdc.api import Artifact, BackendSpec, Finding, Launch, Plan

from ._k8s import common as k8s

NODE = "node"
MANAGER = "mdc.dev/launch-files"
LAUNCHERS = ("basic", "deepspeed", "megatron", "primus", "torchrun", "torchtitan")
#: the TrainJob CRD's own rule for metadata.name (x-kubernetes-validations)
RFC1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
RANK_LINES = (
    'export NODE_RANK="${PET_NODE_RANK:-}"  # the Trainer: the Job completion index',
    'export MASTER_ADDR="${PET_MASTER_ADDR:-}"  # the Trainer: <job>-node-0-0.<job>',
)


@attrs.frozen(kw_only=True, repr=False)  # options are read, never shown
class TrainJobOptions(k8s.PodOptions):
    """The ``[trainjob]`` table: the shared pod keys plus the runtime reference."""

    runtime: str = "torch-distributed"
    runtime_kind: str = "ClusterTrainingRuntime"
    replicated_job: str = NODE
    container: str = NODE
    active_deadline_seconds: int | None = None


def _opts(options: TrainJobOptions | None) -> TrainJobOptions:
    return options if options is not None else TrainJobOptions()


def node_names(plan: Plan, opts: TrainJobOptions) -> k8s.NodeNames:
    """JobSet pod DNS names: <jobset>-<replicatedJob>-<job index>-<pod index>.<jobset>."""
    name = plan.job.name
    return k8s.NodeNames(
        count=plan.nnodes, prefix=f"{name}-{opts.replicated_job}-0-", suffix=f".{name}"
    )


def files_of(plan: Plan, launch: Launch, opts: TrainJobOptions) -> list[Artifact]:
    lines = [*RANK_LINES, *node_names(plan, opts).shell_lines()]
    return [*launch.files, k8s.node_script(plan, lines, "TrainJob")]


def trainjob(plan: Plan, opts: TrainJobOptions, files: list[Artifact]) -> dict[str, Any]:
    env = {"MASTER_PORT": str(plan.rendezvous.master_port)}
    # the shared container: its image, command, env and mounts; the rest goes to the patch
    full = k8s.cluster_container(
        plan, opts, k8s.container(plan, opts, name=opts.container, env=env)
    )
    trainer: dict[str, Any] = {
        "numNodes": plan.nnodes,
        "numProcPerNode": plan.nproc_per_node,
        "image": full["image"],
        "command": full["command"],
        "env": full["env"],
    }
    if "resources" in full:
        trainer["resourcesPerNode"] = full["resources"]
    patched: dict[str, Any] = {"name": opts.container}
    if "securityContext" in full:
        patched["securityContext"] = full["securityContext"]
    patched["volumeMounts"] = full["volumeMounts"]
    pod = k8s.pod_spec(plan, opts, containers=[patched], files=files, restart_policy=None)
    meta: dict[str, Any] = {}
    if opts.labels:
        meta["labels"] = dict(sorted(opts.labels.items()))
    if annotations := k8s.pod_annotations(plan, opts, own_group=False):
        meta["annotations"] = annotations
    template: dict[str, Any] = {"metadata": meta, "spec": pod} if meta else {"spec": pod}
    patch = {
        "manager": MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {"name": opts.replicated_job, "template": {"spec": {"template": template}}}
                    ]
                }
            }
        },
    }
    spec: dict[str, Any] = {
        "runtimeRef": {
            "apiGroup": "trainer.kubeflow.org",
            "kind": opts.runtime_kind,
            "name": opts.runtime,
        },
        "trainer": trainer,
        "runtimePatches": [patch],
    }
    if opts.active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = opts.active_deadline_seconds
    if opts.queue is not None:
        spec["suspend"] = True  # Kueue starts it once the queue admits it
    labels = k8s.object_labels(k8s.job_labels(plan, opts), opts)
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": k8s.metadata(plan.job.name, opts.namespace, labels),
        "spec": spec,
    }


def documents(plan: Plan, launch: Launch, options: TrainJobOptions | None) -> list[dict[str, Any]]:
    opts = _opts(options)
    files = files_of(plan, launch, opts)
    return [
        k8s.configmap(plan, files, namespace=opts.namespace, labels=k8s.job_labels(plan, opts)),
        trainjob(plan, opts, files),
    ]


def emit(plan: Plan, launch: Launch, options: TrainJobOptions | None) -> list[Artifact]:
    return [k8s.yaml_file("trainjob/job.yaml", documents(plan, launch, options))]


def check(plan: Plan, options: TrainJobOptions | None) -> Iterator[Finding]:
    opts = _opts(options)
    yield from k8s.pod_findings(plan, opts, "trainjob")
    # the replicatedJob names pods and hosts: a bad one is its own finding, not the job's
    bad_replicated_job = k8s.dns_label_findings(
        opts.replicated_job, "/trainjob/replicated_job", "[trainjob] replicated_job"
    )
    yield from bad_replicated_job
    longest = node_names(plan, opts).name(plan.nnodes - 1).split(".")[0]
    if not RFC1035.fullmatch(plan.job.name) or (len(longest) > 63 and not bad_replicated_job):
        yield Finding(
            code="MDC480",
            pointer="/job/name",
            message=f"the TrainJob name must be an RFC 1035 label and its pods are "
            f"named <job>-{opts.replicated_job}-0-<i>; {longest!r} "
            f"({len(longest)} characters) must be lowercase letters, digits "
            "and '-', starting with a letter, at most 63 characters",
            hint="start the job name with a letter and keep it to at most "
            f"{63 - (len(longest) - len(plan.job.name))} characters",
        )
    # the JobSet makes the headless Service <job>
    yield from k8s.name_clash_findings(plan.job.name, ("Service",), "trainjob")
    if plan.elastic:
        yield Finding(
            code="MDC481",
            pointer="/distributed/min_nnodes",
            message=f"a TrainJob runs a fixed trainer.numNodes = {plan.nnodes}; "
            f"min_nnodes = {plan.min_nnodes} (elastic) is not supported",
            hint="remove min_nnodes, or use the pytorchjob backend (elasticPolicy)",
        )
    if len(plan.roles) != 1:
        yield Finding(
            code="MDC482",
            pointer="/distributed/launcher",
            message=f"a TrainJob runs one trainer command on every node; launcher "
            f"{plan.launcher} has {len(plan.roles)} roles "
            f"({', '.join(r.name for r in plan.roles)})",
            hint="use the kubernetes or leaderworkerset backend",
        )
    for key, field in (
        ("image_pull_policy", "imagePullPolicy"),
        ("priority_class", "priorityClassName"),
        ("scheduler_name", "schedulerName"),
        ("host_network", "hostNetwork"),
        ("gang", "a PodGroup (the runtime's podGroupPolicy)"),
        ("gpu_sharing", "schedulerName: volcano, which Volcano's vGPUs need"),
    ):
        value = getattr(opts, key)
        if value not in (None, False) and (key != "gpu_sharing" or value == "volcano-vgpu"):
            yield Finding(
                code="MDC483",
                pointer=f"/trainjob/{key}",
                message=f"a TrainJob cannot set {field}: neither trainer nor "
                "runtimePatches (v1alpha1) has that field",
                hint=f"remove {key} and set {field} in the {opts.runtime_kind} {opts.runtime!r}",
            )


@mdc.hookimpl
def mdc_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            name="trainjob",
            emit=emit,
            check=check,
            launchers=LAUNCHERS,
            run_command="kubectl apply -f {out}/trainjob/job.yaml",
            fixed_port=True,  # the manifests carry the master port
            schema=k8s.backend_schema("trainjob"),
            options_type=TrainJobOptions,
            description="Kubeflow Trainer v2 TrainJob on a (Cluster)TrainingRuntime "
            "(default torch-distributed): numNodes, numProcPerNode, resources",
        )
    ]
