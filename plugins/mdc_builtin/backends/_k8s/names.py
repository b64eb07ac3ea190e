"""Names of the objects the Kubernetes backends emit, and the checks the apiserver applies to
them (MDC461, MDC462)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from mdc.api import Finding, Plan
from mdc.api.shell import shell_word

from .options import PodOptions

#: RFC 1035 label: Service names (and what the CRDs that name Services require)
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
#: label value: empty or alphanumerics at both ends, [-_.] inside, <= 63
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def dns_label_findings(name: str, pointer: str, what: str) -> list[Finding]:
    """MDC461 when ``name`` (a given or derived object name) is not a DNS-1123 label (<= 63)."""
    if len(name) <= 63 and DNS_LABEL.fullmatch(name):
        return []
    why = (
        f"is {len(name)} characters long (the limit is 63)"
        if len(name) > 63
        else "holds characters other than lowercase letters, digits and '-', or does not "
        "start and end with a letter or digit"
    )
    return [
        Finding(
            code="MDC461",
            pointer=pointer,
            message=f"{what} {name!r} is not a valid Kubernetes name: it {why}",
            hint="use lowercase letters, digits and '-' (for example "
            f"{_suggest(name)!r}); mdc never renames, since the pods' DNS names "
            "are derived from it",
        )
    ]


def _suggest(name: str) -> str:
    text = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    return (text or "job")[:40].strip("-") or "job"


def label_findings(labels: Mapping[str, str], pointer: str, what: str) -> list[Finding]:
    """MDC462 for each label key (optional DNS-subdomain prefix + name) or value that is invalid."""
    found = []
    for key, value in sorted(labels.items()):
        prefix, _, name = key.rpartition("/")
        key_ok = (
            bool(LABEL_NAME.fullmatch(name))
            and len(name) <= 63
            and (not prefix or (len(prefix) <= 253 and bool(DNS_SUBDOMAIN.fullmatch(prefix))))
        )
        if not key_ok:
            found.append(
                Finding(
                    code="MDC462",
                    pointer=f"{pointer}/{_escape(key)}",
                    message=f"{what} key {key!r} is not a valid label key",
                    hint="write NAME or PREFIX/NAME: NAME up to 63 letters, digits, '-', '_', '.', "
                    "starting and ending with a letter or digit; PREFIX a DNS subdomain "
                    '("kubernetes.io/hostname")',
                )
            )
        if len(value) > 63 or not LABEL_VALUE.fullmatch(value):
            found.append(
                Finding(
                    code="MDC462",
                    pointer=f"{pointer}/{_escape(key)}",
                    message=f"{what} value {value!r} of {key!r} is not a valid label value "
                    f"({len(value)} characters)",
                    hint="up to 63 letters, digits, '-', '_', '.', starting and ending with a "
                    'letter or digit ("a100")',
                )
            )
    return found


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def configmap_name(job: str) -> str:
    """``<job>-mdc``."""
    return f"{job}-mdc"


def metadata(name: str, namespace: str | None, labels: Mapping[str, str]) -> dict[str, Any]:
    """``{name, namespace?, labels}``."""
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    if labels:
        meta["labels"] = dict(sorted(labels.items()))
    return meta


def job_labels(plan: Plan, opts: PodOptions) -> dict[str, str]:
    """The user's labels plus ``app.kubernetes.io/managed-by: mdc`` and ``mdc/job: <job>``."""
    return dict(
        sorted(
            {**opts.labels, "app.kubernetes.io/managed-by": "mdc", "mdc/job": plan.job.name}.items()
        )
    )


