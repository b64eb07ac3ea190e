"""The [job] env pass: values a shell would expand, and the explicit forms."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from mdc.api import Finding, Severity
from mdc.errors import escape_pointer_token
from mdc.launch_scripts import SET_BY_MDC
from mdc.spec import EnvValue

#: what a shell would expand in a literal value: $NAME or ${NAME...}
REFERENCE = re.compile(r"\$(\{[A-Za-z_][A-Za-z0-9_]*[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def env_findings(env: Mapping[str, object]) -> Iterator[Finding]:
    """MDC254: a literal [job] env value that looks like a reference to a variable (it stays
    literal); MDC255: a ``ref`` to a variable mdc does not set; MDC256: an explicit form
    that is not exactly one of prepend, append and ref."""
    for name, value in sorted(env.items()):
        if isinstance(value, str):
            match = REFERENCE.search(value)
            if match is None:
                continue
            ref = match.group(1).strip("{}").split(":")[0].split("-")[0]
            own = ref == name
            yield Finding(
                code="MDC254",
                pointer=f"/job/env/{escape_pointer_token(name)}",
                severity=Severity.WARNING,
                message=f"{name} = {value!r} is passed literally: mdc quotes every value, so "
                f"{match.group(0)} is not expanded"
                + (f" and {name}'s own value is replaced" if own else ""),
                hint=(
                    f'to add to {name}\'s value write {name} = {{ prepend = "..." }} or '
                    '{ append = "..." }'
                    if own
                    else f'to take {ref}\'s value at run time write {name} = {{ ref = "{ref}" }}'
                )
                + "; to keep the text, ignore this",
            )
        elif (
            isinstance(value, EnvValue)
            and sum(v is not None for v in (value.prepend, value.append, value.ref)) != 1
        ):
            yield Finding(
                code="MDC256",
                pointer=f"/job/env/{escape_pointer_token(name)}",
                message=f"[job] env {name} needs exactly one of prepend, append and ref",
                hint=f'for example {name} = {{ prepend = "/opt/tool/bin" }}',
            )
        elif isinstance(value, EnvValue) and value.ref is not None and value.ref not in SET_BY_MDC:
            yield Finding(
                code="MDC255",
                pointer=f"/job/env/{escape_pointer_token(name)}/ref",
                severity=Severity.WARNING,
                message=f"{name} takes {value.ref}, which mdc does not set: it comes from "
                "the node's environment when the launch script runs (empty if unset)",
                hint=f"mdc sets {', '.join(SET_BY_MDC)}",
            )
