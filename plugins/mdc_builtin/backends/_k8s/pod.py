"""Building the pieces of a node's pod: the ConfigMap of launch files, the node dispatcher
script, the container, its resources and volumes, the pod spec, the headless Service."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mdc.api import LAUNCH_ID, Artifact, Plan
from mdc.api.files import script_path
from mdc.api.shell import shell_word

from .apply import report_size
from .names import configmap_name, metadata
from .options import GPU_RESOURCES, MOUNT, PodOptions, gpu_count

#: the dispatcher every container runs
NODE_SCRIPT = "k8s/node.sh"
CONFIGMAP_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def config_key(path: str) -> str:
    """The ConfigMap key of a tree path: ``/`` becomes ``--`` (keys allow ``[-._a-zA-Z0-9]``)."""
    key = path.replace("/", "--")
    if not CONFIGMAP_KEY.fullmatch(key):
        raise ValueError(f"{path!r} cannot be a ConfigMap key")
    return key


def configmap(
    plan: Plan, files: Iterable[Artifact], *, namespace: str | None, labels: Mapping[str, str]
) -> dict[str, Any]:
    """A ConfigMap ``<job>-mdc`` holding ``files`` (one key per path, see :func:`config_key`);
    reports (mdc.api.report) a ConfigMap the apiserver or kubectl apply would not store."""
    data: dict[str, str] = {}
    for artifact in sorted(files, key=lambda a: a.path):
        key = config_key(artifact.path)
        if key in data:
            raise ValueError(f"two files map to ConfigMap key {key!r}")
        data[key] = artifact.data.decode("utf-8")
    doc = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(configmap_name(plan.job.name), namespace, labels),
        "data": data,
    }
    report_size(doc, f"job {plan.job.name!r}")
    return doc


def configmap_volume(plan: Plan, files: Iterable[Artifact]) -> dict[str, Any]:
    """The pod volume ``mdc`` that lays the ConfigMap's keys out as the tree (scripts 0755)."""
    items = [
        {"key": config_key(a.path), "path": a.path, "mode": 0o755 if a.executable else 0o644}
        for a in sorted(files, key=lambda a: a.path)
    ]
    return {
        "name": "mdc",
        "configMap": {"name": configmap_name(plan.job.name), "defaultMode": 0o644, "items": items},
    }


def node_script(plan: Plan, rank_lines: Sequence[str], what: str) -> Artifact:
    """``k8s/node.sh``: ``rank_lines`` set and export NODE_RANK (and anything else the backend
    computes at run time), then the node's role script runs (roles are node ranges)."""
    lines = [
        "#!/usr/bin/env bash",
        f"# One pod per node of job {plan.job.name!r} ({what}): sets NODE_RANK and NODE_HOSTS,",
        "# then runs the node's role, launch/<role>.sh. MASTER_ADDR and MASTER_PORT come from",
        "# the pod.",
        "set -euo pipefail",
        *rank_lines,
        'if [[ -z "${NODE_RANK:-}" || -z "${MASTER_ADDR:-}" || -z "${MASTER_PORT:-}" ]]; then',
        '  echo "mdc: NODE_RANK, MASTER_ADDR and MASTER_PORT must be set in the pod" >&2',
        "  exit 2",
        "fi",
        'out="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"',
    ]
    if len(plan.roles) == 1:
        lines.append(f"script={shell_word(script_path(plan.roles[0].name))}")
    else:
        for index, role in enumerate(plan.roles):
            assign = f"script={shell_word(script_path(role.name))}"
            if index == len(plan.roles) - 1:
                lines.append(f"else {assign}")
            else:
                keyword = "if" if index == 0 else "elif"
                lines.append(
                    f"{keyword} ((NODE_RANK < {role.first_node + role.count})); then {assign}"
                )
        lines.append("fi")
    lines.append('exec bash "$out/$script"')
    return Artifact.text(NODE_SCRIPT, "\n".join(lines), executable=True)


def resources(plan: Plan, opts: PodOptions) -> dict[str, Any]:
    """Container ``resources``: the GPU (by accelerator or ``gpu_resource``) in limits and
    requests (an extended resource's must be equal); cpu and memory as requests only, or with
    equal limits too when ``qos`` is "guaranteed"."""
    requests: dict[str, int | str] = {}
    if opts.cpu is not None:
        requests["cpu"] = opts.cpu
    if opts.memory is not None:
        requests["memory"] = opts.memory
    limits: dict[str, int | str] = dict(requests) if opts.qos == "guaranteed" else {}
    count = gpu_count(plan, opts)
    name = opts.gpu_resource or GPU_RESOURCES.get(plan.accelerator)
    if count is not None and name is not None:
        requests[name] = limits[name] = count
    out: dict[str, Any] = {}
    if limits:
        out["limits"] = dict(sorted(limits.items()))
    if requests:
        out["requests"] = dict(sorted(requests.items()))
    return out


