"""Rendering each launcher role as ``launch/<role>.sh``, the same for every backend."""

from __future__ import annotations

from collections.abc import Mapping

from mdc.api import (
    OUT_DIR,
    Artifact,
    Launch,
    Role,
    Word,
    refs_in,
    script_path,
    shell_join,
    shell_word,
)
from mdc.plan.model import Plan


def render_role(plan: Plan, role: Role, env: Mapping[str, Word]) -> Artifact:
    nodes = plan.role_of_name(role.name).nodes
    span = f"node {nodes[0]}" if len(nodes) == 1 else f"nodes {nodes[0]}-{nodes[-1]}"
    lines = [
        "#!/usr/bin/env bash",
        f"# Role {role.name!r} of job {plan.job.name!r} ({span}), launcher {plan.launcher}.",
        "# The backend runs this once per node with NODE_RANK, MASTER_ADDR, MASTER_PORT and NODE_HOSTS set.",
        "set -euo pipefail",
    ]
    for name in refs_in([*role.argv, *env.values()]):
        if name == OUT_DIR.name:  # launcher files are found beside this script
            lines += [
                f'{name}="$(cd "$(dirname "${{BASH_SOURCE[0]}}")/.." && pwd)"',
                f"export {name}",
            ]
        else:
            lines.append(f': "${{{name}:?{name} must be set by the backend}}"')
    lines += [f"export {name}={shell_word(value)}" for name, value in env.items()]
    if plan.job.workdir:
        lines.append(f"cd {shell_word(plan.job.workdir)}")
    lines.append(f"exec {shell_join(role.argv)}")
    return Artifact.text(script_path(role.name), "\n".join(lines), executable=True)


def render_launch(plan: Plan, launch: Launch) -> list[Artifact]:
    """One script per role; the launcher's env first, then the job's own ``[job] env``."""
    return [render_role(plan, role, {**role.env, **plan.job.env}) for role in launch.roles]
