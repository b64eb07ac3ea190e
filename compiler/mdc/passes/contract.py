"""The plugin contract passes: the launcher's and backend's checks, what the launcher's Launch
must be, and plugin tables neither reads."""

from __future__ import annotations

import functools
from collections.abc import Iterator

from mdc.api import OUT_DIR, RUNTIME_VARIABLES, Artifact, Finding, Launch, Role, Severity
from mdc.errors import PluginError
from mdc.loaders import LoadedDocument
from mdc.passes.calls import call, checked_findings, listed
from mdc.plan import Plan
from mdc.plugin_manager import DISTRIBUTION, PluginSet, Registered


def plugin_findings(
    plan: Plan, chosen: tuple[Registered, Registered], damaged: frozenset[str], unsupported: bool
) -> list[Finding]:
    """The launcher's and the backend's own checks of the plan (a damaged table's plugin, and
    a backend that does not run the launcher, check nothing)."""
    backend_reg = chosen[1]
    found: list[Finding] = []
    for reg in chosen:
        check = reg.record.check
        # a backend checks only the launchers it runs
        skip = reg.record.name in damaged or (reg is backend_reg and unsupported)
        if check is not None and not skip:
            # list() inside call: a generator's errors surface while it is consumed
            results = call(
                reg,
                "check",
                functools.partial(listed, check, plan, plan.options.get(reg.record.name)),
            )
            found += checked_findings(reg, results)
    return found


def launch_findings(reg: Registered, plan: Plan, launch: Launch) -> list[Finding]:
    """The launcher's Launch against the contract (a fault is a PluginError), and MDC240 for
    each [job] env variable the launcher or backend sets itself."""
    if not isinstance(launch, Launch):
        raise PluginError(
            reg.origin, "emit", f"returned {type(launch).__name__}, expected mdc.api.Launch"
        )
    if not (
        isinstance(launch.roles, (tuple, list))
        and isinstance(launch.files, (tuple, list))
        and all(isinstance(r, Role) for r in launch.roles)
        and all(isinstance(f, Artifact) for f in launch.files)
    ):
        raise PluginError(
            reg.origin,
            "emit",
            "returned a Launch whose roles are not all "
            "mdc.api.Role or whose files are not all mdc.api.Artifact",
        )
    wanted = sorted(r.name for r in plan.roles)
    given = sorted(r.name for r in launch.roles)
    if wanted != given:
        raise PluginError(reg.origin, "emit", f"returned roles {given}; the plan has {wanted}")
    if any(not f.path.startswith("launch/") for f in launch.files):
        raise PluginError(reg.origin, "emit", "launcher files must lie under launch/")
    managed = {name for role in launch.roles for name in role.env}
    managed |= set(launch.worker_env) | {*RUNTIME_VARIABLES, OUT_DIR.name}
    return [
        Finding(
            code="MDC240",
            pointer=f"/job/env/{name}",
            message=f"{name} is set by the {plan.launcher} launcher or the "
            f"{plan.backend} backend; [job] env cannot override it",
            hint="remove it from [job] env; the plan sets it",
        )
        for name in sorted(managed & set(plan.job.env))
    ]


def unread_tables(
    doc: LoadedDocument, chosen: tuple[Registered, Registered], plugins: PluginSet
) -> Iterator[Finding]:
    """MDC253 for each plugin table in the spec that neither the chosen launcher nor the
    backend reads: it would change nothing, silently."""
    data = doc.data if isinstance(doc.data, dict) else {}
    read = {reg.record.name for reg in chosen}
    for reg in chosen:
        read.update(reg.record.reads)
    launcher, backend = (reg.record.name for reg in chosen)
    for table in sorted(data):
        kind = (
            "launcher"
            if table in plugins.launchers
            else "backend"
            if table in plugins.backends
            else None
        )
        if kind is None or table in read:
            continue
        origin = plugins.plugins.get(table)
        where = (
            f" (plugin {origin.distribution})"
            if origin is not None and origin.distribution != DISTRIBUTION
            else ""
        )
        yield Finding(
            code="MDC253",
            pointer=f"/{table}",
            severity=Severity.WARNING,
            message=f"[{table}] is not read: it holds the options of the {kind} "
            f"{table!r}{where}, and this job runs launcher {launcher!r} on backend "
            f"{backend!r}",
            hint=f'remove [{table}], or set {kind} = "{table}" in [distributed]',
        )
