"""Rendering each launcher role as ``launch/<role>.sh``, the same for every backend."""

from __future__ import annotations

from collections.abc import Mapping

from mdc.api import OUT_DIR, RUNTIME_VARIABLES, Artifact, Launch, Role, Word
from mdc.api.files import script_path
from mdc.api.shell import refs_in, shell_join, shell_word
from mdc.plan.model import Plan
from mdc.spec import EnvValue

#: the variables a launch script may rely on: the backend sets them before it runs
SET_BY_MDC = (*RUNTIME_VARIABLES, OUT_DIR.name)


def export_line(name: str, value: Word | EnvValue) -> str:
    """``export NAME=...``: a word quoted, an :class:`EnvValue` expanded at run time."""
    if not isinstance(value, EnvValue):
        return f"export {name}={shell_word(value)}"
    if value.ref is not None:  # a name (schema pattern), safe inside double quotes
        fallback = "" if value.ref in SET_BY_MDC else ":-"
        return f'export {name}="${{{value.ref}{fallback}}}"'
    own = f"${{{name}}}"  # the separator is one of : ; , and space (schema enum)
    if value.prepend is not None:
        return f'export {name}={shell_word(value.prepend)}"${{{name}:+{value.separator}{own}}}"'
    return f'export {name}="${{{name}:+{own}{value.separator}}}"{shell_word(value.append or "")}'


def render_role(plan: Plan, role: Role, env: Mapping[str, Word | EnvValue]) -> Artifact:
    nodes = plan.role_of_name(role.name).nodes
    span = f"node {nodes[0]}" if len(nodes) == 1 else f"nodes {nodes[0]}-{nodes[-1]}"
    lines = [
        "#!/usr/bin/env bash",
        f"# Role {role.name!r} of job {plan.job.name!r} ({span}), launcher {plan.launcher}.",
        "# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT, NODE_HOSTS",
        "# and MDC_LAUNCH_ID set.",
        "set -euo pipefail",
    ]
    words = [v for v in env.values() if not isinstance(v, EnvValue)]
    refs = [v.ref for v in env.values() if isinstance(v, EnvValue) and v.ref in SET_BY_MDC]
    for name in dict.fromkeys([*refs_in([*role.argv, *words]), *refs]):
        if name == OUT_DIR.name:  # launcher files are found beside this script
            lines += [
                f'{name}="$(cd "$(dirname "${{BASH_SOURCE[0]}}")/.." && pwd)"',
                f"export {name}",
            ]
        else:
            lines.append(f': "${{{name}:?{name} must be set by the backend}}"')
    lines += [export_line(name, value) for name, value in env.items()]
    if plan.job.workdir:
        lines.append(f"cd {shell_word(plan.job.workdir)}")
    lines.append(f"exec {shell_join(role.argv)}")
    return Artifact.text(script_path(role.name), "\n".join(lines), executable=True)


def render_launch(plan: Plan, launch: Launch) -> list[Artifact]:
    """One script per role; the launcher's env first, then the job's own ``[job] env``."""
    return [render_role(plan, role, {**role.env, **plan.job.env}) for role in launch.roles]
