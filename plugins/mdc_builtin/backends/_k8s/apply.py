"""How much of the ConfigMap of launch files the apiserver stores, and what ``kubectl apply``
adds to it (MDC467, MDC444).

The apiserver refuses a ConfigMap whose keys and values take more than 1 MiB
(``MaxSecretSize``, counted as key length plus value bytes). ``kubectl apply`` (client-side,
the command mdc prints) also writes the whole object as JSON into the annotation
``kubectl.kubernetes.io/last-applied-configuration``, and the apiserver holds an object's
annotations to 256 KiB in all (``TotalAnnotationSizeLimitB``, key plus value): above that,
``kubectl apply`` fails while ``kubectl apply --server-side`` and ``kubectl create`` store the
same object, so it is a warning, not a refusal.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from mdc.api import Finding, Severity, report

#: the most bytes of keys and values one ConfigMap may hold
CONFIGMAP_LIMIT = 1024 * 1024
#: the annotation kubectl apply writes, and the apiserver's limit on all annotations
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
ANNOTATIONS_LIMIT = 256 * 1024
#: what Go's encoding/json escapes beyond JSON's own escapes, and the bytes it adds to each
_GO_ESCAPES = {"<": 5, ">": 5, "&": 5, "\u2028": 3, "\u2029": 3}


def data_size(data: Mapping[str, str]) -> int:
    """The bytes the apiserver counts in a ConfigMap's data: each key's and value's."""
    return sum(len(key) + len(value.encode("utf-8")) for key, value in data.items())


def last_applied_size(doc: Mapping[str, Any]) -> int:
    """The bytes kubectl apply's last-applied annotation of ``doc`` takes, key and value: the
    object as Go's encoding/json writes it (keys sorted, no spaces, ``<`` ``>`` ``&`` U+2028
    U+2029 as ``\\uXXXX``) with a newline."""
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    escaped = sum(extra * text.count(char) for char, extra in _GO_ESCAPES.items())
    return len(LAST_APPLIED) + len(text.encode("utf-8")) + escaped + 1


def size_findings(doc: Mapping[str, Any], what: str) -> list[Finding]:
    """MDC467 when the apiserver refuses the ConfigMap ``doc``; MDC444 (a warning) when only
    kubectl apply's annotation of it is too large."""
    size = data_size(doc.get("data", {}))
    if size > CONFIGMAP_LIMIT:
        return [
            Finding(
                code="MDC467",
                pointer="/distributed/backend",
                message=f"the launch files take {size} bytes in the ConfigMap of {what}; "
                f"the apiserver refuses a ConfigMap of more than {CONFIGMAP_LIMIT} bytes",
                hint="ship large files in the image or a volume instead",
            )
        ]
    applied = last_applied_size(doc)
    if applied <= ANNOTATIONS_LIMIT:
        return []
    return [
        Finding(
            code="MDC444",
            pointer="/distributed/backend",
            severity=Severity.WARNING,
            message=f"the ConfigMap of {what} takes {applied} bytes as kubectl apply's "
            f"last-applied annotation, over the {ANNOTATIONS_LIMIT} bytes the apiserver "
            "holds in annotations: kubectl apply fails on it",
            hint="apply it with kubectl apply --server-side (or kubectl create), or ship "
            "large files in the image or a volume",
        )
    ]


def report_size(doc: Mapping[str, Any], what: str) -> None:
    """Report :func:`size_findings` to the command (mdc.api.report)."""
    for finding in size_findings(doc, what):
        report(finding)
