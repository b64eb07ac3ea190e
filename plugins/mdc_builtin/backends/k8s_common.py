"""Pieces shared by the Kubernetes backends (kubernetes, leaderworkerset, pytorchjob, trainjob).

Plain functions over dicts. Every backend ships the compiled tree's launch files
in one ConfigMap mounted read-only at :data:`MOUNT` (``/mdc``), so
``/mdc/launch/<role>.sh`` runs unchanged (launch scripts find ``$MDC_OUT`` from
their own path), and starts ``bash /mdc/k8s/node.sh``: a small dispatcher that
takes ``NODE_RANK`` from the backend's index variable and runs the node's role.
YAML is written by :func:`dump_yaml`: fixed key order, block style, strings
that would read back as another type quoted.

Shared diagnostics (MDC460-469):

- MDC460 no ``[job] image`` (a pod needs one)
- MDC461 a name (given or derived) is not a DNS-1123 label
- MDC462 a label key or value, or a node selector entry, is not valid
- MDC463 a toleration is inconsistent (operator/value/effect)
- MDC464 a resource quantity is not a Kubernetes quantity
- MDC465 a volume is wrong (name, mount path clash, source)
- MDC466 the GPU request does not match the accelerator (warning)
- MDC467 the ConfigMap payload is over the 1 MiB limit
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from mdc.api import (
    Artifact,
    Finding,
    Plan,
    Severity,
    script_path,
    shell_word,
)

#: where the ConfigMap's files appear in every container
MOUNT = "/mdc"
#: the dispatcher every container runs
NODE_SCRIPT = "k8s/node.sh"
#: ConfigMap payload limit (etcd object size, ~1 MiB)
CONFIGMAP_LIMIT = 1024 * 1024
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
#: label value: empty or alphanumerics at both ends, [-_.] inside, <= 63
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
#: a Kubernetes resource quantity: a number with an optional binary/decimal suffix or exponent
QUANTITY = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?")
CONFIGMAP_KEY = re.compile(r"[-._a-zA-Z0-9]+")
GPU_RESOURCES = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


# ---------------------------------------------------------------- options


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


@attrs.frozen(kw_only=True)
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
    #: sizeLimit of the /dev/shm memory emptyDir (None: no limit)
    shm_size: str | None = None
    volumes: tuple[Volume, ...] = ()
    labels: Mapping[str, str] = attrs.field(factory=dict)


# ---------------------------------------------------------------- YAML
#
# A small block-style writer. Its layout is that of ruamel.yaml's round-trip dumper with
# indent(mapping=2, sequence=4, offset=2), which wrote these files before (the goldens pin
# those bytes); writing it directly costs a few percent of what ruamel's representer,
# serializer and emitter did, and no import of ruamel.

#: what only a double-quoted scalar holds: characters outside YAML's c-printable set (C0 and
#: C1 controls, tab and line feed included; DEL, surrogates, U+FFFE/U+FFFF), the line breaks
#: NEL, LS and PS, and the byte order mark
_OTHER = r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\ufeff\ufffe\uffff]"

#: a plain scalar that a YAML 1.1 reader (PyYAML; kubectl's go-yaml) or a YAML 1.2 reader
#: resolves to something other than a string: the 1.1 type repository's implicit bool, null,
#: int, float, timestamp, merge and value forms and the 1.2 core schema's (both allow "_"
#: in numbers here, as PyYAML and ruamel read them)
_IMPLICIT = re.compile(
    r"""
    ~ | null | Null | NULL
  | y | Y | yes | Yes | YES | n | N | no | No | NO | on | On | ON | off | Off | OFF  # 1.1
  | true | True | TRUE | false | False | FALSE
  | [-+]?0b[01_]+ | [-+]?0o?[0-7_]+ | [-+]?0x[0-9a-fA-F_]+       # 0b1, 017 (1.1), 0o17 (1.2), 0x1f
  | [-+]?[0-9][0-9_]* | [-+][0-9_]+                              # 12, 1_000
  | [-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+                           # base 60 (1.1): 12:30
  | [-+]?[0-9][0-9_]*(?::[0-5]?[0-9])*\.[0-9_]*(?:[eE][-+]?[0-9]+)?  # 1.5, 1.e3, 12:30.5
  | [-+]?[0-9][0-9_]*[eE][-+]?[0-9]+                             # 1e3 (1.2)
  | [-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?                           # .5, .5e3
  | [-+]?\.(?:inf|Inf|INF) | \.(?:nan|NaN|NAN)
  | [0-9]{4}-[0-9]{2}-[0-9]{2}                                   # timestamp: a date
  | [0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(?:[Tt]|[ \t]+)[0-9]{1,2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]*)?
    (?:[ \t]*(?:Z|[-+][0-9]{1,2}(?::[0-9]{2})?))?               # ... or a date and time
  | << | =                                                       # merge, value
""",
    re.VERBOSE,
)

#: what a plain scalar in block context cannot be: starting with an indicator or a document
#: marker, holding ": " or " #", ending in ":" or a space, starting with a space, or holding
#: a character that is not printable (line breaks and tabs included)
_NOT_PLAIN = re.compile(
    r"\A(?:[-?:](?:\ |\Z)|[#,\[\]{}&*!|>'\"%@`]|---|\.\.\.|\ )"
    r"|:\ |\ \#|[:\ ]\Z|" + _OTHER,
    re.VERBOSE,
)
#: what a single-quoted scalar on one line cannot hold
_NOT_SINGLE = re.compile("'|" + _OTHER)
#: what a double-quoted scalar writes as an escape
_ESCAPED = re.compile(r'["\\]|' + _OTHER)
_ESCAPES = {
    "\0": "0",
    "\a": "a",
    "\b": "b",
    "\t": "t",
    "\n": "n",
    "\v": "v",
    "\f": "f",
    "\r": "r",
    "\x1b": "e",
    '"': '"',
    "\\": "\\",
    "\x85": "N",
    "\u2028": "L",
    "\u2029": "P",
}
#: what a literal block cannot hold so as to read back exactly: a leading space or line break
#: (that would need an indentation indicator), a space ending a line, any other character
#: that is not printable
_NOT_LITERAL = re.compile(r"\A[\ \n]|\ \n|\ \Z|(?!\n)" + _OTHER, re.VERBOSE)
_BREAKS = re.compile("[\n\x85\u2028\u2029]")
#: ruamel writes keys this long (or holding a line break) as explicit "? key" entries (its
#: limit, 128, counted the 5 characters of a "!!str" tag it never wrote)
_LONG_KEY = 123


def _string(text: str) -> str:
    """``text`` as a plain scalar when every YAML reader reads that back as the same
    string, else single-quoted, else (a quote, a line break, a control) double-quoted."""
    if text and not _IMPLICIT.fullmatch(text) and not _NOT_PLAIN.search(text):
        return text
    if _NOT_SINGLE.search(text):
        return '"' + _ESCAPED.sub(_escape_char, text) + '"'
    return f"'{text}'"


def _escape_char(match: re.Match[str]) -> str:
    char = match.group()
    if char in _ESCAPES:
        return "\\" + _ESCAPES[char]
    code = ord(char)
    return (
        f"\\x{code:02X}"
        if code <= 0xFF
        else f"\\u{code:04X}"
        if code <= 0xFFFF
        else f"\\U{code:08X}"
    )


def _literal_safe(text: str) -> bool:
    """A multi-line string reads back exactly from a literal block (``|``, ``|-``, ``|+``)."""
    return "\n" in text and not _NOT_LITERAL.search(text)


def _scalar(value: Any) -> str:
    """A one-line scalar (or an empty ``{}``/``[]``); None is the empty plain scalar."""
    if isinstance(value, str):
        return _string(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Mapping):
        return "{}"
    if isinstance(value, (list, tuple)):
        return "[]"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as YAML")


def _items(mapping: Mapping[Any, Any]) -> Iterable[tuple[str, Any]]:
    """Entries with string keys (other keys as ``str(key)``, the last value winning)."""
    if all(type(key) is str for key in mapping):
        return mapping.items()
    return {str(key): value for key, value in mapping.items()}.items()


class _Writer:
    """Lines of block YAML. Each node is written after ``head``, the text already on its
    first line ("---", "key:", the ":" of an explicit "? key", "  -" of a sequence item); a
    collection continues an ``inline`` head as ruamel does ("  - key: v", "  -   - item")."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        #: len(lines) after a ``|+`` block: a stream ending with it ends with "..." too
        self.keep_end = -1

    def text(self) -> str:
        if self.keep_end == len(self.lines):
            self.lines.append("...")
        return "\n".join(self.lines) + "\n"

    def node(self, value: Any, head: str, indent: int, seq_indent: int, inline: bool) -> None:
        """``indent``: of a mapping's keys and of a literal block's lines; ``seq_indent``: of
        a sequence's items (a sequence under a key is not indented further)."""
        if isinstance(value, Mapping) and value:
            self.mapping(value, head, indent, inline)
        elif isinstance(value, (list, tuple)) and value:
            self.sequence(value, head, seq_indent, inline)
        elif isinstance(value, str) and _literal_safe(value):
            self.literal(value, head, indent)
        else:
            text = _scalar(value)
            self.lines.append(f"{head} {text}" if text else head)

    def mapping(self, mapping: Mapping[Any, Any], head: str, indent: int, inline: bool) -> None:
        if not inline:
            self.lines.append(head)
            head = ""
        pad = " " * indent
        for key, value in _items(mapping):
            line = head.ljust(indent) if head else pad
            head = ""
            if len(key) < _LONG_KEY and not _BREAKS.search(key):
                self.node(value, f"{line}{_string(key)}:", indent + 2, indent, False)
            else:
                self.lines.append(f"{line}? {_string(key)}")
                self.node(value, pad + ":", indent + 2, indent + 2, True)

    def sequence(self, items: Sequence[Any], head: str, indent: int, inline: bool) -> None:
        if not inline:
            self.lines.append(head)
            head = ""
        pad = " " * indent
        for item in items:
            line = (head.ljust(indent) if head else pad) + "  -"
            head = ""
            if item is None:
                self.lines.append(line + " ")  # ruamel pads even an empty item to its column
            else:
                self.node(item, line, indent + 4, indent + 4, True)

    def literal(self, text: str, head: str, indent: int) -> None:
        chomp = "+" if text.endswith("\n\n") else "" if text.endswith("\n") else "-"
        self.lines.append(f"{head} |{chomp}")
        pad = " " * indent
        lines = text.removesuffix("\n").split("\n")
        self.lines.extend(pad + line if line else "" for line in lines)
        if chomp == "+":
            self.keep_end = len(self.lines)


def dump_yaml(docs: Sequence[Mapping[str, Any]]) -> str:
    """Documents as one multi-document YAML text, deterministic, every value reading back as given.

    Keys keep the insertion order of the dicts (build them apiVersion, kind,
    metadata, spec); strings that look like numbers, booleans or null are quoted.
    """
    writer = _Writer()
    for doc in docs:
        writer.node(doc, "---", 0, 0, False)
    return writer.text()


def load_yaml(text: str) -> list[Any]:
    """Parse back what :func:`dump_yaml` wrote (plain Python values)."""
    from ruamel.yaml import YAML  # only tests and rehearsals read YAML back

    yaml = YAML(typ="safe", pure=True)
    return [doc for doc in yaml.load_all(text) if doc is not None]


# ---------------------------------------------------------------- names


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


def pod_findings(plan: Plan, opts: PodOptions, table: str) -> Iterator[Finding]:
    """Every shared check of the pod options in ``[table]`` (MDC460, MDC462-466)."""
    if not plan.job.image:
        yield Finding(
            code="MDC460",
            pointer="/job/image",
            message=f"the {table} backend runs the job in pods, which need an image, "
            "but [job] image is not set",
            hint='set [job] image (for example "nvcr.io/nvidia/pytorch:25.01-py3")',
        )
    if opts.namespace is not None:
        yield from dns_label_findings(opts.namespace, f"/{table}/namespace", "namespace")
    for key, value in (
        ("service_account", opts.service_account),
        ("priority_class", opts.priority_class),
    ):
        if value is not None and (len(value) > 253 or not DNS_SUBDOMAIN.fullmatch(value)):
            yield Finding(
                code="MDC461",
                pointer=f"/{table}/{key}",
                message=f"[{table}] {key} {value!r} is not a valid Kubernetes name",
                hint="use lowercase letters, digits, '-' and '.'",
            )
    for index, secret in enumerate(opts.image_pull_secrets):
        if len(secret) > 253 or not DNS_SUBDOMAIN.fullmatch(secret):
            yield Finding(
                code="MDC461",
                pointer=f"/{table}/image_pull_secrets/{index}",
                message=f"image pull secret {secret!r} is not a valid Kubernetes name",
                hint="use lowercase letters, digits, '-' and '.'",
            )
    yield from label_findings(
        opts.node_selector, f"/{table}/node_selector", f"[{table}] node_selector"
    )
    yield from label_findings(opts.labels, f"/{table}/labels", f"[{table}] labels")
    yield from _toleration_findings(opts.tolerations, table)
    for key in ("cpu", "memory", "shm_size", "gpus_per_node"):
        value = getattr(opts, key)
        if value is not None and not QUANTITY.fullmatch(str(value)):
            yield Finding(
                code="MDC464",
                pointer=f"/{table}/{key}",
                message=f"[{table}] {key} {str(value)!r} is not a Kubernetes quantity",
                hint='write a number with an optional suffix: "64Gi", "500m", 8',
            )
    if opts.gpu_resource is not None:
        prefix, _, name = opts.gpu_resource.rpartition("/")
        if not prefix or not DNS_SUBDOMAIN.fullmatch(prefix) or not LABEL_NAME.fullmatch(name):
            yield Finding(
                code="MDC464",
                pointer=f"/{table}/gpu_resource",
                message=f"[{table}] gpu_resource {opts.gpu_resource!r} is not an "
                "extended resource name (DOMAIN/NAME)",
                hint='for example "nvidia.com/gpu" or "amd.com/gpu"',
            )
    yield from _volume_findings(opts.volumes, table)
    count = gpu_count(plan, opts)
    if plan.accelerator == "cpu" and count is not None and opts.gpu_resource is None:
        yield Finding(
            code="MDC466",
            pointer=f"/{table}/gpus_per_node",
            severity=Severity.WARNING,
            message=f"[{table}] gpus_per_node = {count} on a cpu job, which has no GPU "
            "resource name",
            hint='set gpu_resource (for example "nvidia.com/gpu"), or remove gpus_per_node',
        )
    elif (
        plan.accelerator != "cpu"
        and count is not None
        and opts.gpu_resource is None
        and str(count).isdigit()
        and int(str(count)) < plan.nproc_per_node
    ):
        yield Finding(
            code="MDC466",
            pointer=f"/{table}/gpus_per_node",
            severity=Severity.WARNING,
            message=f"each pod asks for {count} GPU(s) but runs {plan.nproc_per_node} "
            "process(es): some processes share a GPU",
            hint=f"set gpus_per_node = {plan.nproc_per_node}, or lower nproc_per_node",
        )


def _toleration_findings(tolerations: Sequence[Toleration], table: str) -> Iterator[Finding]:
    for index, tol in enumerate(tolerations):
        pointer = f"/{table}/tolerations/{index}"
        if tol.operator == "Exists" and tol.value:
            yield Finding(
                code="MDC463",
                pointer=f"{pointer}/value",
                message=f"toleration {index} has operator Exists and value "
                f"{tol.value!r}; Kubernetes rejects a value with Exists",
                hint='remove value, or use operator = "Equal"',
            )
        if not tol.key and tol.operator != "Exists":
            yield Finding(
                code="MDC463",
                pointer=pointer,
                message=f"toleration {index} has no key, which needs operator Exists",
                hint='set key, or operator = "Exists" to tolerate every taint',
            )
        if tol.toleration_seconds is not None and tol.effect != "NoExecute":
            yield Finding(
                code="MDC463",
                pointer=f"{pointer}/toleration_seconds",
                message=f"toleration {index} sets toleration_seconds with effect "
                f"{tol.effect!r}; it applies only to NoExecute",
                hint='set effect = "NoExecute", or remove toleration_seconds',
            )
        if tol.key is not None:
            prefix, _, name = tol.key.rpartition("/")
            if not LABEL_NAME.fullmatch(name) or (prefix and not DNS_SUBDOMAIN.fullmatch(prefix)):
                yield Finding(
                    code="MDC463",
                    pointer=f"{pointer}/key",
                    message=f"toleration {index} key {tol.key!r} is not a taint key",
                    hint='write a label key, as "nvidia.com/gpu"',
                )


def _volume_findings(volumes: Sequence[Volume], table: str) -> Iterator[Finding]:
    seen_names: set[str] = set()
    seen_paths: set[str] = set()
    for index, vol in enumerate(volumes):
        pointer = f"/{table}/volumes/{index}"
        yield from dns_label_findings(vol.name, f"{pointer}/name", "volume name")
        if vol.name in ("mdc", "dshm") or vol.name in seen_names:
            yield Finding(
                code="MDC465",
                pointer=f"{pointer}/name",
                message=f"volume name {vol.name!r} is used twice (mdc names its own "
                'volumes "mdc" and "dshm")',
                hint="give every volume its own name",
            )
        seen_names.add(vol.name)
        path = vol.mount_path.rstrip("/") or "/"
        if (
            not path.startswith("/")
            or path in ("/", MOUNT, "/dev/shm")
            or path.startswith(MOUNT + "/")
            or path in seen_paths
        ):
            yield Finding(
                code="MDC465",
                pointer=f"{pointer}/mount_path",
                message=f"volume {vol.name!r} mount_path {vol.mount_path!r} is not an "
                f"absolute path of its own (/, {MOUNT}, /dev/shm and paths "
                "used twice are taken)",
                hint='mount it at its own absolute path, as "/checkpoints"',
            )
        seen_paths.add(path)
        if (vol.claim is None) == (vol.host_path is None):
            yield Finding(
                code="MDC465",
                pointer=pointer,
                message=f"volume {vol.name!r} needs exactly one of claim and host_path",
                hint='claim = "<pvc name>" for a PersistentVolumeClaim, or '
                'host_path = "/mnt/data" for a node directory',
            )
        elif vol.host_path is not None and not vol.host_path.startswith("/"):
            yield Finding(
                code="MDC465",
                pointer=f"{pointer}/host_path",
                message=f"volume {vol.name!r} host_path {vol.host_path!r} is not absolute",
                hint='write an absolute path, as "/mnt/data"',
            )
        elif vol.claim is not None and (
            len(vol.claim) > 253 or not DNS_SUBDOMAIN.fullmatch(vol.claim)
        ):
            yield Finding(
                code="MDC465",
                pointer=f"{pointer}/claim",
                message=f"volume {vol.name!r} claim {vol.claim!r} is not a valid "
                "PersistentVolumeClaim name",
                hint="use lowercase letters, digits, '-' and '.'",
            )


# ---------------------------------------------------------------- files


def config_key(path: str) -> str:
    """The ConfigMap key of a tree path: ``/`` becomes ``--`` (keys allow ``[-._a-zA-Z0-9]``)."""
    key = path.replace("/", "--")
    if not CONFIGMAP_KEY.fullmatch(key):
        raise ValueError(f"{path!r} cannot be a ConfigMap key")
    return key


def configmap_name(job: str) -> str:
    """``<job>-mdc``."""
    return f"{job}-mdc"


def configmap(
    plan: Plan, files: Iterable[Artifact], *, namespace: str | None, labels: Mapping[str, str]
) -> dict[str, Any]:
    """A ConfigMap ``<job>-mdc`` holding ``files`` (one key per path, see :func:`config_key`)."""
    data: dict[str, str] = {}
    for artifact in sorted(files, key=lambda a: a.path):
        key = config_key(artifact.path)
        if key in data:
            raise ValueError(f"two files map to ConfigMap key {key!r}")
        data[key] = artifact.data.decode("utf-8")
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(configmap_name(plan.job.name), namespace, labels),
        "data": data,
    }


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


def configmap_findings(files: Iterable[Artifact], table: str) -> list[Finding]:
    """MDC467 when the files exceed what one ConfigMap can hold."""
    size = sum(len(a.data) + len(config_key(a.path)) for a in files)
    if size <= CONFIGMAP_LIMIT:
        return []
    return [
        Finding(
            code="MDC467",
            pointer=f"/{table}",
            message=f"the launch files take {size} bytes; a ConfigMap holds at most "
            f"{CONFIGMAP_LIMIT} bytes",
            hint="ship large files in the image or a volume instead",
        )
    ]


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


@attrs.frozen(kw_only=True)
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


# ---------------------------------------------------------------- pod pieces


def gpu_count(plan: Plan, opts: PodOptions) -> int | str | None:
    """The accelerator quantity per pod: the table's, else nproc_per_node on GPU jobs."""
    if opts.gpus_per_node is not None:
        return None if str(opts.gpus_per_node) == "0" else opts.gpus_per_node
    return None if plan.accelerator == "cpu" else plan.nproc_per_node


def resources(plan: Plan, opts: PodOptions) -> dict[str, Any]:
    """Container ``resources``: the GPU (by accelerator or ``gpu_resource``), cpu, memory;
    requests equal limits (extended resources must)."""
    amounts: dict[str, int | str] = {}
    if opts.cpu is not None:
        amounts["cpu"] = opts.cpu
    if opts.memory is not None:
        amounts["memory"] = opts.memory
    count = gpu_count(plan, opts)
    name = opts.gpu_resource or GPU_RESOURCES.get(plan.accelerator)
    if count is not None and name is not None:
        amounts[name] = count
    if not amounts:
        return {}
    ordered = dict(sorted(amounts.items()))
    return {"limits": ordered, "requests": dict(ordered)}


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
    if env:
        spec["env"] = env_list(env)
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


def pod_dns(pod: str, service: str, namespace: str | None) -> str:
    """``<pod>.<service>`` (resolves inside the namespace), fully qualified when the
    namespace is known at compile time."""
    return f"{pod}.{service}.{namespace}.svc.cluster.local" if namespace else f"{pod}.{service}"


def pod_options_schema() -> dict[str, Any]:
    """The JSON Schema ``properties`` of :class:`PodOptions` (from kubernetes.v1.schema.json),
    for other Kubernetes backends' schemas to merge."""
    from mdc.api import read_schema

    full = read_schema("mdc_schemas", "plugins/kubernetes.v1.schema.json")
    names = {f.name for f in attrs.fields(PodOptions)}
    props: dict[str, Any] = {k: v for k, v in full["properties"].items() if k in names}
    return props
