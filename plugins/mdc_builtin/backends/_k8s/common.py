"""Pieces shared by the Kubernetes backends (kubernetes, jobset, leaderworkerset, pytorchjob,
trainjob, kuberay).

Plain functions over dicts. Every backend ships the compiled tree's launch files
in one ConfigMap mounted read-only at :data:`MOUNT` (``/mdc``), so
``/mdc/launch/<role>.sh`` runs unchanged (launch scripts find ``$MDC_OUT`` from
their own path), and starts ``bash /mdc/k8s/node.sh``: a small dispatcher that
takes ``NODE_RANK`` from the backend's index variable and runs the node's role.
YAML is written by :func:`dump_yaml`: fixed key order, block style, strings
that would read back as another type quoted; backends return it as :func:`yaml_file`.

This module is what the backends import; the pieces live by concern in
:mod:`.options` (the shared table keys), :mod:`.names` (object names and
labels), :mod:`.checks` (the shared findings), :mod:`.pod` (building
pods, the ConfigMap and Services), :mod:`.cluster` and :mod:`.cluster_checks` (GPU
networks, queues, gangs, GPU sharing) and :mod:`.yaml` (the writer).

Shared diagnostics (MDC460-469, MDC442, MDC444, MDC472):

- MDC442 ``[job] image`` begins or ends with whitespace
- MDC460 no ``[job] image`` (a pod needs one)
- MDC461 a name (given or derived) is not a DNS-1123 label
- MDC462 a label key or value, or a node selector entry, is not valid
- MDC463 a toleration is inconsistent (operator/value/effect)
- MDC464 a resource quantity is not a Kubernetes quantity, or is negative, or
  ``gpu_resource`` is not a resource name the apiserver takes
- MDC465 a volume is wrong (name, mount path clash, source, a hostPath with '..')
- MDC466 the GPU request does not match the accelerator (warning)
- MDC467 the ConfigMap payload is over the 1 MiB limit (from the ConfigMap builder,
  through mdc.api.report; MDC444, a warning, when only kubectl apply's annotation is)
- MDC468 a Service name (the job's) is not a DNS-1035 label
- MDC469 an object name the backend derives is another job's derived name
- MDC472 a GPU quantity is not a whole number
- MDC450-454 the cluster keys (annotations, extended resources, networks, gangs, GPU
  sharing; see :mod:`.cluster_checks`)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from mdc.api import Artifact, Finding, Plan
from mdc.api.files import files_written

from . import checks
from .apply import (
    ANNOTATIONS_LIMIT,
    CONFIGMAP_LIMIT,
    LAST_APPLIED,
    last_applied_size,
    size_findings,
)
from .checks import (
    configmap_findings,
    extended_resource,
    mount_point,
    whole_quantity,
)
from .cluster import (
    QUEUE_LABEL,
    VOLCANO,
    cluster_container,
    object_labels,
    pod_annotations,
    pod_group,
    pod_template,
)
from .cluster_checks import cluster_findings
from .names import (
    DERIVED_NAMES,
    DNS_1035,
    DNS_LABEL,
    DNS_SUBDOMAIN,
    LABEL_NAME,
    LABEL_VALUE,
    NodeNames,
    configmap_name,
    dns_label_findings,
    job_labels,
    label_findings,
    metadata,
    name_clash_findings,
    pod_dns,
    service_name_findings,
)
from .options import (
    DEFAULT_CLUSTER_DOMAIN,
    DEFAULT_TTL_SECONDS,
    GPU_RESOURCES,
    MOUNT,
    PULL_POLICIES,
    TOLERATION_EFFECTS,
    PodOptions,
    Toleration,
    Volume,
    backend_schema,
    gpu_count,
    pod_options_schema,
    ttl,
)
from .pod import (
    CONFIGMAP_KEY,
    NODE_SCRIPT,
    config_key,
    configmap,
    configmap_volume,
    container,
    env_list,
    field_ref,
    headless_service,
    node_script,
    pod_spec,
    resources,
    tolerations,
    volumes,
)
from .quantity import parse_quantity
from .yaml import dump_yaml, load_yaml, plainly_writable


def pod_findings(plan: Plan, opts: PodOptions, table: str) -> Iterator[Finding]:
    """Every shared check of the pod keys of ``[table]``: the pod's (:mod:`.checks`) and
    the cluster's (:mod:`.cluster_checks`)."""
    yield from checks.pod_findings(plan, opts, table)
    yield from cluster_findings(plan, opts, table)


def yaml_file(path: str, docs: Sequence[Mapping[str, Any]]) -> Artifact:
    """The file ``path`` holding ``docs`` as YAML.

    A command that writes no files gets it without its text (``data`` empty) when the
    documents are :func:`plainly_writable`; any others are written, so that what the
    writer refuses is refused by every command.
    """
    if files_written() or not plainly_writable(docs):
        return Artifact.text(path, dump_yaml(docs))
    return Artifact(path=path, data=b"")


__all__ = [
    "ANNOTATIONS_LIMIT",
    "CONFIGMAP_KEY",
    "CONFIGMAP_LIMIT",
    "DEFAULT_CLUSTER_DOMAIN",
    "DEFAULT_TTL_SECONDS",
    "DERIVED_NAMES",
    "DNS_1035",
    "DNS_LABEL",
    "DNS_SUBDOMAIN",
    "LAST_APPLIED",
    "GPU_RESOURCES",
    "LABEL_NAME",
    "LABEL_VALUE",
    "MOUNT",
    "NODE_SCRIPT",
    "NodeNames",
    "PULL_POLICIES",
    "QUEUE_LABEL",
    "VOLCANO",
    "PodOptions",
    "TOLERATION_EFFECTS",
    "Toleration",
    "Volume",
    "cluster_container",
    "config_key",
    "configmap",
    "configmap_findings",
    "configmap_name",
    "configmap_volume",
    "container",
    "dns_label_findings",
    "dump_yaml",
    "env_list",
    "extended_resource",
    "field_ref",
    "gpu_count",
    "headless_service",
    "job_labels",
    "label_findings",
    "last_applied_size",
    "load_yaml",
    "metadata",
    "mount_point",
    "name_clash_findings",
    "node_script",
    "object_labels",
    "pod_group",
    "pod_template",
    "parse_quantity",
    "pod_dns",
    "pod_annotations",
    "pod_findings",
    "pod_options_schema",
    "backend_schema",
    "plainly_writable",
    "pod_spec",
    "resources",
    "service_name_findings",
    "size_findings",
    "tolerations",
    "ttl",
    "volumes",
    "whole_quantity",
    "yaml_file",
]