def env_list(env: Mapping[str, str | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Container ``env`` from name -> literal value or ``valueFrom`` dict, in the given order."""
    out: list[dict[str, Any]] = []
    for name, value in env.items():
        if isinstance(value, str):
            out.append({"name": name, "value": value})
        else:
            out.append({"name": name, "valueFrom": dict(value)})
    return out


def field_ref(path: str) -> dict[str, Any]:
    """A downward-API ``valueFrom`` (e.g. ``metadata.labels['x']``)."""
    return {"fieldRef": {"fieldPath": path}}


def launch_id_env(plan: Plan) -> dict[str, str | Mapping[str, Any]]:
    """``MDC_LAUNCH_ID`` = ``<namespace>/<object name>``: the apiserver holds one object of a
    name per namespace at a time, so concurrent launches never share it (the namespace from
    the downward API, expanded by the kubelet as ``$(MDC_NAMESPACE)``)."""
    return {
        "MDC_NAMESPACE": field_ref("metadata.namespace"),
        LAUNCH_ID.name: f"$(MDC_NAMESPACE)/{plan.job.name}",
    }


def container(
    plan: Plan,
    opts: PodOptions,
    *,
    name: str,
    env: Mapping[str, str | Mapping[str, Any]],
    ports: Sequence[int] = (),
) -> dict[str, Any]:
    """The one container of a node's pod: image, ``bash /mdc/k8s/node.sh``, env, resources,
    mounts (tree read-only at /mdc, /dev/shm, the table's volumes)."""
    spec: dict[str, Any] = {"name": name, "image": plan.job.image or ""}
    if opts.image_pull_policy is not None:
        spec["imagePullPolicy"] = opts.image_pull_policy
    spec["command"] = ["bash", f"{MOUNT}/{NODE_SCRIPT}"]
    spec["env"] = env_list({**env, **launch_id_env(plan)})
    if ports:
        spec["ports"] = [{"containerPort": port, "protocol": "TCP"} for port in sorted(set(ports))]
    res = resources(plan, opts)
    if res:
        spec["resources"] = res
    mounts: list[dict[str, Any]] = [
        {"name": "mdc", "mountPath": MOUNT, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    for vol in opts.volumes:
        mount: dict[str, Any] = {"name": vol.name, "mountPath": vol.mount_path}
        if vol.read_only:
            mount["readOnly"] = True
        mounts.append(mount)
    spec["volumeMounts"] = mounts
    return spec


def volumes(plan: Plan, opts: PodOptions, files: Iterable[Artifact]) -> list[dict[str, Any]]:
    """Pod ``volumes``: the ConfigMap tree, /dev/shm as a memory emptyDir, the table's volumes."""
    shm: dict[str, Any] = {"medium": "Memory"}
    if opts.shm_size is not None:
        shm["sizeLimit"] = opts.shm_size
    out = [configmap_volume(plan, files), {"name": "dshm", "emptyDir": shm}]
    for vol in opts.volumes:
        if vol.claim is not None:
            source: dict[str, Any] = {"claimName": vol.claim}
            if vol.read_only:
                source["readOnly"] = True
            out.append({"name": vol.name, "persistentVolumeClaim": source})
        else:
            out.append(
                {"name": vol.name, "hostPath": {"path": vol.host_path or "", "type": "Directory"}}
            )
    return out


def tolerations(opts: PodOptions) -> list[dict[str, Any]]:
    """Pod ``tolerations`` in the API's camelCase."""
    out = []
    for tol in opts.tolerations:
        entry: dict[str, Any] = {}
        for key, value in (
            ("key", tol.key),
            ("operator", tol.operator),
            ("value", tol.value),
            ("effect", tol.effect),
            ("tolerationSeconds", tol.toleration_seconds),
        ):
            if value is not None:
                entry[key] = value
        out.append(entry)
    return out


def pod_spec(
    plan: Plan,
    opts: PodOptions,
    *,
    containers: Sequence[Mapping[str, Any]],
    files: Iterable[Artifact],
    restart_policy: str | None = "Never",
    subdomain: str | None = None,
) -> dict[str, Any]:
    """A pod spec: containers, restartPolicy, subdomain, service account, priority class,
    node selector, tolerations, pull secrets and :func:`volumes`."""
    spec: dict[str, Any] = {}
    if restart_policy is not None:
        spec["restartPolicy"] = restart_policy
    if subdomain is not None:
        spec["subdomain"] = subdomain
    if opts.service_account is not None:
        spec["serviceAccountName"] = opts.service_account
    if opts.priority_class is not None:
        spec["priorityClassName"] = opts.priority_class
    if opts.host_ipc:
        spec["hostIPC"] = True
    if opts.node_selector:
        spec["nodeSelector"] = dict(sorted(opts.node_selector.items()))
    if opts.tolerations:
        spec["tolerations"] = tolerations(opts)
    if opts.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in opts.image_pull_secrets]
    spec["containers"] = [dict(c) for c in containers]
    spec["volumes"] = volumes(plan, opts, files)
    return spec


def headless_service(
    name: str,
    namespace: str | None,
    labels: Mapping[str, str],
    selector: Mapping[str, str],
    ports: Sequence[int],
) -> dict[str, Any]:
    """A headless Service (clusterIP None, publishNotReadyAddresses) giving pods DNS names."""
    spec: dict[str, Any] = {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": dict(sorted(selector.items())),
    }
    if ports:
        spec["ports"] = [
            {"name": f"p{port}", "port": port, "protocol": "TCP", "targetPort": port}
            for port in sorted(set(ports))
        ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(name, namespace, labels),
        "spec": spec,
    }