# only read, never compared or printed: no generated ==, hash or repr (start-up time)
@attrs.frozen(kw_only=True, eq=False, repr=False)
class NodeNames:
    """The pods' host names in node-rank order, as a rule rather than a list, so that no
    artifact grows with nnodes: the ``fixed`` names first, then ``<prefix><i><suffix>`` for
    i = first, first + 1, ... up to ``count`` names in all."""

    count: int
    prefix: str
    suffix: str = ""
    first: int = 0
    fixed: tuple[str, ...] = ()

    def name(self, node: int) -> str:
        if node < len(self.fixed):
            return self.fixed[node]
        return f"{self.prefix}{self.first + node - len(self.fixed)}{self.suffix}"

    def shell_lines(self) -> list[str]:
        """node.sh lines exporting NODE_HOSTS; one given by the environment (a rehearsal on
        loopback) is kept."""
        last = self.first + self.count - len(self.fixed)
        word = f'{shell_word(self.prefix)}"$i"{shell_word(self.suffix) if self.suffix else ""}'
        return [
            'if [[ -z "${NODE_HOSTS:-}" ]]; then',
            f"  node_hosts=({' '.join(shell_word(h) for h in self.fixed)})",
            f"  for ((i = {self.first}; i < {last}; i++)); do node_hosts+=({word}); done",
            '  export NODE_HOSTS="${node_hosts[*]}"',
            "fi",
        ]


def pod_dns(pod: str, service: str, namespace: str | None, domain: str) -> str:
    """``<pod>.<service>`` (resolves inside the namespace), fully qualified in the cluster
    domain ``domain`` when the namespace is known at compile time."""
    return f"{pod}.{service}.{namespace}.svc.{domain}" if namespace else f"{pod}.{service}"


def service_name_findings(name: str, pointer: str, what: str) -> list[Finding]:
    """MDC468 when a Service's name is not a DNS-1035 label, the apiserver's rule for Service
    names (ValidateServiceName): at most 63 characters, starting with a letter."""
    if len(name) <= 63 and DNS_1035.fullmatch(name):
        return []
    fixed = re.sub(r"^[^a-z]+", "", name) or "job"
    return [
        Finding(
            code="MDC468",
            pointer=pointer,
            message=f"{what} {name!r} is not a valid Service name: a Service name is a "
            "DNS-1035 label (lowercase letters, digits and '-', starting with a letter, "
            "ending with a letter or digit, at most 63 characters), and the apiserver "
            "refuses the Service",
            hint=f"start the job name with a letter (for example {fixed!r})",
        )
    ]


#: Services and Jobs that mdc's Kubernetes backends (or the operators they drive) name
#: <job><suffix>: a job whose own Service or Job is named like that would share its name with
#: another job's in the same namespace, and kubectl apply would overwrite one with the other
DERIVED_NAMES: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (
        re.compile(r"-leader"),
        "Service",
        "the leaderworkerset backend's leader Service <job>-leader",
    ),
    (
        re.compile(r"-master-[0-9]+"),
        "Service",
        "the per-pod Services <job>-master-<i> the training operator makes for a PyTorchJob",
    ),
    (
        re.compile(r"-worker-[0-9]+"),
        "Service",
        "the per-pod Services <job>-worker-<i> the training operator makes for a PyTorchJob",
    ),
    (
        re.compile(r"-node-[0-9]+"),
        "Job",
        "the Jobs <job>-node-<i> the JobSet of a TrainJob makes (replicated job node)",
    ),
)


def name_clash_findings(name: str, kinds: tuple[str, ...], backend: str) -> list[Finding]:
    """MDC469 when the ``kinds`` objects the backend names ``<job>`` could be the object
    another job's backend derives, as ``<other>-leader``."""
    for suffix, kind, whose in DERIVED_NAMES:
        match = re.search(f"{suffix.pattern}$", name)
        if kind in kinds and match and match.start() > 0:
            other = name[: match.start()]
            return [
                Finding(
                    code="MDC469",
                    pointer="/job/name",
                    message=f"the {backend} backend names its {kind} {name!r}, which is "
                    f"also {whose} for a job named {other!r}: the two jobs would share "
                    "one object in a namespace",
                    hint=f"rename the job so it does not end in {name[match.start() :]!r}",
                )
            ]
    return []
