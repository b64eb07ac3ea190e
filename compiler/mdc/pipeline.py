"""The compiler pipeline: load -> schema -> structure -> plan -> launcher -> backend -> tree.

Data flows one way. The plugin set is loaded once and the composed schema is
built once per process, then reused for every file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from mdc import emit
from mdc.api import (
    Artifact,
    BackendSpec,
    Finding,
    Launch,
    LauncherSpec,
    TrainingSetup,
    _reporting,
)
from mdc.api.files import writing_files
from mdc.convert import structure_spec
from mdc.errors import Diagnostic, SpecError, escape_pointer_token
from mdc.hardware import with_network
from mdc.importers import translate
from mdc.launch_scripts import render_launch
from mdc.loaders import LoadedDocument, load_file
from mdc.passes.accelerator import accelerator_model, tensor_core_findings
from mdc.passes.calls import call
from mdc.passes.contract import launch_findings, plugin_findings, unread_tables
from mdc.passes.env import env_findings
from mdc.passes.serving import (
    fp4_findings,
    serving_memory_findings,
    whole_servers,
    workload_findings,
)
from mdc.plan import Plan, build_plan
from mdc.plan.build import DEFAULT_BACKEND
from mdc.plan.named_models import name_model
from mdc.plugin_manager import PluginSet, Registered
from mdc.schema import ComposedChecker
from mdc.spec import JobSpec

if TYPE_CHECKING:
    from os import PathLike

T = TypeVar("T")

#: The plan as JSON, in every tree.
PLAN = "plan.json"
#: Tables the plan's arithmetic reads.
PLANNED_TABLES = ("distributed", "parallelism", "batch", "model")


def _without(data: object, pointers: set[str], here: str = "") -> object:
    """A copy of ``data`` without the members at ``pointers``."""
    if isinstance(data, dict):
        return {
            k: _without(v, pointers, f"{here}/{escape_pointer_token(k)}")
            for k, v in data.items()
            if f"{here}/{escape_pointer_token(k)}" not in pointers
        }
    if isinstance(data, list):
        return [
            _without(v, pointers, f"{here}/{i}")
            for i, v in enumerate(data)
            if f"{here}/{i}" not in pointers
        ]
    return data


@attrs.frozen(kw_only=True)
class Compiled:
    plan: Plan
    launch: Launch
    #: the complete output tree, manifest included, sorted by path; empty when compiled with
    #: ``tree=False`` (validate and explain, which write nothing)
    tree: tuple[Artifact, ...]
    #: what translating a foreign config (e.g. madengine's) dropped or reinterpreted
    notes: tuple[Diagnostic, ...] = ()

    @property
    def diagnostics(self) -> tuple[Diagnostic, ...]:
        """The warnings (a compiled spec has no errors)."""
        return (*self.notes, *self.plan.warnings)


class Compiler:
    def __init__(self, plugins: PluginSet) -> None:
        self.plugins = plugins
        # A plugin is imported when a spec needs it: its table, launcher or backend.
        self.checker = ComposedChecker(
            [*plugins.launchers, *plugins.backends],
            lambda name: plugins.table(name).record.schema,
            plugins.launchers,
            plugins.backends,
        )
        self.option_types = plugins.option_types()

    @property
    def schema(self) -> dict[str, Any]:
        """The composed JSON Schema: every plugin's table (imports every plugin)."""
        return self.checker.schema

    def compile(self, path: str | PathLike[str], *, tree: bool = True) -> Compiled:
        """Compile one spec file in memory; raises SpecError or PluginError.

        A foreign config (madengine's) is translated first; what the translation dropped
        or reinterpreted comes back with the result's diagnostics. ``tree=False`` runs every
        check and every plugin hook but renders neither plan.json nor the manifest, and the
        backend's emit runs with :func:`mdc.api.files.files_written` False.
        """
        doc, notes = translate(load_file(path))
        try:
            return self.compile_document(doc, notes=notes, tree=tree)
        except SpecError as exc:
            raise SpecError([*notes, *exc.diagnostics]) from None

    def compile_document(
        self, doc: LoadedDocument, notes: Sequence[Diagnostic] = (), *, tree: bool = True
    ) -> Compiled:
        """Compile a loaded document (e.g. one a tool has edited) in memory."""
        doc, unnamed = name_model(doc)
        written = doc
        doc, read = self.read_arguments(doc)
        found = [*unnamed, *self.checker.check(doc)]
        if found:
            raise SpecError([*read, *found, *self._plan_despite(doc, found)])
        if any(d.is_error for d in read):  # the spec as written: its other findings too
            said = {(d.code, d.location.pointer) for d in read}  # (each flag's once)
            others = [d for d in self._findings_of(doc) if (d.code, d.location.pointer) not in said]
            raise SpecError([*read, *others])
        compiled = self._compile(doc, tree=tree, written=written, read=read)
        return attrs.evolve(compiled, notes=tuple(notes))

    def _findings_of(self, doc: LoadedDocument) -> list[Diagnostic]:
        """The plan's and the plugins' findings on a schema-valid document."""
        try:
            self._compile(doc, tree=False)
        except SpecError as exc:
            return list(exc.diagnostics)
        return []

    def read_arguments(self, doc: LoadedDocument) -> tuple[LoadedDocument, list[Diagnostic]]:
        """The document with the flags its launcher reads as keys read in (the launcher's
        ``arguments``), located where they were written, and the findings on them."""
        data = doc.data
        section = data.get("distributed") if isinstance(data, dict) else None
        name = section.get("launcher") if isinstance(section, dict) else None
        if not isinstance(name, str) or name not in self.plugins.launchers:
            return doc, []
        reading = self.plugins.launcher(name).arguments
        if reading is None:
            return doc, []
        # only a launcher whose arguments set keys needs the reading pass (and the flag
        # tables' classes it imports)
        from mdc.passes.flags import read_document

        read, found = read_document(doc, reading)
        return read, [self._diag(doc, f) for f in found]  # where they are written

    def _plan_despite(self, doc: LoadedDocument, found: list[Diagnostic]) -> list[Diagnostic]:
        """Plan findings for a spec whose schema errors lie outside what the plan reads.

        The invalid values are dropped; if none of them feeds the arithmetic, the
        plan's own findings are as real as on a valid spec, so report them too. A plugin
        whose own table was damaged is not asked to check it: its schema errors say it.
        """
        pointers = {d.location.pointer for d in found}
        if any(p == "" or p.split("/")[1] in PLANNED_TABLES for p in pointers):
            return []
        repaired = attrs.evolve(doc, data=_without(doc.data, pointers))
        if self.checker.check(repaired):
            return []
        try:
            self._compile(
                repaired, damaged=frozenset(p.split("/")[1] for p in pointers), tree=False
            )
        except SpecError as exc:
            return list(exc.diagnostics)
        return []

    def _compile(
        self,
        doc: LoadedDocument,
        damaged: frozenset[str] = frozenset(),
        *,
        tree: bool,
        written: LoadedDocument | None = None,
        read: Sequence[Diagnostic] = (),
    ) -> Compiled:
        """Compile a schema-valid document.

        ``damaged``: the tables a repaired document lost (see :meth:`_plan_despite`); their
        plugins' checks are skipped, and the document is only planned, never emitted.
        ``written``: the document before its flags were read as keys (the manifest's hash
        is of it); ``read``: the warnings reading them gave.
        """
        spec = structure_spec(doc.data, self.option_types)  # type: ignore[arg-type]
        backend_name = self._backend_name(doc, spec)
        launcher_reg = self.plugins.launchers[spec.distributed.launcher]
        backend_reg = self.plugins.backends[backend_name]
        launcher = self.plugins.launcher(spec.distributed.launcher)
        backend = self.plugins.backend(backend_name)
        findings: list[Diagnostic] = list(read)
        runs = backend.launchers
        if unsupported := runs is not None and launcher.name not in runs:
            findings.append(
                self._diag(
                    doc,
                    Finding(
                        code="MDC231",
                        pointer="/distributed/backend",
                        message=f"backend {backend.name!r} does not run launcher {launcher.name!r}",
                        hint=f"it runs: {', '.join(sorted(runs or ()))}",
                    ),
                )
            )
        spec, hardware, named = accelerator_model(spec, self.plugins)
        findings += [self._diag(doc, f) for f in named]
        backend_options = spec.plugin_tables.get(backend.name)
        training = _training(spec, launcher_reg, launcher)
        plan, planned = build_plan(
            spec,
            parallelism=launcher.parallelism,
            disaggregated=launcher.disaggregated,
            locate=doc.locate,
            serving=launcher.workload == "serving",
            training=training,
            scale_up_domain=hardware.scale_up_domain if hardware is not None else None,
            fixed_port=backend.fixed_port,
        )
        findings += planned
        if plan is not None and launcher.server_units is not None:
            plan = whole_servers(plan, launcher, launcher_reg)
        if plan is not None and hardware is not None:
            network = spec.distributed.network
            plan = attrs.evolve(plan, hardware=with_network(hardware, network, plan.nproc_per_node))
            if launcher.workload == "training":
                known = self.plugins.accelerators()
                refused = tensor_core_findings(spec, training, hardware, known)
                findings += [self._diag(doc, f) for f in refused]
        findings += [self._diag(doc, f) for f in fp4_findings(launcher, spec)]
        if plan is not None and launcher.workload == "serving":
            plan, serving_found = serving_memory_findings(plan, launcher, spec, launcher_reg)
            findings += [self._diag(doc, f) for f in serving_found]
        if plan is not None and spec.workload is not None:
            plan = attrs.evolve(plan, workload=spec.workload)
            # a damaged [workload] lost the value its schema error names: no second finding
            found = [] if "workload" in damaged else workload_findings(launcher, spec.workload)
            findings += [self._diag(doc, f) for f in found]
        chosen = (launcher_reg, backend_reg)
        if plan is not None:
            plan = _with_hosts(plan, backend, backend_reg, backend_options)
            checked = plugin_findings(plan, chosen, damaged, unsupported)
            findings += [self._diag(doc, f) for f in checked]
        findings += [self._diag(doc, f) for f in unread_tables(doc, chosen, self.plugins)]
        findings += [self._diag(doc, f) for f in env_findings(spec.job.env)]
        failed = any(d.is_error for d in findings)
        if plan is None or failed or damaged:
            raise SpecError(findings if plan is None or failed else [])
        plan = attrs.evolve(plan, warnings=tuple(sorted(findings, key=Diagnostic.sort_key)))
        return self._emit(doc, plan, (launcher_reg, backend_reg), tree=tree, written=written)

    def _backend_name(self, doc: LoadedDocument, spec: JobSpec) -> str:
        """The spec's backend, else the default, which is refused (MDC104) when it is not
        loaded (blocked or absent)."""
        name = spec.distributed.backend or DEFAULT_BACKEND
        if name in self.plugins.backends:
            return name
        raise SpecError(
            [
                self._diag(
                    doc,
                    Finding(
                        code="MDC104",
                        pointer="/distributed",
                        message=f"the default backend {name!r} is not available",
                        hint="set backend to one of: "
                        f"{', '.join(self.plugins.backends) or '(none)'}",
                    ),
                )
            ]
        )

    def _emit(
        self,
        doc: LoadedDocument,
        plan: Plan,
        chosen: tuple[Registered, Registered],
        *,
        tree: bool,
        written: LoadedDocument | None,
    ) -> Compiled:
        """The launcher's and the backend's files for a checked plan, and the tree's."""
        launcher_reg, backend_reg = chosen
        launcher = self.plugins.launcher(launcher_reg.record.name)
        backend = self.plugins.backend(backend_reg.record.name)
        launch = call(
            launcher_reg, "emit", lambda: launcher.emit(plan, plan.options.get(launcher.name))
        )
        clashes = launch_findings(launcher_reg, plan, launch)
        if clashes:
            raise SpecError([self._diag(doc, f) for f in clashes])
        call(launcher_reg, "emit", lambda: emit.check_paths(launch.files))
        # the backend sees every file a node needs: the role scripts, then the launcher's
        # (a launcher file that takes a role script's path, or a word that is not one, is
        # the launcher's fault, found before the backend runs)
        launched = attrs.evolve(
            launch,
            files=call(launcher_reg, "emit", lambda: (*render_launch(plan, launch), *launch.files)),
        )
        call(launcher_reg, "emit", lambda: emit.check_paths(launched.files))
        # without a tree the backend's files are dropped; what it reports joins the findings
        with writing_files(tree), _reporting() as reported:
            scheduler = call(
                backend_reg,
                "emit",
                lambda: list(backend.emit(plan, launched, plan.options.get(backend.name))),
            )
        final = self._with_reported(doc, plan, reported)
        own = [*launched.files]
        if tree:
            from mdc.describe import plan_json  # only a command that writes the tree

            own.append(Artifact.json(PLAN, plan_json(final, launch)))
        # without the tree, plan.json's path is still taken
        reserved = (emit.MANIFEST,) if tree else (emit.MANIFEST, PLAN)
        call(backend_reg, "emit", lambda: emit.check_paths([*own, *scheduler], reserved=reserved))
        if not tree:
            return Compiled(plan=final, launch=launch, tree=())
        plugins = {
            name: reg.origin.distribution
            for name, reg in ((launcher.name, launcher_reg), (backend.name, backend_reg))
        }
        files = emit.finish(
            [*own, *scheduler],
            spec_sha256=emit.canonical_sha256((written or doc).data),
            plugins=plugins,
        )
        return Compiled(plan=final, launch=launch, tree=tuple(files))

    def _with_reported(self, doc: LoadedDocument, plan: Plan, reported: list[Finding]) -> Plan:
        """The plan with the warnings a backend's emit reported (mdc.api.report); SpecError
        when it reported an error."""
        found = [self._diag(doc, f) for f in reported]
        if any(d.is_error for d in found):
            raise SpecError([*plan.warnings, *found])
        warnings = sorted((*plan.warnings, *found), key=Diagnostic.sort_key)
        return attrs.evolve(plan, warnings=tuple(warnings))

    @staticmethod
    def _diag(doc: LoadedDocument, finding: Finding) -> Diagnostic:
        return Diagnostic(
            severity=finding.severity,
            code=finding.code,
            message=finding.message,
            hint=finding.hint,
            location=doc.locate(finding.pointer),
        )


def _with_hosts(plan: Plan, backend: BackendSpec, backend_reg: Registered, options: Any) -> Plan:
    """The plan with the nodes' host names, where the backend knows them before the run
    (one a node; else the plan as it is)."""
    hosts_of, nnodes = backend.hosts, plan.nnodes
    if hosts_of is None:
        return plan
    hosts = call(backend_reg, "hosts", lambda: hosts_of(nnodes, options))
    if hosts is not None and len(hosts) == nnodes:
        return attrs.evolve(plan, hosts=tuple(hosts))
    return plan


def _training(spec: JobSpec, launcher_reg: Registered, launcher: LauncherSpec) -> TrainingSetup:
    """What the launcher trains with, from its table and the command's overrides."""
    launcher_options = spec.plugin_tables.get(launcher.name)
    training = TrainingSetup()
    if launcher.training is not None:
        training_of, read_command = launcher.training, launcher.read_command
        trained = launcher_options
        if read_command is not None:  # the command's overrides, as the framework reads them
            argv = spec.job.argv
            trained = call(launcher_reg, "read_command",
                           lambda: read_command(launcher_options, argv))  # fmt: skip
        training = call(launcher_reg, "training", lambda: training_of(trained))
    return training
